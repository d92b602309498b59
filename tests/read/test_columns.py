"""``compute --columns all|keys|none``: which input columns go to the output beside the new ones,
in every output format and on standard output, with the rows in input order and the values of
``--columns all``."""

from __future__ import annotations

import io
import math

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from advcli.read.columns import resolve_columns
from advcli.read.scan import closing_sources
from advcli.run.loading import opened
from advcli.settings.config import ColumnNames, OutputColumns
from advcli.write.rows import _input_rows, kept_columns

torch = pytest.importorskip("torch")

# (group, trajectory, turn, score, tokens), groups and trajectories interleaved so that input
# order is not the order of the keys. Each group holds a trajectory of score 1 and one of
# score 0: at trajectory level GRPO gives them ±0.5 / std, std = √0.5 (Bessel), so ±1/√2.
ROWS = [
    ("G", "b", 0, 0.0, 2),
    ("H", "c", 0, 0.0, 3),
    ("G", "a", 0, 1.0, 1),
    ("G", "b", 1, 0.0, 2),
    ("H", "d", 0, 1.0, 4),
    ("G", "a", 1, 1.0, 3),
]
EXPECTED_ADVANTAGE = [-1, -1, 1, -1, 1, 1]
NEW = ["score", "advantage", "advantages"]
KEYS = ["prompt", "sample", "step_idx"]


def _write_dump(path, ids=str):
    """A dump under names no trainer uses (read by the flags), with token columns beside."""
    letters = {"G": 0, "H": 1, "a": 0, "b": 1, "c": 2, "d": 3}
    pl.DataFrame(
        {
            "prompt": [ids(r[0]) if ids is str else letters[r[0]] for r in ROWS],
            "response_ids": [list(range(r[4])) for r in ROWS],
            "sample": [ids(r[1]) if ids is str else letters[r[1]] for r in ROWS],
            "step_idx": [r[2] for r in ROWS],
            "rewards": [[0.0] * (r[4] - 1) + [r[3]] for r in ROWS],
            "old_log_probs": [[-0.5] * r[4] for r in ROWS],
            "loss_mask": [[1] * r[4] for r in ROWS],
        },
        schema_overrides={"loss_mask": pl.List(pl.Int8)},
    ).write_parquet(path)
    return path


@pytest.fixture
def dump(tmp_path):
    return _write_dump(tmp_path / "dump.parquet")


FLAGS = (
    *("--group-col", "prompt", "--traj-col", "sample", "--turn-col", "step_idx"),
    *("--reward-col", "rewards", "--mask-col", "loss_mask", "--level", "trajectory", "-q"),
)


def _compute(run, dump, output, *options):
    result = run("compute", dump, "-o", output, *FLAGS, *options)
    assert result.exit_code == 0, result.stderr
    return result


def _read(path):
    if path.suffix == ".arrows":
        return pl.from_arrow(pa.ipc.open_stream(path.read_bytes()).read_all())
    return pl.read_ipc(path) if path.suffix == ".arrow" else pl.read_parquet(path)


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "arrows"])
def test_keys_and_none_are_all_s_columns_and_values(fmt, dump, run, tmp_path):
    for choice in ("all", "keys", "none"):
        _compute(run, dump, tmp_path / f"{choice}.{fmt}", "--columns", choice)
    every, keys, none = (_read(tmp_path / f"{c}.{fmt}") for c in ("all", "keys", "none"))
    assert keys.columns == [*KEYS, *NEW]
    assert none.columns == NEW
    assert keys.equals(every.select(keys.columns))
    assert none.equals(every.select(NEW))
    # The role columns as read: the input's names and types, in input order.
    assert keys["prompt"].to_list() == [r[0] for r in ROWS]
    assert keys["step_idx"].dtype == pl.Int64
    assert keys["advantage"].to_list() == pytest.approx(
        [a / math.sqrt(2) for a in EXPECTED_ADVANTAGE], rel=1e-5
    )
    expected_tokens = [
        a / math.sqrt(2) for a, r in zip(EXPECTED_ADVANTAGE, ROWS, strict=True) for _ in range(r[4])
    ]
    assert none["advantages"].explode().to_list() == pytest.approx(expected_tokens, rel=1e-5)


def test_loss_weight_and_no_tokens(dump, run, tmp_path):
    options = ("--loss-weight", "token-sum")
    _compute(run, dump, tmp_path / "all.parquet", *options)
    _compute(run, dump, tmp_path / "keys.parquet", "--columns", "keys", *options)
    _compute(run, dump, tmp_path / "none.parquet", "--columns", "none", "--no-tokens", *options)
    every = pl.read_parquet(tmp_path / "all.parquet")
    keys = pl.read_parquet(tmp_path / "keys.parquet")
    none = pl.read_parquet(tmp_path / "none.parquet")
    assert keys.columns == [*KEYS, "score", "advantage", "loss_weight", "advantages"]
    assert keys.equals(every.select(keys.columns))
    # No input column to read: the rows still number the input's.
    assert none.columns == ["score", "advantage", "loss_weight"]
    assert none.equals(every.select(none.columns))
    assert none["loss_weight"].to_list() == [1.0] * len(ROWS)


@pytest.mark.parametrize(("fmt", "ids"), [("npz", str), ("npz", int), ("pt", int)])
def test_padded_arrays(fmt, ids, run, tmp_path):
    dump = _write_dump(tmp_path / "dump.parquet", ids)
    _compute(run, dump, tmp_path / "all.parquet")

    def arrays(choice):
        path = tmp_path / f"{choice}.{fmt}"
        _compute(run, dump, path, "--columns", choice)
        if fmt == "npz":
            with np.load(path) as loaded:
                return {name: loaded[name] for name in loaded.files}
        return {name: tensor.numpy() for name, tensor in torch.load(path).items()}

    every, keys, none = arrays("all"), arrays("keys"), arrays("none")
    assert list(every) == ["response_mask", "advantage", "advantages"]
    assert list(keys) == ["response_mask", "prompt", "sample", "step_idx", *NEW]
    assert list(none) == ["response_mask", *NEW]
    for name in every:
        np.testing.assert_array_equal(keys[name], every[name])
        np.testing.assert_array_equal(none[name], every[name])
    table = pl.read_parquet(tmp_path / "all.parquet")
    np.testing.assert_array_equal(none["score"], table["score"].to_numpy())
    for name in ("prompt", "sample", "step_idx"):
        np.testing.assert_array_equal(keys[name], table[name].to_numpy())
    if ids is str:
        assert keys["prompt"].dtype.kind == "U"  # text, not pickled objects


def test_a_tensor_file_refuses_a_text_key(dump, run, tmp_path):
    output = tmp_path / "out.pt"
    result = run("compute", dump, "-o", output, *FLAGS, "--columns", "keys")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: {output}: the column 'prompt' is String, and a .pt file holds numbers only; "
        "write .npz or .parquet, or pass --columns none"
    )
    assert list(tmp_path.iterdir()) == [dump]


def test_a_bad_choice_is_a_usage_error(dump, run, tmp_path):
    result = run("compute", dump, "-o", tmp_path / "out.parquet", *FLAGS, "--columns", "some")
    assert result.exit_code == 2
    assert "'some' is not one of 'all', 'keys', 'none'" in result.stderr


def test_standard_output(dump, run, tmp_path):
    result = run("compute", dump, "-o", "-", *FLAGS, "--columns", "keys")
    assert result.exit_code == 0, result.stderr
    streamed = pl.from_arrow(pa.ipc.open_stream(io.BytesIO(result.stdout_bytes)).read_all())
    _compute(run, dump, tmp_path / "keys.parquet", "--columns", "keys")
    assert streamed.equals(pl.read_parquet(tmp_path / "keys.parquet"))


def test_groups_of_consecutive_rows_and_replaced_names(tmp_path, run):
    """Without a group column (--group-size) the keys are the trajectory and turn columns; an
    input column the output replaces (a user's ``advantage``) is the new one."""
    path = tmp_path / "dump.parquet"
    pl.DataFrame(
        {
            "advantage": [9.0, 9.0, 9.0, 9.0],
            "rollout_id": [0, 1, 2, 3],
            "turn_index": [0, 0, 0, 0],
            "token_level_rewards": [[1.0], [0.0], [0.0], [1.0]],
            "response_mask": [[1], [1], [1], [1]],
        }
    ).write_parquet(path)
    output = tmp_path / "keys.parquet"
    options = ("--group-size", "2", "--columns", "keys", "-q", "--level", "trajectory")
    assert run("compute", path, "-o", output, *options).exit_code == 0
    keys = pl.read_parquet(output)
    assert keys.columns == ["rollout_id", "turn_index", *NEW]
    assert keys["advantage"].to_list() == pytest.approx(
        [2**-0.5, -(2**-0.5), -(2**-0.5), 2**-0.5], rel=1e-5
    )


def test_stage_3_reads_only_the_columns_it_writes(dump):
    """The input columns stage 3 reads again: the keys and the mask, never the token ids or the
    log-probs; with neither keys nor tokens, none (the rows numbered from the values)."""
    names = ColumnNames(
        group="prompt", trajectory="sample", turn="step_idx", reward="rewards", mask="loss_mask"
    )
    row_values = pl.DataFrame({"row": range(len(ROWS))}, schema={"row": pl.UInt32})
    with opened([str(dump)]) as dataset:
        columns = resolve_columns(dataset.schema, dataset.describe(), names)
        schema = dataset.schema.names()

        def read(choice, mask):
            kept = kept_columns(schema, columns, choice)
            rows = _input_rows(dataset, row_values, columns, kept, "n", mask)
            with closing_sources():
                return rows.collect(engine="streaming")

        assert read(OutputColumns.KEYS, True).columns == ["n", *KEYS, "loss_mask"]
        assert read(OutputColumns.NONE, True).columns == ["n", "loss_mask"]
        assert read(OutputColumns.NONE, False)["n"].to_list() == list(range(len(ROWS)))
        assert read(OutputColumns.ALL, True).columns == ["n", *schema]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("choice", ["keys", "none"])
def test_ray_engine_writes_the_local_engine_s_columns(choice, cluster, dump, run, tmp_path):
    local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
    _compute(run, dump, local, "--columns", choice)
    _compute(run, dump, distributed, "--columns", choice, "--engine", "ray")
    assert pl.read_parquet(sorted(distributed.glob("*.parquet"))).equals(pl.read_parquet(local))

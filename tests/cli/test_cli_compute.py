"""advcli compute through the real Typer CLI: outputs, formats, summaries and every error path."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cases import BIAS_EXAMPLE, MIXED_TURNS
from conftest import dump_frame
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from advcli.cli.app import app
from advcli.run.commands import compute
from advcli.settings.config import AdvantageConfig, Level


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_command_has_help(run):
    for command in app.registered_commands:
        assert command.callback.__doc__, command.name
        result = run(command.name, "--help")
        assert result.exit_code == 0
        assert "Example" in result.stdout


def test_the_command_list_is_whole_in_an_80_column_terminal():
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["--help"])
    assert result.exit_code == 0
    commands = result.stdout.split("Commands:", 1)[1].splitlines()
    listed = [line for line in commands if line.strip()]
    assert len(listed) == len(app.registered_commands)
    assert not [line for line in listed if line.rstrip().endswith("...")]


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("advcli ")


def test_pass_through_columns_and_row_order(write_dump, run, tmp_path):
    frame = dump_frame(MIXED_TURNS.rows).with_columns(
        prompt=pl.Series(["p1", None, "p3", "p4", "p5", "p6"]),
        meta=pl.Series([{"step": i, "tag": str(i)} for i in range(6)]),
        tools=pl.Series([["a"], [], ["b", "c"], None, ["d"], ["e"]]),
    )
    source = write_dump(frame)
    before = digest(source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output)

    assert result.exit_code == 0, result.output
    out = pl.read_parquet(output)
    assert out.columns == [*frame.columns, "score", "advantage", "advantages"]
    assert_frame_equal(out.select(frame.columns), frame)
    assert out["advantages"].dtype == pl.List(pl.Float32)
    assert digest(source) == before


def test_advantages_is_advantage_times_mask(write_dump, run, tmp_path):
    frame = pl.DataFrame(
        {
            "data_id": [1, 1],
            "rollout_id": [1, 2],
            "token_level_rewards": [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0]],
            "response_mask": [[True, False, True, False], [True, True]],
        }
    )
    output = tmp_path / "out.parquet"
    assert run("compute", write_dump(frame), "-o", output, "--estimator", "drgrpo").exit_code == 0
    assert pl.read_parquet(output)["advantages"].to_list() == [[0.5, 0, 0.5, 0], [-0.5, -0.5]]


def test_scalar_score_and_response_length(write_dump, run, tmp_path):
    frame = pl.DataFrame(
        {
            "uid": ["a", "a", "a"],
            "traj_uid": [0, 1, 1],
            "reward": [2.0, 0.0, 0.0],
            "response_length": [2, 3, 0],
        }
    )
    output = tmp_path / "out.parquet"
    result = run("compute", write_dump(frame), "-o", output, "--estimator", "drgrpo")
    assert result.exit_code == 0, result.output
    assert (
        "reward: 'reward' is the reward column of advcli's dumps, one number per row"
        in result.stderr
    )
    out = pl.read_parquet(output)
    assert out["advantages"].to_list() == [[1.0, 1.0], [-1.0, -1.0, -1.0], []]


def test_column_options(write_dump, run, tmp_path):
    frame = pl.DataFrame(
        {"prompt": [1, 1], "sample": [0, 1], "step": [0, 0], "r": [1.0, 0.0], "m": [[1], [1]]}
    )
    output = tmp_path / "out.parquet"
    result = run(
        "compute",
        write_dump(frame),
        "-o",
        output,
        "--group-col",
        "prompt",
        "--traj-col",
        "sample",
        "--turn-col",
        "step",
        "--reward-col",
        "r",
        "--mask-col",
        "m",
        "--estimator",
        "drgrpo",
    )
    assert result.exit_code == 0, result.output
    assert pl.read_parquet(output)["advantage"].to_list() == [0.5, -0.5]


def test_rerun_on_an_output_replaces_the_added_columns(write_dump, run, tmp_path):
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    assert run("compute", write_dump(BIAS_EXAMPLE.rows), "-o", first).exit_code == 0
    result = run("compute", first, "-o", second, "--level", "turn")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "input columns named like outputs │ score, advantage, advantages (not kept)" in said
    out = pl.read_parquet(second)
    assert out.columns.count("advantage") == 1
    np.testing.assert_allclose(
        out["advantage"].to_numpy(), BIAS_EXAMPLE.expected[("turn", "grpo")], rtol=1e-5
    )


@pytest.mark.parametrize("suffix", [".parquet", ".npz"])
def test_an_earlier_runs_loss_weight_is_not_carried_into_a_run_that_writes_none(
    write_dump, run, tmp_path, suffix
):
    """A rerun on an output written with --loss-weight: its stale loss_weight would pass for
    this run's (in the Parquet rows and the .npz arrays alike); it is not kept, and the
    summary says so."""
    source = write_dump(BIAS_EXAMPLE.rows)
    first, second = tmp_path / "first.parquet", tmp_path / f"second{suffix}"
    written = run("compute", source, "-o", first, "--loss-weight", "token-mean")
    assert written.exit_code == 0, written.stderr
    result = run("compute", first, "-o", second)
    assert result.exit_code == 0, result.stderr
    assert "advantages, loss_weight (not kept)" in " ".join(result.stderr.split())
    if suffix == ".npz":
        with np.load(second) as arrays:
            assert "loss_weight" not in arrays
    else:
        assert "loss_weight" not in pl.read_parquet(second).columns
    # Asked for again, the weights are this run's: those of a run on the original dump.
    again, fresh = tmp_path / "again.parquet", tmp_path / "fresh.parquet"
    mode = ("--loss-weight", "seq-mean-token-sum-norm", "--loss-scale-factor", "4")
    assert run("compute", first, "-o", again, *mode).exit_code == 0
    assert run("compute", source, "-o", fresh, *mode).exit_code == 0
    weights = pl.read_parquet(again)["loss_weight"]
    assert weights.equals(pl.read_parquet(fresh)["loss_weight"])
    assert not weights.equals(pl.read_parquet(first)["loss_weight"])


@pytest.mark.parametrize(
    ("renamed", "option"),
    [
        ({"data_id": "score"}, "--group-col"),
        ({"rollout_id": "advantage"}, "--traj-col"),
        ({"turn_index": "loss_weight"}, "--turn-col"),
        ({"response_mask": "advantages"}, "--mask-col"),
    ],
    ids=["group", "trajectory", "turn", "mask"],
)
def test_a_key_column_named_like_an_output_is_refused_by_compute(
    write_dump, run, tmp_path, renamed, option
):
    """The output would replace its values (group ids become scores), and a run on the output
    would read them as the key; compare writes no rows and reads it. A column an option names
    for one role is never a candidate for another (a group column 'score' is no reward)."""
    (new,) = renamed.values()
    source = tmp_path / "renamed.parquet"
    pl.read_parquet(write_dump(BIAS_EXAMPLE.rows)).rename(renamed).write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "out.parquet", option, new)
    assert result.exit_code == 1
    role = {"--group-col": "group", "--traj-col": "trajectory", "--turn-col": "turn"}
    assert result.stderr == (
        f"Error: {source}: the {role.get(option, 'mask')} column '{new}' has the name of a "
        "column the output writes, which would replace it; rename it in the input\n"
    )
    assert not (tmp_path / "out.parquet").exists()
    compared = run("compare", source, option, new, "-q")
    assert compared.exit_code == 0, compared.stderr


def test_no_tokens(write_dump, run, tmp_path):
    output = tmp_path / "out.parquet"
    assert run("compute", write_dump(BIAS_EXAMPLE.rows), "-o", output, "--no-tokens").exit_code == 0
    assert "advantages" not in pl.read_parquet(output).columns


def test_npz_output(write_dump, run, tmp_path):
    frame = dump_frame([(0, 0, 0, 1.0, 3), (0, 1, 0, 0.0, 1)]).with_columns(
        response_mask=pl.Series([[1, 0, 1], [1]], dtype=pl.List(pl.Int8))
    )
    output = tmp_path / "out.npz"
    assert run("compute", write_dump(frame), "-o", output, "--estimator", "drgrpo").exit_code == 0
    with np.load(output) as arrays:
        assert arrays["advantages"].dtype == np.float32
        np.testing.assert_array_equal(arrays["advantage"], [0.5, -0.5])
        np.testing.assert_array_equal(arrays["response_mask"], [[1, 0, 1], [1, 0, 0]])
        np.testing.assert_array_equal(arrays["advantages"], [[0.5, 0, 0.5], [-0.5, 0, 0]])


@pytest.mark.torch
def test_pt_output(write_dump, run, tmp_path):
    torch = pytest.importorskip("torch")
    output = tmp_path / "out.bin"
    source = write_dump([(0, 0, 0, 1.0, 2), (0, 1, 0, 0.0, 1)])
    result = run("compute", source, "-o", output, "--format", "pt", "--estimator", "drgrpo")
    assert result.exit_code == 0, result.output
    saved = torch.load(output)
    assert saved["advantages"].dtype == torch.float32
    assert saved["advantages"].tolist() == [[0.5, 0.5], [-0.5, 0.0]]
    assert saved["advantage"].tolist() == [0.5, -0.5]


def test_groups_may_span_files_globs_and_directories(tmp_path, run):
    folder = tmp_path / "dump"
    folder.mkdir()
    rows = BIAS_EXAMPLE.rows
    dump_frame(rows[:2]).write_parquet(folder / "part-0.parquet")
    dump_frame(rows[2:]).write_parquet(folder / "part-1.parquet")
    expected = BIAS_EXAMPLE.expected[("turn", "grpo")]
    for spec in (folder, f"{folder}/*.parquet"):
        output = tmp_path / "out.parquet"
        result = run("compute", spec, "-o", output, "--level", "turn", "--force")
        assert result.exit_code == 0, result.output
        np.testing.assert_allclose(pl.read_parquet(output)["advantage"], expected, rtol=1e-5)


def test_summary_on_stderr_and_quiet(write_dump, run, tmp_path):
    source = write_dump(BIAS_EXAMPLE.rows)
    result = run("compute", source, "-o", tmp_path / "a.parquet")
    assert result.stdout == ""
    for text in (
        "rows",
        "5",
        "groups",
        "trajectories",
        "singleton groups",
        "trajectory",
        "grpo",
        "token_level_rewards",
        "seconds",
    ):
        assert text in result.stderr
    quiet = run("compute", source, "-o", tmp_path / "b.parquet", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == ""


def test_existing_output_is_replaced_with_force(write_dump, run, tmp_path):
    output = tmp_path / "out.parquet"
    output.write_bytes(b"old")
    assert run("compute", write_dump(BIAS_EXAMPLE.rows), "-o", output, "--force").exit_code == 0
    assert pl.read_parquet(output).height == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "rollouts.parquet"]


# ---------------------------------------------------------------------------------------------
# Bad input: exit 1, one "Error:" line naming what and where, no output, input unchanged.

BASE = dump_frame([(0, "a", 0, 1.0, 2), (0, "a", 1, 1.0, 2), (0, "b", 0, 0.0, 2)])


def with_column(name, values, dtype=None):
    return BASE.with_columns(pl.Series(name, values, dtype=dtype))


BAD_FRAMES = {
    "missing group": (
        BASE.drop("data_id"),
        [],
        "no group column: expected 'data_id', 'data_id_list', 'uid', 'uids'",
    ),
    "missing trajectory": (BASE.drop("rollout_id"), [], "no trajectory column"),
    "missing reward": (BASE.drop("token_level_rewards"), [], "no reward column"),
    "missing mask": (BASE.drop("response_mask"), [], "no mask column"),
    "option names a missing column": (
        BASE,
        ["--reward-col", "nope"],
        "column 'nope' (--reward-col) not found",
    ),
    "string rewards": (
        with_column("token_level_rewards", ["1", "1", "0"]),
        [],
        "column 'token_level_rewards' (reward) has type String",
    ),
    "list of strings mask": (
        with_column("response_mask", [["1"], ["1"], ["1"]]),
        [],
        "column 'response_mask' (response mask) has type List(String)",
    ),
    "float ids": (
        with_column("data_id", [0.0, 0.0, 1.0]),
        [],
        "column 'data_id' (group id) has type Float64",
    ),
    "null group": (
        with_column("data_id", [0, None, 0]),
        [],
        "row 1: column 'data_id' (group id) is null",
    ),
    "null trajectory": (
        with_column("rollout_id", ["a", "a", None]),
        [],
        "row 2: column 'rollout_id' (trajectory id) is null",
    ),
    "null reward list": (
        with_column("token_level_rewards", [[0.0, 1.0], None, [0.0, 0.0]]),
        [],
        "row 1: column 'token_level_rewards' (reward) is null",
    ),
    "null reward element": (
        with_column("token_level_rewards", [[0.0, 1.0], [0.0, None], [0.0, 0.0]]),
        [],
        "row 1: column 'token_level_rewards' has a null element",
    ),
    "nan score": (
        with_column("token_level_rewards", [[0.0, 1.0], [0.0, 1.0], [0.0, float("nan")]]),
        [],
        "row 2: column 'token_level_rewards': the score is NaN",
    ),
    "inf score": (
        with_column("token_level_rewards", [[0.0, float("inf")], [0.0, 1.0], [0.0, 0.0]]),
        [],
        "row 0: column 'token_level_rewards': the score is +inf",
    ),
    "length mismatch": (
        with_column("response_mask", [[1, 1], [1, 1, 1], [1, 1]], pl.List(pl.Int8)),
        [],
        "row 1: column 'response_mask' and column 'token_level_rewards' have different lengths",
    ),
    "inconsistent trajectory": (
        with_column("token_level_rewards", [[0.0, 1.0], [0.0, 0.5], [0.0, 0.0]]),
        [],
        "trajectory (data_id=0, rollout_id='a') has rows with different scores [1.0, 0.5]",
    ),
}


@pytest.mark.parametrize("case", BAD_FRAMES, ids=str)
def test_bad_frames(case, write_dump, run, tmp_path):
    frame, options, message = BAD_FRAMES[case]
    source = write_dump(frame)
    before = digest(source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output, *options)

    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message in lines[0]
    assert str(source) in lines[0] or "trajectory (" in lines[0]
    assert "Traceback" not in result.output
    assert not output.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.parquet"]
    assert digest(source) == before


def bad_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "bad.parquet"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "csv":
        path.write_text("data_id,rollout_id\n1,2\n")
    elif kind == "truncated":
        BASE.write_parquet(path)
        path.write_bytes(path.read_bytes()[:-20])
    elif kind == "zero rows":
        BASE.clear().write_parquet(path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "the file is empty (0 bytes)"),
        ("csv", "not a readable Parquet file"),
        ("truncated", "not a readable Parquet file"),
        ("zero rows", "the input has no rows"),
    ],
)
def test_bad_files(kind, message, run, tmp_path):
    source = bad_file(tmp_path, kind)
    result = run("compute", source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {source}: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.parquet").exists()


def test_no_inputs(run, tmp_path):
    result = run("compute", "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: no input files given"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.parquet", "no such file or directory"),
        ("*.nothing", "the pattern matches no file"),
    ],
)
def test_missing_inputs(spec, message, run, tmp_path):
    result = run("compute", tmp_path / spec, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"Error: {tmp_path / spec}: {message}"


def test_empty_directory(run, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run("compute", tmp_path / "empty", "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'empty'}: the directory holds no Parquet file (*.parquet, *.pq), "
        "JSON-lines file (*.jsonl, *.ndjson) or trainer's dump advcli reads (rLLM's "
        "episode_*.json, slime's rollout_data/{id}.pt, SkyRL's "
        "global_step_{N}_training_input.pkl)\n"
    )


def test_conflicting_schemas(run, tmp_path):
    BASE.write_parquet(tmp_path / "a.parquet")
    BASE.with_columns(pl.col("data_id").cast(pl.String)).write_parquet(tmp_path / "b.parquet")
    result = run("compute", tmp_path / "a.parquet", tmp_path / "b.parquet", "-o", tmp_path / "o.pq")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: schemas conflict: column 'data_id' is Int64 in {tmp_path / 'a.parquet'} but "
        f"String in {tmp_path / 'b.parquet'}\n"
    )


def test_existing_output_needs_force(write_dump, run, tmp_path):
    output = tmp_path / "out.parquet"
    output.write_bytes(b"keep me")
    result = run("compute", write_dump(BASE), "-o", output)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"Error: {output}: the file exists; pass --force to replace it"
    assert output.read_bytes() == b"keep me"


def test_output_equal_to_input_is_refused(write_dump, run):
    source = write_dump(BASE)
    before = digest(source)
    result = run("compute", source, "-o", source, "--force")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {source}: the output is also an input; choose another path\n"
    assert digest(source) == before


def test_output_folder_missing(write_dump, run, tmp_path):
    output = tmp_path / "nowhere" / "out.parquet"
    result = run("compute", write_dump(BASE), "-o", output)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {output}: the folder {output.parent} does not exist\n"


def test_unknown_output_extension(write_dump, run, tmp_path):
    result = run("compute", write_dump(BASE), "-o", tmp_path / "out.csv")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'out.csv'}: cannot tell the output format from the extension; use "
        ".parquet, .arrow, .arrows, .npz or .pt, or pass --format\n"
    )


@pytest.mark.parametrize(
    "args",
    [["--level", "episode"], ["--estimator", "ppo"], ["--bogus"], ["--traj-score", "median"]],
)
def test_usage_errors_exit_2(args, write_dump, run, tmp_path):
    result = run("compute", write_dump(BASE), "-o", tmp_path / "out.parquet", *args)
    assert result.exit_code == 2
    assert not (tmp_path / "out.parquet").exists()


def test_output_that_is_a_directory(write_dump, run, tmp_path):
    (tmp_path / "out.parquet").mkdir()
    result = run("compute", write_dump(BASE), "-o", tmp_path / "out.parquet", "--force")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path / 'out.parquet'}: is a directory; name a file\n"


def test_every_output_is_checked_before_any_is_written(write_dump, run, tmp_path):
    output = tmp_path / "out.parquet"
    result = run(
        "compute", write_dump(BASE), "-o", output, "--report", tmp_path / "missing" / "r.json"
    )
    assert result.exit_code == 1
    assert "does not exist" in result.stderr
    assert not output.exists()


def test_two_outputs_may_not_share_a_path(write_dump, run, tmp_path):
    same = tmp_path / "same.json"
    result = run("compute", write_dump(BASE), "-o", same, "--format", "parquet", "--report", same)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {same}: named for two outputs; give each its own path\n"
    result = run("compare", write_dump(BASE, "b.parquet"), "--json", same, "--markdown", same)
    assert result.exit_code == 1
    assert not same.exists()


@pytest.mark.parametrize(
    "args",
    [["--address", "auto"], ["--epsilon", "inf"], ["--engine", "ray", "--format", "npz"]],
)
def test_more_usage_errors_exit_2(args, write_dump, run, tmp_path):
    result = run("compute", write_dump(BASE), "-o", tmp_path / "out.parquet", *args)
    assert result.exit_code == 2
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("bound", ["nan", "inf", "-1", "-0.001"])
def test_fail_above_must_be_finite_and_not_negative(bound, write_dump, run):
    result = run("compare", write_dump(BASE), "--fail-above", bound, "-q")
    assert result.exit_code == 2
    assert "must be a finite number, 0 or more" in result.stderr


def test_rerun_keeps_the_original_reward_column(write_dump, run, tmp_path):
    # A scalar 'reward' column: on the output, advcli's own 'score' must not be taken for it.
    frame = pl.DataFrame(
        {
            "data_id": [0, 0, 0],
            "rollout_id": [0, 0, 1],
            "turn_index": [0, 1, 0],
            "reward": [1.0, 1.0, 0.0],
            "response_length": [1, 1, 1],
        }
    )
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    assert run("compute", write_dump(frame), "-o", first, "--traj-score", "sum").exit_code == 0
    result = run("compute", first, "-o", second, "--traj-score", "sum")
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(second)["score"].to_list() == [2.0, 2.0, 0.0]


def test_arrow_file_and_stream_outputs(write_dump, run, tmp_path):
    source = write_dump(BIAS_EXAMPLE.rows)
    assert run("compute", source, "-o", tmp_path / "out.arrow").exit_code == 0
    assert pl.read_ipc(tmp_path / "out.arrow").height == 5
    assert run("compute", source, "-o", tmp_path / "out.arrows").exit_code == 0
    assert pl.read_ipc_stream(tmp_path / "out.arrows").height == 5


def test_no_tokens_leaves_out_the_padded_advantages(write_dump, run, tmp_path):
    output = tmp_path / "out.npz"
    assert run("compute", write_dump(BIAS_EXAMPLE.rows), "-o", output, "--no-tokens").exit_code == 0
    with np.load(output) as arrays:
        assert sorted(arrays.files) == ["advantage", "response_mask"]


def test_directory_prefers_parquet_over_a_stray_json(run, tmp_path):
    folder = tmp_path / "dump"
    folder.mkdir()
    dump_frame(BIAS_EXAMPLE.rows).write_parquet(folder / "part-0.parquet")
    (folder / "config.json").write_text('{"lr": 1e-6}\n')
    assert run("compute", folder, "-o", tmp_path / "out.parquet").exit_code == 0


@pytest.mark.parametrize("level", ["turn", "trajectory"])
def test_summary_counts_trajectories_at_either_level(level, write_dump, tmp_path):
    """Two trajectories (one of four turns) and a third in another group, by hand: 3."""
    rows = [*BIAS_EXAMPLE.rows, (1, "success", 0, 1.0, 4)]
    summary = compute(
        [str(write_dump(rows))],
        tmp_path / "out.parquet",
        AdvantageConfig(level=Level(level)),
    )
    assert (summary.rows, summary.groups, summary.trajectories) == (6, 2, 3)

"""Issue 9: `--engine ray` on a real local Ray cluster (2 CPUs) gives the local engine's output,
row for row, on a multi-file dump."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import polars as pl
import pytest
from test_skyrl import skyrl_batch
from test_trainer_dumps import write_batch

from advcli.settings.config import StepGroups
from advcli.write.sample import sample_table

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    # Ray's own imports and workers raise deprecation and resource warnings we cannot fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> list[Path]:
    """A dump of three files; every group spans them (rows are spread round-robin)."""
    folder = tmp_path_factory.mktemp("dump")
    frame = pl.from_arrow(sample_table(groups=30, rollouts=6, seed=4)).with_columns(
        token_level_rewards=pl.col("token_level_rewards") * (0.3 + pl.col("data_id") * 0.07)
    )
    paths = []
    for index in range(3):
        path = folder / f"part-{index}.parquet"
        frame.gather_every(3, offset=index).write_parquet(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    "options",
    [
        ["--level", "trajectory"],
        ["--level", "turn"],
        ["--level", "turn", "--estimator", "grpo_passk"],
        ["--level", "trajectory", "--estimator", "reinforce_pp_baseline"],
        ["--level", "turn", "--scale", "batch"],
    ],
    ids=" ".join,
)
def test_ray_engine_equals_local_engine(options, cluster, parts, run, tmp_path):
    local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
    assert run("compute", *parts, "-o", local, "-q", *options).exit_code == 0
    result = run("compute", *parts, "-o", distributed, "-q", "--engine", "ray", *options)
    assert result.exit_code == 0, result.stderr
    files = sorted(distributed.glob("*.parquet"))
    assert files and not list(tmp_path.glob(".*advcli-partial"))
    assert pl.read_parquet(files).equals(pl.read_parquet(local))


def test_compare_on_ray_equals_local(cluster, parts, run, tmp_path):
    # Into files: what Ray itself prints (a warning under load) never mixes with the report.
    local, distributed = tmp_path / "local.json", tmp_path / "ray.json"
    assert run("compare", *parts, "--json", local, "-q", "--estimator", "rloo").exit_code == 0
    result = run(
        "compare", *parts, "--json", distributed, "-q", "--estimator", "rloo", "--engine", "ray"
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(distributed.read_text()) == json.loads(local.read_text())


def test_ray_engine_reports_bad_input_like_the_local_engine(cluster, parts, run, tmp_path):
    broken = tmp_path / "broken.parquet"
    pl.read_parquet(parts[0]).with_columns(
        pl.when(pl.int_range(pl.len()) == 4)
        .then(None)
        .otherwise(pl.col("data_id"))
        .alias("data_id")
    ).write_parquet(broken)
    result = run("compute", broken, "-o", tmp_path / "out", "--engine", "ray")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"Error: {broken} row 4: column 'data_id' (group id) is null"
    assert not (tmp_path / "out").exists()


def test_ray_engine_needs_parquet_and_a_folder(cluster, parts, run, tmp_path):
    result = run("compute", *parts, "-o", "-", "--engine", "ray")
    assert result.exit_code == 2  # a usage error
    assert "--engine ray writes a Parquet dataset folder" in " ".join(result.output.split())
    jsonl = tmp_path / "dump.jsonl"
    pl.read_parquet(parts[0]).write_ndjson(jsonl)
    result = run("compute", jsonl, "-o", tmp_path / "out", "--engine", "ray")
    assert result.exit_code == 1
    assert "--engine ray reads Parquet inputs" in result.stderr


def test_ray_engine_refuses_a_trainers_own_dump(cluster, run, tmp_path):
    """verl's v1 rollout lines as Parquet: its ids are made from 'uid' as the file is read."""
    dump = tmp_path / "7.parquet"
    pl.DataFrame(
        {
            "input": ["q"] * 4,
            "output": ["a"] * 4,
            "score": [1.0, 0.0, 1.0, 0.0],
            "step": [7] * 4,
            "uid": ["u_0_0", "u_1_0", "v_0_0", "v_1_0"],
        }
    ).write_parquet(dump)
    result = run("compare", dump, "--engine", "ray", "-q")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {dump}: --engine ray does not read verl's trainer.rollout_data_dir dump of the "
        "v1 trainer (each output keyed in 'uid'), whose columns are made as the file is read; "
        "use the local engine\n"
    )


def test_force_replaces_only_an_output_folder_advcli_wrote(cluster, parts, run, tmp_path):
    output = tmp_path / "ray-out"
    first = run("compute", *parts, "-o", output, "-q", "--engine", "ray")
    assert first.exit_code == 0, first.stderr
    again = run("compute", *parts, "-o", output, "-q", "--engine", "ray", "--force")
    assert again.exit_code == 0, again.stderr

    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own file")
    refused = run("compute", *parts, "-o", mine, "-q", "--engine", "ray", "--force")
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {mine}: the folder holds files advcli did not write (notes.txt); remove it "
        "yourself or choose another output\n"
    )
    assert (mine / "notes.txt").read_text() == "the user's own file"


def test_user_columns_named_like_the_lookup_keys_pass_through(cluster, parts, run, tmp_path):
    renamed = tmp_path / "named.parquet"
    frame = pl.read_parquet(parts[0]).with_columns(
        group=pl.lit("g"), trajectory=pl.lit("t"), turn=pl.lit(-1), row=pl.lit("r")
    )
    frame.write_parquet(renamed)
    local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
    assert run("compute", renamed, "-o", local, "-q", "--level", "turn").exit_code == 0
    result = run("compute", renamed, "-o", distributed, "-q", "--engine", "ray", "--level", "turn")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(sorted(distributed.glob("*.parquet")))
    assert written.equals(pl.read_parquet(local))
    assert written.select("group", "trajectory", "turn", "row").unique().rows() == [
        ("g", "t", -1, "r")
    ]


def test_reinforce_pp_rows_without_tokens_on_ray(cluster, run, tmp_path):
    # At trajectory level a row without response tokens is written as 0 and its trajectory's
    # other rows with the trajectory's whitened value: the lookup must not take the value of a
    # trajectory's first row for all of them.
    frame = pl.DataFrame(
        {
            "data_id": ["g", "g", "g", "g", "h", "h"],
            "rollout_id": ["a", "a", "b", "b", "c", "d"],
            "turn_index": [0, 1, 0, 1, 0, 0],
            "score": [1.0, 1.0, 0.0, 0.0, 0.5, 0.25],
            "response_length": [0, 3, 2, 0, 4, 1],
        }
    )
    source = tmp_path / "dump.parquet"
    frame.write_parquet(source)
    local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
    options = ["--estimator", "reinforce_pp_baseline", "--no-tokens"]
    assert run("compute", source, "-o", local, "-q", *options).exit_code == 0
    result = run("compute", source, "-o", distributed, "-q", "--engine", "ray", *options)
    assert result.exit_code == 0, result.stderr
    expected = pl.read_parquet(local)
    assert expected["advantage"][0] == 0.0 and expected["advantage"][1] != 0.0
    assert pl.read_parquet(sorted(distributed.glob("*.parquet"))).equals(expected)


@pytest.mark.parametrize("level", ["trajectory", "turn"])
def test_ray_engine_writes_skyrl_padding_rows_as_local(level, cluster, run, tmp_path):
    """SkyRL's padding rows are in no trajectory of the statistics: the broadcast lookup gives
    them advantage 0 and their own score, as the local engine writes them."""
    dump = write_batch(tmp_path / "dump.parquet", skyrl_batch("0.3.1")[0])
    local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
    assert run("compute", dump, "-o", local, "-q", "--level", level).exit_code == 0
    result = run("compute", dump, "-o", distributed, "-q", "--engine", "ray", "--level", level)
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(sorted(distributed.glob("*.parquet"))).equals(pl.read_parquet(local))


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize(
    ("source", "output", "problem"),
    [
        ("dump/", "dump/", "the output folder holds the input dump/part-00000.parquet"),
        # The input's own folder, through '..'.
        ("dump/part-00000.parquet", "./dump/../dump", "the output folder holds the input"),
        ("dump", "link", "the output folder holds the input"),  # a link to the input folder
        ("dump", "dump/ray-out", "the output is inside the input folder dump"),
    ],
)
def test_force_never_replaces_a_folder_holding_an_input(
    source, output, problem, cluster, parts, run, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dump").mkdir()
    pl.read_parquet(parts[0]).write_parquet(tmp_path / "dump" / "part-00000.parquet")
    (tmp_path / "link").symlink_to(tmp_path / "dump")
    before = _hashes(tmp_path)

    result = run("compute", source, "-o", output, "--engine", "ray", "--force")

    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {Path(output)}: {problem}")
    assert "Traceback" not in result.stderr
    assert _hashes(tmp_path) == before


def test_per_turn_rewards_on_ray_equal_the_local_engine(cluster, run, tmp_path):
    """Every --step-groups choice (anchor at both scopes) on a three-file dump whose groups
    span the files: stage 2 runs on the driver over the whole projection, so trajectories and
    step groups are never split. Without a turn column the blocks cannot place a row in its
    trajectory, and Ray is refused."""
    frame = pl.from_arrow(sample_table(groups=20, rollouts=5, seed=8)).with_columns(
        # Each turn's own reward (the sample's outcome scaled by the turn), and an anchor
        # state that the group's rollouts share at even turns.
        token_level_rewards=pl.col("token_level_rewards") * (pl.col("turn_index") - 1.5),
        anchor=pl.col("data_id") * 10 + pl.col("turn_index") % 2,
    )
    paths = []
    for index in range(3):
        paths.append(tmp_path / f"part-{index}.parquet")
        frame.gather_every(3, offset=index).write_parquet(paths[-1])
    choices = [["--step-groups", groups.value] for groups in StepGroups]
    choices.append(["--step-groups", "anchor", "--anchor-scope", "batch"])
    for options in choices:
        options = ["--reward-mode", "per-turn", "--gamma", "0.9", *options]
        local, distributed = tmp_path / "local.parquet", tmp_path / "ray-out"
        assert run("compute", *paths, "-o", local, "-q", "--force", *options).exit_code == 0
        result = run(
            "compute", *paths, "-o", distributed, "-q", "--force", "--engine", "ray", *options
        )
        assert result.exit_code == 0, (options, result.stderr)
        expected = pl.read_parquet(local)
        assert pl.read_parquet(sorted(distributed.glob("*.parquet"))).equals(expected), options
    unordered = tmp_path / "no-turns.parquet"
    frame.drop("turn_index").write_parquet(unordered)
    result = run(
        "compute", unordered, "-o", tmp_path / "out", "--engine", "ray",
        "--reward-mode", "per-turn",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {unordered}: --engine ray needs a turn column under --reward-mode per-turn"
    )


@pytest.mark.ray
def test_what_the_cluster_tells_the_driver_goes_to_stderr(cluster, capfd):
    """Ray's driver prints the cluster's messages (the raylet's warnings) from a thread of its
    own, at any moment, on standard output, which may carry advcli's report: once advcli's Ray
    engine has started they go to standard error. The message travels the real way, through
    the cluster's error channel to the driver's listening thread."""
    import ray

    from advcli.run.ray_engine import start

    start(None)
    message = f"a message from the cluster at {time.time()}"
    ray._private.utils.push_error_to_driver(ray._private.worker.global_worker, "test", message)
    deadline, stderr = time.monotonic() + 60, ""
    while message not in stderr:
        assert time.monotonic() < deadline, "the message did not arrive"
        time.sleep(0.05)
        out, err = capfd.readouterr()
        assert message not in out
        stderr += err

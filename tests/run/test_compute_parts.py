"""Issue 31: ``compute DIR --by file`` one file at a time. Each file is its own batch, so the
output is, row for row, each file computed alone, one after another (a file without rows adds
none); the summary's figures are the files' summed; a bad or changed file is one error naming
it, and nothing is written."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.ipc
import pyarrow.parquet
import pytest
from conftest import fifo_reader, wait_for_partial, write_read_otherwise

from advcli.run import parts
from advcli.write.sample import write_sample


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    """Three step files of sample rollouts, their ids repeating across files (a dataset index),
    and a file without rows between them."""
    folder = tmp_path / "run"
    folder.mkdir()
    for step in range(3):
        write_sample(folder / f"step_{step}.parquet", groups=5 + 2 * step, seed=step)
    pl.read_parquet(folder / "step_0.parquet").clear().write_parquet(folder / "step_1b.parquet")
    return folder


def read(path: Path) -> pl.DataFrame:
    if path.suffix == ".arrows":
        with path.open("rb") as handle:
            return pl.from_arrow(pyarrow.ipc.open_stream(handle).read_all())  # type: ignore[return-value]
    return pl.read_ipc(path) if path.suffix == ".arrow" else pl.read_parquet(path)


def each_file_alone(run, folder: Path, out: Path, *options: str) -> pl.DataFrame:
    """The files computed one by one, as runs of one batch each, their rows one after another."""
    frames = []
    for index, path in enumerate(sorted(folder.glob("*.parquet"))):
        if pl.read_parquet(path).is_empty():
            continue
        alone = out.with_name(f"alone-{index}{out.suffix}")
        result = run("compute", path, "-o", alone, *options, "-q")
        assert result.exit_code == 0, result.stderr
        frames.append(read(alone))
    return pl.concat(frames)


@pytest.mark.parametrize(
    "options",
    [
        (),
        ("--level", "turn"),
        ("--estimator", "rloo"),
        ("--scale", "batch"),
        ("--loss-weight", "seq-mean-token-mean"),
        ("--columns", "keys"),
        ("--columns", "none", "--no-tokens"),
        ("--estimator", "reinforce_pp_baseline"),
        ("--reward-mode", "per-turn", "--reward-col", "token_level_rewards"),
    ],
)
@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".arrows"])
def test_the_run_is_each_file_computed_alone(run, steps, tmp_path, options, suffix):
    out = tmp_path / f"run{suffix}"
    result = run("compute", steps, "-o", out, "--by", "file", *options, "-q")
    assert result.exit_code == 0, result.stderr
    expected = each_file_alone(run, steps, out, *options)
    assert read(out).equals(expected)


def test_a_parquet_row_group_holds_the_largest_files_rows_at_most(run, steps, tmp_path):
    """So that the write holds no more than a file's rows while the next file is read and
    computed: the row groups are of the largest file's row count, the last one the rest."""
    out = tmp_path / "run.parquet"
    assert run("compute", steps, "-o", out, "--by", "file", "-q").exit_code == 0
    counts = [pl.read_parquet(path).height for path in sorted(steps.glob("*.parquet"))]
    largest, total = max(counts), sum(counts)
    metadata = pyarrow.parquet.ParquetFile(out).metadata
    groups = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
    assert groups == [largest] * (total // largest) + ([total % largest] if total % largest else [])


def test_the_summary_sums_the_files(run, steps, tmp_path):
    result = run("compute", steps, "-o", tmp_path / "out.parquet", "--by", "file")
    assert result.exit_code == 0, result.stderr
    rows = groups = 0
    for path in sorted(steps.glob("*.parquet")):
        frame = pl.read_parquet(path)
        rows += frame.height
        groups += frame["data_id"].n_unique()
    lines = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stderr.splitlines()
        if line.count("│") == 3
    }
    assert lines["rows"] == f"{rows:,}" and lines["groups"] == f"{groups:,}"
    assert "each file is its own batch (--by file)" in result.stderr


def test_a_bad_row_in_a_later_file_is_named_and_nothing_is_written(run, steps, tmp_path):
    bad = steps / "step_2.parquet"
    frame = pl.read_parquet(bad)
    frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 7)
        .then(pl.lit(None))
        .otherwise(pl.col("data_id"))
        .alias("data_id")
    ).write_parquet(bad)
    out = tmp_path / "out.parquet"
    result = run("compute", steps, "-o", out, "--by", "file")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert f"{bad} row 7" in result.stderr, result.stderr
    assert not out.exists() and list(tmp_path.glob(".*advcli-partial*")) == []


def test_files_read_alike_or_the_run_is_refused(run, tmp_path):
    """A column named like a trajectory id that varies and repeats within a group says the rows
    are turns; one unique per row says nothing. Files read the two ways are refused: the run
    would be written under two readings. Named, the column is read alike in both."""
    first, second = write_read_otherwise(tmp_path / "run")
    folder = first.parent
    out = tmp_path / "out.parquet"
    result = run("compute", folder, "-o", out, "--by", "file", "--no-tokens")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {second}: read otherwise than {first} (trajectory: 'traj_id' here, none there);"
    ), result.stderr
    assert not out.exists()
    options = ("--by", "file", "--no-tokens", "--traj-col", "traj_id", "-q")
    assert run("compute", folder, "-o", out, *options).exit_code == 0
    # Group a of the first file: scores 1, 1, 0, each row its own trajectory; mean 2/3, sample
    # std sqrt(1/3), epsilon 1e-6.
    std = math.sqrt(1 / 3) + 1e-6
    expected = [(1 - 2 / 3) / std, (1 - 2 / 3) / std, (0 - 2 / 3) / std]
    got = pl.read_parquet(out)["advantage"].head(3).to_list()
    assert got == pytest.approx(expected, abs=1e-6)


def test_a_file_whose_values_say_nothing_is_read_as_the_run(run, tmp_path):
    """The first file reads 'traj_id' as the trajectory; in the second its ids are unique per
    row, which says nothing: the second is read with the column named, as the run is."""
    first, _ = write_read_otherwise(tmp_path / "run", repeating_first=True)
    out = tmp_path / "out.parquet"
    result = run("compute", first.parent, "-o", out, "--by", "file", "--no-tokens")
    assert result.exit_code == 0, result.stderr
    assert re.search(r"trajectory column\s+│ traj_id:", result.stderr), result.stderr
    # Group a of the first file: trajectories (1, 1) and (0): scores 1 and 0, mean 1/2, sample
    # std sqrt(1/2); of the second: each row its own, scores 1, 1, 0, as in the test above.
    one, three = 0.5 / (math.sqrt(0.5) + 1e-6), (1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    expected = [one, one, -one, three, three, -2 * three]
    got = pl.read_parquet(out)["advantage"].to_list()
    assert [got[0], got[1], got[2], got[6], got[7], got[8]] == pytest.approx(expected, abs=1e-6)


def test_a_run_of_empty_files_is_refused(run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "step_0.parquet"
    write_sample(path, groups=2, seed=0)
    pl.read_parquet(path).clear().write_parquet(path)
    out = tmp_path / "out.parquet"
    result = run("compute", folder, "-o", out, "--by", "file")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {path}: the input has no rows\n"
    assert not out.exists()


def test_to_a_named_pipe(run, steps, tmp_path):
    expected_path = tmp_path / "file.parquet"
    assert run("compute", steps, "-o", expected_path, "--by", "file", "-q").exit_code == 0
    expected = pl.read_parquet(expected_path)
    pipe = tmp_path / "pipe"
    with fifo_reader(pipe) as received:
        result = run("compute", steps, "-o", pipe, "--by", "file", "--format", "arrows", "-q")
    assert result.exit_code == 0, result.stderr
    streamed = pl.from_arrow(pyarrow.ipc.open_stream(b"".join(received)).read_all())
    assert streamed.equals(expected)
    assert os.path.exists(pipe)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "word"),
    [(signal.SIGINT, 130, "Interrupted"), (signal.SIGTERM, 143, "Terminated")],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_while_the_files_stream_leaves_nothing(tmp_path, signum, code, word):
    """The signal comes once the output is being written, while later files are still to be
    read (in the sink's own thread): the run ends with the signal's code, one line, and nothing
    behind it."""
    one = tmp_path / "step.parquet"
    write_sample(one, groups=400, seed=0)
    folder = tmp_path / "run"
    folder.mkdir()
    for step in range(300):
        os.link(one, folder / f"step_{step:03d}.parquet")
    out = tmp_path / "out" / "advantages.parquet"
    out.parent.mkdir()
    command = [sys.executable, "-m", "advcli", "compute", str(folder), "-o", str(out), "--by"]
    with subprocess.Popen(
        [*command, "file", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        wait_for_partial(process, out)
        time.sleep(0.5)
        assert process.poll() is None, "the run ended before the signal"
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert stderr == f"{word}; no partial output was left behind.\n"
    assert list(out.parent.iterdir()) == []


def _blocks_of_two(folder: Path, sizes: list[int]) -> None:
    """TRL-like step files (one row per completion, no group id), ``sizes`` rows each."""
    folder.mkdir()
    for number, size in enumerate(sizes):
        pl.DataFrame(
            {"rewards": [float(i % 2) for i in range(size)], "completion_mask": [[1, 1]] * size}
        ).write_parquet(folder / f"step-{number}.parquet")


@pytest.mark.parametrize(
    "outputs",
    [
        ("compute", "-o", "OUT.parquet"),
        ("compute", "-o", "OUT.npz"),
        ("compute", "-o", "OUT.parquet", "--report", "OUT.json"),
        ("compare",),
    ],
    ids=["streamed", "npz", "report", "compare"],
)
def test_groups_of_rows_never_cross_from_one_file_into_the_next(run, tmp_path, outputs):
    """Every path of --by file --group-size refuses a file that is not whole groups (the
    .npz and --report paths read the run at once and made a group of one file's last row and
    the next file's first)."""
    folder = tmp_path / "run"
    _blocks_of_two(folder, [3, 5])
    command, *rest = outputs
    rest = [str(tmp_path / part.replace("OUT", "out")) if "OUT" in part else part for part in rest]
    result = run(command, folder, "--by", "file", "--group-size", "2", *rest, "-q")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {folder}/step-0.parquet: 3 rows are not whole groups of --group-size 2\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


@pytest.mark.parametrize("command", ["compute", "compare"])
def test_groups_of_rows_never_cross_from_one_value_of_by_into_the_next(
    run, tmp_path, monkeypatch, command
):
    path = tmp_path / "steps.parquet"
    pl.DataFrame(
        {
            "rewards": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            "completion_mask": [[1, 1]] * 6,
            "step": [1, 1, 1, 2, 2, 2],
        }
    ).write_parquet(path)
    outputs = ["-o", tmp_path / "out.npz"] if command == "compute" else []
    result = run(command, path, "--by", "step", "--group-size", "2", *outputs, "-q")
    assert result.exit_code == 1
    # compute --by COLUMN reads the run at once, as compare reads a dump this small.
    assert result.stderr == (
        f"Error: {path} row 3: its group of --group-size 2 rows has rows of 'step' 1 and 2; "
        "each value is its own batch (--by step), so its rows must be whole groups\n"
    )
    assert not (tmp_path / "out.npz").exists()
    if command == "compare":
        # A value at a time, each value's rows are checked alone.
        monkeypatch.setattr(parts, "ONE_PASS_ROWS", 0)
        result = run(command, path, "--by", "step", "--group-size", "2", "-q")
        assert result.stderr == (
            f"Error: {path} (step=1): 3 rows are not whole groups of --group-size 2\n"
        )

"""Issue 31: ``compare --by file`` one file at a time. The whole run's report combined from the
files' own reports equals one pass over every row (the files' group ids made apart), each file's
entry is that file compared alone, ``--jobs 2`` and ``--engine ray`` give the same report, and an
error names its file."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import write_read_otherwise

from advcli.run import parts
from advcli.write.sample import write_sample

# What the parts' report names by the file, and the one pass has not (by_step) or names otherwise.
RENAMED = {"by_step", "settings"}


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    """Three step files of sample rollouts (ids repeating across files, as a dataset index
    does), each with its number in a ``step`` column, and a fourth without rows."""
    folder = tmp_path / "run"
    folder.mkdir()
    for step in range(3):
        path = folder / f"step_{step}.parquet"
        write_sample(path, groups=6 + 3 * step, seed=step)
        frame = pl.read_parquet(path).with_columns(pl.lit(step, dtype=pl.Int64).alias("step"))
        frame.write_parquet(path)
    frame.clear().write_parquet(folder / "step_3.parquet")
    return folder


def assert_same(one: Any, other: Any, where: str = "") -> None:
    """Equal, but for floats a few units in the last place apart (sums added in another order)."""
    if isinstance(one, dict):
        assert isinstance(other, dict) and list(one) == list(other), where
        for key in one:
            assert_same(one[key], other[key], f"{where}.{key}")
    elif isinstance(one, list):
        assert isinstance(other, list) and len(one) == len(other), where
        for index, (a, b) in enumerate(zip(one, other, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(one, float) and isinstance(other, float):
        assert math.isclose(one, other, rel_tol=1e-12, abs_tol=1e-15), (where, one, other)
    else:
        assert one == other, (where, one, other)


def compare_json(run, *args: object) -> dict[str, Any]:
    result = run("compare", *args, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def one_pass(run, files: list[Path], *options: object) -> dict[str, Any]:
    """``compare`` without ``--by`` over every file's rows at once, each file's group ids made
    its own (the file's number × 1000 + the id): one pass over every row whose groups are the
    parts' (file, group) pairs, named as the parts' report names them."""
    frame = pl.concat(
        pl.read_parquet(path).with_columns(pl.col("data_id") + 1000 * number)
        for number, path in enumerate(files)
    )
    path = files[0].parent.parent / "one_pass.parquet"
    frame.write_parquet(path)
    summary = compare_json(run, path, *options)
    for entry in (*summary["top_groups"], *summary["top_trajectories"]):
        entry["group"] = {"file": entry["group"] // 1000, "group": entry["group"] % 1000}
    return summary


@pytest.mark.parametrize("options", [(), ("--estimator", "rloo", "--traj-score", "mean")])
def test_combined_report_equals_one_pass_over_every_row(run, steps, options):
    files = sorted(steps.glob("step_[0-2].parquet"))
    parts = compare_json(run, *files, "--by", "file", *options)
    every_row = one_pass(run, files, *options)
    assert_same(
        {key: value for key, value in parts.items() if key not in RENAMED},
        {key: value for key, value in every_row.items() if key not in RENAMED},
    )
    for name in ("reading", "inputs"):
        every_row["settings"].pop(name), parts["settings"].pop(name)
    assert parts["settings"] == every_row["settings"]
    # The merged figures are there to be compared, not absent on both sides.
    assert parts["trajectories"]["corr_turns_diff"] is not None
    assert len(parts["top_groups"]) == len(parts["top_trajectories"]) == 10


def test_each_file_is_its_entry_compared_alone_and_keeps_its_place(run, steps):
    summary = compare_json(run, steps, "--by", "file")
    entries = summary["by_step"]["steps"]
    assert [entry["step"] for entry in entries] == [0, 1, 2, 3]
    assert [Path(name).name for name in summary["settings"]["inputs"]] == [
        f"step_{step}.parquet" for step in range(4)
    ]
    for step, entry in enumerate(entries[:3]):
        alone = compare_json(run, steps / f"step_{step}.parquet")
        assert entry["rows"] == alone["counts"]["rows"]
        assert entry["sign_flips"] == alone["trajectories"]["sign_flips"]
        assert entry["baseline_shift_mean"] == alone["groups"]["baseline_shift_mean"]
        assert entry["advantage_diff_mean"] == alone["trajectories"]["advantage_diff_mean"]
        assert entry["advantage_diff_max"] == alone["trajectories"]["advantage_diff_max"]
        token_mean = alone["loss_weights"]["token-mean"]["longest_vs_shortest"]
        assert entry["token_mean_longest_vs_shortest"] == token_mean
    assert entries[3]["rows"] == 0 and entries[3]["level"] is None
    assert summary["counts"]["rows"] == sum(entry["rows"] for entry in entries)


def test_two_jobs_give_the_same_report_in_file_order(run, steps):
    one = run("compare", steps, "--by", "file", "--json", "-", "-q")
    two = run("compare", steps, "--by", "file", "--json", "-", "-q", "--jobs", "2")
    assert two.exit_code == 0, two.stderr
    assert two.stdout == one.stdout


@pytest.mark.parametrize(
    ("broken", "named"),
    [({1}, 1), ({2}, 2), ({1, 2}, 1)],
    ids=["in the worker", "in this process", "the first of two"],
)
def test_an_error_names_the_first_failing_file_in_order(run, steps, broken, named):
    """With two jobs the worker takes the first two files and this process the third while it
    waits: wherever a part fails, the error is the first failing file's, as with one job."""
    for step in range(4, 6):
        (steps / f"step_{step}.parquet").write_bytes((steps / "step_2.parquet").read_bytes())
    for step in broken:
        path = steps / f"step_{step}.parquet"
        frame = pl.read_parquet(path)
        group = pl.when(pl.int_range(pl.len()) == step).then(None).otherwise(pl.col("data_id"))
        frame.with_columns(group.alias("data_id")).write_parquet(path)
    expected = [
        f"Error: {steps / f'step_{named}.parquet'} row {named}: column 'data_id' (group id) is null"
    ]
    for jobs in ("1", "2"):
        result = run("compare", steps, "--by", "file", "-q", "--jobs", jobs)
        assert result.exit_code == 1
        assert result.stderr.splitlines() == expected, jobs


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("by", ["file", "step"])
def test_a_part_read_otherwise_than_the_first_is_refused(run, tmp_path, monkeypatch, by, jobs):
    """The report says how the run was read: a part whose roles read otherwise (its values
    decide them) is refused by name, not merged under the first part's reading. Named, the
    column is read alike in both parts. (A small dump's values are read in one pass, as one
    reading: each value a part here.)"""
    monkeypatch.setattr(parts, "ONE_PASS_ROWS", 0)
    files = write_read_otherwise(tmp_path / "run")
    first, second = files
    if by == "file":
        inputs, here, there, every = [first.parent], second, first, "every file"
    else:
        inputs = [tmp_path / "run.parquet"]
        frames = [pl.read_parquet(path).with_columns(step=step) for step, path in enumerate(files)]
        pl.concat(frames).write_parquet(inputs[0])
        here, there = f"{inputs[0]} (step=1)", f"{inputs[0]} (step=0)"
        every = "each step value"
    result = run("compare", *inputs, "--by", by, "-q", "--jobs", jobs)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {here}: read otherwise than {there} (trajectory: 'traj_id' here, none there); "
        "name the columns (--group-col, --traj-col, --turn-col, --reward-col, --mask-col) so "
        f"that {every} is read alike\n"
    )
    summary = compare_json(run, *inputs, "--by", by, "--traj-col", "traj_id", "--jobs", jobs)
    assert summary["settings"]["reading"]["roles"]["trajectory"]["column"] == "traj_id"
    # 6 trajectories of one row in the first part, 4 of one or two rows in the second.
    assert [step["trajectories"] for step in summary["by_step"]["steps"]] == [6, 4]
    assert summary["counts"]["trajectories"] == 10


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("by", ["file", "step"])
def test_a_part_whose_values_say_nothing_is_read_as_the_run(run, tmp_path, by, jobs):
    """The first part reads 'traj_id' as the trajectory (its ids repeat within groups); in the
    second they are unique per row, which says nothing: nothing contradicts the run's reading,
    and the part is read with the column named (each row its trajectory either way)."""
    files = write_read_otherwise(tmp_path / "run", repeating_first=True)
    inputs = [files[0].parent]
    if by == "step":
        inputs = [tmp_path / "run.parquet"]
        frames = [pl.read_parquet(path).with_columns(step=step) for step, path in enumerate(files)]
        pl.concat(frames).write_parquet(inputs[0])
    summary = compare_json(run, *inputs, "--by", by, "--jobs", jobs)
    assert summary["settings"]["reading"]["roles"]["trajectory"]["column"] == "traj_id"
    first, second = summary["by_step"]["steps"]
    assert (first["trajectories"], second["trajectories"]) == (4, 6)
    # Per group of the first part: turn level (every row) mean 2/3 or 5/6, trajectory level
    # the mean of the two trajectories' scores; the lone row's |diff| is the largest,
    # 2/sqrt(3) - 1/sqrt(2) (the epsilon 1e-6 aside). The second part: one row a trajectory.
    assert first["advantage_diff_max"] == pytest.approx(
        2 / math.sqrt(3) - 1 / math.sqrt(2), abs=1e-5
    )
    assert second["advantage_diff_max"] == pytest.approx(0.0, abs=1e-6)
    assert summary["counts"]["trajectories"] == 10


@pytest.mark.parametrize(
    "options",
    [
        (),
        ("--by", "file", "--plot", "plot.png"),
        ("--by", "file", "--html", "page.html"),
        ("--by", "step", "--estimator", "gigpo"),
    ],
)
def test_jobs_where_no_parts_are_compared_apart_is_a_usage_error(run, steps, options):
    result = run("compare", steps, *options, "-q", "--jobs", "2")
    assert result.exit_code == 2
    assert (
        "--jobs runs the parts of --by (its files, or its column's values) in parallel; it does "
        "not go without --by, nor with --plot or --html (their figure needs every trajectory at "
        "once) or --estimator gigpo"
    ) in " ".join(result.stderr.split())


def test_the_html_pages_figure_under_by_has_every_panel(run, steps, tmp_path):
    """--html reads the run at once under --by, as --plot does: its figure's per-trajectory
    and per-group panels are drawn from every trajectory, never left empty."""
    page = tmp_path / "page.html"
    by_file = run("compare", steps, "--by", "file", "--html", page, "--json", "-", "-q")
    assert by_file.exit_code == 0, by_file.stderr
    summary = json.loads(by_file.stdout)
    whole = json.loads(run("compare", steps, "--by", "file", "--json", "-", "-q").stdout)
    assert summary["by_step"] == whole["by_step"]
    assert len(summary["top_trajectories"]) == len(whole["top_trajectories"]) == 10
    # The page's figure is --plot's, which every trajectory of the run draws.
    plot = tmp_path / "plot.png"
    assert run("compare", steps, "--by", "file", "--plot", plot, "-q").exit_code == 0
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', page.read_text())
    assert embedded is not None
    assert base64.b64decode(embedded[1]) == plot.read_bytes()


@pytest.mark.ray
# Ray's own imports and workers raise deprecation and resource warnings we cannot fix.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_one_ray_task_per_file_gives_the_local_report(cluster, run, steps, tmp_path):
    # Into files: what Ray itself prints (a warning under load) never mixes with the report.
    local, distributed = tmp_path / "local.json", tmp_path / "ray.json"
    assert run("compare", steps, "--by", "file", "--json", local, "-q").exit_code == 0
    result = run("compare", steps, "--by", "file", "--json", distributed, "-q", "--engine", "ray")
    assert result.exit_code == 0, result.stderr
    assert distributed.read_bytes() == local.read_bytes()


# Each process that imported Polars and Arrow records, as it exits, its pid and the sizes of
# their thread pools.
RECORD_THREADS = """
import atexit, os, sys

def record():
    if "polars" in sys.modules and "pyarrow" in sys.modules:
        import polars, pyarrow
        with open(os.environ["THREADS_RECORD"], "a") as record:
            record.write(f"{os.getpid()} {polars.thread_pool_size()} {pyarrow.cpu_count()}\\n")

atexit.register(record)
"""


@pytest.mark.process
@pytest.mark.parametrize(
    ("options", "each"),
    [
        ((), len(os.sched_getaffinity(0))),
        (("--jobs", "2"), max(1, len(os.sched_getaffinity(0)) // 2)),
        (("--jobs", "2", "--threads", "3"), 3),
    ],
    ids=["one job", "two jobs", "two jobs, --threads"],
)
def test_the_jobs_share_the_cores(steps, tmp_path, options, each):
    """With --jobs N each process (this one and its workers) runs the cores shared among the
    N in its Polars and Arrow pools, so that they do not wait for each other's threads;
    --threads sets it for each."""
    (tmp_path / "sitecustomize.py").write_text(RECORD_THREADS)
    record = tmp_path / "threads"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "THREADS_RECORD": str(record)}
    env.pop("POLARS_MAX_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    command = [sys.executable, "-m", "advcli", "compare", steps, "--by", "file", *options, "-q"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    processes = [line.split() for line in record.read_text().splitlines()]
    assert len(processes) == (2 if "--jobs" in options else 1)
    assert [(polars, arrow) for _, polars, arrow in processes] == [(str(each), str(each))] * len(
        processes
    )


@pytest.mark.process
def test_ctrl_c_ends_the_workers(steps):
    """Ctrl-C while this process and its worker compare: exit 130, one line, and no worker left
    running."""
    # Enough files that the run is still going half a second after the worker starts, however
    # fast a part is compared.
    for step in range(4, 400):
        os.link(steps / "step_2.parquet", steps / f"step_{step}.parquet")
    command = [sys.executable, "-m", "advcli", "compare", str(steps), "--by", "file", "--jobs", "2"]
    process = subprocess.Popen(
        [*command, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while not workers:
        assert process.poll() is None and time.monotonic() < deadline, process.stderr
        workers = spawned_workers(process.pid)
        time.sleep(0.01)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.splitlines() == ["Interrupted; no partial output was left behind."], stderr
    assert not [worker for worker in workers if Path(f"/proc/{worker}").exists()]


def spawned_workers(pid: int) -> list[int]:
    """The worker processes ``pid`` has spawned (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(child)
        for child in children
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]

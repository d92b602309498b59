"""Issue 6: the bad-input corpus through every command, kill safety with real signals, and
byte-identical, order-independent outputs."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from bad_inputs import CASES, BadInput
from conftest import partials, wait_for_partial

from advcli.write.sample import sample_table

EXTENSION = {"compute": ".parquet", "compare": ".json"}


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: a file's sha256, a link's target, a directory as such."""
    return {
        str(path.relative_to(folder)): (
            f"-> {os.readlink(path)}"
            if path.is_symlink()
            else hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file()
            else "directory"
        )
        for path in sorted(folder.rglob("*"))
    }


def command_line(command: str, inputs: list[str], output: Path, options) -> list[str]:
    target = {"compute": ["-o", str(output)], "compare": ["--json", str(output)], "inspect": []}
    return [command, *inputs, *target[command], *options]


RUNS = [(case, command) for case in CASES for command in case.commands]


@pytest.mark.parametrize(
    ("case", "command"), RUNS, ids=[f"{case.name}-{command}" for case, command in RUNS]
)
def test_bad_input(case: BadInput, command, run, tmp_path):
    inputs = case.build(tmp_path)
    output = Path(case.output) if Path(case.output).is_absolute() else tmp_path / case.output
    if not output.suffix:
        output = output.with_suffix(EXTENSION.get(command, ".json"))
    if case.existing_output:
        output.write_bytes(b"a previous result")
    if case.prepare_output is not None:
        case.prepare_output(output)
    before = snapshot(tmp_path)

    result = run(*command_line(command, inputs, output, case.options))

    assert result.exit_code == case.exit_code, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    if case.exit_code == 2:  # a usage error: the command's usage, then its one Error line
        assert [line for line in lines if line.startswith("Error: ")] == lines[-1:], lines
        lines = lines[-1:]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for text in case.expected:
        assert text in lines[0], lines[0]
    for text in ("Traceback", "panicked", "stack backtrace"):
        assert text not in result.stdout + result.stderr
    # Nothing written, nothing changed: the folder holds exactly what it held before.
    assert snapshot(tmp_path) == before
    if not case.existing_output and case.prepare_output is None and str(output) not in inputs:
        assert not os.path.lexists(output)


def test_corpus_has_every_listed_kind():
    assert len(CASES) >= 60
    assert len({case.name for case in CASES}) == len(CASES)


# ---------------------------------------------------------------------------------------------
# Kill safety: real signals to a real advcli process in the middle of writing.


@pytest.fixture(scope="module")
def large_dump(tmp_path_factory) -> Path:
    """A dump that takes a few seconds to compute, so that a signal lands mid-run."""
    path = tmp_path_factory.mktemp("large") / "large.parquet"
    pl.from_arrow(sample_table(groups=12_000, rollouts=8, tokens=128, seed=1)).write_parquet(path)
    return path


def start_compute(source: Path, output: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "advcli", "compute", str(source), "-o", str(output), "-q", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.process
@pytest.mark.slow
def test_sigkill_mid_write_leaves_nothing_and_keeps_the_old_output(large_dump, tmp_path):
    output = tmp_path / "advantages.parquet"
    output.write_bytes(b"the previous, complete result")
    process = start_compute(large_dump, output, "--force")
    wait_for_partial(process, output)
    process.send_signal(signal.SIGKILL)
    process.communicate()

    assert process.returncode == -signal.SIGKILL
    assert output.read_bytes() == b"the previous, complete result"
    leftovers = partials(output)
    assert len(leftovers) == 1 and str(process.pid) in leftovers[0].name

    # The next run that writes the same output removes the dead run's partial file.
    small = tmp_path / "small.parquet"
    pl.from_arrow(sample_table(groups=2, rollouts=2)).write_parquet(small)
    finished = start_compute(small, output, "--force")
    _, stderr = finished.communicate()
    assert finished.returncode == 0, stderr
    assert partials(output) == []
    assert pl.read_parquet(output).height == pl.read_parquet(small).height


# ---------------------------------------------------------------------------------------------
# Determinism


def compute_in_subprocess(inputs: list[Path], output: Path, threads: int, *options: str) -> None:
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "advcli",
            "compute",
            *map(str, inputs),
            "-o",
            str(output),
            "-q",
            *options,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp_baseline"])
def test_byte_identical_whatever_the_thread_count(estimator, tmp_path):
    source = tmp_path / "dump.parquet"
    pl.from_arrow(sample_table(groups=3000, rollouts=8, seed=5)).write_parquet(source)
    digests = set()
    for index, threads in enumerate([1, 2, 4, 2]):
        output = tmp_path / f"out-{index}.parquet"
        compute_in_subprocess([source], output, threads, "--estimator", estimator)
        digests.add(hashlib.sha256(output.read_bytes()).hexdigest())
    assert len(digests) == 1


@pytest.mark.parametrize("level", ["turn", "trajectory"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "opo", "reinforce_pp_baseline"])
def test_advantages_do_not_depend_on_file_order(level, estimator, run, tmp_path):
    # Groups span the three files; scores that are not round numbers, so that a change in
    # summation order would show in the last bits.
    frame = pl.from_arrow(sample_table(groups=40, rollouts=6, seed=2)).with_columns(
        token_level_rewards=pl.col("token_level_rewards") * (0.1 + pl.col("data_id") * 0.0137)
    )
    parts = [tmp_path / f"part-{i}.parquet" for i in range(3)]
    for index, part in enumerate(parts):
        frame.gather_every(3, offset=index).write_parquet(part)

    outputs = []
    for order in ([0, 1, 2], [2, 0, 1]):
        output = tmp_path / f"out-{''.join(map(str, order))}.parquet"
        result = run(
            "compute",
            *[parts[i] for i in order],
            "-o",
            output,
            "--level",
            level,
            "--estimator",
            estimator,
            "--traj-score",
            "mean",
        )
        assert result.exit_code == 0, result.stderr
        outputs.append(pl.read_parquet(output))

    first, second = outputs
    # Row order follows the order the files were given...
    assert first["data_id"].to_list() != second["data_id"].to_list()
    # ...and every row's advantage is bit-for-bit the same.
    key = ["data_id", "rollout_id", "turn_index"]
    assert (
        first.select(*key, "advantage").sort(key).equals(second.select(*key, "advantage").sort(key))
    )


@pytest.mark.process
@pytest.mark.slow
def test_compare_report_identical_whatever_the_thread_count(tmp_path):
    # Enough trajectories (64k) that Polars splits a group-by's float sums between threads;
    # scores that are not round numbers, so that any change in summation order shows.
    source = tmp_path / "dump.parquet"
    pl.from_arrow(sample_table(groups=8000, rollouts=8, seed=5)).with_columns(
        token_level_rewards=pl.col("token_level_rewards") * (0.3 + pl.col("data_id") * 0.0137)
    ).write_parquet(source)
    reports = set()
    for index, threads in enumerate([1, 2, 4, 2, 2]):
        report = tmp_path / f"report-{index}.json"
        result = subprocess.run(
            [sys.executable, "-m", "advcli", "compare", str(source), "--json", str(report)],
            env={**os.environ, "POLARS_MAX_THREADS": str(threads)},
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        reports.add(report.read_text())
    assert len(reports) == 1

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

# pytest-xdist's workers inherit a terminal size (COLUMNS=80, LINES=24) that a run in one
# process does not have; rich would fix its stderr console's width from it when the command line
# is imported, and every test would read tables wrapped at 80 columns whatever width it asks for.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

from advcli.cli.app import app
from advcli.run.commands import compute
from advcli.settings.config import ColumnNames
from advcli.settings.resolve import resolve_config
from advcli.write.atomic import MARKER

# The repository's root: the tests are in folders that mirror the package's, below tests/.
ROOT = Path(__file__).resolve().parent.parent


def dump_frame(rows: Sequence[tuple[object, object, int, float, int]]) -> pl.DataFrame:
    """A rollout dump from (group, trajectory, turn, score, tokens) tuples: the score sits on the
    last token of ``token_level_rewards`` and the mask is all ones."""
    return pl.DataFrame(
        {
            "data_id": [r[0] for r in rows],
            "rollout_id": [r[1] for r in rows],
            "turn_index": [r[2] for r in rows],
            "token_level_rewards": [[0.0] * (r[4] - 1) + [r[3]] for r in rows],
            "response_mask": [[1] * r[4] for r in rows],
        },
        schema_overrides={"response_mask": pl.List(pl.Int8)},
    )


# The tiers of the suite, each a marker: a test is counted in the first tier it is marked with,
# and a test with none runs in this process only ("in-process": the library and the command line
# through CliRunner).
TIERS = ("ray", "browser", "peers", "docs", "process")
IN_PROCESS = "in-process"


def tier_of(keywords: Iterable[str]) -> str:
    return next((tier for tier in TIERS if tier in keywords), IN_PROCESS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``ray`` run last (in their usual order), those that join the one in-process
    cluster after those that start their own; under pytest-xdist each worker takes its share of
    them last, after the rest: a cluster's many processes take both cores while they start."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("ray") is not None,
            "cluster" in getattr(item, "fixturenames", ()),
        )
    )


@pytest.fixture(autouse=True)
def _a_test_that_starts_a_process_says_so(request: pytest.FixtureRequest):
    """A test in the in-process tier that starts a process (advcli, Python, a browser) fails:
    its tier marker is what lets the tiers be timed and run apart, so it must not go stale."""
    if tier_of(request.node.keywords) != IN_PROCESS:
        yield
        return
    started: list[object] = []
    original = subprocess.Popen.__init__

    def spy(self: subprocess.Popen, args: object, *rest: object, **options: object) -> None:
        started.append(args)
        original(self, args, *rest, **options)  # type: ignore[arg-type]

    subprocess.Popen.__init__ = spy  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]
    assert not started, f"this test starts a process ({started[0]!r}): mark it process"


class TierTimes:
    """Each tier's tests, their summed time (setup, call and teardown) and the wall span from the
    first of them starting to the last ending: the tiers run side by side over the workers, so a
    tier's span is how long it held the run, and its summed time what it cost."""

    def __init__(self) -> None:
        self.tests: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.start: dict[str, float] = {}
        self.stop: dict[str, float] = {}

    def add(self, report: pytest.TestReport) -> None:
        tier = tier_of(report.keywords)
        self.seconds[tier] += report.duration
        self.tests[tier] += report.when == "call"
        self.start[tier] = min(self.start.get(tier, report.start), report.start)
        self.stop[tier] = max(self.stop.get(tier, report.stop), report.stop)

    def lines(self) -> list[str]:
        tiers = [tier for tier in (*TIERS, IN_PROCESS) if tier in self.seconds]
        rows = [f"{'tier':<12}{'tests':>7}{'span':>10}{'test time':>12}"]
        for tier in tiers:
            span = self.stop[tier] - self.start[tier]
            rows.append(f"{tier:<12}{self.tests[tier]:>7}{span:>9.0f}s{self.seconds[tier]:>11.0f}s")
        return rows


TIER_TIMES = TierTimes()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TIER_TIMES.add(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workerinput") or not TIER_TIMES.tests:
        return
    terminalreporter.write_sep("=", "time by tier")
    for line in TIER_TIMES.lines():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def cluster():
    """A local Ray cluster (2 CPUs) in this process, which ``--engine ray`` joins: one for every
    test that needs one, since starting one, and its first job, are slow.

    What the cluster tells this driver (the raylet's warnings, as its workers add up over the
    session) goes to the process's own streams, not to the ones a test captures at that moment:
    it is the session's cluster speaking, not the command under test."""
    ray = pytest.importorskip("ray")
    worker = ray._private.worker

    def to_process_streams(data: dict, ignore_prefix: bool = False) -> None:
        stream = sys.__stderr__ if data["is_err"] else sys.__stdout__
        worker.print_worker_logs(data, stream, ignore_prefix)

    worker.print_to_stdstream = to_process_streams
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def write_dump(tmp_path: Path):
    """Write rows (or a frame) to a Parquet file under tmp_path and return its path."""

    def write(rows, name: str = "rollouts.parquet") -> Path:
        frame = rows if isinstance(rows, pl.DataFrame) else dump_frame(rows)
        path = tmp_path / name
        frame.write_parquet(path)
        return path

    return write


@pytest.fixture
def computed(write_dump, tmp_path):
    """``advcli.compute``, the library below the command line, on rows or a frame, with the
    settings given as keywords (resolved as the command line resolves its options): the output
    rows. The numeric cases run here; the options' paths are the command line's own tests."""
    outputs = itertools.count()

    def compute_rows(
        rows, names: ColumnNames = ColumnNames(), tokens: bool = True, **settings
    ) -> pl.DataFrame:
        output = tmp_path / f"computed-{next(outputs)}.parquet"
        compute([write_dump(rows)], output, resolve_config(settings), names=names, tokens=tokens)
        return pl.read_parquet(output)

    return compute_rows


@pytest.fixture
def run():
    """Run the advcli CLI in-process; stdout and stderr are kept apart."""
    # A wide terminal, so that rich does not wrap the summary tables the tests read.
    runner = CliRunner(env={"COLUMNS": "200"})

    def invoke(*args: object):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


@contextlib.contextmanager
def fifo_reader(path: Path) -> Iterator[list[bytes]]:
    """A named pipe made at ``path`` and read to its end by a thread: what it read is in the
    list once the block ends. The reader never outlives the block, even when nothing opened the
    pipe to write (a reader left waiting in open() would keep the test session from exiting): a
    write end opened and closed here ends its read."""
    os.mkfifo(path)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(path.read_bytes()), daemon=True)
    reader.start()
    try:
        yield received
    finally:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as error:
            # No reader has the pipe open: it has read to the end already.
            if error.errno != errno.ENXIO:
                raise
        reader.join(timeout=60)
        assert not reader.is_alive(), f"the reader of {path} did not end"


def partials(output: Path) -> list[Path]:
    """The partial files (and folders) advcli is writing, or left, for ``output``."""
    return sorted(output.parent.glob(f".{output.name}.*advcli-partial*"))


def wait_for_partial(process: subprocess.Popen, output: Path, timeout: float = 120) -> None:
    """Wait until ``process`` has started writing ``output``: its partial folder exists and is
    marked as advcli's. (Between the folder's creation and its mark, a kill leaves an unmarked
    folder that, by design, no later run removes: not the moment these tests aim at.)"""
    deadline = time.monotonic() + timeout
    while not any(_marked(path) for path in partials(output)):
        assert process.poll() is None, "advcli finished before it started writing"
        assert time.monotonic() < deadline, "no partial file appeared"
        time.sleep(0.005)


def _marked(path: Path) -> bool:
    try:
        os.getxattr(path, MARKER)
    except OSError:
        return False
    return True


def write_read_otherwise(folder: Path, *, repeating_first: bool = False) -> tuple[Path, Path]:
    """Two step files of one schema, read two ways: a column named like a trajectory id that
    repeats within a group says the rows are turns (the second file, or with
    ``repeating_first`` the first); unique per row, it says nothing (the other). Scores of
    group a: 1, 1, 0; of group b: 1, 1, 0.5; the repeating ids pair the first two rows of each
    group."""
    folder.mkdir()
    rewards = [[1.0], [1.0], [0.0], [1.0], [1.0], [0.5]]
    common = {"uid": ["a", "a", "a", "b", "b", "b"], "token_level_rewards": rewards}
    first, second = folder / "step_0.parquet", folder / "step_1.parquet"
    unique, repeating = (second, first) if repeating_first else (first, second)
    pl.DataFrame({**common, "traj_id": list(range(6))}).write_parquet(unique)
    pl.DataFrame({**common, "traj_id": [0, 0, 1, 2, 2, 3]}).write_parquet(repeating)
    return first, second


def lines_within(path: Path, count: int, timeout: float = 120) -> list[str]:
    """The first ``count`` lines of ``path``, once it has them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines[:count]
        time.sleep(0.1)
    raise AssertionError(f"{path} did not get {count} lines in {timeout} s")


def error_line(result) -> str:
    """The one ``Error:`` line of an in-process run that failed (exit 1)."""
    assert result.exit_code == 1, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def watched(folder: Path, count: int, write_next, *options: str) -> list[str]:
    """``advcli watch FOLDER`` (with ``options``) in its own process until it has reported
    ``count`` steps (its JSON lines), ``write_next()`` called once the first is in; its standard
    error must be empty."""
    jsonl = folder.parent / f"{folder.name}-steps.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    watch = [sys.executable, "-m", "advcli", "watch", folder, *options, "--settle", "0"]
    watch += ["--jsonl", jsonl]
    process = subprocess.Popen([*map(str, watch), "-q"], env=env, stderr=subprocess.PIPE)
    try:
        lines_within(jsonl, 1)
        write_next()
        lines = lines_within(jsonl, count)
    finally:
        process.kill()
        process.wait()
        assert process.stderr is not None
        stderr = process.stderr.read().decode()
        process.stderr.close()
    assert stderr == ""
    return lines

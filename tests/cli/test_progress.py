"""The progress bar: on a terminal, each stage and the rows its scans read of those they are to
read, with the time left; nothing in a pipe or with --quiet. The rows come from advcli's own
Parquet source as it decodes each batch (advcli._runtime.progress)."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from rich.console import Console

from advcli._runtime import progress
from advcli.cli import progress_bar
from advcli.read.scan import ScannedFile, closing_sources, scan_parquet

SAMPLE = ROOT / "sample_data" / "rollouts.parquet"
SAMPLE_ROWS = pq.ParquetFile(SAMPLE).metadata.num_rows


@pytest.fixture
def terminal(monkeypatch) -> io.StringIO:
    """stderr as a terminal the bar draws on at once (no delay), its text kept."""
    screen = io.StringIO()
    monkeypatch.setattr(
        progress_bar, "stderr", Console(file=screen, force_terminal=True, width=120)
    )
    monkeypatch.setattr(progress_bar, "PROGRESS_DELAY_SECONDS", 0)
    return screen


def drawn(screen: io.StringIO) -> tuple[set[str], list[str]]:
    """The stages the bar named and the row counts it showed."""
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue())
    stages = {stage.strip() for stage in re.findall(r"([a-z ]+) ━", text)}
    return stages, re.findall(r"[\d,]+ / [\d,]+ rows", text)


@pytest.mark.parametrize(
    ("command", "stages"),
    [
        (("compute", "-o", "OUT"), {"reading keys", "computing statistics", "writing output"}),
        (("compare",), {"reading keys", "comparing both levels"}),
        (("inspect",), {"reading keys", "inspecting"}),
    ],
    ids=["compute", "compare", "inspect"],
)
def test_the_bar_names_each_stage_and_counts_its_rows(run, terminal, tmp_path, command, stages):
    name, *options = command
    options = [str(tmp_path / "out.parquet") if part == "OUT" else part for part in options]
    result = run(name, SAMPLE, *options)
    assert result.exit_code == 0, result.stderr
    named, counts = drawn(terminal)
    assert stages <= named
    # The key columns' pass (and compute's write) read every row of the sample.
    assert f"{SAMPLE_ROWS:,} / {SAMPLE_ROWS:,} rows" in counts


def test_quiet_draws_no_bar(run, terminal, tmp_path):
    result = run("compute", SAMPLE, "-o", tmp_path / "out.parquet", "-q")
    assert result.exit_code == 0, result.stderr
    assert terminal.getvalue() == ""


@pytest.mark.process
def test_a_pipe_gets_no_bar(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "advcli", "compute", str(SAMPLE), "-o", str(tmp_path / "o.parquet")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "━" not in result.stderr and " rows" not in result.stderr.split("advcli compute")[0]


@pytest.mark.parametrize(
    ("start", "stop", "limit", "announced"),
    [(0, None, None, 1_000), (100, 350, None, 250), (0, None, 7, 7), (600, None, 30, 30)],
    ids=["whole", "window", "limit", "window and limit"],
)
def test_a_scan_says_the_rows_it_reads(tmp_path, start, stop, limit, announced):
    """A scan announces the rows of its window (at most its limit) and, batch by batch and at its
    end, accounts for every one of them: the bar's count ends at its total."""
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"n": range(1_000)}), path, row_group_size=64)
    said: list[tuple[str, int]] = []

    class Listener:
        def to_read(self, rows: int) -> None:
            said.append(("to read", rows))

        def read(self, rows: int) -> None:
            said.append(("read", rows))

    frame = scan_parquet(
        [ScannedFile(str(path), "rows", 1_000, start, stop)], pl.Schema({"n": pl.Int64})
    )
    with progress.listening(Listener()), closing_sources():
        rows = (frame.head(limit) if limit is not None else frame).collect()
    assert rows["n"].to_list()[:1] == [start]
    assert said[0] == ("to read", announced)
    assert [kind for kind, _ in said[1:]] == ["read"] * (len(said) - 1)
    assert sum(rows for _, rows in said[1:]) == announced


def test_without_a_listener_nothing_is_kept(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"n": range(10)}), path)
    with closing_sources():
        frame = scan_parquet([ScannedFile(str(path), "rows", 10)], pl.Schema({"n": pl.Int64}))
        assert frame.collect().height == 10
    assert progress._listener is None


@pytest.mark.process
@pytest.mark.parametrize("quiet", [False, True], ids=["shown", "quiet"])
def test_watch_says_what_it_watches_before_the_first_step(tmp_path, quiet):
    """On a terminal's stderr a watch of a folder with no step yet says it waits; a pipe or
    --quiet gets nothing."""
    folder = tmp_path / "run"
    folder.mkdir()
    controller, terminal_end = pty.openpty()
    command = [sys.executable, "-m", "advcli", "watch", str(folder), *(["-q"] if quiet else [])]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal_end
    )
    os.close(terminal_end)
    shown = b""
    deadline = time.monotonic() + 30
    while b"Ctrl-C ends" not in shown and time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.5)
        if ready:
            shown += os.read(controller, 4096)
        elif quiet and time.monotonic() > deadline - 25:
            break
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    os.close(controller)
    said = " ".join(shown.decode(errors="replace").split())
    if quiet:
        assert said == ""
    else:
        assert f"watching {folder} for step files, each reported as it is written" in said

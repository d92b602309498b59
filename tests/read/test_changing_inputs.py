"""Issue 26: the inputs are what they were when the run began.

An input renamed over, rewritten in place, appended to or removed while a command reads it ends
the run with one ``Error:`` line naming it, exit 1, and nothing derived from it published: no
output, no report, nothing on stdout, the folder as it was but for the input the test changed.

The change lands at a chosen moment of a real run, in-process: at the first read of stage 1 (the
first scan of the dataset), between stage 1 and stage 3 (the progress callback the CLI gives
``compute``), or as stage 3 starts its write (the first Polars sink). Each wrapper runs the change
and then the real call; nothing advcli does is replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import dump_frame, fifo_reader

from advcli.cli import compute as cli_compute
from advcli.cli.app import app
from advcli.read.dataset import Dataset

# 0.8125 is the score of one trajectory; rewritten, 0.1875 (as many bytes, in JSON and float64).
SCORE, OTHER_SCORE = 0.8125, 0.1875
ROWS = [
    (0, "a", 0, SCORE, 2),
    (0, "a", 1, SCORE, 3),
    (0, "b", 0, 0.0, 2),
    (1, "a", 0, 0.5, 2),
    (1, "b", 0, 1.0, 1),
]
FORMATS = ["parquet", "jsonl"]
CHANGED = re.compile(
    r"Error: (?P<input>.+) changed while advcli was reading it \((?P<change>.+)\); "
    r"nothing was written\n"
)
CLOCK = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{9}"


def write_input(path: Path) -> Path:
    """The dump at ``path``: Parquet stored plain (no dictionary, compression or statistics), so
    each reward is its 8 bytes in the file; or JSON lines."""
    frame = dump_frame(ROWS)
    if path.suffix == ".parquet":
        pq.write_table(
            frame.to_arrow(),
            path,
            use_dictionary=False,
            compression="none",
            write_statistics=False,
        )
    else:
        frame.write_ndjson(path)
    return path


def other_bytes(path: Path) -> bytes:
    """The file with its score 0.8125 made 0.1875: as many bytes, other content."""
    data = path.read_bytes()
    if path.suffix == ".parquet":
        old, new = struct.pack("<d", SCORE), struct.pack("<d", OTHER_SCORE)
    else:
        old, new = str(SCORE).encode(), str(OTHER_SCORE).encode()
    assert data.count(old) == 2  # the score on the last token of both of its rows
    return data.replace(old, new)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) by its sha256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


# ---------------------------------------------------------------------------------------------
# The changes. Each returns the words the error gives for it (a regular expression).


def rewrite(path: Path, spare: Path) -> str:
    """Rewritten in place, same size, other content."""
    before = os.stat(path)
    with path.open("r+b") as handle:
        handle.write(other_bytes(path))
    # The write a clock tick later, as any later write is: the filesystem's clock may not have
    # moved on since the file was made (its granularity), the one change identity cannot see.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert os.stat(path).st_size == before.st_size
    assert os.stat(path).st_ino == before.st_ino
    return rf"mtime {CLOCK}, now {CLOCK}"


def rename_over(path: Path, spare: Path) -> str:
    """Another file renamed over it, of the same size and modification time: only the inode
    tells them apart."""
    before = os.stat(path)
    replacement = spare / path.name
    replacement.write_bytes(other_bytes(path))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, path)
    return f"inode {before.st_ino}, now {os.stat(path).st_ino}"


def append(path: Path, spare: Path) -> str:
    """A row more: a line appended to JSON lines; Parquet rewritten in place with the row."""
    before = os.stat(path)
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        pq.write_table(pl.concat([pl.from_arrow(table), dump_frame(ROWS[:1])]).to_arrow(), path)
    else:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(path.read_text(encoding="utf-8").splitlines()[0] + "\n")
    assert os.stat(path).st_ino == before.st_ino
    size = f"size {before.st_size:,} bytes, now {os.stat(path).st_size:,}"
    return rf"{size}; mtime {CLOCK}, now {CLOCK}"


def remove(path: Path, spare: Path) -> str:
    path.unlink()
    return "it was removed"


CHANGES = [rewrite, rename_over, append, remove]


# ---------------------------------------------------------------------------------------------
# The moments


def once(change: Callable[[], None]) -> Callable[[], None]:
    done = []

    def run_once() -> None:
        if not done:
            done.append(True)
            change()

    return run_once


def in_stage_1(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """The change, then stage 1's first read of the rows (the first scan of the dataset)."""
    scan, change = Dataset.scan, once(change)

    def changed_then_scanned(self: Dataset) -> pl.LazyFrame:
        change()
        return scan(self)

    monkeypatch.setattr(Dataset, "scan", changed_then_scanned)


def between_stages(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """The change when ``compute`` tells the CLI's progress display that stage 3 begins."""

    @contextlib.contextmanager
    def progress(enabled: bool, first_stage: str) -> Iterator[Callable[[str], None]]:
        yield lambda stage: change() if stage == "writing output" else None

    monkeypatch.setattr(cli_compute, "progress_bar", progress)


def in_stage_3(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """The change, then stage 3's write of the Parquet output (after the check that begins it)."""
    sink, change = pl.LazyFrame.sink_parquet, once(change)

    def changed_then_sunk(self: pl.LazyFrame, *args: object, **kwargs: object) -> object:
        change()
        return sink(self, *args, **kwargs)

    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", changed_then_sunk)


MOMENTS = [in_stage_1, between_stages, in_stage_3]


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """The folder of the inputs and outputs, and one beside it for a file to rename over."""
    data, spare = tmp_path / "data", tmp_path / "spare"
    data.mkdir()
    spare.mkdir()
    return data, spare


def changed_during(monkeypatch, moment, change, source: Path, spare: Path) -> list[str]:
    """Arrange ``change`` of ``source`` at ``moment``; the words it gives are filled in when it
    has happened."""
    words: list[str] = []
    moment(monkeypatch, lambda: words.append(change(source, spare)))
    return words


def assert_refused(result, source: Path, words: list[str], before: dict[str, str]) -> None:
    """Exit 1, the one line naming ``source`` and its change, nothing on stdout, and the folder
    as it was but for ``source``."""
    assert result.exit_code == 1, result.stderr
    found = CHANGED.fullmatch(result.stderr)
    assert found, result.stderr
    assert found["input"] == str(source)
    assert len(words) == 1 and re.fullmatch(words[0], found["change"]), found["change"]
    assert result.stdout == ""
    after = snapshot(source.parent)
    after.pop(source.name, None)
    before = {**before}
    before.pop(source.name)
    assert after == before


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("suffix", FORMATS)
def test_compute_refuses_an_input_that_changes(moment, change, suffix, folders, monkeypatch, run):
    data, spare = folders
    source = write_input(data / f"rollouts.{suffix}")
    output = data / "advantages.parquet"
    before = snapshot(data)
    words = changed_during(monkeypatch, moment, change, source, spare)

    result = run("compute", source, "-o", output, "--report", data / "report.json")

    assert_refused(result, source, words, before)
    assert not output.exists()


@pytest.mark.parametrize("output_name", ["advantages.arrow", "advantages.npz", "-"])
def test_every_output_format_is_checked(output_name, folders, monkeypatch, run):
    data, spare = folders
    source = write_input(data / "rollouts.jsonl")
    before = snapshot(data)
    words = changed_during(monkeypatch, between_stages, append, source, spare)

    result = run("compute", source, "-o", data / output_name if output_name != "-" else "-")

    assert_refused(result, source, words, before)


def test_a_named_pipe_output_is_disowned(folders, monkeypatch, run):
    """A named pipe gets the bytes as they are written, so they cannot be held back: the line
    says that what went down the pipe is not to be used."""
    data, spare = folders
    source = write_input(data / "rollouts.parquet")
    fifo = data / "advantages.parquet"
    words = changed_during(monkeypatch, in_stage_3, rename_over, source, spare)

    with fifo_reader(fifo) as received:
        result = run("compute", source, "-o", fifo, "-q")

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {source} changed while advcli was reading it ({words[0]}); what went to {fifo} "
        "was read from it while it changed: do not use it\n"
    )
    assert received and fifo.is_fifo()


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("suffix", FORMATS)
def test_compare_writes_no_report_of_an_input_that_changes(
    change, suffix, folders, monkeypatch, run
):
    data, spare = folders
    source = write_input(data / f"rollouts.{suffix}")
    before = snapshot(data)
    words = changed_during(monkeypatch, in_stage_1, change, source, spare)

    result = run(
        "compare",
        source,
        "--json",
        "-",
        "--markdown",
        data / "report.md",
        "--html",
        data / "report.html",
        "-q",
    )

    assert_refused(result, source, words, before)


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("suffix", FORMATS)
def test_inspect_prints_nothing_of_an_input_that_changes(change, suffix, folders, monkeypatch, run):
    data, spare = folders
    source = write_input(data / f"rollouts.{suffix}")
    before = snapshot(data)
    words = changed_during(monkeypatch, in_stage_1, change, source, spare)

    result = run("inspect", source, "--json")

    assert_refused(result, source, words, before)


def test_an_unchanged_input_passes_every_check(folders, run):
    data, _ = folders
    source = write_input(data / "rollouts.jsonl")
    output = data / "advantages.parquet"

    result = run("compute", source, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    # Trajectory scores by hand: a = 0.8125 (both turns), b = 0, then 0.5 and 1.
    assert pl.read_parquet(output)["score"].to_list() == [SCORE, SCORE, 0.0, 0.5, 1.0]


# ---------------------------------------------------------------------------------------------
# Standard input and folders


def test_standard_input_is_read_once(folders, monkeypatch, run, tmp_path):
    """What came down the pipe is spooled: the file it came from may change meanwhile."""
    data, spare = folders
    source = write_input(data / "rollouts.parquet")
    output = tmp_path / "advantages.parquet"
    words = changed_during(monkeypatch, between_stages, rewrite, source, spare)

    result = CliRunnerWithInput(source.read_bytes()).invoke("compute", "-", "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert words  # the source did change
    assert pl.read_parquet(output)["score"].to_list() == [SCORE, SCORE, 0.0, 0.5, 1.0]


class CliRunnerWithInput:
    """The CLI in-process with ``data`` on standard input."""

    def __init__(self, data: bytes) -> None:
        from typer.testing import CliRunner

        self.runner, self.data = CliRunner(env={"COLUMNS": "200"}), data

    def invoke(self, *args: object):
        return self.runner.invoke(
            app, [str(a) for a in args], input=self.data, catch_exceptions=False
        )


def test_a_file_added_to_an_input_folder_is_not_read(folders, monkeypatch, run, tmp_path):
    """The files of a folder are those found when the run began; one written meanwhile waits
    for the next run (it is never half-read)."""
    data, _ = folders
    dump = data / "dump"
    dump.mkdir()
    write_input(dump / "step-0.parquet")
    output = tmp_path / "advantages.parquet"
    added = dump / "step-1.parquet"
    between_stages(monkeypatch, lambda: write_input(added))

    result = run("compute", dump, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert added.exists()
    assert pl.read_parquet(output).height == len(ROWS)


def test_a_file_removed_from_an_input_folder_is_named(folders, monkeypatch, run, tmp_path):
    data, _ = folders
    dump = data / "dump"
    dump.mkdir()
    first, second = write_input(dump / "step-0.jsonl"), write_input(dump / "step-1.jsonl")
    output = tmp_path / "advantages.parquet"
    between_stages(monkeypatch, second.unlink)

    result = run("compute", dump, "-o", output, "--by", "file")

    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {second} changed while advcli was reading it (it was removed); nothing was "
        "written\n"
    )
    assert first.exists() and not output.exists()
    assert list(tmp_path.glob(".*advcli-partial*")) == []


# ---------------------------------------------------------------------------------------------
# Ray


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_ray_engine_refuses_an_input_that_changes(cluster, folders, monkeypatch, run):
    data, spare = folders
    source = write_input(data / "rollouts.parquet")
    output = data / "advantages"
    before = snapshot(data)
    words = changed_during(monkeypatch, between_stages, rename_over, source, spare)
    result = run("compute", source, "-o", output, "--engine", "ray")

    assert_refused(result, source, words, before)
    assert not output.exists()

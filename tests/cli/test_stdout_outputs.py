"""``-`` is standard output for every output option (``compute -o`` and ``--report``,
``compare --json``, ``--markdown``, ``--html`` and ``--plot``, ``sample``), one output at most goes
there, binary bytes never onto a terminal, and a reader that leaves ends the run with 141: real
runs of the command, in subprocesses with pipes and terminals."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT

pytestmark = pytest.mark.process

SAMPLE = ROOT / "sample_data" / "rollouts.parquet"
ADVCLI = [sys.executable, "-m", "advcli"]


def advcli(*args: object, cwd: Path, **popen) -> subprocess.CompletedProcess:
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([*ADVCLI, *map(str, args)], cwd=cwd, **popen)


# Each option's '-' against the same option naming a file.
TEXT_REPORTS = {
    "compare-json": (("compare", SAMPLE, "-q", "--json"), "report.json"),
    "compare-markdown": (("compare", SAMPLE, "-q", "--markdown"), "report.md"),
    "compare-html": (("compare", SAMPLE, "-q", "--html"), "report.html"),
    "compute-report": (("compute", SAMPLE, "-q", "-o", "out.parquet", "--report"), "report.json"),
}


@pytest.mark.parametrize(("args", "name"), TEXT_REPORTS.values(), ids=TEXT_REPORTS.keys())
def test_a_report_on_stdout_is_the_file_the_option_writes(args, name, tmp_path):
    (tmp_path / "piped").mkdir()
    (tmp_path / "file").mkdir()
    piped = advcli(*args, "-", cwd=tmp_path / "piped")
    written = advcli(*args, name, cwd=tmp_path / "file")
    assert piped.returncode == written.returncode == 0, piped.stderr
    assert piped.stderr == b""
    assert piped.stdout == (tmp_path / "file" / name).read_bytes()
    # No file named '-' (or anything else but compute's own output) appeared.
    left = sorted(os.listdir(tmp_path / "piped"))
    assert left == (["out.parquet"] if args[0] == "compute" else [])


def test_compute_report_on_stdout_is_json(tmp_path):
    result = advcli("compute", SAMPLE, "-q", "-o", "out.parquet", "--report", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"]["trajectories"] == 512
    told = advcli("compute", SAMPLE, "-o", "told.parquet", "--report", "-", cwd=tmp_path)
    assert told.returncode == 0, told.stderr
    assert b"report: standard output" in told.stderr


def test_the_figure_on_stdout_is_the_png(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "file").mkdir()
    piped = advcli("compare", SAMPLE, "-q", "--plot", "-", cwd=tmp_path)
    written = advcli("compare", SAMPLE, "-q", "--plot", "bias.png", cwd=tmp_path / "file")
    assert piped.returncode == written.returncode == 0, piped.stderr
    assert piped.stdout.startswith(b"\x89PNG\r\n\x1a\n")
    assert piped.stdout == (tmp_path / "file" / "bias.png").read_bytes()
    assert os.listdir(tmp_path) == ["file"]


def test_the_terminal_report_moves_to_stderr_when_stdout_carries_a_report(tmp_path):
    result = advcli("compare", SAMPLE, "--markdown", "-", cwd=tmp_path, env=_columns(80))
    quiet = advcli("compare", SAMPLE, "--markdown", "-", "-q", cwd=tmp_path)
    assert result.returncode == quiet.returncode == 0, result.stderr
    assert result.stdout == quiet.stdout
    assert result.stdout.startswith(b"# advcli compare: turn level vs trajectory level\n")
    assert b"Turn level vs trajectory level" in result.stderr


def test_sample_on_stdout_is_the_file_sample_writes(tmp_path):
    piped = advcli("sample", "-", "--groups", "3", "--seed", "5", cwd=tmp_path)
    written = advcli("sample", "dump.parquet", "--groups", "3", "--seed", "5", "-q", cwd=tmp_path)
    assert piped.returncode == written.returncode == 0, piped.stderr
    assert piped.stderr.decode().strip().endswith("to standard output")
    (tmp_path / "piped.parquet").write_bytes(piped.stdout)
    assert pl.read_parquet(tmp_path / "piped.parquet").equals(
        pl.read_parquet(tmp_path / "dump.parquet")
    )
    assert sorted(os.listdir(tmp_path)) == ["dump.parquet", "piped.parquet"]


# Two outputs on standard output, under any of its names: a usage error before any input is
# opened (the input does not exist, which would be exit 1).
TWO_ON_STDOUT = {
    "compute-o-and-report": (("compute", "-o", "-", "--report", "-"), "-o and --report both"),
    "compute-dev-stdout-and-report": (
        ("compute", "-o", "/dev/stdout", "--report", "-"),
        "-o and --report both",
    ),
    "compare-json-and-markdown": (
        ("compare", "--json", "-", "--markdown", "-"),
        "--json and --markdown both",
    ),
    "compare-dev-stdout-json-and-html": (
        ("compare", "--json", "/dev/stdout", "--html", "-"),
        "--json and --html both",
    ),
    "compare-three": (
        ("compare", "--json", "-", "--markdown", "/dev/fd/1", "--html", "/proc/self/fd/1"),
        "--json, --markdown and --html all",
    ),
}


@pytest.mark.parametrize(("args", "named"), TWO_ON_STDOUT.values(), ids=TWO_ON_STDOUT.keys())
def test_two_outputs_on_stdout_are_a_usage_error_before_any_work(args, named, tmp_path):
    result = advcli(args[0], "missing.parquet", *args[1:], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.decode().splitlines() if "Error" in line]
    assert errors == [
        f"Error: Invalid value: {named} write to standard output, which takes one output; send "
        "the others to files"
    ]
    assert result.stdout == b""
    assert os.listdir(tmp_path) == []


def _on_a_terminal(*args: object, cwd: Path) -> tuple[int, bytes, bytes]:
    """Run advcli with its standard output on a terminal: exit code, what reached the terminal,
    standard error."""
    terminal, other_end = pty.openpty()
    try:
        process = subprocess.Popen(
            [*ADVCLI, *map(str, args)],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=other_end,
            stderr=subprocess.PIPE,
        )
        os.close(other_end)
        other_end = -1
        shown = b""
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # the other end closed: the run is over
                break
            if not chunk:
                break
            shown += chunk
        _, errors = process.communicate(timeout=120)
    finally:
        os.close(terminal)
        if other_end != -1:
            os.close(other_end)
    return process.returncode, shown, errors


BINARY = {
    "compute": (("compute", SAMPLE, "-o", "-"), "-o"),
    "compute-parquet-dev-stdout": (
        ("compute", SAMPLE, "-o", "/dev/stdout", "--format", "parquet"),
        "-o",
    ),
    "sample": (("sample", "-"), "the sample"),
    "compare-plot": (("compare", SAMPLE, "-q", "--plot", "-"), "--plot"),
}


@pytest.mark.parametrize(("args", "named"), BINARY.values(), ids=BINARY.keys())
def test_binary_output_is_refused_on_a_terminal(args, named, tmp_path):
    code, shown, errors = _on_a_terminal(*args, cwd=tmp_path)
    assert code == 2, errors
    assert shown == b""
    assert errors.decode().splitlines()[-1] == (
        f"Error: Invalid value: {named} writes binary data to standard output, which is a "
        "terminal; redirect it to a file or a pipe"
    )
    assert os.listdir(tmp_path) == []


def test_a_text_report_on_a_terminal_is_written(tmp_path):
    code, shown, errors = _on_a_terminal("compare", SAMPLE, "-q", "--json", "-", cwd=tmp_path)
    assert code == 0, errors
    # The terminal turns each newline into CR LF.
    assert json.loads(shown.replace(b"\r\n", b"\n"))["counts"]["trajectories"] == 512


@pytest.mark.parametrize(
    "args",
    [
        ("compare", SAMPLE, "-q", "--markdown", "-", "--top", "400"),
        ("compare", SAMPLE, "-q", "--html", "-"),
        ("compute", SAMPLE, "-q", "-o", "out.parquet", "--report", "-"),
        ("sample", "-"),
    ],
    ids=["compare-markdown", "compare-html", "compute-report", "sample"],
)
def test_a_reader_that_leaves_ends_the_run_with_141(args, tmp_path):
    read_end, write_end = os.pipe()
    # A pipe of one page, which each output outlasts: head leaves before the end.
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    producer = subprocess.Popen(
        [*ADVCLI, *map(str, args)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(
        [shutil.which("head") or "head", "-c", "10"], stdin=read_end, stdout=subprocess.PIPE
    )
    os.close(read_end)
    os.close(write_end)
    taken, _ = head.communicate(timeout=120)
    _, errors = producer.communicate(timeout=120)
    assert len(taken) == 10
    assert errors == b"", errors
    # 141 as a shell shows it: an exit status of 141, or death by SIGPIPE.
    assert producer.returncode in (141, -signal.SIGPIPE)


def test_stdout_that_is_an_input_is_refused(tmp_path):
    source = tmp_path / "dump.parquet"
    shutil.copy(SAMPLE, source)
    before = source.read_bytes()
    for args in (
        ("compare", source, "-q", "--markdown", "-"),
        ("compute", source, "-q", "-o", tmp_path / "out.parquet", "--report", "-"),
    ):
        with source.open("ab") as appended:
            result = advcli(*args, cwd=tmp_path, stdout=appended, stderr=subprocess.PIPE)
        assert result.returncode == 1
        assert result.stderr.decode() == (
            f"Error: standard output: the output is the input {source} (the same file); choose "
            "another path\n"
        )
        assert source.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["dump.parquet"]


def _columns(width: int) -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(width)}


def test_a_report_file_that_fails_sends_nothing_to_stdout(tmp_path):
    """The report on standard output is written after the files: the HTML page, larger than the
    file-size limit, fails first, and the pipe gets no JSON of a run that failed."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

    result = advcli(
        "compare",
        SAMPLE,
        "-q",
        "--json",
        "-",
        "--html",
        "page.html",
        cwd=tmp_path,
        preexec_fn=limited,
    )
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().startswith("Error: page.html: cannot write (File too large)")
    assert os.listdir(tmp_path) == []


def test_sample_whose_staging_fails_sends_nothing_and_leaves_nothing(tmp_path):
    """``sample -`` is written whole to a temporary file first: a file-size limit that stops it
    is one error line, nothing reaches the pipe and the temporary folder is gone."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = advcli(
        "sample",
        "-",
        "--groups",
        "200",
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temporary)},
        preexec_fn=limited,
    )
    assert result.returncode == 1
    assert result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: standard output: staging the output failed ("
    ), lines
    assert "File too large" in lines[0]
    assert os.listdir(temporary) == []

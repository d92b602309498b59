"""Fault injection against a real ``python -m advcli`` process: a full disk (RLIMIT_FSIZE) under
every writer, closed standard streams, a broken pipe into ``head``, and signals at start-up, in
the middle of a write and at random moments of a run."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from conftest import partials, wait_for_partial

from advcli.read.json_translation import BLOCK_BYTES
from advcli.write.sample import sample_table

pytestmark = pytest.mark.process

# Every output of the medium dump is larger than this (the smallest, `inspect --json`, is about
# 1.4 KB; the Markdown report 2.4 KB; the others tens of KB to MB), so every writer hits it.
LIMIT = 512
# A pipe this small breaks under any output of more than a few KB (Linux's minimum: one page).
PIPE_SIZE = 4096
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}
CRASH_MARKERS = ("Traceback", "panicked", "stack backtrace")
INTERRUPTED = "Interrupted; no partial output was left behind."
TERMINATED = "Terminated; no partial output was left behind."

Preexec = Callable[[], None]


# ---------------------------------------------------------------------------------------------
# Helpers


@dataclass
class Run:
    """What a finished advcli process left: its exit code and both streams, as text."""

    args: Sequence[str]
    returncode: int | None
    stdout: str
    stderr: str

    def __str__(self) -> str:
        stdout = self.stdout if len(self.stdout) <= 2000 else self.stdout[:2000] + "…"
        return (
            f"\n$ advcli {' '.join(self.args)}\nexit code: {self.returncode}\n"
            f"--- stderr ---\n{self.stderr}--- stdout ---\n{stdout}"
        )


def text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def file_size_limit(limit: int) -> Preexec:
    """In the child: writes past ``limit`` bytes fail with EFBIG instead of killing it."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return preexec


def closed(fd: int) -> Preexec:
    """In the child: standard stream ``fd`` really closed (not /dev/null) when advcli starts."""

    def preexec() -> None:
        os.close(fd)

    return preexec


def child_env(tmpdir: Path, mplconfig: Path, **extra: str) -> dict[str, str]:
    """The child's environment: the same whatever the runner's, but for ``extra``."""
    env = {
        **os.environ,
        # Nothing but advcli's own writes under the size limit: no bytecode caches...
        "PYTHONDONTWRITEBYTECODE": "1",
        # ...and matplotlib's font cache already built (see the mplconfig fixture).
        "MPLCONFIGDIR": str(mplconfig),
        "TMPDIR": str(tmpdir),
        "COLUMNS": "200",
    }
    # Both change what the child does (PYTHONUNBUFFERED: stdout without a buffer), so a test
    # that wants one sets it itself.
    for name in ("RUST_BACKTRACE", "PYTHONUNBUFFERED"):
        env.pop(name, None)
    env.update(extra)
    return env


def advcli_args(args: Sequence[object]) -> list[str]:
    return [sys.executable, "-m", "advcli", *map(str, args)]


def run_advcli(
    args: Sequence[object],
    *,
    cwd: Path,
    env: dict[str, str],
    preexec: Preexec | None = None,
    stdin: int | None = subprocess.DEVNULL,
    stdout_file: Path | None = None,
    stdout_fd: int | None = None,
    timeout: float = 120,
) -> Run:
    """Run advcli to the end; with ``stdout_file``, its stdout is that regular file; with
    ``stdout_fd``, that descriptor."""
    with contextlib.ExitStack() as stack:
        stdout = (
            stack.enter_context(stdout_file.open("wb"))
            if stdout_file is not None
            else stdout_fd
            if stdout_fd is not None
            else subprocess.PIPE
        )
        finished = subprocess.run(
            advcli_args(args),
            cwd=cwd,
            env=env,
            preexec_fn=preexec,
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    out = (
        text(stdout_file.read_bytes()) if stdout_file is not None else text(finished.stdout or b"")
    )
    return Run([str(a) for a in args], finished.returncode, out, text(finished.stderr))


@contextlib.contextmanager
def spawned(args: Sequence[object], **popen: object) -> Iterator[subprocess.Popen]:
    """A running advcli process, killed and reaped if the test stops before it ends."""
    process = subprocess.Popen(advcli_args(args), **popen)  # type: ignore[call-overload]
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def finish(process: subprocess.Popen, args: Sequence[object], timeout: float = 120) -> Run:
    stdout, stderr = process.communicate(timeout=timeout)
    return Run([str(a) for a in args], process.returncode, text(stdout), text(stderr))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def row_count(path: Path) -> int:
    """The rows of a Parquet file, from its metadata: the big dump's token lists are not read."""
    return pl.scan_parquet(path).select(pl.len()).collect().item()


def listing(folder: Path) -> set[str]:
    """Every file and folder under ``folder`` (hidden ones too)."""
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh output folder (the child's working directory) and a fresh $TMPDIR."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    return out, tmp


def error_line(result: Run) -> str:
    """The one line of stderr, which must be an ``Error:`` line."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"stderr is not exactly one line{result}"
    assert lines[0].startswith("Error: "), f"stderr is not an Error: line{result}"
    return lines[0]


def assert_no_crash(result: Run) -> None:
    for marker in CRASH_MARKERS:
        assert marker not in result.stdout + result.stderr, f"{marker!r} in the output{result}"


def names_standard_output(line: str) -> bool:
    """Standard output by name, or as '-' (a temporary file named advcli-stdout-… is not it)."""
    return (
        any(name in line for name in ("standard output", "<stdout>", "'-'", '"-"'))
        or re.match(r"Error: -[:\s]", line) is not None
    )


# ---------------------------------------------------------------------------------------------
# Inputs, made once per module


@pytest.fixture(scope="module")
def mplconfig(tmp_path_factory) -> Path:
    """A matplotlib config folder whose font cache is built before any run under the size limit
    (building it there would fail and log a warning on stderr)."""
    folder = tmp_path_factory.mktemp("mplconfig")
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.font_manager"],
        env={**os.environ, "MPLCONFIGDIR": str(folder)},
        check=True,
        capture_output=True,
    )
    return folder


@pytest.fixture(scope="module")
def medium_dump(tmp_path_factory) -> Path:
    """9,335 rows: every output exceeds LIMIT and `compute -o -` writes about 3 MB, yet a run
    takes well under a second."""
    path = tmp_path_factory.mktemp("medium") / "rollouts.parquet"
    pl.from_arrow(sample_table(groups=400, rollouts=8, seed=0)).write_parquet(path)
    return path


@pytest.fixture(scope="module")
def many_files(medium_dump, tmp_path_factory) -> Path:
    """The medium dump split into 64 files with long names: `inspect --json` lists every input
    file, so its JSON (about 12 KB) outgrows a small pipe; a single file's is 1.4 KB."""
    folder = tmp_path_factory.mktemp("parts") / "dump"
    folder.mkdir()
    frame = pl.read_parquet(medium_dump)
    for part in range(64):
        name = f"rollouts-part-{part:03d}-of-064-{'from-a-long-running-agent-job-' * 4}.parquet"
        frame.filter(pl.col("data_id") % 64 == part).write_parquet(folder / name)
    assert sum(len(str(path)) for path in folder.iterdir()) > 2 * PIPE_SIZE
    return folder


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory) -> Path:
    """About 575k rows of ~128 tokens: `compute` takes a few seconds, so signals land mid-run."""
    path = tmp_path_factory.mktemp("big") / "big.parquet"
    pl.from_arrow(sample_table(groups=24_000, rollouts=8, tokens=128, seed=1)).write_parquet(path)
    return path


# ---------------------------------------------------------------------------------------------
# A. A full disk under every writer


def test_the_size_limit_makes_writes_fail_with_efbig(mplconfig, tmp_path):
    """The premise of the full-disk tests: under file_size_limit a plain Python write past the
    limit, to a named file or to a stdout redirected to a file, fails with EFBIG."""
    probe = (
        "import errno, os, sys\n"
        "for fd in (os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT), 1):\n"
        "    os.write(fd, b'x' * int(sys.argv[2]))\n"
        "    try:\n"
        "        os.write(fd, b'x')\n"
        "    except OSError as error:\n"
        "        print(errno.errorcode[error.errno], error.strerror, file=sys.stderr)\n"
    )
    with (tmp_path / "stdout").open("wb") as stdout:
        probed = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "file"), str(LIMIT)],
            preexec_fn=file_size_limit(LIMIT),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert probed.returncode == 0, probed.stderr
    assert probed.stderr.splitlines() == ["EFBIG File too large"] * 2, probed.stderr
    assert (tmp_path / "file").stat().st_size == LIMIT
    assert (tmp_path / "stdout").stat().st_size == LIMIT


@dataclass(frozen=True)
class Writer:
    """One of advcli's writers: its command line (IN is the input) and the file it writes in the
    output folder (None: standard output)."""

    args: tuple[str, ...]
    output: str | None

    def command(self, source: Path, folder: Path) -> list[str]:
        return [
            str(source) if arg == "IN" else str(folder / arg) if arg == self.output else arg
            for arg in self.args
        ]


WRITERS = {
    "compute-parquet": Writer(("compute", "IN", "-o", "out.parquet"), "out.parquet"),
    "compute-arrow": Writer(("compute", "IN", "-o", "out.arrow"), "out.arrow"),
    "compute-arrows": Writer(("compute", "IN", "-o", "out.arrows"), "out.arrows"),
    "compute-npz": Writer(("compute", "IN", "-o", "out.npz"), "out.npz"),
    "compute-pt": Writer(("compute", "IN", "-o", "out.pt"), "out.pt"),
    "compute-stdout": Writer(("compute", "IN", "-o", "-"), None),
    "compare-json": Writer(("compare", "IN", "--json", "r.json"), "r.json"),
    "compare-markdown": Writer(("compare", "IN", "--markdown", "r.md"), "r.md"),
    "compare-plot": Writer(("compare", "IN", "--plot", "p.png"), "p.png"),
    "compare-json-stdout": Writer(("compare", "IN", "--json", "-"), None),
    "inspect-json-stdout": Writer(("inspect", "IN", "--json"), None),
    "sample": Writer(("sample", "out.parquet", "--groups", "400"), "out.parquet"),
}


def writer_params(names: Sequence[str]) -> list:
    return [
        pytest.param(
            WRITERS[name], id=name, marks=[pytest.mark.torch] if name.endswith("-pt") else []
        )
        for name in names
    ]


STDOUT_WRITERS = [name for name, writer in WRITERS.items() if writer.output is None]
# Whether Python buffers stdout changes how a short write shows (an unbuffered text stream drops
# the rest of a short write without an error), and PYTHONUNBUFFERED=1 is common in containers.
FULL_DISK_RUNS = [
    *[
        pytest.param(*param.values, {}, id=param.id, marks=param.marks)
        for param in writer_params(list(WRITERS))
    ],
    *[
        pytest.param(WRITERS[name], UNBUFFERED, id=f"{name}-PYTHONUNBUFFERED")
        for name in STDOUT_WRITERS
    ],
]


@pytest.mark.parametrize(("writer", "env"), FULL_DISK_RUNS)
def test_full_disk(writer: Writer, env: dict[str, str], medium_dump, mplconfig, tmp_path):
    if writer.output == "out.pt":
        pytest.importorskip("torch")
    out, tmp = folders(tmp_path)
    stdout_file = out / "stdout.bin" if writer.output is None else None
    if stdout_file is not None:
        stdout_file.touch()
    digest, before = sha256(medium_dump), listing(out)

    result = run_advcli(
        writer.command(medium_dump, out),
        cwd=out,
        env=child_env(tmp, mplconfig, **env),
        preexec=file_size_limit(LIMIT),
        stdout_file=stdout_file,
    )

    assert result.returncode == 1, f"exit code is not 1{result}"
    line = error_line(result)
    if writer.output is not None:
        assert str(out / writer.output) in line, f"the Error line does not name the output{result}"
        assert not (out / writer.output).exists(), f"an output was left behind{result}"
    else:
        assert names_standard_output(line), f"the Error line does not name stdout{result}"
    assert_no_crash(result)
    assert listing(out) == before, f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"
    assert sha256(medium_dump) == digest, "the input changed"


@pytest.mark.parametrize("name", ["out.parquet", "out.arrows", "out.npz", "r.json"])
def test_full_disk_under_a_folder_named_in_bytes(name, medium_dump, mplconfig, tmp_path):
    """Writers that open their output through a descriptor (its folder's name is not UTF-8) fail
    on a full disk as any other: one line naming the output with its bytes escaped."""
    out, tmp = folders(tmp_path)
    folder = out / os.fsdecode(b"runs-\xff")
    folder.mkdir()
    option = "--json" if name.endswith(".json") else "-o"
    command = "compare" if option == "--json" else "compute"
    before = listing(out)

    result = run_advcli(
        [command, medium_dump, option, folder / name],
        cwd=out,
        env=child_env(tmp, mplconfig),
        preexec=file_size_limit(LIMIT),
    )

    assert result.returncode == 1, f"exit code is not 1{result}"
    assert f"{out}/runs-\\xff/{name}: cannot write" in error_line(result), str(result)
    assert_no_crash(result)
    assert listing(out) == before, f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


# One case per way of writing a file (the Markdown report is written as the JSON one is).
KEPT = [
    "compute-parquet",
    "compute-arrows",
    "compute-npz",
    "compare-json",
    "compare-plot",
    "sample",
]


@pytest.mark.parametrize("writer", writer_params(KEPT))
def test_full_disk_keeps_the_previous_output(writer: Writer, medium_dump, mplconfig, tmp_path):
    if writer.output == "out.pt":
        pytest.importorskip("torch")
    assert writer.output is not None
    out, tmp = folders(tmp_path)
    output = out / writer.output
    output.write_bytes(b"the previous, complete result")
    before = listing(out)

    result = run_advcli(
        [*writer.command(medium_dump, out), "--force"],
        cwd=out,
        env=child_env(tmp, mplconfig),
        preexec=file_size_limit(LIMIT),
    )

    assert result.returncode == 1, f"exit code is not 1{result}"
    assert str(output) in error_line(result), f"the Error line does not name the output{result}"
    assert_no_crash(result)
    assert output.read_bytes() == b"the previous, complete result", f"old output lost{result}"
    assert listing(out) == before, f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


def report_dump(path: Path) -> Path:
    """156 small rows (scalar score, response_length) whose Markdown report outweighs their
    advantages written with --no-tokens: 30 trajectories of 1 to 30 turns in 15 groups make
    long turn tables while the Parquet output stays about 2.8 KB (the report about 3.8 KB)."""
    rows = [(k // 2, k % 2, turn, float(k % 3 == 0), 3) for k in range(30) for turn in range(k + 1)]
    names = ["data_id", "rollout_id", "turn_index", "score", "response_length"]
    pl.DataFrame(rows, schema=names, orient="row").write_parquet(path)
    return path


def test_full_disk_under_the_report_after_the_output(mplconfig, tmp_path):
    source = report_dump(tmp_path / "rollouts.parquet")
    # The same file names and folder-name lengths in both runs, so the report has the same size.
    measure, out, tmp = tmp_path / "run-a", tmp_path / "run-b", tmp_path / "tmp"
    for folder in (measure, out, tmp):
        folder.mkdir()

    def command(folder: Path) -> list[str]:
        output, report = folder / "out.parquet", folder / "r.md"
        return ["compute", str(source), "-o", str(output), "--no-tokens", "--report", str(report)]

    free = run_advcli(command(measure), cwd=measure, env=child_env(tmp, mplconfig))
    assert free.returncode == 0, str(free)
    output_size = (measure / "out.parquet").stat().st_size
    report_size = (measure / "r.md").stat().st_size
    if report_size <= output_size + 64:
        pytest.skip(f"the report ({report_size} B) is not larger than the output ({output_size} B)")
    limit = (output_size + report_size) // 2

    result = run_advcli(
        command(out), cwd=out, env=child_env(tmp, mplconfig), preexec=file_size_limit(limit)
    )

    assert result.returncode == 1, f"exit code is not 1 (limit {limit} B){result}"
    line = error_line(result)
    for part in ("r.md", "out.parquet", "was written"):
        assert part in line, f"{part!r} not in the Error line{result}"
    assert_no_crash(result)
    assert pl.read_parquet(out / "out.parquet").equals(pl.read_parquet(measure / "out.parquet"))
    assert listing(out) == {"out.parquet"}, f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


# ---------------------------------------------------------------------------------------------
# B. Closed standard streams


@pytest.fixture(scope="module")
def ordinary_output(medium_dump, mplconfig, tmp_path_factory) -> Path:
    """`compute medium -o out.parquet -q` with every stream open, as a reference."""
    folder = tmp_path_factory.mktemp("ordinary")
    tmp = tmp_path_factory.mktemp("ordinary-tmp")
    output = folder / "out.parquet"
    result = run_advcli(
        ["compute", medium_dump, "-o", output, "-q"], cwd=folder, env=child_env(tmp, mplconfig)
    )
    assert result.returncode == 0, str(result)
    return output


def test_closed_stdin(mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    output = out / "out.parquet"
    result = run_advcli(
        ["compute", "-", "-o", output],
        cwd=out,
        env=child_env(tmp, mplconfig),
        preexec=closed(0),
        stdin=None,
    )
    assert result.returncode == 1, f"exit code is not 1{result}"
    assert "standard input is closed" in error_line(result), str(result)
    assert_no_crash(result)
    assert listing(out) == set(), f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


@pytest.mark.parametrize(
    "args",
    [("compute", "IN", "-o", "-"), ("compare", "IN", "--json", "-"), ("inspect", "IN", "--json")],
    ids=["compute-stdout", "compare-json-stdout", "inspect-json"],
)
def test_closed_stdout_when_it_carries_the_data(args, medium_dump, mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    result = run_advcli(
        [str(medium_dump) if arg == "IN" else arg for arg in args],
        cwd=out,
        env=child_env(tmp, mplconfig),
        preexec=closed(1),
    )
    assert result.returncode == 1, f"exit code is not 1{result}"
    assert "standard output is closed" in error_line(result), str(result)
    assert_no_crash(result)
    assert listing(out) == set(), f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


@pytest.mark.parametrize(
    ("fd", "options"), [(1, ["-q"]), (2, [])], ids=["stdout-closed-quiet", "stderr-closed"]
)
def test_closed_stream_that_carries_no_data(
    fd, options, medium_dump, ordinary_output, mplconfig, tmp_path
):
    out, tmp = folders(tmp_path)
    output = out / "out.parquet"
    result = run_advcli(
        ["compute", medium_dump, "-o", output, *options],
        cwd=out,
        env=child_env(tmp, mplconfig),
        preexec=closed(fd),
    )
    assert result.returncode == 0, f"exit code is not 0{result}"
    assert_no_crash(result)
    assert pl.read_parquet(output).equals(pl.read_parquet(ordinary_output)), str(result)
    # Nothing stray (a summary, a progress bar) landed in a file that took the closed fd.
    assert output.read_bytes() == ordinary_output.read_bytes(), str(result)
    assert listing(out) == {"out.parquet"}, f"files left in the output folder{result}"


# ---------------------------------------------------------------------------------------------
# C. A broken pipe into head

PIPELINES = {
    # --top 400 lists every group: about 100 KB of JSON.
    "compare-json": (("compare", "IN", "--json", "-", "--top", "400"), 10),
    # About 3 MB of Arrow IPC stream.
    "compute-stdout": (("compute", "IN", "-o", "-"), 100),
    # IN is the 64-file folder here: about 12 KB of JSON.
    "inspect-json": (("inspect", "IN", "--json"), 10),
    "compute-stdout-parquet": (("compute", "IN", "-o", "-", "--format", "parquet"), 10),
    # Written straight into the pipe, by Polars, Arrow, numpy and torch, and by the report writer.
    **{
        f"compute-dev-stdout-{fmt}": (("compute", "IN", "-o", "/dev/stdout", "--format", fmt), 10)
        for fmt in ("parquet", "arrow", "arrows", "npz", "pt")
    },
    "compare-json-dev-stdout": (
        ("compare", "IN", "--json", "/dev/stdout", "--top", "400", "-q"),
        10,
    ),
}
PIPE_RUNS = [
    *[
        pytest.param(*run, {}, id=name, marks=[pytest.mark.torch] if name.endswith("-pt") else [])
        for name, run in PIPELINES.items()
    ],
    # Text written through an unbuffered stdout: a short write must not pass for a whole one.
    *[
        pytest.param(*PIPELINES[name], UNBUFFERED, id=f"{name}-PYTHONUNBUFFERED")
        for name in ("compare-json", "inspect-json")
    ],
]


@pytest.mark.parametrize(("args", "head_bytes", "env"), PIPE_RUNS)
def test_broken_pipe_into_head(args, head_bytes, env, medium_dump, many_files, mplconfig, tmp_path):
    if "pt" in args:
        pytest.importorskip("torch")
    out, tmp = folders(tmp_path)
    source = many_files if args[0] == "inspect" else medium_dump
    command = [str(source) if arg == "IN" else arg for arg in args]
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    try:
        with spawned(
            command,
            cwd=out,
            env=child_env(tmp, mplconfig, **env),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
        ) as producer:
            head = subprocess.Popen(
                [shutil.which("head") or "head", "-c", str(head_bytes)],
                stdin=read_end,
                stdout=subprocess.PIPE,
            )
            os.close(read_end)
            os.close(write_end)
            read_end = write_end = -1
            head_out, _ = head.communicate(timeout=120)
            result = finish(producer, command)
    finally:
        for fd in (read_end, write_end):
            if fd != -1:
                os.close(fd)

    assert head.returncode == 0 and len(head_out) == head_bytes, "head did not get its bytes"
    assert result.stderr == "", f"stderr is not empty{result}"
    # 141 as a shell shows it: an exit status of 141, or death by SIGPIPE.
    assert result.returncode in (141, -signal.SIGPIPE), f"exit code is not 141{result}"
    assert listing(out) == set(), f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


# ---------------------------------------------------------------------------------------------
# D. Signals


def start_compute(
    source: Path, out: Path, tmp: Path, mplconfig: Path, **env: str
) -> tuple[list[str], dict]:
    args = ["compute", str(source), "-o", str(out / "out.parquet")]
    popen = {
        "cwd": out,
        "env": child_env(tmp, mplconfig, **env),
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    return args, popen


def wait_for_handlers(process: subprocess.Popen, timeout: float = 30) -> None:
    """Wait until advcli's signal handlers are in place: the moment its own code has run.

    Python itself catches SIGINT from its start-up on, but never SIGTERM: the process catching
    SIGTERM (the SigCgt mask in /proc) shows that ``advcli.__main__`` has installed its handlers.
    A signal before that lands in the interpreter's own start-up, which is Python's to report.
    """
    deadline = time.monotonic() + timeout
    status = Path(f"/proc/{process.pid}/status")
    while True:
        assert process.poll() is None, "advcli finished before its handlers were in place"
        assert time.monotonic() < deadline, "advcli never installed its signal handlers"
        caught = next(
            (
                line.split()[1]
                for line in status.read_text().splitlines()
                if line.startswith("SigCgt")
            ),
            "0",
        )
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.0005)


@pytest.mark.parametrize("backtrace", [False, True], ids=["plain", "RUST_BACKTRACE=1"])
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.1, 0.2, 0.4])
def test_sigint_during_startup(delay, backtrace, big_dump, mplconfig, tmp_path):
    """Delays count from the moment advcli's handlers are in place, while it imports Typer,
    Polars and the rest and opens its input."""
    out, tmp = folders(tmp_path)
    env = {"RUST_BACKTRACE": "1"} if backtrace else {}
    args, popen = start_compute(big_dump, out, tmp, mplconfig, **env)
    with spawned(args, **popen) as process:
        wait_for_handlers(process)
        time.sleep(delay)
        assert process.poll() is None, "advcli finished before the signal"
        process.send_signal(signal.SIGINT)
        result = finish(process, args)

    assert result.returncode == 130, f"exit code is not 130{result}"
    assert result.stderr.splitlines() == [INTERRUPTED], f"stderr is not the one line{result}"
    assert_no_crash(result)
    assert listing(out) == set(), f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


# The command line stood in for by a class whose creation is interrupted: Python turns an
# exception raised in a __set_name__ into a RuntimeError, which is how a Ctrl-C during rich's
# import once reached the user as a traceback with exit code 1 (seen in CI).
INTERRUPTED_IN_SET_NAME = """
import os, signal, sys, types

class Field:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)

def app(prog_name):
    class Console:
        buffer = Field()

sys.modules["advcli.cli.app"] = types.SimpleNamespace(app=app)
from advcli.__main__ import main
main()
"""


# A command whose work fails because of the interrupt: the signal is received while it is held
# (as inside a Polars query, which then fails), and the failure is one of advcli's errors.
ERROR_AFTER_INTERRUPT = """
import os, signal, sys, types
import typer
from advcli.cli.exits import reports_errors
from advcli.errors import AdvcliError
from advcli._runtime.signals import held

@reports_errors
def command():
    with held():
        os.kill(os.getpid(), signal.SIGINT)
        raise AdvcliError("out.parquet: cannot write (the query was cancelled)")

app = typer.Typer()
app.command()(command)
sys.modules["advcli.cli.app"] = types.SimpleNamespace(app=app)
from advcli.__main__ import main
main()
"""


# An error that a termination signal raced: the signal reached the process, but the thread that
# takes it has not run yet (a loaded machine), and its sender closed the input the next moment.
ERROR_RACED_BY_A_WAITING_SIGNAL = """
import os, signal, sys, threading, types
import typer
from advcli._runtime import signals
from advcli.cli.exits import reports_errors
from advcli.errors import AdvcliError

signals._forward_termination = lambda *args: threading.Event().wait()  # not scheduled yet

@reports_errors
def command():
    os.kill(os.getpid(), signal.SIGTERM)
    raise AdvcliError("<stdin>: standard input is empty")

app = typer.Typer()
app.command()(command)
sys.modules["advcli.cli.app"] = types.SimpleNamespace(app=app)
from advcli.__main__ import main
main()
"""


# The interrupt raised inside a weakref's callback, where Python can only print it and go on
# (the import system's module locks have such a callback: a Ctrl-C in start-up landed there).
INTERRUPTED_IN_WEAKREF_CALLBACK = """
import os, signal, sys, time, types, weakref
from pathlib import Path

class Thing:
    pass

def app(prog_name):
    thing = Thing()
    keep = weakref.ref(thing, lambda ref: os.kill(os.getpid(), signal.SIGINT))
    del thing
    for _ in range(200):  # work that goes on for 2 s, if nothing stops it
        time.sleep(0.01)
    Path("went-on").write_text("the run went on after the interrupt")

sys.modules["advcli.cli.app"] = types.SimpleNamespace(app=app)
from advcli.__main__ import main
main()
"""


def _run_script(script: str, out: Path, tmp: Path, mplconfig: Path) -> Run:
    """``python -c script`` in ``out``, as the tests' advcli processes run."""
    finished = subprocess.run(
        [sys.executable, "-c", script],
        cwd=out,
        env=child_env(tmp, mplconfig),
        capture_output=True,
        timeout=60,
    )
    return Run(["-c"], finished.returncode, text(finished.stdout), text(finished.stderr))


@pytest.mark.parametrize(
    "script",
    [INTERRUPTED_IN_SET_NAME, ERROR_AFTER_INTERRUPT, INTERRUPTED_IN_WEAKREF_CALLBACK],
    ids=["wrapped in another error", "an advcli error it caused", "dropped by Python"],
)
def test_an_interrupt_turned_into_something_else_still_ends_as_one(script, mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    result = _run_script(script, out, tmp, mplconfig)

    assert result.returncode == 130, f"exit code is not 130{result}"
    assert result.stderr.splitlines() == [INTERRUPTED], f"stderr is not the one line{result}"
    assert_no_crash(result)
    assert not (out / "went-on").exists(), f"the run went on after the interrupt{result}"


def test_a_waiting_signal_outranks_the_error_it_raced(mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    result = _run_script(ERROR_RACED_BY_A_WAITING_SIGNAL, out, tmp, mplconfig)

    assert result.returncode == 143, f"exit code is not 143{result}"
    assert result.stderr.splitlines() == [TERMINATED], f"stderr is not the one line{result}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "message"),
    [(signal.SIGINT, 130, INTERRUPTED), (signal.SIGTERM, 143, TERMINATED)],
    ids=["SIGINT", "SIGTERM"],
)
def test_signal_mid_write(signum, code, message, big_dump, mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    args, popen = start_compute(big_dump, out, tmp, mplconfig, RUST_BACKTRACE="1")
    with spawned(args, **popen) as process:
        wait_for_partial(process, out / "out.parquet")
        process.send_signal(signum)
        result = finish(process, args)

    assert result.returncode == code, f"exit code is not {code}{result}"
    assert result.stderr.splitlines() == [message], f"stderr is not the one line{result}"
    assert_no_crash(result)
    assert not (out / "out.parquet").exists(), f"an output was left behind{result}"
    assert partials(out / "out.parquet") == [], f"a partial was left behind{result}"
    assert listing(out) == set(), f"files left in the output folder{result}"


@pytest.fixture(scope="module")
def big_run_seconds(big_dump, mplconfig, tmp_path_factory) -> float:
    """How long an undisturbed `compute` of the big dump takes here (the faster of two runs, so
    that a signal sent within its first 80 % finds advcli still running)."""
    return min(
        undisturbed_seconds(big_dump, mplconfig, tmp_path_factory.mktemp("timed")) for _ in range(2)
    )


def undisturbed_seconds(big_dump: Path, mplconfig: Path, folder: Path) -> float:
    """How long one `compute` of the big dump takes now, with no signal."""
    folder.mkdir(exist_ok=True)
    out, tmp = folders(folder)
    args, popen = start_compute(big_dump, out, tmp, mplconfig)
    started = time.monotonic()
    with spawned(args, **popen) as process:
        result = finish(process, args)
    assert result.returncode == 0, str(result)
    return time.monotonic() - started


SWALLOW_RUNS = 5


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(SWALLOW_RUNS))
def test_sigint_is_never_swallowed(attempt, big_dump, big_run_seconds, mplconfig, tmp_path):
    """A SIGINT at a random moment of the run's first 80 %, one moment in each fifth of it.

    The run's length was measured once; a machine that has since grown faster (other work on
    it ended) can finish a run before the moment, or be at its very end then (exit 0, told by
    timing an undisturbed run): that tests nothing, so the moment is halved and the run made
    again, up to three times."""
    window = 0.8 * big_run_seconds / SWALLOW_RUNS
    moment = max(0.02, window * (attempt + random.Random(attempt).random()))
    for run_number in range(3):
        (tmp_path / str(run_number)).mkdir()
        out, tmp = folders(tmp_path / str(run_number))
        args, popen = start_compute(big_dump, out, tmp, mplconfig)
        with spawned(args, **popen) as process:
            time.sleep(moment)
            sent = process.poll() is None
            process.send_signal(signal.SIGINT)
            result = finish(process, args)
        if sent and result.returncode == 0:
            # A machine that has grown faster since the measurement can put the moment at the
            # run's very end, after its exit code was settled (0 is right there): told by timing
            # an undisturbed run now. A swallowed Ctrl-C earlier in the run still fails.
            now = undisturbed_seconds(big_dump, mplconfig, tmp_path / f"{run_number}-timed")
            sent = moment < 0.9 * now
        if sent:
            break
        moment /= 2

    when = f"SIGINT at {moment:.3f} s of a {big_run_seconds:.2f} s run"
    assert sent, f"advcli finished before the {when}{result}"
    assert result.returncode == 130, f"exit code is not 130 after a {when}{result}"


END_MOMENTS = (0.75, 0.85, 0.92, 0.97, 1.0, 1.05)


@pytest.mark.slow
@pytest.mark.parametrize("share", END_MOMENTS)
def test_sigint_around_the_end_of_a_run(share, big_dump, big_run_seconds, mplconfig, tmp_path):
    """Near the end the write finishes, the output is published and the interpreter shuts down:
    a Ctrl-C then stops the run (130, one line) or comes after the exit code was settled (0).
    The output is absent, or whole when the Ctrl-C came after its publishing: between that and
    the settled exit code it still ends in 130, with the whole output (as the README's account of
    signals says). Which of these a moment gives depends on how fast this run goes, so each is
    allowed; never a partial, a panic of a cancelled Polars task (seen in 6 of 150 random
    moments) or death by the signal itself (-2: Python's shutdown had put back SIGINT's default
    action while Polars' threads could still receive it)."""
    moment = share * big_run_seconds
    out, tmp = folders(tmp_path)
    args, popen = start_compute(big_dump, out, tmp, mplconfig, RUST_BACKTRACE="1")
    with spawned(args, **popen) as process:
        time.sleep(moment)
        process.send_signal(signal.SIGINT)
        result = finish(process, args)

    when = f"after a SIGINT at {moment:.3f} s of a {big_run_seconds:.2f} s run"
    assert_no_crash(result)
    assert result.returncode in (0, 130), f"exit code {result.returncode} {when}{result}"
    if result.returncode == 130:
        assert result.stderr.splitlines() == [INTERRUPTED], f"stderr {when}{result}"
    if result.returncode == 0 or listing(out):
        assert listing(out) == {"out.parquet"}, f"files left {when}{result}"
        assert row_count(out / "out.parquet") == row_count(big_dump)
    assert listing(tmp) == set(), f"files left in $TMPDIR {when}{result}"


def ignoring_sigint() -> None:
    """In the child: SIGINT ignored, as for a background job or under ``nohup``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_a_sigint_the_parent_ignores_stays_ignored(big_dump, mplconfig, tmp_path):
    out, tmp = folders(tmp_path)
    args, popen = start_compute(big_dump, out, tmp, mplconfig)
    with spawned(args, preexec_fn=ignoring_sigint, **popen) as process:
        wait_for_partial(process, out / "out.parquet")
        process.send_signal(signal.SIGINT)
        result = finish(process, args)

    assert result.returncode == 0, f"the ignored SIGINT stopped the run{result}"
    assert "Interrupted" not in result.stderr, f"the run says it was interrupted{result}"
    assert row_count(out / "out.parquet") == row_count(big_dump)


@pytest.mark.parametrize("command", ["inspect", "compare"])
def test_a_terminal_report_into_a_closed_pipe_ends_quietly(command, medium_dump, tmp_path):
    out, tmp = folders(tmp_path)
    reader, writer = os.pipe()
    os.close(reader)  # nobody will read: the first write breaks the pipe
    try:
        result = run_advcli(
            [command, medium_dump],
            cwd=out,
            env=child_env(tmp, tmp),
            stdin=subprocess.DEVNULL,
            stdout_fd=writer,
        )
    finally:
        os.close(writer)
    assert result.stderr == "", f"stderr is not empty{result}"
    assert result.returncode in (141, -signal.SIGPIPE), f"exit code is not 141{result}"


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_onto_a_full_device_is_one_error_line(option, tmp_path):
    _, tmp = folders(tmp_path)
    with open("/dev/full", "wb") as full:
        finished = subprocess.run(
            advcli_args([option]), stdout=full, stderr=subprocess.PIPE, env=child_env(tmp, tmp)
        )
    assert finished.returncode == 1
    assert text(finished.stderr) == (
        "Error: standard output: cannot write (No space left on device)\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_shutdown_is_one_line_or_nothing(signum, medium_dump, mplconfig, tmp_path):
    """Signals sent as the output is published, while the process shuts down: never a
    traceback, never a silent death by the signal; either one line and 128 + N, or (when it came
    after advcli's last look) a plain exit 0 with the complete output."""
    for attempt in range(5):
        (tmp_path / str(attempt)).mkdir()
        out, tmp = folders(tmp_path / str(attempt))
        output = out / "out.parquet"
        args = ["compute", medium_dump, "-o", output, "-q", "--format", "pt"]
        popen = {"cwd": out, "env": child_env(tmp, mplconfig), "stdout": subprocess.PIPE}
        with spawned(args, stderr=subprocess.PIPE, **popen) as process:
            while not output.exists() and process.poll() is None:
                time.sleep(0.0002)
            process.send_signal(signum)
            result = finish(process, args)
        assert_no_crash(result)
        assert "Exception ignored" not in result.stderr, f"a shutdown traceback{result}"
        if result.returncode == 0:
            assert result.stderr == "", f"exit 0 with a message{result}"
        else:
            assert result.returncode == 128 + signum, f"not 128 + N{result}"
            assert len(result.stderr.splitlines()) == 1, f"not one line{result}"


def _catches_signals(pid: int) -> bool:
    """Whether the process has its signal handlers in place (SigCgt holds SIGINT's bit)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize(
    ("signum", "code", "message"),
    [
        (signal.SIGINT, 130, INTERRUPTED),
        (signal.SIGTERM, 143, TERMINATED),
        (signal.SIGHUP, 129, TERMINATED),
    ],
    ids=["SIGINT", "SIGTERM", "SIGHUP"],
)
def test_a_stalled_standard_input_ends_on_a_signal(signum, code, message):
    """A writer that never writes (nor closes) does not hold the run: each signal ends it as
    it ends any run."""
    process = subprocess.Popen(
        [sys.executable, "-m", "advcli", "compare", "-", "-q"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _catches_signals(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # on into the read of standard input
        process.send_signal(signum)
        # Waited for with its input still open (communicate would close it: an end of input,
        # not the stalled writer this is about).
        process.wait(timeout=10)
        stdout, stderr = process.stdout.read(), process.stderr.read()
    finally:
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
    assert (process.returncode, stdout, stderr) == (code, "", message + "\n")


# ---------------------------------------------------------------------------------------------
# E. JSON lines read into an Arrow file in the spool folder (advcli/read/json_translation.py)


@pytest.fixture(scope="module")
def json_dump(tmp_path_factory) -> Path:
    """About 100k rows of 32 tokens as JSON lines (some 60 MB): their reading into the spool
    folder lasts long enough for a signal to land in it."""
    path = tmp_path_factory.mktemp("json") / "rollouts.jsonl"
    pl.from_arrow(sample_table(groups=3_000, rollouts=8, tokens=32, seed=2)).write_ndjson(path)
    return path


def test_a_full_disk_under_the_json_translation_falls_back_to_polars(
    json_dump, mplconfig, tmp_path
):
    """The spool file cannot be written: Polars reads the lines, and the report is the same."""
    out, tmp = folders(tmp_path)
    args = ["compare", json_dump, "-q", "--json", "-"]
    env = child_env(tmp, mplconfig)
    full = run_advcli(args, cwd=out, env=env, preexec=file_size_limit(LIMIT))
    free = run_advcli(args, cwd=out, env=env)

    assert full.returncode == 0 and free.returncode == 0, f"{full}{free}"
    assert_no_crash(full)
    assert json.loads(full.stdout) == json.loads(free.stdout)
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{full}"


@pytest.mark.parametrize(
    ("signum", "code", "message"),
    [(signal.SIGINT, 130, INTERRUPTED), (signal.SIGTERM, 143, TERMINATED)],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_during_the_json_translation(
    signum, code, message, json_dump, mplconfig, tmp_path
):
    """A signal while the lines are being parsed, on a pool's threads: one line, the signal's
    exit code, no crash as the process exits, and the spool folder gone."""
    out, tmp = folders(tmp_path)
    args = ["compute", str(json_dump), "-o", str(out / "out.parquet")]
    popen = {
        "cwd": out,
        "env": child_env(tmp, mplconfig),
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    with spawned(args, **popen) as process:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("advcli-spool-*/json-lines-0.arrow")):
            assert process.poll() is None and time.monotonic() < deadline, "no translation seen"
            time.sleep(0.001)
        process.send_signal(signum)
        result = finish(process, args)

    assert result.returncode == code, f"exit code is not {code}{result}"
    assert result.stderr.splitlines() == [message], f"stderr is not the one line{result}"
    assert_no_crash(result)
    assert listing(out) == set(), f"files left in the output folder{result}"
    assert listing(tmp) == set(), f"files left in $TMPDIR: {listing(tmp)}{result}"


def test_a_null_line_at_the_start_of_a_block_is_an_error_line(mplconfig, tmp_path):
    """Arrow's JSON reader crashes the process on a block whose first line is ``null``: the
    block is left to Polars, which refuses the line as it always did."""
    out, tmp = folders(tmp_path)
    line = '{"data_id": 0, "rollout_id": 0, "reward": 1.0, "pad": "%s"}\n'
    width = 64
    body = line % ("x" * (width - len(line % "")))
    assert len(body) == width and BLOCK_BYTES % width == 0
    path = out / "dump.jsonl"
    path.write_text(body * (BLOCK_BYTES // width) + "null\n" + body)
    result = run_advcli(["inspect", path], cwd=out, env=child_env(tmp, mplconfig))

    assert result.returncode == 1, str(result)
    assert "NDJSON line expected to contain JSON object: null" in error_line(result)
    assert_no_crash(result)

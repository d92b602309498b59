"""Polars' reports of the tasks a Ctrl-C cancelled are kept off standard error; everything else
native code writes there passes unchanged
(advcli._runtime.native_stderr.cancelled_tasks_unreported)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from advcli._runtime.native_stderr import CancelledTaskFilter

# What Polars printed when a Ctrl-C cancelled its streaming Parquet writer (seen in a stress run
# of `compute`), with the blank line the panic hook writes first.
CANCELLED = (
    b"\nthread 'async-executor-1' (9361) panicked at crates/polars-stream/src/nodes/io_sinks/"
    b"writers/parquet/mod.rs:190:29:\n"
    b"called `Result::unwrap()` on an `Err` value: JoinError::Panic(Id(10), "
    b'"__POLARS_ABORT_KEYBOARD_INTERRUPT", ...)\n'
    b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
)
CANCELLED_WITH_BACKTRACE = (
    b"\nthread 'async-executor-0' (10387) panicked at crates/polars-stream/src/nodes/io_sinks/"
    b"writers/parquet/mod.rs:190:29:\n"
    b"called `Result::unwrap()` on an `Err` value: JoinError::Panic(Id(11), "
    b'"__POLARS_ABORT_KEYBOARD_INTERRUPT", ...)\n'
    b"stack backtrace:\n"
    b"   0: __rustc::rust_begin_unwind\n"
    b"   1: core::panicking::panic_fmt\n"
    b"note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n"
)
# A panic that is a bug: it must reach the user.
OTHER_PANIC = (
    b"\nthread '<unnamed>' panicked at crates/polars-core/src/x.rs:1:1:\n"
    b"index out of bounds\n"
    b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
)


def filtered(pieces: list[bytes]) -> bytes:
    unreported = CancelledTaskFilter()
    return b"".join(unreported.feed(piece) for piece in pieces) + unreported.flush()


def in_pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 10_000])
def test_a_cancelled_task_report_is_dropped_with_its_blank_line(size):
    data = b"before\n" + CANCELLED + CANCELLED_WITH_BACKTRACE + b"after\n"
    assert filtered(in_pieces(data, size)) == b"before\nafter\n"


@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_everything_else_passes_unchanged(size):
    data = b"warning: x\n\n\nthreads: 2\nthread 'main' said hi\n" + OTHER_PANIC + b"\n"
    assert filtered(in_pieces(data, size)) == data


def test_a_report_without_its_closing_note_is_decided_when_the_stream_goes_quiet():
    # RUST_BACKTRACE=full prints no closing note.
    cut = CANCELLED_WITH_BACKTRACE.index(b"note: ")
    assert filtered([b"x\n", CANCELLED_WITH_BACKTRACE[:cut]]) == b"x\n"
    unfinished_bug = OTHER_PANIC[: OTHER_PANIC.index(b"note: ")]
    assert filtered([unfinished_bug]) == unfinished_bug


def test_an_unfinished_line_goes_on_at_once():
    # A progress bar redraws its line with a carriage return and no newline.
    unreported = CancelledTaskFilter()
    assert unreported.feed(b"\r 40% writing") == b"\r 40% writing"
    assert unreported.feed(b"\r 80% writing") == b"\r 80% writing"
    assert unreported.feed(b"\n") == b"\n"
    # Only the start of a line that could begin a report waits.
    assert unreported.feed(b"thre") == b""
    assert unreported.flush() == b"thre"


# A real standard error: native code writes to file descriptor 2 (os.write here), in the pieces
# Rust's hook uses, while Python's own writes go through sys.stderr, which the block points
# straight at the real standard error.
WRITER = """
import os, sys, time
from advcli._runtime.native_stderr import cancelled_tasks_unreported

report = {report!r}
with cancelled_tasks_unreported():
    os.write(2, b"native warning\\n")
    sys.stderr.write("python line\\n")
    sys.stderr.flush()
    time.sleep(0.3)
    for piece in report.split(b"\\n")[:-1]:
        os.write(2, piece + b"\\n")
    os.write(2, b"native after\\n")
sys.stderr.write("outside\\n")
"""


@pytest.mark.process
@pytest.mark.parametrize(
    ("report", "expected"),
    [(CANCELLED, b""), (OTHER_PANIC, OTHER_PANIC)],
    ids=["cancelled task", "other panic"],
)
def test_through_a_real_file_descriptor(report, expected):
    result = subprocess.run(
        [sys.executable, "-c", WRITER.format(report=report)], capture_output=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # Python's own lines go straight to standard error, native code's through the filter's
    # thread: each stream keeps its order, not their interleaving.
    lines = result.stderr.splitlines(keepends=True)
    assert lines.count(b"python line\n") == 1, result.stderr
    assert lines[-1] == b"outside\n", result.stderr
    native = b"".join(line for line in lines if line not in (b"python line\n", b"outside\n"))
    assert native == b"native warning\n" + expected + b"native after\n"


@pytest.mark.process
def test_python_still_sees_a_terminal_inside_the_block():
    # The progress bar draws itself only on a terminal, and is drawn while advcli writes.
    script = (
        "import sys\n"
        "from advcli._runtime.native_stderr import cancelled_tasks_unreported\n"
        "with cancelled_tasks_unreported():\n"
        "    print(sys.stderr.isatty())\n"
        "print(sys.stderr.isatty())\n"
    )
    terminal, other_end = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-c", script],
            stderr=other_end,
            capture_output=False,
            stdout=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(other_end)
        os.close(terminal)
    assert result.returncode == 0
    assert result.stdout == b"True\nTrue\n"


def test_a_report_without_a_note_ends_where_the_next_one_begins():
    # Rust writes the closing note for a process's first panic only.
    second = CANCELLED.replace(
        b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n", b""
    )
    data = CANCELLED + second + OTHER_PANIC + b"warning: something important\n"
    assert filtered(in_pieces(data, 3)) == OTHER_PANIC + b"warning: something important\n"


@pytest.mark.process
def test_a_stream_kept_past_the_block_still_writes():
    # rich's progress bar keeps the sys.stderr it found when it started (inside the block) and
    # puts it back when it stops (after the block).
    script = (
        "import sys\n"
        "from advcli._runtime.native_stderr import cancelled_tasks_unreported\n"
        "with cancelled_tasks_unreported():\n"
        "    kept = sys.stderr\n"
        "    sys.stderr = open('/dev/null', 'w')\n"
        "sys.stderr = kept\n"
        "print('after the block', file=sys.stderr, flush=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b"after the block\n"


@pytest.mark.parametrize("cut", [b"   ", b"   1: core::pan"], ids=["indent", "half a frame"])
def test_a_report_cut_mid_line_is_dropped_whole(cut):
    # Rust writes a backtrace's padding a character at a time; when the block ends (or the
    # stream goes quiet) inside a frame's line, that start of a line belongs to the report.
    frames = CANCELLED_WITH_BACKTRACE.index(b"   1: ")
    data = b"before\n" + CANCELLED_WITH_BACKTRACE[:frames] + cut
    assert filtered(in_pieces(data, 1)) == b"before\n"
    assert filtered([data]) == b"before\n"
    # A report that is a bug reaches the user with its last line as far as it came.
    bug = OTHER_PANIC[: OTHER_PANIC.index(b"note: ")] + cut
    assert filtered(in_pieces(bug, 1)) == bug


# A cancelled task that goes on writing its backtrace while an interrupted block ends.
STILL_REPORTING = """
import os, signal, sys, threading
from advcli._runtime.native_stderr import cancelled_tasks_unreported
from advcli._runtime.signals import handle_signals, held

report = {report!r}
head = report[: report.index(b"   0: ")]
handle_signals()
started, stop = threading.Event(), threading.Event()

def task():
    os.write(2, head)
    started.set()
    while not stop.is_set():
        os.write(2, b"   1: core::panicking::panic_fmt\\n")

writer = threading.Thread(target=task)
try:
    with cancelled_tasks_unreported():
        writer.start()
        started.wait()
        with held():
            os.kill(os.getpid(), signal.SIGINT)
except KeyboardInterrupt:
    pass
stop.set()
writer.join()
sys.stderr.write("after\\n")
"""


@pytest.mark.process
def test_an_interrupted_block_sends_native_stderr_nowhere_but_to_null():
    result = subprocess.run(
        [sys.executable, "-c", STILL_REPORTING.format(report=CANCELLED_WITH_BACKTRACE)],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == b"after\n"

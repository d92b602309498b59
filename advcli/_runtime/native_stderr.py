"""Native code's standard error: Polars' reports of the tasks a Ctrl-C cancelled kept off it.

Polars cancels a running query on SIGINT by making its tasks panic; its own panic hook keeps
that quiet, but its streaming Parquet writer unwraps the cancelled task's result and panics again
with a message of its own, which the hook prints, sometimes after the query has returned (seen
after the run's last line). Native code writes such a report to file descriptor 2, so that is
where :func:`cancelled_tasks_unreported` filters, and :func:`native_stderr_to_null` closes it
once a run is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from advcli._runtime.signals import held, received_signal

# The first line of a Rust panic report (the standard library's hook), which a blank line comes
# before: "thread '<name>' panicked at", with the thread's id in brackets since Rust 1.89.
_PANIC_LINE = re.compile(rb"thread '[^'\n]*'(?: \(\d+\))? panicked at ")
_REPORT_PREFIX = b"thread '"
# The task a Polars query cancelled on Ctrl-C panics with this payload; a task waiting on it may
# then panic in turn, and its report quotes the payload.
POLARS_CANCEL_MARKER = b"__POLARS_ABORT_KEYBOARD_INTERRUPT"
# A panic report ends with a "note: ..." line, or where the next one begins; the note comes with
# a process's first panic only, and never with RUST_BACKTRACE=full: a report also ends when nothing
# more comes for this long.
_QUIET_SECONDS = 0.2


@contextlib.contextmanager
def cancelled_tasks_unreported() -> Iterator[None]:
    """Standard error passes through a filter for the block that drops Polars' reports of tasks
    a Ctrl-C cancelled and passes everything else on unchanged: file descriptor 2 becomes a
    pipe, read by a thread that forwards to the real standard error (measured: 6 of 150 Ctrl-Cs
    at random moments of a `compute` ended in such a panic). When the block ends after a signal,
    native code's standard error stays closed to the end of the run."""
    python_stderr = sys.stderr
    try:
        python_stderr.flush()
        real = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no standard error to filter
        yield
        return
    read_end, write_end = os.pipe()
    forwarder = threading.Thread(
        target=_forward_stderr, args=(read_end, real), name="advcli-stderr", daemon=True
    )
    # Python's own writes (the progress bar among them) go straight to the real standard error,
    # a terminal still answering isatty() as one. On a descriptor of its own, closed with the
    # stream: the progress bar may hold the stream past the block and put it back in sys.stderr
    # when it stops.
    own_stream = _text_stream(os.dup(real), python_stderr)
    try:
        # Held: a Ctrl-C between the steps that move file descriptor 2 is raised once they are
        # done, where the teardown below undoes them.
        with held():
            forwarder.start()
            os.dup2(write_end, 2)
            os.close(write_end)
            sys.stderr = own_stream
        yield
    finally:
        with held():
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            if sys.stderr is own_stream:  # else the progress bar put its own there meanwhile
                sys.stderr = python_stderr
                own_stream.close()
            # Either way the pipe's last write end closes: the forwarder reads to its end.
            if received_signal() is None or _NATIVE_STDERR_SILENCED:
                os.dup2(real, 2)
            else:
                # Straight to /dev/null, not through the real standard error first: a cancelled
                # task still writing its backtrace meanwhile reached the terminal.
                _native_stderr_to_null(os.dup(real))
            forwarder.join(timeout=5)
            os.close(real)
        if received_signal() is not None:
            # The cancelled tasks may report after the query has returned, up to the
            # interpreter's shutdown (seen: after the run's last line).
            native_stderr_to_null()


def _text_stream(fd: int, like: TextIO) -> TextIO:
    """A line-buffered text stream on ``fd``, which it owns, with ``like``'s encoding."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    return open(fd, "w", encoding=encoding, errors="backslashreplace", buffering=1)


def native_stderr_to_null() -> None:
    """Send native code's writes to standard error (file descriptor 2) to ``/dev/null`` for the
    rest of the process, and Python's own (``sys.stderr``) on to the real standard error: once a
    run is interrupted, all a native library has left to say is that its tasks were cancelled."""
    if _NATIVE_STDERR_SILENCED:
        return
    try:
        real = os.dup(2)
    except OSError:  # no standard error at all
        return
    _native_stderr_to_null(real)


def _native_stderr_to_null(real: int) -> None:
    """:func:`native_stderr_to_null` with ``real``, a descriptor of the real standard error that
    Python's stream takes over."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
    sys.stderr = _text_stream(real, sys.stderr)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    _NATIVE_STDERR_SILENCED.append(True)


_NATIVE_STDERR_SILENCED: list[bool] = []


def _forward_stderr(read_end: int, real: int) -> None:
    unreported = CancelledTaskFilter()
    # poll, not select: select cannot wait on a descriptor numbered 1024 or more.
    readable = select.poll()
    readable.register(read_end, select.POLLIN)
    try:
        while True:
            waiting = unreported.holds_back()
            ready = readable.poll(_QUIET_SECONDS * 1000 if waiting else None)
            if not ready:  # quiet: what was held back is complete
                _write_all(real, unreported.flush())
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:  # the end of the block
                _write_all(real, unreported.flush())
                return
            _write_all(real, unreported.feed(chunk))
    finally:
        os.close(read_end)


class CancelledTaskFilter:
    """A stream filter, line by line, that drops each panic report quoting
    :data:`POLARS_CANCEL_MARKER` with the blank line before it. A report is held back until its
    closing ``note:`` line or :meth:`flush`; so are a blank line and the start of a line that
    could begin a report. Everything else goes on as it comes, incomplete lines too (a progress
    bar redraws its line without ending it)."""

    def __init__(self) -> None:
        self._partial = b""  # the start of a line, held back
        self._mid_line = False  # the start of the current line went on already
        self._blank = False  # a blank line, held back
        self._report: list[bytes] | None = None

    def holds_back(self) -> bool:
        return bool(self._partial or self._blank or self._report is not None)

    def feed(self, data: bytes) -> bytes:
        out = []
        lines = (self._partial + data).split(b"\n")
        self._partial = b""
        for line in lines[:-1]:
            out.append(self._line(line + b"\n"))
        last = lines[-1]
        if last:
            if self._mid_line or not (
                self._report is not None or self._blank or _REPORT_PREFIX.startswith(last[:8])
            ):
                out.append(last)
                self._mid_line = True
            else:
                self._partial = last
        return b"".join(out)

    def flush(self) -> bytes:
        cut = self._partial
        if self._report is not None:
            # The start of a line inside a report is the report's: Rust writes a backtrace's
            # padding a character at a time, and a lone space on stderr once outlived the
            # cancelled task's report it came from.
            self._report.append(cut)
            out = self._end_report()
        else:
            out = (b"\n" if self._blank else b"") + cut
        self._mid_line = self._mid_line or bool(cut)
        self._blank, self._partial = False, b""
        return out

    def _line(self, line: bytes) -> bytes:
        if self._mid_line:
            self._mid_line = False
            return line
        if self._report is not None and _PANIC_LINE.match(line):
            # Another report begins: Rust writes the closing note for a process's first panic
            # only, so the one before may have none. The blank line before this one is its own.
            self._blank = self._report[-1] == b"\n"
            if self._blank:
                self._report.pop()
            earlier = self._end_report()
            return earlier + self._line(line)
        if self._report is not None:
            self._report.append(line)
            return self._end_report() if line.startswith(b"note: ") else b""
        if _PANIC_LINE.match(line):
            self._report = [b"\n" if self._blank else b"", line]
            self._blank = False
            return b""
        if line == b"\n":
            earlier, self._blank = (b"\n" if self._blank else b""), True
            return earlier
        earlier, self._blank = (b"\n" if self._blank else b""), False
        return earlier + line

    def _end_report(self) -> bytes:
        report = b"".join(self._report or [])
        self._report = None
        return b"" if POLARS_CANCEL_MARKER in report else report


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data) :]
        except OSError:  # standard error went away: nothing to tell it
            return

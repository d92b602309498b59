"""What the process meets at its edges: closed standard streams, broken pipes, what native code
prints on standard error, threads and memory (signals: :mod:`advcli.signals`).

A process may start with standard input, output or error closed (``advcli … >&-``). The next file
it opens would then take that descriptor, and anything written to "standard output" — by advcli,
or by a native library printing a warning — would land in that file. :func:`guard_standard_streams`
puts ``/dev/null`` on every closed one first and remembers which were closed, so that a command
that needs one says so instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import select
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from advcli.errors import AdvcliError
from advcli.signals import received_signal

if TYPE_CHECKING:
    from typing import BinaryIO, TextIO

_CLOSED: set[int] = set()


def guard_standard_streams() -> None:
    """Put ``/dev/null`` on standard input, output and error where they are closed."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        _CLOSED.add(fd)
        setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (lives as long as sys)


def stdin_closed() -> bool:
    return 0 in _CLOSED


def stdout_closed() -> bool:
    return 1 in _CLOSED


def require_stdout(purpose: str) -> None:
    """Refuse to write ``purpose`` to a standard output that was closed."""
    if stdout_closed():
        raise AdvcliError(f"standard output is closed; cannot write {purpose} there")


def copy_to_stdout(source: BinaryIO) -> None:
    """Copy a finished result to standard output. A reader that went away (a broken pipe) ends
    the copy with ``BrokenPipeError``, which the command line ends quietly; any other failure is
    an error."""
    require_stdout("the output")
    while chunk := source.read(COPY_CHUNK):
        _write_stdout(chunk, "the output")


def write_stdout_text(text: str, purpose: str) -> None:
    """Write text (a JSON report) to standard output, as :func:`copy_to_stdout` does bytes."""
    require_stdout(purpose)
    _write_stdout(text.encode("utf-8"), purpose)


COPY_CHUNK = 1 << 20


class StdoutText:
    """A text stream onto standard output that writes every byte or raises (for rich's console):
    a terminal report cut short by a full disk is an error, not a silent exit 0."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        _write_stdout(text.encode("utf-8"), "the report")
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered here."""

    def isatty(self) -> bool:
        return os.isatty(1)

    def fileno(self) -> int:
        return 1


def _write_stdout(data: bytes, purpose: str) -> None:
    # Until every byte is taken: standard output's buffer can report a short write (a full disk,
    # a file-size limit) by its return value alone, which a text write drops, so the output would
    # be cut without an error. Writing the rest makes the system say why it stopped.
    sys.stdout.flush()
    binary = sys.stdout.buffer
    view = memoryview(data)
    try:
        while view:
            taken = binary.write(view)
            if not taken:
                raise OSError(errno.EIO, "the write took no bytes")
            view = view[taken:]
        binary.flush()
    except BrokenPipeError:
        raise
    except OSError as error:
        # What the buffer still holds cannot be written either; the interpreter's flush at exit
        # would fail on it again and print a second message.
        silence_stdout()
        raise AdvcliError(
            f"standard output: cannot write {purpose} ({error.strerror or type(error).__name__})"
        ) from None


def silence_stdout() -> None:
    """After a broken pipe or a failed write: point standard output at ``/dev/null``, so that the
    interpreter's last flush at exit does not fail on it again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


def available_memory() -> int:
    """Bytes of memory this process can still use: what the machine has free (MemAvailable where
    Linux tells it), or less under a cgroup's limit (a container's)."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    return min(free, _cgroup_room())


def _cgroup_room() -> int:
    """What the process's memory cgroup limit leaves (limit − usage; v2 and v1), unbounded
    without one."""
    unbounded = 1 << 62
    try:
        with open("/proc/self/cgroup", encoding="ascii") as cgroups:
            lines = [line.strip().split(":", 2) for line in cgroups if line.strip()]
    except OSError:
        return unbounded
    candidates = []
    for _, controllers, path in lines:
        if controllers == "":  # v2: one unified hierarchy
            candidates.append((f"/sys/fs/cgroup{path}", "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            folder = f"/sys/fs/cgroup/memory{path}"
            candidates.append((folder, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    room = unbounded
    for folder, limit_name, usage_name in candidates:
        try:
            with open(f"{folder}/{limit_name}", encoding="ascii") as limit:
                text = limit.read().strip()
            with open(f"{folder}/{usage_name}", encoding="ascii") as usage:
                used = int(usage.read())
            if text != "max":
                room = min(room, max(0, int(text) - used))
        except (OSError, ValueError):
            continue
    return room


def flush_stdout() -> str | None:
    """Flush standard output before exit; the reason it failed, if it did (``None`` also for a
    reader that went away, which ends quietly)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as error:
        silence_stdout()
        return error.strerror or type(error).__name__
    return None


def use_threads(threads: int | None) -> None:
    """Size Polars' and Arrow's thread pools. Polars reads its setting once, when it is first
    imported: call this before that."""
    if threads is not None:
        os.environ["POLARS_MAX_THREADS"] = str(threads)
        import pyarrow

        pyarrow.set_cpu_count(threads)


def tune_allocator() -> None:
    """Have both allocators give freed memory back soon (a value the user set wins). Must run
    before Polars loads.

    - Polars' jemalloc: after half a second. It keeps freed memory for 10 s by default, longer
      than a stage lasts, so the statistics' scratch memory was still held while the write filled
      Arrow's (a different allocator): peak memory grew with the rows. Measured at no cost in
      speed.
    - The C library's malloc, which serves numpy: every block of 128 KiB or more gets pages of its
      own, returned when freed. glibc otherwise raises that threshold to the size of the last big
      block freed (up to 32 MiB), and the index's and the sums' arrays of a million values then
      come from its heap, which keeps them once freed. See :func:`_map_large_blocks`.
    """
    os.environ.setdefault(
        "_RJEM_MALLOC_CONF", "background_thread:true,dirty_decay_ms:500,muzzy_decay_ms:0"
    )
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        _map_large_blocks()


# glibc's mallopt parameter for the size from which a block is mapped on its own (malloc.h).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def _map_large_blocks() -> None:
    """Fix glibc's mmap threshold at its initial 128 KiB, which also turns its adjustment off.
    Measured on 4.3 M rows: ``compare`` peaks some 50 MiB lower; nothing where the C library
    is not glibc (``mallopt`` is missing, or a no-op as in musl)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


# The first line of a Rust panic report (the standard library's hook), which a blank line comes
# before: "thread '<name>' panicked at", with the thread's id in brackets since Rust 1.89.
_PANIC_LINE = re.compile(rb"thread '[^'\n]*'(?: \(\d+\))? panicked at ")
_REPORT_PREFIX = b"thread '"
# The task a Polars query cancelled on Ctrl-C panics with this payload; a task waiting on it may
# then panic in turn, and its report quotes the payload.
POLARS_CANCEL_MARKER = b"__POLARS_ABORT_KEYBOARD_INTERRUPT"
# A panic report ends with a "note: ..." line; with RUST_BACKTRACE=full it has none, and ends when
# nothing more comes for this long.
_QUIET_SECONDS = 0.2


@contextlib.contextmanager
def cancelled_tasks_unreported() -> Iterator[None]:
    """Standard error passes through a filter for the block that drops Polars' reports of tasks
    a Ctrl-C cancelled, and passes everything else on unchanged.

    Polars cancels a running query on SIGINT by making its tasks panic; its own hook keeps that
    quiet, but its streaming Parquet writer unwraps the cancelled task's result and panics again
    with a message of its own, which the hook prints: a run interrupted while writing could end
    with a Rust panic on the terminal (6 of 150 Ctrl-Cs at random moments of a `compute`). Native
    code writes the report to file descriptor 2, so the filter sits there: a pipe, read by a
    thread that forwards to the real standard error. When the block ends in a Ctrl-C, native
    code's standard error stays away from the terminal to the end of the run
    (:func:`native_stderr_to_null`).
    """
    python_stderr = sys.stderr
    try:
        python_stderr.flush()
        real = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no standard error to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(
        target=_forward_stderr, args=(read_end, real), name="advcli-stderr", daemon=True
    )
    forwarder.start()
    # Python's own writes (the progress bar among them) go straight to the real standard
    # error, a terminal still answering isatty() as one.
    sys.stderr = _text_stream(real, python_stderr, closefd=False)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        sys.stderr = python_stderr
        os.dup2(real, 2)  # the pipe's last write end closes: the forwarder reads to its end
        forwarder.join(timeout=5)
        os.close(real)
        if received_signal() is not None:
            # The cancelled tasks may report after the query has returned, up to the
            # interpreter's shutdown (seen: after the run's last line).
            native_stderr_to_null()


def _text_stream(fd: int, like: TextIO, *, closefd: bool) -> TextIO:
    """A line-buffered text stream on ``fd`` with ``like``'s encoding."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    return open(fd, "w", encoding=encoding, errors="backslashreplace", buffering=1, closefd=closefd)


def native_stderr_to_null() -> None:
    """Send native code's writes to standard error (file descriptor 2) to ``/dev/null`` for the
    rest of the process, and Python's own (``sys.stderr``) on to the real standard error: once a
    run is interrupted, all a native library has left to say is that its tasks were cancelled."""
    if _NATIVE_STDERR_SILENCED:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
    try:
        real = os.dup(2)
    except OSError:  # no standard error at all
        return
    sys.stderr = _text_stream(real, sys.stderr, closefd=True)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    _NATIVE_STDERR_SILENCED.append(True)


_NATIVE_STDERR_SILENCED: list[bool] = []


def _forward_stderr(read_end: int, real: int) -> None:
    unreported = CancelledTaskFilter()
    try:
        while True:
            waiting = unreported.holds_back()
            ready, _, _ = select.select([read_end], [], [], _QUIET_SECONDS if waiting else None)
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
        out = self._end_report() if self._report is not None else b""
        out += (b"\n" if self._blank else b"") + self._partial
        self._mid_line = self._mid_line or bool(self._partial)
        self._blank, self._partial = False, b""
        return out

    def _line(self, line: bytes) -> bytes:
        if self._mid_line:
            self._mid_line = False
            return line
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

"""What the process meets at its edges: closed standard streams, broken pipes, threads and
memory (signals: :mod:`advcli._runtime.signals`; native code's standard error:
:mod:`advcli._runtime.native_stderr`).

A process may start with standard input, output or error closed (``advcli … >&-``). The next file
it opens would then take that descriptor, and anything written to "standard output" — by advcli,
or by a native library printing a warning — would land in that file. :func:`guard_standard_streams`
puts ``/dev/null`` on every closed one first and remembers which were closed, so that a command
that needs one says so instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import TYPE_CHECKING

from advcli.errors import AdvcliError

if TYPE_CHECKING:
    from typing import BinaryIO

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


def drop_bad_thread_count(most: int) -> str | None:
    """Remove a ``POLARS_MAX_THREADS`` that is not a whole number from 1 to ``most`` (Polars
    panics on 0 and would start any number of threads) and say so; call it before Polars loads."""
    value = os.environ.get("POLARS_MAX_THREADS")
    if value is None:
        return None
    try:
        if 1 <= int(value) <= most:
            return None
    except ValueError:
        pass
    del os.environ["POLARS_MAX_THREADS"]
    return (
        f"advcli: ignoring POLARS_MAX_THREADS={value!r} (not a whole number from 1 to {most}); "
        "using all cores"
    )


def use_threads(threads: int | None) -> None:
    """Size Polars' and Arrow's thread pools, this process's and its workers' (which read them
    from the environment: Arrow's from OpenMP's thread count, unless the user set one). Polars
    reads its setting once, when it is first imported: call this before that."""
    if threads is not None:
        os.environ["POLARS_MAX_THREADS"] = str(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import pyarrow

        pyarrow.set_cpu_count(threads)


def load_numpy_bridge() -> None:
    """Have Polars reach numpy's C API now (call it with signals held): it does so at its first
    conversion to numpy, where it runs numpy's Python code (the version check) from Rust, and a
    Ctrl-C raised inside that code is a panic of Polars' (exit 1, a traceback), not an
    interrupt. Later conversions run no Python code."""
    import polars as pl

    pl.Series([0.0]).to_numpy()


def threads_per_job(jobs: int, threads: int | None) -> int | None:
    """The threads each of ``jobs`` processes runs: ``threads`` if given; else, for more than
    one job, the cores shared among them (one at least), unless the user set
    ``POLARS_MAX_THREADS``; None for every core. Jobs that each took every core would
    contend for them: their threads wait for each other."""
    if threads is not None or jobs == 1 or "POLARS_MAX_THREADS" in os.environ:
        return threads
    # The cores this process may run on, where the system says (Linux), else the machine's.
    getaffinity = getattr(os, "sched_getaffinity", None)
    cores = len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1
    return max(1, cores // jobs)


def single_blas_thread() -> None:
    """Have numpy's OpenBLAS start no thread pool (a value the user set wins). Must run before
    numpy loads. advcli makes no BLAS call (a matrix product's worker threads would spin a core
    on after it), and the pool OpenBLAS starts as numpy loads, one thread per core, spins while
    the rest of the program imports."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def tune_allocator() -> None:
    """Have both allocators give freed memory back soon (a value the user set wins). Must run
    before Polars loads.

    - Polars' jemalloc: after half a second. It keeps freed memory for 10 s by default, longer
      than a stage lasts, so the statistics' scratch memory was still held while the write filled
      Arrow's (a different allocator): peak memory grew with the rows.
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
    It lowers ``compare``'s peak (docs/performance.md); nothing where the C library is not
    glibc (``mallopt`` is missing, or a no-op as in musl)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)

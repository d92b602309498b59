"""Standard input (``-``), copied to a file named for the format its first bytes tell, since
the data flow reads its input twice."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable
from pathlib import Path

from advcli._runtime.process import stdin_closed
from advcli.errors import AdvcliError
from advcli.read.formats import IPC_FILE_MAGIC, IPC_STREAM_MARKER

# What may come before the first '{' of JSON lines: white space and a UTF-8 byte-order mark.
UTF8_BOM = b"\xef\xbb\xbf"
JSON_BLANK = b" \t\r\n" + UTF8_BOM
# How far into standard input to look for that '{'.
SNIFF_LIMIT = 1 << 16
# How long a read waits for standard input before it lets a signal's handler run, and how much
# one read takes.
WAIT_SECONDS = 0.2
CHUNK = 1 << 20


def spool_stdin(folder: Path) -> Path:
    """Copy standard input to a file in ``folder``, named for its format, which its first bytes
    tell: ``PAR1`` Parquet, ``ARROW1`` an Arrow IPC file, an IPC stream's continuation marker a
    stream, a ``{`` after any blank space JSON lines."""
    if stdin_closed():
        raise AdvcliError("<stdin>: standard input is closed")
    read = _reader()
    head = _read_exactly(read, 8)
    if not head:
        raise AdvcliError("<stdin>: standard input is empty")
    # JSON lines may start with blank lines or a byte-order mark: read on to the first other byte.
    while not head.lstrip(JSON_BLANK) and len(head) < SNIFF_LIMIT:
        more = _read_exactly(read, 8)
        if not more:
            break
        head += more
    name = (
        "stdin.parquet"
        if head.startswith(b"PAR1")
        else "stdin.arrow"
        if head.startswith(IPC_FILE_MAGIC)
        else "stdin.arrows"
        if head.startswith(IPC_STREAM_MARKER)
        else "stdin.jsonl"
        if head.lstrip(JSON_BLANK).startswith(b"{")
        else None
    )
    if name is None:
        raise AdvcliError(
            "<stdin>: not Parquet, an Arrow IPC stream or JSON lines (checked the first bytes)"
        )
    path = folder / name
    with path.open("wb") as sink:
        # Polars' JSON reader takes no byte-order mark.
        sink.write(head.removeprefix(UTF8_BOM) if name == "stdin.jsonl" else head)
        while chunk := read(CHUNK):
            sink.write(chunk)
    return path


def _reader() -> Callable[[int], bytes]:
    """How standard input is read: up to N bytes a call (none at its end). From its descriptor,
    a writer that stalls never holds the run: the wait is cut into :data:`WAIT_SECONDS`,
    between which Python runs a signal's handler (Ctrl-C, and SIGTERM or SIGHUP, which reach
    this thread only as a request to run it). A standard input with no descriptor (replaced by
    a caller in this process) is read as it is."""
    try:
        source = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return sys.stdin.buffer.read

    def read(size: int) -> bytes:
        while not select.select([source], [], [], WAIT_SECONDS)[0]:
            pass
        return os.read(source, size)

    return read


def _read_exactly(read: Callable[[int], bytes], size: int) -> bytes:
    """``size`` bytes, fewer only at the end."""
    data = b""
    while len(data) < size and (more := read(size - len(data))):
        data += more
    return data

"""File names that are not UTF-8: how messages show them and how Polars and Arrow open them.

On Linux a file name is bytes. Python holds each byte of a name that does not decode as UTF-8
as a lone surrogate (U+DC80 to U+DCFF, PEP 383), so ``b"dump-\\xff.parquet"`` is the text
``"dump-\\udcff.parquet"``: Python's own file functions take it, but no UTF-8 stream (a
terminal line, a JSON report) can write it, and Polars and Arrow, which take paths as UTF-8
text only, fail on it. Messages show such a byte as its escape (``dump-\\xff.parquet``); the
native readers and writers get ``/proc/self/fd/N`` of a descriptor opened here instead.

No Polars or Arrow here: the command line and ``advcli sample`` use it too.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

from advcli.errors import AdvcliError

NOT_UTF8_ESCAPES = {0xDC00 + byte: f"\\x{byte:02x}" for byte in range(0x80, 0x100)}
# Where an open descriptor can be opened again by name (Linux).
OPEN_FILE_NAME = "/proc/self/fd/{}"


def printable(text: str) -> str:
    """``text`` with the bytes of a name that is not UTF-8 written as escapes (``\\xff``)."""
    return text.translate(NOT_UTF8_ESCAPES)


def shown_path(path: Path | str) -> str:
    """A path as messages and reports show it (:func:`printable`)."""
    return printable(str(path))


def is_utf8(path: Path | str) -> bool:
    """Whether a path is UTF-8 text (else Python holds some of its bytes as surrogates)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class NativeNames:
    """The names Polars and Arrow open input files by (``names``, in the order of ``files``).

    A file whose path is not UTF-8 is opened here and read through ``/proc/self/fd/N``, its
    descriptor held open as long as this object lives; any other file goes by its own path.
    """

    def __init__(self, files: Sequence[Path], labels: Sequence[str]) -> None:
        self._descriptors: list[int] = []
        # Also when a later file cannot be opened: the ones opened so far are closed.
        weakref.finalize(self, _close_all, self._descriptors)
        names = []
        for path, label in zip(files, labels, strict=True):
            if is_utf8(path):
                names.append(str(path))
                continue
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as error:
                raise AdvcliError(f"{label}: cannot read the file ({error.strerror})") from None
            self._descriptors.append(descriptor)
            names.append(_reopenable(descriptor, label))
        self.names = tuple(names)


@contextlib.contextmanager
def native_name(path: Path) -> Iterator[str]:
    """The name Polars and Arrow can write the existing file ``path`` by, for the length of the
    block (as :class:`NativeNames` reads).

    A named pipe is held open for writing through the block: Polars opens its output twice (to
    create it, then to write it), and a reader that took the first close for the end of the
    data would be gone, leaving the second open to wait for a reader forever.
    """
    utf8 = is_utf8(path)
    if utf8 and not path.is_fifo():
        yield str(path)
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        yield str(path) if utf8 else _reopenable(descriptor, shown_path(path))
    finally:
        os.close(descriptor)


def _reopenable(descriptor: int, label: str) -> str:
    name = OPEN_FILE_NAME.format(descriptor)
    if not os.path.exists(name):
        raise AdvcliError(
            f"{label}: the path is not UTF-8, which Polars and Arrow cannot open, and /proc is "
            "not mounted to open it by its descriptor; rename it"
        )
    return name


def _close_all(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            os.close(descriptor)

"""JSON lines written as they come (``watch --jsonl``): each line whole and flushed, so that a
reader of the file sees every step reported and no half line.

The file is new: with ``--force`` an existing one is replaced by renaming a new file over its
name, never truncated in place, so that a file the path is another name of (a hard link to an
input) keeps its bytes. A device or a named pipe (``/dev/null``, a FIFO a reader tails) takes
the lines as they are written.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from advcli._runtime.signals import held
from advcli.errors import AdvcliError, UsageError
from advcli.write.atomic import writes_in_place


class JsonLines:
    """Where the JSON lines go: standard output (``-``), a new file, a device or a pipe, or
    nowhere (None). Entered, it gives the function that writes one line."""

    def __init__(self, path: Path | None, force: bool) -> None:
        self.path, self.force = path, force
        self.handle: IO[str] | None = None

    def __enter__(self) -> Callable[[str], None] | None:
        if self.path is None:
            return None
        if str(self.path) == "-":
            self.handle = sys.stdout
            return self._write
        try:
            if writes_in_place(self.path):
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            elif self.force:
                descriptor = _replacing(self.path)
            else:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            raise AdvcliError(f"{self.path}: the file exists; pass --force to replace it") from None
        except OSError as error:
            raise AdvcliError(f"{self.path}: cannot write ({error.strerror})") from None
        self.handle = open(descriptor, "w", encoding="utf-8")
        return self._write

    def _write(self, line: str) -> None:
        assert self.handle is not None
        try:
            with held():
                self.handle.write(line)
                self.handle.flush()
        except BrokenPipeError:  # the reader went away: the command line ends quietly
            raise
        except OSError as error:  # a full disk, a file-size limit
            where = "standard output" if self.handle is sys.stdout else self.path
            raise AdvcliError(f"{where}: cannot write ({error.strerror})") from None

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None and self.handle is not sys.stdout:
            self.handle.close()


def _replacing(path: Path) -> int:
    """A new empty file renamed over ``path`` (a link at ``path`` is replaced, not followed),
    open for writing."""
    beside = path.parent / f".{path.name}.{os.getpid()}.advcli-lines"
    descriptor = os.open(beside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.replace(beside, path)
    except OSError:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            beside.unlink()
        raise
    return descriptor


def check_lines_path(path: Path, folder: Path) -> None:
    """Refuse a lines file that is in the watched ``folder`` (where it would be read as a step
    file), by its own name or the one a link leads to, or that is one of the folder's files
    under another name (a hard link, a link from outside): writing would change an input.
    Files are compared by device and inode."""
    places = {Path(os.path.abspath(path)).parent, path.resolve().parent}
    inside = folder.resolve()
    if any(place == inside or inside in place.parents for place in places):
        raise UsageError(f"--jsonl {path} is inside the watched folder; write it elsewhere")
    try:
        info = os.stat(path)
    except OSError:
        return  # a new file
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):  # removed meanwhile
                held_file = os.stat(os.path.join(parent, name))
                if (held_file.st_dev, held_file.st_ino) == (info.st_dev, info.st_ino):
                    raise AdvcliError(
                        f"{path}: it is {os.path.join(parent, name)} of the watched folder "
                        "under another name (the same file); write the lines elsewhere"
                    )

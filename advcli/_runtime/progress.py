"""How many input rows the readers have to read and have read, for the command line's progress
bar.

advcli's own sources (:mod:`advcli.read.scan`: Parquet and Arrow streams, the inputs of stage 1
and stage 3) say here how many rows a scan is to read when it starts and how many it has read as
each batch is decoded; the command line listens (:func:`listening`) and draws a bar with an ETA on
a terminal. With no listener nothing is kept. Polars' own readers (JSON lines, Arrow IPC files)
say nothing: their stages show no count. Scans run on Polars' threads: a listener takes calls
from any thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class RowListener(Protocol):
    def to_read(self, rows: int) -> None:
        """A scan starts that reads ``rows`` rows."""

    def read(self, rows: int) -> None:
        """A scan has read ``rows`` more rows (or given up reading them)."""


_listener: RowListener | None = None


def to_read(rows: int) -> None:
    """Say that a scan starts that reads ``rows`` rows."""
    if _listener is not None:
        _listener.to_read(rows)


def read(rows: int) -> None:
    """Say that a scan has read ``rows`` more rows."""
    if _listener is not None and rows:
        _listener.read(rows)


@contextlib.contextmanager
def listening(listener: RowListener) -> Iterator[None]:
    """Tell ``listener`` of the rows the scans read while the block runs."""
    global _listener
    _listener = listener
    try:
        yield
    finally:
        _listener = None

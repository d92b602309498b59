"""Writing a report's documents to their files, atomically: the text or bytes the report room
made (:mod:`advcli.report.documents`, :mod:`advcli.report.figure`), as they are."""

from __future__ import annotations

from pathlib import Path

from advcli.write.atomic import atomic_output


def write_text(path: Path, text: str, *, force: bool = False) -> None:
    """Write a report file atomically (a reader never sees half of it)."""
    with atomic_output(path, force=force) as partial:
        partial.write_text(text, encoding="utf-8")


def write_bytes(path: Path, data: bytes, *, force: bool = False) -> None:
    """Write a binary report file (the figure's PNG) atomically."""
    with atomic_output(path, force=force) as partial:
        partial.write_bytes(data)

"""Writing a report's documents to their files, atomically: the text or bytes the report room
made (:mod:`advcli.report.documents`, :mod:`advcli.report.figure`), as they are. ``-`` is
standard output, which gets the document whole, as it is already in memory."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from advcli._runtime.process import copy_to_stdout, write_stdout_text
from advcli.errors import AdvcliError
from advcli.read.inputs import STDIN
from advcli.write.atomic import atomic_output
from advcli.write.outputs import goes_to_stdout


def write_text(path: Path, text: str, *, force: bool = False) -> None:
    """Write a report file atomically (a reader never sees half of it)."""
    if str(path) == STDIN:
        write_stdout_text(text, "the report")
        return
    with atomic_output(path, force=force) as partial:
        partial.write_text(text, encoding="utf-8")


def write_reports(writers: Sequence[tuple[Path | None, Callable[[Path], None]]]) -> None:
    """Write each report file given (a path, or None for none, and what writes it), in order,
    the one on standard output last (a failure before it sends nothing down the pipe); an
    error names the ones written."""
    written: list[Path] = []
    for path, write in sorted(writers, key=lambda writer: goes_to_stdout(writer[0])):
        if path is None:
            continue
        try:
            write(path)
        except AdvcliError as error:
            done = f"; {', '.join(map(str, written))} was written" if written else ""
            raise AdvcliError(f"{error}{done}") from None
        written.append(path)


def write_bytes(path: Path, data: bytes, *, force: bool = False) -> None:
    """Write a binary report file (the figure's PNG) atomically."""
    if str(path) == STDIN:
        copy_to_stdout(io.BytesIO(data))
        return
    with atomic_output(path, force=force) as partial:
        partial.write_bytes(data)


@dataclass(frozen=True)
class ReportFiles:
    """The files ``compare`` writes its report to (each optional; ``-`` is standard output, for
    one of them at most)."""

    json: Path | None = None
    markdown: Path | None = None
    plot: Path | None = None
    html: Path | None = None

    def __post_init__(self) -> None:
        # A name given as text is that file (``ReportFiles(json="report.json")``).
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, item.name, Path(value))

    def options(self) -> dict[str, Path | None]:
        """Each file by the option that names it on the command line (``--json``, …)."""
        return {f"--{field.name}": getattr(self, field.name) for field in fields(self)}

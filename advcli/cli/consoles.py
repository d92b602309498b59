"""The two consoles: stderr for summaries, progress and reports beside data on stdout; stdout
for reports, where every byte is written or the run fails."""

from __future__ import annotations

from rich.console import Console

from advcli._runtime.process import StdoutText

stderr = Console(stderr=True, highlight=False)


class _StdoutConsole(Console):
    """A console whose reader going away ends the command quietly (exit 141), as ``-o -`` and
    ``--json -`` do; rich would exit 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def stdout() -> Console:
    """The console for reports on standard output; every byte is written or the run fails."""
    return _StdoutConsole(file=StdoutText(), highlight=False)  # type: ignore[arg-type]

"""The one exception type advcli raises for bad input (and its kinds).

Every kind survives pickling (a ``--jobs`` worker's or a Ray task's error reaches the parent
whole): one that takes arguments of its own rebuilds itself from them (``__reduce__``).

The library raises :class:`AdvcliError` with a message that names the file, column and row (or
trajectory key) at fault; only ``advcli.cli.exits`` turns it into ``Error: …`` and an exit code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class AdvcliError(Exception):
    """Bad input or an impossible request; the message is shown to the user as is."""


class UsageError(AdvcliError):
    """Settings or options that do not fit together (the command line exits 2, not 1)."""


class SettingsError(UsageError, ValueError):
    """Settings (of the numbers, or of the columns) that are not valid or do not fit together:
    the command line exits 2 on it, and a library caller (``advcli.torch``, ``advcli.verl``)
    catches it as the ``ValueError`` a bad argument is."""


class InputChanged(AdvcliError):
    """An input that is no longer the file advcli opened: what was computed from it mixes two
    versions of it (or rows of another file), so nothing derived from it may be published.
    ``label`` names the input, ``change`` what changed, ``outcome`` what became of the output."""

    def __init__(self, label: str, change: str, outcome: str = "nothing was written") -> None:
        self.label, self.change, self.outcome = label, change, outcome
        super().__init__(f"{label} changed while advcli was reading it ({change}); {outcome}")

    def __reduce__(self) -> tuple[type[InputChanged], tuple[str, str, str]]:
        # Rebuilt from its arguments, not its message: it crosses to a --jobs or Ray parent.
        return type(self), (self.label, self.change, self.outcome)


class MissingRoles(AdvcliError):
    """Roles that found no column, each with what to do (``missing``), and the columns the
    other roles found (``found``). ``flags``: the options that would read the dump, which
    :func:`advcli.read.roles.read_roles` finds from the values; ``text``: the message without
    them."""

    def __init__(
        self,
        where: str,
        missing: Mapping[str, str],
        hint: str,
        found: Mapping[str, str | None],
        flags: Sequence[str] = (),
    ) -> None:
        self.where, self.missing, self.hint = where, missing, hint
        self.found, self.flags = found, tuple(flags)
        self.text = f"{where}: {'; '.join(missing.values())}{hint}"
        options = f". These options read it: {' '.join(self.flags)}" if self.flags else ""
        super().__init__(self.text + options)

    def __reduce__(self) -> tuple[type[MissingRoles], tuple[object, ...]]:
        # Rebuilt from its arguments, not its message: it crosses to a --jobs or Ray parent.
        missing, found = dict(self.missing), dict(self.found)
        return type(self), (self.where, missing, self.hint, found, self.flags)


def first_line(error: BaseException) -> str:
    """An error's first line of text (or its type name): Polars' and Arrow's messages run on."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

"""The one exception type advcli raises for bad input.

The library raises :class:`AdvcliError` with a message that names the file, column and row (or
trajectory key) at fault; only ``advcli.cli`` turns it into ``Error: …`` and an exit code.
"""


class AdvcliError(Exception):
    """Bad input or an impossible request; the message is shown to the user as is."""


class UsageError(AdvcliError):
    """Settings or options that do not fit together (the command line exits 2, not 1)."""


def first_line(error: BaseException) -> str:
    """An error's first line of text (or its type name): Polars' and Arrow's messages run on."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

"""How a command ends: the library's errors as one ``Error: …`` line and exit code 1, usage
errors as exit code 2, a reader that left as a quiet 141.

Only this module turns :class:`~advcli.errors.AdvcliError` into ``Error: …`` and exit code 1.
"""

from __future__ import annotations

import functools
import shlex
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from advcli._runtime.process import silence_stdout
from advcli._runtime.signals import arrived_signal, exit_status
from advcli.errors import AdvcliError, MissingRoles, UsageError
from advcli.names import printable

# The command line as typed (less the program's name), for an error that proposes a complete one.
INVOCATION: list[str] = []

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(command: F) -> F:
    """Turn the library's errors into one ``Error:`` line on stderr and exit code 1, and a reader
    that closed the pipe into a quiet exit 141 (128 + SIGPIPE), as other Unix tools end.

    Ctrl-C and termination signals pass on: partial outputs are removed on the way up, and the
    entry point (``advcli.__main__``) prints their one line and exit code.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as error:
            raise typer.BadParameter(printable(str(error))) from None
        except AdvcliError as error:
            if arrived_signal() is None:
                typer.echo(f"Error: {printable(_with_command(error))}", err=True)
            # Else the interrupt caused it (a query it cancelled fails): the entry point prints
            # the interrupt's line and exit code instead.
            raise typer.Exit(1) from None
        except BrokenPipeError:
            silence_stdout()
            raise typer.Exit(exit_status(signal.SIGPIPE)) from None
        except MemoryError:
            typer.echo("Error: not enough memory for this input on this machine", err=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _with_command(error: AdvcliError) -> str:
    """The error's text; for roles that found no column but whose likeliest columns are known,
    with the whole command line that reads the dump."""
    if not isinstance(error, MissingRoles) or not error.flags:
        return str(error)
    return f"{error.text}. This command reads it: advcli {shlex.join([*INVOCATION, *error.flags])}"

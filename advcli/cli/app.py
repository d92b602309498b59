"""The ``advcli`` command line: the Typer app and its commands, each a thin layer of option
parsing and presentation over :mod:`advcli.run.commands`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
import typer.core

import advcli
from advcli._runtime.process import drop_bad_thread_count
from advcli.cli.audit import audit_command
from advcli.cli.compare import compare_command
from advcli.cli.compute import compute_command
from advcli.cli.exits import INVOCATION
from advcli.cli.inspect import inspect_command
from advcli.cli.options import MAX_THREADS
from advcli.cli.panels import PanelledCommand
from advcli.cli.sample import sample_command
from advcli.cli.watch import watch_command


class _Commands(typer.core.TyperGroup):
    """advcli's commands, keeping the arguments they were called with."""

    def main(self, args: Any = None, *rest: Any, **options: Any) -> Any:
        INVOCATION[:] = list(sys.argv[1:] if args is None else args)
        return super().main(args, *rest, **options)


app = typer.Typer(
    name="advcli",
    cls=_Commands,
    help="Trajectory-level advantages for multi-turn agent RL rollout dumps.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Help text is plain: with Rich markup on, "[default: error]" and "advcli[ray]" read as
    # markup tags and vanish.
    rich_markup_mode=None,
)
# Each command's line in `advcli --help`, whole in an 80-column terminal (click cuts a longer
# first sentence of the docstring with "...").
app.command("compute", cls=PanelledCommand)(compute_command)
app.command(
    "compare",
    cls=PanelledCommand,
    short_help="Report how counting every turn biases baselines and advantages.",
)(compare_command)
app.command(
    "watch", cls=PanelledCommand, short_help="Report each step file of a run as it is written."
)(watch_command)
app.command(
    "inspect",
    cls=PanelledCommand,
    short_help="Look at a dump before computing: roles, counts, checks.",
)(inspect_command)
app.command(
    "audit",
    cls=PanelledCommand,
    short_help="Check a trainer's advantages: the rule they follow, and its bugs.",
)(audit_command)
app.command("sample", cls=PanelledCommand)(sample_command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"advcli {advcli.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Trajectory-level advantages for multi-turn agent RL rollout dumps."""
    warning = drop_bad_thread_count(MAX_THREADS)
    if warning is not None:
        typer.echo(warning, err=True)

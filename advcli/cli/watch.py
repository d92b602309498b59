"""``advcli watch DIR``: each step file's figures as a JSON line or a terminal table row as the
trainer writes it, until Ctrl-C, an error, or a step that trips ``--fail-on``/``--fail-above``.
``advcli compare DIR --by file --follow``, where the watch began, still runs it and says where
it moved."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from advcli._runtime.process import threads_per_job, use_threads
from advcli._runtime.signals import held
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    SETTING_OPTIONS,
    STEP_COLUMN_OPTIONS,
    ConfigOpt,
    DropDuplicatesOpt,
    FailAboveOpt,
    FailOnOpt,
    ThreadsOpt,
    check_fail_above,
    dump_settings,
    with_options,
)
from advcli.errors import UsageError
from advcli.settings.config import Engine

if TYPE_CHECKING:
    from advcli.cli.options import DumpSettings
    from advcli.report.summary import StepEntry
    from advcli.run.follow import FollowedStep

# Long enough for a writer's pauses between its buffered writes, short against a training step.
SETTLE_SECONDS = 2.0

# What compare --follow says on standard error before it runs the watch.
MOVED = "advcli compare --follow is now advcli watch DIR (the same options, without --by file)"

FolderArg = Annotated[
    Path,
    typer.Argument(
        metavar="DIR",
        help="The folder the trainer writes its step files to (write_batch's, for one).",
        show_default=False,
    ),
]
FollowOpt = Annotated[
    bool,
    option(
        "--follow",
        help="Moved to advcli watch DIR, which this runs: with --by file and one folder, report "
        "each step file as it appears (the ones there first), until Ctrl-C.",
    ),
]
SettleOpt = Annotated[
    float | None,
    option(
        "--settle",
        min=0,
        help="Seconds a step file not published by advcli must stay unchanged "
        f"(size and modification time) before it is read [default: {SETTLE_SECONDS:g}].",
    ),
]
JsonlOpt = Annotated[
    Path | None,
    option(
        "--jsonl",
        help="Write each step as one JSON line ('-' for stdout), as it comes.",
    ),
]

# The options of a whole run's report, which a watch that never ends does not write, by their
# parameter names.
_REPORT_FILES = {
    "json_path": "--json",
    "markdown": "--markdown",
    "plot": "--plot",
    "html": "--html",
}


def check_follow(params: dict[str, Any]) -> None:
    """Refuse ``--settle`` and ``--jsonl`` without ``--follow``, and ``--follow`` without
    ``--by file`` or with what it does not take. ``params``: the command's options by their
    parameter names (typer's ``ctx.params``)."""
    if not params["follow"]:
        for name in ("settle", "jsonl"):
            if params[name] is not None:
                raise UsageError(f"--{name} goes with --follow")
        return
    if params["by"] != "file":
        raise UsageError("--follow reports each step file as it appears: pass --by file")
    if len(params["inputs"] or []) != 1:
        raise UsageError("--follow watches one folder: give one input")
    for name, flag in _REPORT_FILES.items():
        if params[name] is not None:
            raise UsageError(
                f"--follow does not take {flag}: a report of the whole run, which a watch "
                "does not end with (pass --jsonl)"
            )
    if params["engine"] != Engine.LOCAL or params.get("jobs", 1) != 1:
        raise UsageError(
            "--follow does not take --engine ray or --jobs: each step file is compared on its "
            "own, locally, as it comes"
        )


WatchForceOpt = Annotated[bool, option("--force", help="Replace an existing --jsonl file.")]
WatchQuietOpt = Annotated[bool, option("--quiet", "-q", help="No terminal rows.")]


@with_options(*SETTING_OPTIONS, *COLUMN_OPTIONS, *STEP_COLUMN_OPTIONS)
@reports_errors
def watch_command(  # noqa: PLR0913
    ctx: typer.Context,
    folder: FolderArg,
    drop_duplicates: DropDuplicatesOpt = False,
    fail_above: FailAboveOpt = None,
    fail_on: FailOnOpt = None,
    settle: SettleOpt = None,
    jsonl: JsonlOpt = None,
    force: WatchForceOpt = False,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: WatchQuietOpt = False,
) -> None:
    """Report each step file of a training run's folder as the trainer writes it, until Ctrl-C.

    Each step is compared alone, with the figures compare --by file gives it once the run is
    over: a table row on the terminal, or a JSON line with --jsonl. Exit 3 at the first step
    that trips --fail-on or --fail-above.

    Example: advcli watch rollout_dumps/run-1 --jsonl steps.jsonl --fail-on severe
    """
    settings = dump_settings(ctx)
    check_fail_above(fail_above, settings)
    use_threads(threads_per_job(1, threads))
    run_watch(folder, settings, ctx.params, "watch")


def run_watch(folder: Path, settings: DumpSettings, params: dict[str, Any], command: str) -> None:
    """Watch ``folder``: each step as a JSON line and/or a table row as it comes (the rows on
    standard error when standard output carries the lines), ending with exit 3 at the first
    step that trips ``--fail-on`` or ``--fail-above``. ``command``: the command that runs it,
    which its lines name."""
    from advcli._runtime.process import load_numpy_bridge, require_stdout
    from advcli.cli.consoles import stderr, stdout
    from advcli.cli.terminal import reading_table
    from advcli.report.views import visible
    from advcli.write.lines import JsonLines, check_lines_path

    jsonl, settle = params["jsonl"], params["settle"]
    if jsonl is not None and str(jsonl) != "-":
        check_lines_path(jsonl, folder)
    fail_on = params["fail_on"].value if params["fail_on"] is not None else None
    lines_on_stdout = jsonl is not None and str(jsonl) == "-"
    if lines_on_stdout or not params["quiet"]:
        require_stdout("the steps" if lines_on_stdout else "the steps' rows (pass --quiet)")
    show = None if params["quiet"] else stderr if lines_on_stdout else stdout()
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.run.follow import follow_steps

        load_numpy_bridge()
    if show is not None and stderr.is_terminal:
        # Nothing else shows until the first step file is complete.
        stderr.print(
            Text(
                f"watching {visible(folder)} for step files, each reported as it is written "
                "(Ctrl-C ends)"
            )
        )
    with JsonLines(jsonl, params["force"]) as write:
        steps = follow_steps(
            folder,
            settings.config,
            names=settings.names,
            settle=SETTLE_SECONDS if settle is None else settle,
            drop_duplicates=params["drop_duplicates"],
        )
        reading_due = True
        for index, step in enumerate(steps):
            if write is not None:
                write(json.dumps(step, ensure_ascii=False) + "\n")
            if show is not None:
                # How the steps are read, once (every step is read alike), above the first
                # step read: a file without rows is not.
                reading = step["reading"]
                first_read = reading_due and reading is not None
                if reading is not None and first_read:
                    show.print(reading_table(reading))
                    reading_due = False
                # The folder is every step's: a row names the file within it, or its step.
                label = step["step"]
                within = label if isinstance(label, int) else os.path.relpath(label, folder)
                shown: FollowedStep = {**step, "step": within}
                show.print(_row_table(shown, header=index == 0 or first_read))
            reason = step_trips(step, params["fail_above"], fail_on)
            if reason is not None:
                typer.echo(f"advcli {command}: {reason}", err=True)
                raise typer.Exit(3)


def _row_table(step: FollowedStep, *, header: bool) -> Table:
    """One step as a table row, of the columns ``compare --by``'s series shows (the header
    above the first)."""
    from advcli.report.views import STEP_HEADERS, step_row

    table = Table(show_header=header, show_edge=False, box=None, pad_edge=False)
    # Fixed widths, so that the rows printed one by one line up.
    for name, width in zip(STEP_HEADERS, (24, *[11] * (len(STEP_HEADERS) - 1)), strict=True):
        table.add_column(name, justify="right", width=width, overflow="fold")
    table.add_row(*map(Text, step_row(step)))
    return table


def step_trips(step: StepEntry, fail_above: float | None, fail_on: str | None) -> str | None:
    """Why one step ends the watch: its level reaches ``--fail-on`` (as ``compare --by``'s
    steps do), or its largest advantage difference exceeds ``--fail-above``."""
    from advcli.report.verdict import THRESHOLDS

    order = ["negligible", *THRESHOLDS]
    # A step without rows has no level.
    if fail_on is not None and step["level"] and order.index(step["level"]) >= order.index(fail_on):
        return f"step {step['step']} ({step['level']}) reaches --fail-on {fail_on}"
    diff_max = step["advantage_diff_max"] or 0.0
    if fail_above is not None and diff_max > fail_above:
        return (
            f"step {step['step']}: the largest advantage difference {diff_max:.4g} exceeds "
            f"--fail-above {fail_above:g}"
        )
    return None

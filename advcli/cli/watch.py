"""``advcli watch DIR``: each step file's figures as a JSON line or a terminal table row as the
trainer writes it, until Ctrl-C, an error, or a step that trips ``--fail-on``/``--fail-above``.
``advcli compare DIR --by file --follow``, where the watch began, still runs it and says where
it moved."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from advcli._runtime.process import threads_per_job, use_threads
from advcli._runtime.signals import held
from advcli.cli.audit import (
    AdvantageColOpt,
    ExpectOpt,
    check_fail_on_kind,
    expected_rule_of,
)
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    SETTING_OPTIONS,
    STEP_COLUMN_OPTIONS,
    ConfigOpt,
    DropDuplicatesOpt,
    FailAboveOpt,
    FailOn,
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
    from advcli.run.follow import StepReader

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


WatchAuditOpt = Annotated[
    bool,
    option(
        "--audit",
        help="Audit each step instead (advcli audit's): the rule the trainer's advantages "
        "follow, the rows it explains and the findings' rows by kind.",
    ),
]
WatchFailOnOpt = Annotated[
    str | None,
    option(
        "--fail-on",
        help="Exit 3 at the first step whose level reaches this one (material, severe); with "
        "--audit, whose audit finds a bug ('any') or a finding of this kind.",
    ),
]
WatchForceOpt = Annotated[bool, option("--force", help="Replace an existing --jsonl file.")]
WatchQuietOpt = Annotated[bool, option("--quiet", "-q", help="No terminal rows.")]


@with_options(*SETTING_OPTIONS, *COLUMN_OPTIONS, *STEP_COLUMN_OPTIONS)
@reports_errors
def watch_command(  # noqa: PLR0913
    ctx: typer.Context,
    folder: FolderArg,
    drop_duplicates: DropDuplicatesOpt = False,
    fail_above: FailAboveOpt = None,
    fail_on: WatchFailOnOpt = None,
    audit: WatchAuditOpt = False,
    advantage_col: AdvantageColOpt = None,
    expect: ExpectOpt = None,
    settle: SettleOpt = None,
    jsonl: JsonlOpt = None,
    force: WatchForceOpt = False,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: WatchQuietOpt = False,
) -> None:
    """Report each step file of a training run's folder as the trainer writes it, until Ctrl-C.

    Each step is compared alone, with the figures compare --by file gives it once the run is
    over (with --audit: audited alone, as audit --by file audits it): a table row on the
    terminal, or a JSON line with --jsonl. Exit 3 at the first step that trips --fail-on or
    --fail-above.

    Example: advcli watch rollout_dumps/run-1 --jsonl steps.jsonl --fail-on severe
    """
    if audit:
        _check_audit_options(ctx)
        check_fail_on_kind(ctx, fail_on, config_path)
    elif fail_on is not None and fail_on not in {level.value for level in FailOn}:
        raise UsageError(
            f"--fail-on takes {' or '.join(level.value for level in FailOn)}, not '{fail_on}' "
            "(a finding's kind goes with --audit)"
        )
    else:
        for name, given in (("--advantage-col", advantage_col), ("--expect", expect)):
            if given is not None:
                raise UsageError(f"{name} goes with --audit")
    settings = dump_settings(ctx)
    check_fail_above(fail_above, settings)
    use_threads(threads_per_job(1, threads))
    run_watch(folder, settings, ctx.params, "watch")


def _check_audit_options(ctx: typer.Context) -> None:
    """Refuse beside ``--audit`` what only a comparison reads: the settings of a rule (the
    audit finds the rule; --expect names the one believed), --fail-above and
    --drop-duplicates, where given on the command line (a saved one is compare's)."""
    compare_only = [shared.name for shared in (*SETTING_OPTIONS, *STEP_COLUMN_OPTIONS)]
    compare_only += ["fail_above", "drop_duplicates", "anchor_col"]
    for name in compare_only:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} does not go with --audit, which finds the rule the trainer's "
                "advantages follow (--expect names the one you believe it ran)"
            )


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
    # compare --follow's is a FailOn, watch's its value.
    fail_on = getattr(params["fail_on"], "value", params["fail_on"])
    lines_on_stdout = jsonl is not None and str(jsonl) == "-"
    if lines_on_stdout or not params["quiet"]:
        require_stdout("the steps" if lines_on_stdout else "the steps' rows (pass --quiet)")
    show = None if params["quiet"] else stderr if lines_on_stdout else stdout()
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.run.follow import follow_steps

        view = (
            _audit_view(params, settings)
            if params.get("audit")
            else _compare_view(params, settings)
        )
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
        steps = follow_steps(folder, view.read, settle=SETTLE_SECONDS if settle is None else settle)
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
                row = view.row({**step, "step": within})
                show.print(_row_table(view, row, header=index == 0 or first_read))
            reason = view.trips(step, params["fail_above"], fail_on)
            if reason is not None:
                typer.echo(f"advcli {command}: {reason}", err=True)
                raise typer.Exit(3)


@dataclass(frozen=True)
class _View:
    """What a watch makes of each step (``read``) and shows of it: a row of ``headers`` of
    ``widths`` (``row``), and why it ends the watch (``trips``: of the step, --fail-above and
    --fail-on)."""

    read: StepReader
    headers: tuple[str, ...]
    widths: tuple[int, ...]
    row: Callable[[Any], Sequence[str]]
    trips: Callable[[Any, float | None, str | None], str | None]


def _compare_view(params: dict[str, Any], settings: DumpSettings) -> _View:
    """Each step compared alone, as compare --by file's series shows it."""
    from advcli.report.views import STEP_HEADERS, step_row
    from advcli.run.follow import compare_step

    read = compare_step(settings.config, settings.names, params["drop_duplicates"])
    widths = (24, *[11] * (len(STEP_HEADERS) - 1))
    return _View(read, STEP_HEADERS, widths, step_row, step_trips)


def _audit_view(params: dict[str, Any], settings: DumpSettings) -> _View:
    """Each step audited alone, as audit --by file's steps show it."""
    from advcli.report.audit import STEP_AUDIT_HEADERS, step_row, tripped
    from advcli.run.audit import audit_step

    names = replace(settings.names, advantage=params["advantage_col"])
    read = audit_step(names, expected_rule_of(params["expect"]))

    def trips(step: dict[str, Any], _fail_above: float | None, on: str | None) -> str | None:
        reason = tripped(list(step["findings"]), on)
        return None if reason is None else f"step {step['step']}'s audit has {reason}"

    # A rule's settings and the findings are words, not figures.
    return _View(read, STEP_AUDIT_HEADERS, (24, 9, 56, 9, 40), step_row, trips)


def _row_table(view: _View, cells: Sequence[str], *, header: bool) -> Table:
    """One step as a table row of the view's headers (the header above the first)."""
    table = Table(show_header=header, show_edge=False, box=None, pad_edge=False)
    # Fixed widths, so that the rows printed one by one line up.
    for name, width in zip(view.headers, view.widths, strict=True):
        table.add_column(name, justify="right", width=width, overflow="fold")
    table.add_row(*map(Text, cells))
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

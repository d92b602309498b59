"""``advcli compare``: how much counting every turn changes baselines and advantages, as a
terminal report and report files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from advcli._runtime.process import (
    load_numpy_bridge,
    require_stdout,
    threads_per_job,
    use_threads,
)
from advcli._runtime.signals import held
from advcli.cli.consoles import stderr, stdout
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    SETTING_OPTIONS,
    STEP_COLUMN_OPTIONS,
    AddressOpt,
    CompareEngineOpt,
    ConfigOpt,
    DropDuplicatesOpt,
    FailAboveOpt,
    FailOn,
    FailOnOpt,
    Inputs,
    ThreadsOpt,
    check_fail_above,
    dump_settings,
    with_options,
)
from advcli.cli.progress_bar import progress_bar
from advcli.cli.watch import (
    MOVED,
    FollowOpt,
    JsonlOpt,
    SettleOpt,
    check_follow,
    run_watch,
)
from advcli.settings.config import Engine

if TYPE_CHECKING:
    from rich.console import Console

    from advcli.report.bias import BiasReport
    from advcli.report.termination import TerminationReport

# A list longer than this is no report; Polars takes a count below 2**32.
MAX_TOP = 1_000_000

TopOpt = Annotated[
    int,
    option("--top", min=1, max=MAX_TOP, help="How many groups and trajectories to list."),
]
JsonOpt = Annotated[
    Path | None, option("--json", help="Write the report as JSON ('-' for stdout).")
]
MarkdownOpt = Annotated[
    Path | None, option("--markdown", help="Write the report as Markdown ('-' for stdout).")
]
PlotOpt = Annotated[
    Path | None,
    option(
        "--plot", help="Write a PNG figure (needs advcli[plot]; '-' for stdout, not a terminal)."
    ),
]
HtmlOpt = Annotated[
    Path | None,
    option(
        "--html",
        help="Write the report as one self-contained HTML page (figure embedded with "
        "advcli[plot]; '-' for stdout).",
    ),
]
ByOpt = Annotated[
    str | None,
    option(
        "--by",
        help="Each input file ('file') or each value of a column (e.g. step) is its own "
        "batch, also reported on its own as a series over training steps.",
    ),
]
JobsOpt = Annotated[
    int,
    option(
        "--jobs",
        min=1,
        help="With --by: how many parts (files, or values of the column) to compare at once, "
        "this process and N-1 worker processes, at most one a part and one a core (the report "
        "is the same, but for the last places of the whole run's float sums where one job "
        "reads a small dump in one pass), each with the cores shared among them unless "
        "--threads says otherwise.",
    ),
]
ForceOpt = Annotated[bool, option("--force", help="Replace existing report files.")]
QuietOpt = Annotated[bool, option("--quiet", "-q", help="No terminal report.")]


@with_options(*SETTING_OPTIONS, *COLUMN_OPTIONS, *STEP_COLUMN_OPTIONS)
@reports_errors
def compare_command(  # noqa: PLR0913
    ctx: typer.Context,
    inputs: Inputs = None,
    top: TopOpt = 10,
    json_path: JsonOpt = None,
    markdown: MarkdownOpt = None,
    plot: PlotOpt = None,
    html: HtmlOpt = None,
    by: ByOpt = None,
    jobs: JobsOpt = 1,
    drop_duplicates: DropDuplicatesOpt = False,
    force: ForceOpt = False,
    engine: CompareEngineOpt = Engine.LOCAL,
    address: AddressOpt = None,
    fail_above: FailAboveOpt = None,
    fail_on: FailOnOpt = None,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: QuietOpt = False,
    follow: FollowOpt = False,
    settle: SettleOpt = None,
    jsonl: JsonlOpt = None,
) -> None:
    """Report how much counting every turn changes baselines and advantages.

    Under --reward-mode per-turn: each step grouping's termination bias (its hidden bonus on
    taking another turn) against turn-padded.

    Example: advcli compare rollouts.parquet --json report.json --plot bias.png
    """
    settings = dump_settings(ctx)
    check_fail_above(fail_above, settings)
    check_follow(ctx.params)
    use_threads(threads_per_job(jobs, threads))
    if follow:  # of one input, which check_follow made sure of
        typer.echo(MOVED, err=True)
        run_watch(Path((inputs or [""])[0]), settings, ctx.params, "compare")
        return
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.run.commands import compare
        from advcli.write.documents import ReportFiles
        from advcli.write.outputs import goes_to_stdout

        load_numpy_bridge()
    files = ReportFiles(json=json_path, markdown=markdown, plot=plot, html=html)
    # The terminal report moves to stderr when stdout carries a report file.
    file_on_stdout = any(map(goes_to_stdout, files.options().values()))
    if not quiet and not file_on_stdout:
        require_stdout("the report (pass --quiet)")
    with progress_bar(not quiet, "opening") as on_stage:
        report = compare(
            inputs or [],
            settings.config,
            names=settings.names,
            top=top,
            files=files,
            force=force,
            engine=engine,
            address=address,
            by=by,
            drop_duplicates=drop_duplicates,
            jobs=jobs,
            on_stage=on_stage,
        )
    if not quiet:
        _show(report, stderr if file_on_stdout else stdout(), config_path)
    tripped = [
        reason
        for reason in (_above(report, fail_above), _reached(report, fail_on))
        if reason is not None
    ]
    for reason in tripped:
        typer.echo(f"advcli compare: {reason}", err=True)
    if tripped:
        raise typer.Exit(3)


def _show(
    report: BiasReport | TerminationReport, console: Console, config_path: Path | None
) -> None:
    """The terminal report, and the config file in force."""
    from advcli.cli.terminal import render_terminal, render_termination
    from advcli.report.bias import BiasReport
    from advcli.report.views import visible

    if isinstance(report, BiasReport):
        render_terminal(report, console)
    else:
        render_termination(report, console)
    if config_path is not None:
        console.print(Text(f"config: {visible(config_path)}"))


def _above(report: BiasReport | TerminationReport, fail_above: float | None) -> str | None:
    """Why ``--fail-above`` trips: the largest per-trajectory advantage difference exceeds it
    (with ``--by`` that is the largest of every step's)."""
    if fail_above is None:
        return None
    diff_max = report.summary["trajectories"]["advantage_diff_max"] or 0.0
    if diff_max <= fail_above:
        return None
    return f"the largest advantage difference {diff_max:.4g} exceeds --fail-above {fail_above:g}"


def _reached(report: BiasReport | TerminationReport, fail_on: FailOn | None) -> str | None:
    """Why ``--fail-on`` trips: the assessment's level (under per-turn rewards the grouping in
    use's), or with ``--by`` a step's, reaches it."""
    if fail_on is None:
        return None
    from advcli.report.bias import BiasReport
    from advcli.report.verdict import THRESHOLDS
    from advcli.report.views import steps_of

    order = ["negligible", *THRESHOLDS]
    floor = order.index(fail_on.value)
    level = report.summary["assessment"]["level"]
    steps = steps_of(report.summary) if isinstance(report, BiasReport) else []
    # A step without rows has no level.
    reaching = [step for step in steps if step["level"] and order.index(step["level"]) >= floor]
    if reaching:
        shown = ", ".join(f"{step['step']} ({step['level']})" for step in reaching[:5])
        more = f" and {len(reaching) - 5:,} more" if len(reaching) > 5 else ""
        steps_reach = "step {} reaches" if len(reaching) == 1 else "steps {} reach"
        return f"{steps_reach.format(shown + more)} --fail-on {fail_on.value}"
    if order.index(level) >= floor:
        return f"the bias is {level}, which reaches --fail-on {fail_on.value}"
    return None

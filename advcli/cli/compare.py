"""``advcli compare``: how much counting every turn changes baselines and advantages, as a
terminal report and report files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from advcli._runtime.process import require_stdout, use_threads, write_stdout_text
from advcli._runtime.signals import held
from advcli.cli.consoles import stderr, stdout
from advcli.cli.exits import reports_errors
from advcli.cli.options import (
    DEFAULTS,
    AddressOpt,
    CompareEngineOpt,
    ConfigOpt,
    DropDuplicatesOpt,
    EpsilonOpt,
    EstimatorOpt,
    GroupCol,
    GroupSize,
    Inputs,
    MaskCol,
    RewardCol,
    ScaleOpt,
    SingletonOpt,
    ThreadsOpt,
    TrajCol,
    TrajScoreOpt,
    TurnCol,
    dump_settings,
)
from advcli.settings import Engine

if TYPE_CHECKING:
    from advcli.report.bias import BiasReport

# A list longer than this is no report; Polars takes a count below 2**32.
MAX_TOP = 1_000_000

TopOpt = Annotated[
    int,
    typer.Option("--top", min=1, max=MAX_TOP, help="How many groups and trajectories to list."),
]
JsonOpt = Annotated[
    str | None, typer.Option("--json", help="Write the report as JSON ('-' for stdout).")
]
MarkdownOpt = Annotated[
    Path | None, typer.Option("--markdown", help="Write the report as Markdown.")
]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write a PNG figure (needs advcli[plot]).")
]
HtmlOpt = Annotated[
    Path | None,
    typer.Option(
        "--html",
        help="Write the report as one self-contained HTML page (figure embedded with "
        "advcli[plot]).",
    ),
]
ByOpt = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Each input file ('file') or each value of a column (e.g. step) is its own "
        "batch, also reported on its own as a series over training steps.",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace existing report files.")]
FailAboveOpt = Annotated[
    float | None,
    typer.Option(
        "--fail-above",
        help="Exit 3 when the largest per-trajectory advantage difference exceeds this.",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")]


@reports_errors
def compare_command(
    ctx: typer.Context,
    inputs: Inputs = None,
    estimator: EstimatorOpt = DEFAULTS.estimator,
    epsilon: EpsilonOpt = DEFAULTS.epsilon,
    traj_score: TrajScoreOpt = None,
    scale: ScaleOpt = None,
    singleton: SingletonOpt = DEFAULTS.singleton,
    group_col: GroupCol = None,
    group_size: GroupSize = None,
    traj_col: TrajCol = None,
    turn_col: TurnCol = None,
    reward_col: RewardCol = None,
    mask_col: MaskCol = None,
    top: TopOpt = 10,
    json_path: JsonOpt = None,
    markdown: MarkdownOpt = None,
    plot: PlotOpt = None,
    html: HtmlOpt = None,
    by: ByOpt = None,
    drop_duplicates: DropDuplicatesOpt = False,
    force: ForceOpt = False,
    engine: CompareEngineOpt = Engine.LOCAL,
    address: AddressOpt = None,
    fail_above: FailAboveOpt = None,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Report how much counting every turn changes baselines and advantages.

    Example: advcli compare rollouts.parquet --json report.json --plot bias.png
    """
    settings = dump_settings(ctx)
    if fail_above is not None and not math.isfinite(fail_above):
        raise typer.BadParameter("must be a finite number", param_hint="'--fail-above'")
    json_to_stdout = json_path == "-"
    if json_to_stdout:
        require_stdout("the JSON report")
    elif not quiet:
        require_stdout("the report (pass --quiet)")
    use_threads(threads)
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.pipeline import ReportFiles, compare

    report = compare(
        inputs or [],
        settings.config,
        names=settings.names,
        top=top,
        files=ReportFiles(
            json=None if json_path is None or json_to_stdout else Path(json_path),
            markdown=markdown,
            plot=plot,
            html=html,
        ),
        force=force,
        engine=engine,
        address=address,
        by=by,
        drop_duplicates=drop_duplicates,
    )
    _show(report, json_to_stdout=json_to_stdout, quiet=quiet, config_path=config_path)
    _fail_above(report, fail_above)


def _show(
    report: BiasReport, *, json_to_stdout: bool, quiet: bool, config_path: Path | None
) -> None:
    """The JSON on stdout when asked for, and the terminal report unless quiet."""
    from advcli.cli.terminal import render_terminal
    from advcli.report.documents import render_json
    from advcli.report.views import visible

    if json_to_stdout:
        write_stdout_text(render_json(report), "the JSON report")
    if not quiet:
        # The terminal report moves to stderr when stdout carries the JSON.
        console = stderr if json_to_stdout else stdout()
        render_terminal(report, console)
        if config_path is not None:
            console.print(Text(f"config: {visible(config_path)}"))


def _fail_above(report: BiasReport, fail_above: float | None) -> None:
    """Exit 3 when the largest per-trajectory advantage difference exceeds ``fail_above``."""
    diff_max = report.summary["trajectories"]["advantage_diff_max"] or 0.0
    if fail_above is not None and diff_max > fail_above:
        typer.echo(
            f"advcli compare: the largest advantage difference {diff_max:.4g} exceeds "
            f"--fail-above {fail_above:g}",
            err=True,
        )
        raise typer.Exit(3)

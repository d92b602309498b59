"""``advcli compute``: advantages for every row of a dump, with a summary of the run on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from advcli._runtime.process import load_numpy_bridge, use_threads
from advcli._runtime.signals import held
from advcli.cli.consoles import stderr
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    LEVEL_OPTION,
    SETTING_OPTIONS,
    STEP_COLUMN_OPTIONS,
    AddressOpt,
    ConfigOpt,
    DropDuplicatesOpt,
    EngineOpt,
    Inputs,
    ThreadsOpt,
    dump_settings,
    with_options,
)
from advcli.cli.progress_bar import progress_bar
from advcli.settings.config import Engine, LossMode, OutputColumns, OutputFormat

if TYPE_CHECKING:
    from advcli.run.commands import ComputeSummary

Output = Annotated[
    Path,
    option(
        "--output",
        "-o",
        help="Output file (.parquet, .arrow IPC file, .arrows IPC stream, .npz or .pt; with "
        "--engine ray a Parquet dataset folder); '-' writes an Arrow IPC stream to stdout, not "
        "a terminal (--format parquet for Parquet bytes).",
    ),
]
FormatOpt = Annotated[
    OutputFormat | None,
    option("--format", help="Output format [default: from the output's extension]."),
]
LossWeightOpt = Annotated[
    LossMode | None,
    option(
        "--loss-weight",
        help="Also write each row's loss_weight under this loss aggregation: a plain sum of "
        "loss_weight x per-token loss over the batch is that mode's loss.",
    ),
]
LossScaleFactorOpt = Annotated[
    float | None,
    option(
        "--loss-scale-factor",
        help="verl's loss_scale_factor H for seq-mean-token-sum-norm [default: the width of "
        "a fixed-size mask].",
    ),
]
NoTokensOpt = Annotated[
    bool, option("--no-tokens", help="Leave out the per-token 'advantages' column.")
]
ColumnsOpt = Annotated[
    OutputColumns,
    option(
        "--columns",
        help="Which input columns to write beside the new ones (score, advantage, any "
        "loss_weight, advantages): all, keys (the group, trajectory and turn columns) or none. "
        "The rows are the input's, in its order.",
    ),
]
ReportOpt = Annotated[
    Path | None,
    option(
        "--report",
        help="Also write the bias report (.json or .md; '-': JSON on stdout), from the same "
        "read of the input.",
    ),
]
ByOpt = Annotated[
    str | None,
    option(
        "--by",
        help="Each input file ('file') or each value of a column (e.g. step) is its own "
        "batch: ids may repeat across them.",
    ),
]
ForceOpt = Annotated[bool, option("--force", help="Replace an existing output.")]
QuietOpt = Annotated[bool, option("--quiet", "-q", help="No summary on stderr.")]


@with_options(LEVEL_OPTION, *SETTING_OPTIONS, *COLUMN_OPTIONS, *STEP_COLUMN_OPTIONS)
@reports_errors
def compute_command(  # noqa: PLR0913
    ctx: typer.Context,
    output: Output,
    inputs: Inputs = None,
    output_format: FormatOpt = None,
    loss_weight: LossWeightOpt = None,
    loss_scale_factor: LossScaleFactorOpt = None,
    no_tokens: NoTokensOpt = False,
    columns: ColumnsOpt = OutputColumns.ALL,
    report: ReportOpt = None,
    by: ByOpt = None,
    drop_duplicates: DropDuplicatesOpt = False,
    force: ForceOpt = False,
    engine: EngineOpt = Engine.LOCAL,
    address: AddressOpt = None,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Compute per-row and per-token advantages for a rollout dump.

    Example: advcli compute rollouts.parquet -o advantages.parquet --level trajectory
    """
    settings = dump_settings(ctx)
    use_threads(threads)
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.run.commands import compute

        load_numpy_bridge()

    with progress_bar(not quiet, "reading keys") as on_stage:
        summary = compute(
            inputs or [],
            output,
            settings.config,
            names=settings.names,
            output_format=output_format,
            tokens=not no_tokens,
            columns=columns,
            force=force,
            report_path=report,
            on_stage=on_stage,
            engine=engine,
            address=address,
            loss_weight=loss_weight,
            loss_scale_factor=loss_scale_factor,
            by=by,
            drop_duplicates=drop_duplicates,
        )
    if not quiet:
        _print_summary(summary, config_path, report)


def _print_summary(summary: ComputeSummary, config_path: Path | None, report: Path | None) -> None:
    """The run's table on stderr, then what it noticed about duplicated rows and where the report
    went."""
    from advcli.report.views import counted, visible
    from advcli.write.outputs import goes_to_stdout

    table = _summary_table(summary)
    if config_path is not None:
        table.add_row("config", Text(visible(config_path)))
    stderr.print(table)
    if summary.duplicate_rows and not summary.duplicates_confirmed:
        stderr.print(
            f"{counted(summary.duplicate_rows, 'row')} alike in keys, score and tokens: "
            "possible copies (the dump has no token ids to confirm them), counted as rows"
        )
    elif summary.duplicate_rows and not summary.duplicates_dropped:
        stderr.print(
            f"{counted(summary.duplicate_rows, 'duplicated row')} counted as the trainer did; "
            "--drop-duplicates to count each once"
        )
    if report is not None:
        where = "standard output" if goes_to_stdout(report) else visible(report)
        stderr.print(Text(f"report: {where}"))


def _summary_table(summary: ComputeSummary) -> Table:
    """The run's figures; text from the data or the command line is shown as plain text, ids
    and column names shortened as the reports show them."""
    from advcli.report.views import shown, visible

    table = Table(title="advcli compute", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    config = summary.config
    for name, value in [
        ("rows", f"{summary.rows:,}"),
        ("groups", f"{summary.groups:,}"),
        ("trajectories", f"{summary.trajectories:,}"),
        (f"singleton groups ({config.level.value} level)", f"{summary.singleton_groups:,}"),
        (f"zero-std groups ({config.level.value} level)", f"{summary.zero_std_groups:,}"),
        ("duplicate rows", _duplicate_rows(summary)),
        ("level", config.level.value),
        ("estimator", config.describe()),
        ("read as", visible(summary.columns.read_as())),
        *(
            (
                f"{role.replace('_', ' ')} column",
                visible(f"{shown(entry['column'])}: {entry['why']}")
                if entry["column"]
                else visible(entry["why"]),
            )
            for role, entry in summary.columns.reading()["roles"].items()
        ),
        *(("note", visible(note)) for note in summary.columns.notes),
        ("output", f"{visible(summary.output)} ({summary.output_format.value})"),
        ("seconds", f"{summary.seconds:.2f} ({summary.threads} threads)"),
    ]:
        table.add_row(name, Text(value))
    if summary.padding_rows:
        label = summary.columns.padding_label
        table.add_row(f"{label} (advantage 0)", f"{summary.padding_rows:,}")
    if summary.earlier_outputs:
        named = ", ".join(map(shown, summary.earlier_outputs))
        table.add_row("input columns named like outputs", Text(f"{named} (not kept)"))
    return table


def _duplicate_rows(summary: ComputeSummary) -> str:
    if summary.duplicate_rows and summary.duplicates_dropped:
        return (
            f"{summary.duplicate_rows:,} (left out of the statistics; written with the "
            "advantage of the row each copies)"
        )
    return f"{summary.duplicate_rows:,}"

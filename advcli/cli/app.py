"""The ``advcli`` command line: option parsing and presentation over :mod:`advcli.pipeline`.

Only this module turns :class:`~advcli.errors.AdvcliError` into ``Error: …`` and exit code 1.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shlex
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.core
from rich.console import Console
from rich.table import Table
from rich.text import Text

import advcli
from advcli._runtime.process import (
    StdoutText,
    drop_bad_thread_count,
    require_stdout,
    silence_stdout,
    use_threads,
    write_stdout_text,
)
from advcli._runtime.signals import exit_status, held, received_signal
from advcli.errors import AdvcliError, MissingRoles, UsageError
from advcli.names import printable
from advcli.settings import (
    AdvantageConfig,
    ColumnNames,
    Engine,
    Estimator,
    Level,
    LossMode,
    OutputFormat,
    Scale,
    Singleton,
    TrajScore,
)

if TYPE_CHECKING:
    from advcli.pipeline import ComputeSummary

# The command line as typed (less the program's name), for an error that proposes a complete one.
INVOCATION: list[str] = []


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
stderr = Console(stderr=True, highlight=False)


class _StdoutConsole(Console):
    """A console whose reader going away ends the command quietly (exit 141), as ``-o -`` and
    ``--json -`` do; rich would exit 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def stdout() -> Console:
    """The console for reports on standard output; every byte is written or the run fails."""
    return _StdoutConsole(file=StdoutText(), highlight=False)  # type: ignore[arg-type]


# A list longer than this is no report; Polars takes a count below 2**32.
MAX_TOP = 1_000_000
# More threads than this only cost memory on any machine advcli runs on.
MAX_THREADS = 1024

F = TypeVar("F", bound=Callable[..., Any])
# Option defaults are the settings' own.
DEFAULTS = AdvantageConfig()


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
            if received_signal() is None:
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


# Options shared by the commands that read a dump.
Inputs = Annotated[
    list[str] | None,
    typer.Argument(
        help="Parquet, JSON-lines or Arrow files, globs or directories, read as one dataset; '-' "
        "reads Parquet, an Arrow IPC stream or JSON lines from stdin.",
        show_default=False,
    ),
]
DIALECT_DEFAULT = "[default: the trainer's name for it: see the docs' input schema page]"
GroupCol = Annotated[
    str | None, typer.Option("--group-col", help=f"Group column {DIALECT_DEFAULT}.")
]
GroupSize = Annotated[
    int | None,
    typer.Option(
        "--group-size",
        min=1,
        help="For dumps with no group id (TRL, OpenRLHF): each block of this many consecutive "
        "rows is a group.",
    ),
]
TrajCol = Annotated[
    str | None, typer.Option("--traj-col", help=f"Trajectory column {DIALECT_DEFAULT}.")
]
TurnCol = Annotated[
    str | None,
    typer.Option("--turn-col", help=f"Turn-order column {DIALECT_DEFAULT}."),
]
RewardCol = Annotated[
    str | None,
    typer.Option(
        "--reward-col",
        help=f"Reward column: a list of token rewards (summed) or a scalar {DIALECT_DEFAULT}.",
    ),
]
MaskCol = Annotated[
    str | None,
    typer.Option(
        "--mask-col",
        help=f"Response mask (list of 0/1) or response length (int) {DIALECT_DEFAULT}.",
    ),
]
LevelOpt = Annotated[
    Level, typer.Option("--level", help="Which unit counts once in its group's statistics.")
]
EstimatorOpt = Annotated[Estimator, typer.Option("--estimator", help="Advantage estimator.")]
EpsilonOpt = Annotated[float, typer.Option("--epsilon", min=0.0, help="Added to the group std.")]
TrajScoreOpt = Annotated[
    TrajScore | None,
    typer.Option(
        "--traj-score",
        help="Rule for a trajectory whose rows carry different scores [default: error].",
    ),
]
ScaleOpt = Annotated[
    Scale | None,
    typer.Option(
        "--scale", help="grpo/grpo_passk divisor: group std, batch std or none [default: group]."
    ),
]
SingletonOpt = Annotated[
    Singleton,
    typer.Option("--singleton", help="A single-unit group keeps its raw score, or gets 0."),
]


EngineOpt = Annotated[
    Engine,
    typer.Option(
        "--engine",
        help="local: Polars on this machine; ray: Ray Data (needs advcli[ray]), writing a "
        "Parquet dataset folder.",
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (e.g. auto) [default: a new local one]."),
]
DropDuplicatesOpt = Annotated[
    bool,
    typer.Option(
        "--drop-duplicates",
        help="Count each set of identical rows (a trainer's padding copies) once in the "
        "statistics [default: every row counts, as the trainer counted it].",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        max=MAX_THREADS,
        help="Threads for Polars and Arrow [default: all cores].",
    ),
]


# Options never saved in a config file: where a run writes (a saved path would be replaced by
# every later run, and --force would make that silent) and --quiet, which would hide the line
# saying that a config file is in force.
UNSAVED = frozenset(
    {"config", "output", "format", "report", "json", "markdown", "plot", "html", "force", "quiet"}
)


def _savable(command: Any) -> dict[str, Any]:
    """A command's options that a config file may hold, by long name without the dashes."""
    options = {}
    for param in command.params:
        if isinstance(param, typer.core.TyperOption):
            name = next(opt for opt in param.opts if opt.startswith("--"))[2:]
            if name not in UNSAVED:
                options[name] = param
    return options


def _value_types(command: Any, options: dict[str, Any]) -> dict[str, type]:
    """The TOML type a saved value of each option must have, from the command's annotations:
    choices (enums) and paths are strings, as on the command line."""
    hints = typing.get_type_hints(command.callback)
    types = {}
    for key, option in options.items():
        hint = hints[option.name]
        declared = next(arg for arg in typing.get_args(hint) or (hint,) if arg is not type(None))
        types[key] = next((kind for kind in (bool, int, float) if declared is kind), str)
    return types


@reports_errors
def _read_config(ctx: typer.Context, value: Path | None) -> Path | None:
    """Load the config file in force into ``ctx.default_map``, so that its values become the
    options' defaults: the command line still wins, and each value goes through its option's
    own type, choices and range. Eager, so it runs before the other options are read."""
    from advcli.cli.config_file import command_settings, find_config

    config = find_config(value)
    if config is None:
        return None
    reading = {
        name: command
        for name, command in ctx.find_root().command.commands.items()  # type: ignore[attr-defined]
        if any(param.name == "config_path" for param in command.params)
    }
    commands = {name: _savable(command) for name, command in reading.items()}
    settings = command_settings(
        config,
        {name: _value_types(reading[name], options) for name, options in commands.items()},
        UNSAVED,
    )
    # Every command's values are checked, so a bad value fails whichever command runs.
    for name, values in settings.items():
        for key, setting in values.items():
            try:
                commands[name][key].process_value(ctx, setting.value)
            except typer.BadParameter as error:
                raise config.error(setting.key, error.message) from None
    command = ctx.command.name or ""
    ctx.default_map = {
        commands[command][key].name: setting.value for key, setting in settings[command].items()
    }
    return config.path


def _column_names(
    ctx: typer.Context,
    group: str | None,
    trajectory: str | None,
    turn: str | None,
    reward: str | None,
    mask: str | None,
    group_size: int | None,
    config: Path | None,
) -> ColumnNames:
    """The column options, each role saying where it was named when the saved mapping named it
    (inspect's reasons then name the file and key, not the option)."""
    saved = {
        role: f"'{option.removeprefix('--')}' in {config}"
        for role, parameter, option in (
            ("group", "group_col", "--group-col"),
            ("trajectory", "traj_col", "--traj-col"),
            ("turn", "turn_col", "--turn-col"),
            ("reward", "reward_col", "--reward-col"),
            ("mask", "mask_col", "--mask-col"),
        )
        if _saved(ctx, parameter)
    }
    # --group-col and --group-size exclude each other: the one typed wins over the one saved.
    if group is not None and group_size is not None:
        if _saved(ctx, "group_col") and not _saved(ctx, "group_size"):
            group = None
            saved.pop("group", None)
        elif _saved(ctx, "group_size") and not _saved(ctx, "group_col"):
            group_size = None
    return ColumnNames(group, trajectory, turn, reward, mask, group_size, named_in=saved)


def _saved(ctx: typer.Context, parameter: str) -> bool:
    """Whether ``parameter``'s value came from the saved mapping."""
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name == "DEFAULT_MAP"


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        is_eager=True,
        callback=_read_config,
        show_default=False,
        help="TOML file of saved options [default: ./advcli.toml, else the [tool.advcli] table "
        "of ./pyproject.toml]. Keys are the long option names without dashes: group-col, "
        "group-size, traj-col, turn-col, reward-col, mask-col, level, estimator, epsilon, "
        "traj-score, scale, singleton, loss-weight, loss-scale-factor, no-tokens, top, by, "
        "drop-duplicates, "
        "fail-above, engine, address, threads; each command takes those it has, and a "
        "[compute], [compare] or [inspect] table overrides them for that command. Options on "
        "the command line win.",
    ),
]


# Progress shows only on a terminal, and only once the work has lasted this long.
PROGRESS_DELAY_SECONDS = 1.0


@contextlib.contextmanager
def _stage_progress(enabled: bool) -> Iterator[Callable[[str], None] | None]:
    """Yield a callback that names the stage being worked on, shown as a rich progress bar on
    stderr; yield None when stderr is not a terminal or output is quiet."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    stages = ("reading keys", "computing statistics", "writing output")
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("stage {task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    task = progress.add_task(stages[0], total=len(stages))

    def on_stage(stage: str) -> None:
        progress.update(task, description=stage, completed=stages.index(stage))

    timer = threading.Timer(PROGRESS_DELAY_SECONDS, progress.start)
    timer.start()
    try:
        yield on_stage
    finally:
        timer.cancel()
        progress.stop()


@app.command("compute")
@reports_errors
def compute_command(
    ctx: typer.Context,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Output file (.parquet, .arrow IPC file, .arrows IPC stream, .npz or .pt); '-' "
            "writes an Arrow IPC stream to stdout (--format parquet for Parquet bytes).",
        ),
    ],
    inputs: Inputs = None,
    level: LevelOpt = DEFAULTS.level,
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
    output_format: Annotated[
        OutputFormat | None,
        typer.Option("--format", help="Output format [default: from the output's extension]."),
    ] = None,
    loss_weight: Annotated[
        LossMode | None,
        typer.Option(
            "--loss-weight",
            help="Also write each row's loss_weight under this loss aggregation: a plain sum of "
            "loss_weight x per-token loss over the batch is that mode's loss.",
        ),
    ] = None,
    loss_scale_factor: Annotated[
        float | None,
        typer.Option(
            "--loss-scale-factor",
            help="verl's loss_scale_factor H for seq-mean-token-sum-norm [default: the width of "
            "a fixed-size mask].",
        ),
    ] = None,
    no_tokens: Annotated[
        bool, typer.Option("--no-tokens", help="Leave out the per-token 'advantages' column.")
    ] = False,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Also write the bias report (.json or .md), from the same read of the input.",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            help="Each input file ('file') or each value of a column (e.g. step) is its own "
            "batch: ids may repeat across them.",
        ),
    ] = None,
    drop_duplicates: DropDuplicatesOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output.")] = False,
    engine: EngineOpt = Engine.LOCAL,
    address: AddressOpt = None,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> None:
    """Compute per-row and per-token advantages for a rollout dump.

    Example: advcli compute rollouts.parquet -o advantages.parquet --level trajectory
    """
    config = AdvantageConfig(
        level=level,
        estimator=estimator,
        epsilon=epsilon,
        traj_score=traj_score,
        scale=scale,
        singleton=singleton,
    )
    use_threads(threads)
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.pipeline import compute

    with _stage_progress(not quiet) as on_stage:
        summary = compute(
            inputs or [],
            output,
            config,
            names=_column_names(
                ctx, group_col, traj_col, turn_col, reward_col, mask_col, group_size, config_path
            ),
            output_format=output_format,
            tokens=not no_tokens,
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
        from advcli.report.views import visible

        table = _summary_table(summary)
        if config_path is not None:
            table.add_row("config", Text(visible(config_path)))
        stderr.print(table)
        if summary.duplicate_rows and not summary.duplicates_confirmed:
            stderr.print(
                f"{summary.duplicate_rows:,} rows alike in keys, score and tokens: possible "
                "copies (the dump has no token ids to confirm them), counted as rows"
            )
        elif summary.duplicate_rows and not summary.duplicates_dropped:
            stderr.print(
                f"{summary.duplicate_rows:,} duplicated rows counted as the trainer did; "
                "--drop-duplicates to count each once"
            )
        if report is not None:
            stderr.print(Text(f"report: {visible(report)}"))


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
                f"{role} column",
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
        table.add_row("padding rows (advantage 0)", f"{summary.padding_rows:,}")
    if summary.replaced:
        table.add_row("replaced input columns", Text(", ".join(map(shown, summary.replaced))))
    return table


def _duplicate_rows(summary: ComputeSummary) -> str:
    if summary.duplicate_rows and summary.duplicates_dropped:
        return (
            f"{summary.duplicate_rows:,} (left out of the statistics; written with the "
            "advantage of the row each copies)"
        )
    return f"{summary.duplicate_rows:,}"


@app.command("compare")
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
    top: Annotated[
        int,
        typer.Option("--top", min=1, max=MAX_TOP, help="How many groups and trajectories to list."),
    ] = 10,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Write the report as JSON ('-' for stdout).")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Write the report as Markdown.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG figure (needs advcli[plot]).")
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Write the report as one self-contained HTML page (figure embedded with "
            "advcli[plot]).",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            help="Each input file ('file') or each value of a column (e.g. step) is its own "
            "batch, also reported on its own as a series over training steps.",
        ),
    ] = None,
    drop_duplicates: DropDuplicatesOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace existing report files.")] = False,
    engine: EngineOpt = Engine.LOCAL,
    address: AddressOpt = None,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            help="Exit 3 when the largest per-trajectory advantage difference exceeds this.",
        ),
    ] = None,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")] = False,
) -> None:
    """Report how much counting every turn changes baselines and advantages.

    Example: advcli compare rollouts.parquet --json report.json --plot bias.png
    """
    config = AdvantageConfig(
        estimator=estimator,
        epsilon=epsilon,
        traj_score=traj_score,
        scale=scale,
        singleton=singleton,
    )
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
    from advcli.cli.terminal import render_terminal
    from advcli.report.documents import render_json
    from advcli.report.views import visible

    report = compare(
        inputs or [],
        config,
        names=_column_names(
            ctx, group_col, traj_col, turn_col, reward_col, mask_col, group_size, config_path
        ),
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
    if json_to_stdout:
        write_stdout_text(render_json(report), "the JSON report")
    if not quiet:
        # The terminal report moves to stderr when stdout carries the JSON.
        console = stderr if json_to_stdout else stdout()
        render_terminal(report, console)
        if config_path is not None:
            console.print(Text(f"config: {visible(config_path)}"))
    diff_max = report.summary["trajectories"]["advantage_diff_max"] or 0.0
    if fail_above is not None and diff_max > fail_above:
        typer.echo(
            f"advcli compare: the largest advantage difference {diff_max:.4g} exceeds "
            f"--fail-above {fail_above:g}",
            err=True,
        )
        raise typer.Exit(3)


@app.command("inspect")
@reports_errors
def inspect_command(
    ctx: typer.Context,
    inputs: Inputs = None,
    group_col: GroupCol = None,
    group_size: GroupSize = None,
    traj_col: TrajCol = None,
    turn_col: TurnCol = None,
    reward_col: RewardCol = None,
    mask_col: MaskCol = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON on stdout.")
    ] = False,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
) -> None:
    """Look at a dump before computing: column roles, counts, turns, scores, and problems.

    Reads only the key columns. Example: advcli inspect rollouts/ --json | jq .counts
    """
    require_stdout("the inspection")
    use_threads(threads)
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.pipeline import inspect

    summary = inspect(
        inputs or [],
        _column_names(
            ctx, group_col, traj_col, turn_col, reward_col, mask_col, group_size, config_path
        ),
    )
    if config_path is not None:
        summary["config"] = printable(str(config_path))
    if json_output:
        write_stdout_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", "the JSON")
    else:
        from advcli.cli.terminal import render_inspection
        from advcli.report.views import visible

        console = stdout()
        render_inspection(summary, console)
        if config_path is not None:
            console.print(Text(f"config: {visible(config_path)}"))


@app.command("sample")
@reports_errors
def sample_command(
    output: Annotated[Path, typer.Argument(help="Parquet file to write.", show_default=False)],
    groups: Annotated[int, typer.Option(min=1, max=10**9, help="Prompts (groups).")] = 64,
    rollouts: Annotated[int, typer.Option(min=1, max=100_000, help="Trajectories per prompt.")] = 8,
    max_turns: Annotated[
        int, typer.Option(min=1, max=10_000, help="Most turns per trajectory.")
    ] = 6,
    tokens: Annotated[
        int, typer.Option(min=2, max=1_000_000, help="Mean response tokens per turn row.")
    ] = 48,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Random seed.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> None:
    """Write a synthetic multi-turn rollout dump.

    Example: advcli sample rollouts.parquet --groups 64 --rollouts 8 --seed 0
    """
    from advcli.report.views import visible
    from advcli.sample import write_sample

    rows = write_sample(
        output,
        groups=groups,
        rollouts=rollouts,
        max_turns=max_turns,
        tokens=tokens,
        seed=seed,
        force=force,
    )
    if not quiet:
        stderr.print(
            Text(
                f"wrote {rows:,} turn rows of {groups * rollouts:,} trajectories to "
                f"{visible(output)}"
            )
        )

"""The library entry points behind the commands: open → project → compute → write.

These functions know nothing of Typer; they raise :class:`~advcli.errors.AdvcliError` for bad input.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from advcli.advantages.estimators import Advantages, compute_advantages
from advcli.advantages.levels import both_levels
from advcli.advantages.loss import token_weight, unwritable_weight
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import Trajectories, count_trajectories, index_trajectories
from advcli.errors import AdvcliError, UsageError
from advcli.keys import GROUP, ROW, SCORE, TOKENS
from advcli.read.columns import ColumnRoles, is_enum
from advcli.read.duplicates import TOKEN_COLUMNS, DuplicateRows, find_duplicates
from advcli.read.inputs import STDIN, Dataset, open_dataset
from advcli.read.projection import check_unique_turns, key_projection, split_padding
from advcli.read.roles import read_roles
from advcli.read.scan import release_freed_memory
from advcli.report.bias import BiasReport, bias_report, by_step
from advcli.report.inspection import inspect_dump
from advcli.report.render import render_html, render_json, render_markdown, write_plot, write_text
from advcli.rules import RULES
from advcli.settings import AdvantageConfig, ColumnNames, Engine, Level, LossMode, OutputFormat
from advcli.write.outputs import check_outputs, output_format_for, report_format_for, write_rows
from advcli.write.rows import replaced_columns, with_padding


@dataclass(frozen=True)
class LoadedDump:
    """A dump after stage 1: its files, its column roles and its checked key projection, less
    its padding rows (SkyRL's), which are in ``padding``."""

    dataset: Dataset
    columns: ColumnRoles
    projection: pl.DataFrame
    # With --by, each row's step (its file's number, or its value of the --by column).
    steps: pl.Series | None = None
    padding: pl.DataFrame = field(default_factory=pl.DataFrame)

    @functools.cached_property
    def trajectories(self) -> Trajectories:
        """Each row's trajectory, found once for every use (both levels, the report)."""
        return index_trajectories(self.projection)

    @property
    def naming(self) -> Naming:
        """How stage 2's errors name the dump's key columns, rows and files."""
        return Naming(
            self.columns.group or "group",
            self.columns.trajectory or "row",
            self.dataset.locate,
            self.dataset.file_of,
            _turn_hint(self.columns),
        )

    @property
    def batch(self) -> str | None:
        """With --by each step is its own batch, for the batch-wide quantities too."""
        return self.steps.name if self.steps is not None else None

    def advantages(self, config: AdvantageConfig) -> Advantages:
        trajectories = self.trajectories if config.level is Level.TRAJECTORY else None
        return compute_advantages(self.projection, config, self.naming, trajectories, self.batch)

    def trajectory_count(self) -> int:
        """How many trajectories the dump holds: the index's count when it was made anyway (at
        trajectory level, for a report), else a streaming count, a third of the index's time."""
        if "trajectories" in self.__dict__:  # functools.cached_property keeps it there
            return self.trajectories.count
        return count_trajectories(self.projection)

    def report_settings(self) -> dict[str, Any]:
        """What the report says of the input: its column roles, how it was read, and its
        files."""
        return {
            "columns": self.columns.describe(),
            "reading": self.columns.reading(),
            "inputs": [self.dataset.label(i) for i in range(len(self.dataset.files))],
            "padding_rows": self.padding.height,
        }


@dataclass(frozen=True)
class ComputeSummary:
    rows: int
    groups: int
    trajectories: int
    singleton_groups: int
    zero_std_groups: int
    config: AdvantageConfig
    columns: ColumnRoles
    output: Path
    output_format: OutputFormat
    seconds: float
    threads: int
    replaced: list[str] = field(default_factory=list)
    report: BiasReport | None = None
    duplicate_rows: int = 0
    duplicates_dropped: bool = False
    duplicates_confirmed: bool = True
    padding_rows: int = 0


def _turn_hint(columns: ColumnRoles) -> str:
    """For a turn column read for its name: what to do if it is the training step."""
    if columns.turn is None or "turn" not in columns.by_name:
        return ""
    return (
        f" (or, if '{columns.turn}', read as the turn index for its name, is the training step, "
        f"--by {columns.turn})"
    )


def load_dump(
    dataset: Dataset,
    names: ColumnNames = ColumnNames(),
    *,
    unique_turns: bool = True,
    engine: Engine = Engine.LOCAL,
    mask_needed_for: str | None = None,
    by: str | None = None,
) -> LoadedDump:
    """Stage 1: pick the columns, read and check the key projection (on Ray Data with
    ``engine="ray"``, after :func:`start_engine`). ``mask_needed_for`` says what needs the
    token counts, if anything does: without it a dump with no mask column is read too.

    ``by`` (``"file"`` or a column) makes each part its own batch: its groups are keyed by
    ``(step, group)``, so ids that repeat across steps (dataset indices) stay apart."""
    columns = read_roles(
        dataset.schema,
        dataset.describe(),
        names,
        dataset.read_columns,
        mask_needed_for=mask_needed_for,
        not_turns=(by,) if by not in (None, "file") else (),
    )
    if columns.group_size is not None and dataset.num_rows % columns.group_size:
        raise AdvcliError(
            f"{dataset.describe()}: {dataset.num_rows:,} rows are not whole groups of "
            f"--group-size {columns.group_size}"
        )
    if engine == Engine.RAY and (columns.group is None or columns.trajectory is None):
        raise AdvcliError(
            f"{dataset.describe()}: --engine ray needs group and trajectory id columns (its "
            "blocks do not know their rows' numbers); use the local engine"
        )
    project = _ray_engine().key_projection if engine == Engine.RAY else key_projection
    # With --by the repeated turns are looked for once the groups are keyed by step.
    projection, padding = split_padding(
        project(dataset, columns, unique_turns=unique_turns and by is None), dataset, columns
    )
    if by is None:
        notes = _spanning_files(dataset, projection)
        return LoadedDump(dataset, replace(columns, notes=notes), projection, padding=padding)
    steps = _step_labels(dataset, by)
    projection = projection.with_columns(
        pl.struct(steps.gather(projection[ROW]), pl.col(GROUP).alias("group")).alias(GROUP)
    )
    if unique_turns and columns.turn is not None:
        check_unique_turns(projection, dataset, columns)
    part = "file" if by == "file" else f"value of '{by}'"
    reasons = {
        **columns.reasons,
        "group": f"{columns.reasons['group']}; each {part} is its own batch (--by {by}): "
        f"a group is a ({steps.name}, group) pair",
    }
    return LoadedDump(
        dataset, replace(columns, reasons=reasons), projection, steps=steps, padding=padding
    )


def _spanning_files(dataset: Dataset, projection: pl.DataFrame) -> tuple[str, ...]:
    """A note on the groups whose rows are in more than one input file: the files are read as
    one batch, right for the parts of one, wrong for step files whose ids repeat (a dataset
    index), which nothing else may contradict."""
    if len(dataset.files) < 2:
        return ()
    files = dataset.file_numbers().gather(projection[ROW])
    spanning = (
        projection.select(GROUP, files.alias("__file"))
        .group_by(GROUP)
        .agg(pl.col("__file").n_unique() > 1)
        .get_column("__file")
        .sum()
    )
    if not spanning:
        return ()
    return (
        f"{spanning:,} groups have rows in more than one file: the files are read as one batch "
        "(if each file is a training step whose ids repeat, pass --by file)",
    )


def _step_labels(dataset: Dataset, by: str) -> pl.Series:
    """Each input row's step: its file's number (``by="file"``) or its value of column ``by``."""
    if by == "file":
        return dataset.file_numbers()
    labels = dataset.read_columns([by]).to_series().alias("step")
    if labels.dtype == pl.Categorical or is_enum(labels.dtype):
        labels = labels.cast(pl.String)  # steps in the order of their text
    if labels.null_count():
        row = int(labels.is_null().arg_max() or 0)
        raise AdvcliError(f"{dataset.locate(row)}: column '{by}' (--by) is null")
    return labels


def _ray_engine() -> Any:
    try:
        from advcli import ray_engine
    except ImportError:
        raise AdvcliError("--engine ray needs Ray: pip install 'advcli[ray]'") from None
    return ray_engine


def counted_rows(dump: LoadedDump, drop_duplicates: bool) -> tuple[LoadedDump, DuplicateRows]:
    """The dump as stage 2 counts it, and its duplicated rows: every row, as the trainer counted
    them, or with ``drop_duplicates`` only the first row of each identical set."""
    duplicates = find_duplicates(dump.dataset, dump.columns, dump.projection)
    if not drop_duplicates or duplicates.count == 0:
        return dump, duplicates
    if not duplicates.confirmed:
        raise AdvcliError(
            f"{dump.dataset.describe()}: --drop-duplicates needs the rows' token ids "
            f"({', '.join(TOKEN_COLUMNS)}) to tell a copy from a turn alike in score and tokens; "
            f"the dump has none, so its {duplicates.count:,} rows alike in keys, score and tokens "
            "are only possible copies"
        )
    return replace(dump, projection=duplicates.drop_from(dump.projection)), duplicates


def report_settings(dump: LoadedDump, drop_duplicates: bool) -> dict[str, Any]:
    """What a bias report says of its input and of how its rows were counted."""
    return {**dump.report_settings(), "drop_duplicates": drop_duplicates}


def check_engine(engine: Engine, address: str | None) -> None:
    """Refuse a cluster address without the engine that uses one."""
    if address is not None and engine != Engine.RAY:
        raise UsageError("--address goes with --engine ray")


def start_engine(engine: Engine, address: str | None) -> None:
    """Connect to (or start) the engine's cluster; nothing to do for the local engine."""
    if engine == Engine.RAY:
        _ray_engine().start(address)


@contextlib.contextmanager
def opened(inputs: Sequence[str]) -> Iterator[Dataset]:
    """Open the inputs as one dataset; standard input (``-``) is spooled to a temporary folder
    that is removed afterwards. Without ``-`` no folder is made (a run killed by SIGKILL, which no
    cleanup outlives, would leave it behind). An error in the block is reported as an input's
    change when one changed (:meth:`Dataset.changes_reported`)."""
    if STDIN not in inputs:
        dataset = open_dataset(inputs)
        with dataset.changes_reported():
            yield dataset
        return
    with tempfile.TemporaryDirectory(prefix="advcli-stdin-") as spool:
        dataset = open_dataset(inputs, spool=Path(spool))
        with dataset.changes_reported():
            yield dataset


def compute(
    inputs: Sequence[str],
    output: Path,
    config: AdvantageConfig = AdvantageConfig(),
    *,
    names: ColumnNames = ColumnNames(),
    output_format: OutputFormat | None = None,
    tokens: bool = True,
    force: bool = False,
    report_path: Path | None = None,
    on_stage: Callable[[str], None] | None = None,
    engine: Engine = Engine.LOCAL,
    address: str | None = None,
    loss_weight: LossMode | None = None,
    loss_scale_factor: float | None = None,
    by: str | None = None,
    drop_duplicates: bool = False,
) -> ComputeSummary:
    """Compute advantages for every row of the inputs and write them to ``output``.

    With ``loss_weight`` each row also gets ``loss_weight``, its per-token weight under that
    loss aggregation (:mod:`advcli.advantages.loss`): a plain sum of ``loss_weight × per-token
    loss`` over
    the masked tokens of the batch is that mode's loss. ``loss_scale_factor`` is verl's H for
    ``seq-mean-token-sum-norm`` (by default the width of a fixed-size mask column).

    With ``report_path`` (``.json`` or ``.md``) the other level is computed from the same key
    projection and the bias report is written there too, so the input is read once for the
    statistics. ``on_stage`` is told when each stage starts: ``reading keys``, ``computing
    statistics``, ``writing output``. ``engine="ray"`` runs stages 1 and 3 on Ray Data (at
    ``address``, else on a new local cluster) and writes ``output`` as a Parquet dataset folder.
    ``by`` (``"file"`` or a column such as ``step``) computes each part as its own batch.

    Duplicated rows (:mod:`advcli.read.duplicates`) count as the trainer counted them; with
    ``drop_duplicates`` the statistics see only the first row of each identical set, and each
    copy is written with the advantage of the row it copies.

    Examples
    --------
    >>> import tempfile
    >>> output = Path(tempfile.mkdtemp()) / "advantages.parquet"
    >>> summary = compute(["sample_data/rollouts.parquet"], output)
    >>> summary.rows, summary.trajectories, summary.groups
    (1553, 512, 64)
    """
    started = time.perf_counter()
    check_engine(engine, address)
    if engine == Engine.RAY and (output_format not in (None, "parquet") or str(output) == STDIN):
        raise UsageError(
            "--engine ray writes a Parquet dataset folder: no '-o -', no --format other than "
            "parquet"
        )
    if loss_weight is not None and engine == Engine.RAY:
        raise UsageError("--loss-weight runs on the local engine only")
    if by is not None and engine == Engine.RAY:
        raise UsageError("compute --by runs on the local engine only")
    if loss_scale_factor is not None and loss_weight is not LossMode.SEQ_MEAN_TOKEN_SUM_NORM:
        raise UsageError("--loss-scale-factor goes with --loss-weight seq-mean-token-sum-norm")
    if loss_scale_factor is not None and not 0 < loss_scale_factor < math.inf:
        raise UsageError(f"--loss-scale-factor must be a positive number, got {loss_scale_factor}")
    fmt = OutputFormat.PARQUET if engine == Engine.RAY else output_format_for(output, output_format)
    report_kind = report_format_for(report_path) if report_path is not None else None
    stage = on_stage or (lambda name: None)
    with opened(inputs) as dataset:
        check_outputs([output, report_path], dataset, force=force, engine=engine)
        if by is not None:
            _check_by(dataset, by)
        start_engine(engine, address)
        stage("reading keys")
        needs_mask = (
            "--loss-weight needs one" if loss_weight else _mask_needed_for(config, fmt, tokens)
        )
        every_row = load_dump(dataset, names, engine=engine, mask_needed_for=needs_mask, by=by)
        dump, duplicates = counted_rows(every_row, drop_duplicates)
        stage("computing statistics")
        advantages = dump.advantages(config)
        report = None
        if report_path is not None:
            turn, trajectory = both_levels(
                dump.projection,
                config,
                dump.naming,
                dump.trajectories,
                dump.batch,
                computed=advantages,
            )
            report = bias_report(
                turn, trajectory, config=config, settings=report_settings(dump, drop_duplicates)
            )
            report.summary["duplicate_rows"] = duplicates.report(dataset.locate)
            del turn, trajectory
        summary = ComputeSummary(
            rows=dataset.num_rows,
            groups=advantages.groups.height,
            trajectories=dump.trajectory_count(),
            singleton_groups=advantages.singleton_groups,
            zero_std_groups=advantages.zero_std_groups,
            config=config,
            columns=dump.columns,
            output=output,
            output_format=fmt,
            seconds=0.0,
            threads=pl.thread_pool_size(),
            replaced=replaced_columns(dataset.schema.names()),
            report=report,
            duplicate_rows=duplicates.count,
            duplicates_dropped=drop_duplicates,
            duplicates_confirmed=duplicates.confirmed,
            padding_rows=dump.padding.height,
        )
        stage("writing output")
        if engine == Engine.RAY:
            _ray_engine().write_advantages(
                dataset,
                dump.columns,
                dump.projection,
                advantages,
                config,
                output,
                tokens=tokens,
                force=force,
                padding=dump.padding,
            )
        else:
            # Only the per-row (score, advantage) pairs go on to the write, as the float32 they
            # are written as: let the key projection, the unit frames and the float64 values go
            # first, so their memory is reused for the streaming write's buffers.
            row_values = advantages.rows(dump.projection).select(
                ROW, pl.col(SCORE, "advantage").cast(pl.Float32)
            )
            if dump is not every_row:
                row_values = duplicates.spread_to_copies(row_values)
            if loss_weight is not None:
                # Over every row: the weights are of the batch as written, copies included.
                row_values = row_values.join(
                    _loss_weights(every_row, loss_weight, loss_scale_factor),
                    on=ROW,
                    how="left",
                    maintain_order="left",
                )
            row_values = with_padding(row_values, dump.padding)
            del dump, every_row, duplicates, advantages
            release_freed_memory()
            write_rows(dataset, summary.columns, row_values, output, fmt, tokens, force)
    if report is not None and report_path is not None:
        text = render_json(report) if report_kind == "json" else render_markdown(report)
        try:
            write_text(report_path, text, force=force)
        except AdvcliError as error:
            raise AdvcliError(f"{error}; the output {output} was written") from None
    return replace(summary, seconds=time.perf_counter() - started)


def _loss_weights(dump: LoadedDump, mode: LossMode, scale_factor: float | None) -> pl.DataFrame:
    """Each row's ``loss_weight`` under ``mode``."""
    if mode is LossMode.SEQ_MEAN_TOKEN_SUM_NORM and scale_factor is None:
        scale_factor = dump.columns.mask_width
        if scale_factor is None:
            raise UsageError(
                "--loss-weight seq-mean-token-sum-norm divides by verl's loss_scale_factor (by "
                "default the padded response length, which a list mask does not state): pass "
                "--loss-scale-factor N"
            )
    # With --by each step is its own batch, as for the advantages.
    batch = dump.steps.name if dump.steps is not None else None
    weight = token_weight(mode.value, scale_factor or 1.0, batch)
    weights = dump.projection.select(ROW, TOKENS, weight.alias("loss_weight"))
    bad = unwritable_weight(weights)
    if bad is not None:
        kind = "overflows to infinity" if abs(bad) > 1 else "underflows float64's range"
        message = f"--loss-weight {mode.value}: the rows' loss_weight ({bad:g}) {kind}"
        if mode is LossMode.SEQ_MEAN_TOKEN_SUM_NORM:
            message = (
                f"--loss-scale-factor {scale_factor:g}: the rows' loss_weight 1 / (rows × "
                f"{scale_factor:g}) = {bad:g} {kind}; pass a factor near the padded response "
                "length"
            )
        raise UsageError(message)
    return weights.drop(TOKENS)


def _mask_needed_for(config: AdvantageConfig, fmt: OutputFormat, tokens: bool) -> str | None:
    """What in a compute run needs each row's token count, if anything."""
    if fmt in (OutputFormat.NPZ, OutputFormat.PT):
        return f"the .{fmt.value} output's response_mask array needs one"
    if tokens:
        return "the per-token output needs one; pass --no-tokens for one advantage per row"
    return _estimator_needs_mask(config)


def _estimator_needs_mask(config: AdvantageConfig) -> str | None:
    if RULES[config.estimator].counts_tokens:
        return f"{config.estimator.value} weighs rows by their tokens and needs one"
    return None


@dataclass(frozen=True)
class ReportFiles:
    """The files ``compare`` writes its report to (each optional)."""

    json: Path | None = None
    markdown: Path | None = None
    plot: Path | None = None
    html: Path | None = None


def compare(
    inputs: Sequence[str],
    config: AdvantageConfig = AdvantageConfig(),
    *,
    names: ColumnNames = ColumnNames(),
    top: int = 10,
    files: ReportFiles = ReportFiles(),
    force: bool = False,
    engine: Engine = Engine.LOCAL,
    address: str | None = None,
    by: str | None = None,
    drop_duplicates: bool = False,
) -> BiasReport:
    """The bias report of ``config.estimator``: turn level against trajectory level, written to
    ``files`` and returned.

    ``by="file"`` (or a column name, e.g. ``step``) also reports each input file (each value of
    the column) on its own, as a series over training steps in ``summary["by_step"]``.

    ``summary["duplicate_rows"]`` counts the duplicated rows (:mod:`advcli.read.duplicates`), which
    both levels count as the trainer did, or, with ``drop_duplicates``, once.

    The report files are checked (not an input, not existing unless ``force``) before any work
    is done.

    Examples
    --------
    >>> report = compare(["sample_data/rollouts.parquet"])
    >>> report.summary["counts"]["trajectories"], report.summary["trajectories"]["sign_flips"]
    (512, 0)
    """
    check_engine(engine, address)
    if files.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise AdvcliError(f"{files.plot}: --plot needs matplotlib: pip install 'advcli[plot]'")
    with opened(inputs) as dataset:
        check_outputs([files.json, files.markdown, files.plot, files.html], dataset, force=force)
        if by is not None:
            _check_by(dataset, by)
        start_engine(engine, address)
        dump, duplicates = counted_rows(
            load_dump(
                dataset, names, engine=engine, mask_needed_for=_estimator_needs_mask(config), by=by
            ),
            drop_duplicates,
        )
        settings = report_settings(dump, drop_duplicates)
        steps = _step_order(dump, by) if by is not None else None
        # The index is made first: its sort runs before the turn level's advantages are held.
        turn, trajectory = both_levels(
            dump.projection, config, dump.naming, dump.trajectories, dump.batch
        )
        # The report needs the trajectories only: the rows (and their index) go first.
        del dump
        trajectory = trajectory.without_index()
        release_freed_memory()
        report = bias_report(turn, trajectory, config=config, settings=settings, top=top)
        if steps is not None:
            values, labels = steps
            report.summary["by_step"] = {
                "by": by,
                "steps": by_step(report, values.name, values, labels),
            }
        report.summary["duplicate_rows"] = duplicates.report(dataset.locate)
        # Stage 1 has read the inputs for the last time: the report is theirs if they are as
        # they were opened.
        dataset.check_unchanged()
    writers: list[tuple[Path | None, Callable[[Path], None]]] = [
        (files.json, lambda path: write_text(path, render_json(report), force=force)),
        (files.markdown, lambda path: write_text(path, render_markdown(report), force=force)),
        (files.plot, lambda path: write_plot(report, path, force=force)),
        (files.html, lambda path: write_text(path, render_html(report), force=force)),
    ]
    written: list[Path] = []
    for path, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except AdvcliError as error:
            done = f"; {', '.join(map(str, written))} was written" if written else ""
            raise AdvcliError(f"{error}{done}") from None
        written.append(path)
    return report


def _check_by(dataset: Dataset, by: str) -> None:
    """Refuse a ``--by`` column that is missing or not integers or strings, before any work."""
    if by == "file":
        return
    if by not in dataset.schema:
        raise AdvcliError(
            f"{dataset.describe()}: column '{by}' (--by) not found; --by takes 'file' or a "
            "column such as 'step'"
        )
    dtype = dataset.schema[by]
    if not (dtype.is_integer() or dtype in (pl.String, pl.Categorical) or is_enum(dtype)):
        raise AdvcliError(
            f"{dataset.describe()}: column '{by}' (--by) has type {dtype}; steps are integers "
            "or strings"
        )


def _step_order(dump: LoadedDump, by: str) -> tuple[pl.Series, list[Any]]:
    """The steps of ``compare --by``'s series in order, and how the report names each: every
    input file as given (one without rows too), by its label, or the column's values sorted."""
    steps = dump.steps
    assert steps is not None
    if by == "file":
        files = range(len(dump.dataset.files))
        labels = [dump.dataset.label(i) for i in files]
        return pl.Series(steps.name, files, dtype=steps.dtype), labels
    values = steps.unique().sort()
    if values.len() > MAX_STEPS:
        raise AdvcliError(
            f"{dump.dataset.describe()}: column '{by}' (--by) has {values.len():,} distinct "
            f"values; compare --by reports at most {MAX_STEPS:,} steps (is '{by}' the training "
            "step?)"
        )
    return values, values.to_list()


# The most steps compare --by reports (README, "Step files"): a column of more distinct values
# is not a training step (a row or trajectory id, say).
MAX_STEPS = 100_000


def inspect(inputs: Sequence[str], names: ColumnNames = ColumnNames()) -> dict[str, Any]:
    """What a user should know about a dump before ``compute``, read from the key columns only.

    Examples
    --------
    >>> inspect(["sample_data/rollouts.parquet"])["counts"]["trajectories"]
    512
    """
    with opened(inputs) as dataset:
        dump = load_dump(dataset, names, unique_turns=False)
        duplicates = find_duplicates(dataset, dump.columns, dump.projection)
        summary = inspect_dump(
            dump.projection,
            dump.columns,
            inputs=[dataset.label(i) for i in range(len(dataset.files))],
            input_format=dataset.input_format,
            locate=dataset.locate,
            padding_rows=dump.padding.height,
        )
        summary["duplicate_rows"] = duplicates.report(dataset.locate)
        dataset.check_unchanged()
        return summary

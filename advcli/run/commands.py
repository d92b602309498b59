"""The library entry points behind the commands: open → project → compute → write.

These functions know nothing of Typer; they raise :class:`~advcli.errors.AdvcliError` for bad input.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from advcli import __version__
from advcli.advantages.estimators import Advantages
from advcli.advantages.levels import both_levels
from advcli.errors import AdvcliError, UsageError
from advcli.read.columns import ColumnRoles
from advcli.read.dataset import Dataset
from advcli.read.duplicates import DuplicateRows, find_duplicates
from advcli.read.inputs import STDIN
from advcli.read.scan import release_freed_memory
from advcli.report.bias import bias_report
from advcli.report.by_step import by_step
from advcli.report.documents import render_json
from advcli.report.inspection import inspect_dump
from advcli.report.step_credit import attach_step_credit
from advcli.report.termination import Report
from advcli.report.termination_documents import renderers
from advcli.run.compute_parts import PartSettings, RunCounts, file_parts, run_columns
from advcli.run.loading import (
    Inputs,
    LoadedDump,
    check_by,
    check_engine,
    counted_rows,
    load_dump,
    load_ray_engine,
    opened,
    report_settings,
    start_engine,
)
from advcli.run.parts import by_parts, compare_parts, in_one_pass, step_order
from advcli.run.row_values import row_values
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    ColumnNames,
    Engine,
    LossMode,
    OutputColumns,
    OutputFormat,
    StepTerm,
)
from advcli.write.documents import ReportFiles, write_bytes, write_reports, write_text
from advcli.write.outputs import (
    check_outputs,
    check_standard_output,
    output_format_for,
    report_format_for,
    write_rows,
)
from advcli.write.rows import earlier_outputs


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
    # The input columns named like outputs (an earlier run's), none of which the output keeps.
    earlier_outputs: list[str] = field(default_factory=list)
    report: Report | None = None
    duplicate_rows: int = 0
    duplicates_dropped: bool = False
    duplicates_confirmed: bool = True
    padding_rows: int = 0


def compute(  # noqa: PLR0913
    inputs: Inputs,
    output: Path,
    config: AdvantageConfig = AdvantageConfig(),
    *,
    names: ColumnNames = ColumnNames(),
    output_format: OutputFormat | None = None,
    tokens: bool = True,
    columns: OutputColumns = OutputColumns.ALL,
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
    loss`` over the masked tokens of the batch is that mode's loss. ``loss_scale_factor`` is
    verl's H for ``seq-mean-token-sum-norm`` (by default the width of a fixed-size mask column).

    ``report_path`` (``.json``, ``.md``; ``-``: JSON on standard output, if ``output`` is not):
    the bias report too, the other level from the same key projection. ``on_stage`` is told as
    each stage starts: ``reading keys``, ``computing statistics``, ``writing output``.
    ``engine="ray"``: stages 1 and 3 on Ray Data (at ``address``, else a new local cluster),
    ``output`` a Parquet dataset folder. ``by`` (``"file"`` or a column such as ``step``): each
    part its own batch, with ``"file"`` one file at a time (:mod:`advcli.run.compute_parts`) but for
    ``report_path`` and arrays. ``columns``: the input columns kept beside the new ones.
    Duplicated rows count as the trainer counted them; with ``drop_duplicates`` the statistics
    see each identical set's first row only, each copy written with its original's advantage.

    Examples
    --------
    >>> import tempfile
    >>> output = Path(tempfile.mkdtemp()) / "advantages.parquet"
    >>> summary = compute(["sample_data/rollouts.parquet"], output)
    >>> summary.rows, summary.trajectories, summary.groups
    (1553, 512, 64)
    """
    started = time.perf_counter()
    check_engine(engine, address, config)
    _check_compute_options(output, output_format, engine, loss_weight, loss_scale_factor, by)
    check_standard_output({"-o": output, "--report": report_path}, binary={"-o"})
    fmt = OutputFormat.PARQUET if engine == Engine.RAY else output_format_for(output, output_format)
    report_kind = report_format_for(report_path) if report_path is not None else None
    stage = on_stage or (lambda name: None)
    with opened(inputs) as dataset:
        check_outputs([output, report_path], dataset, force=force, engine=engine)
        check_by(dataset, by)
        mask_needed_for = _mask_needed_for(config, fmt, tokens, loss_weight)
        if by == "file" and report_path is None and fmt not in ("npz", "pt"):
            stage("writing output")  # each file is read, computed and written in turn
            part = PartSettings(
                names, config, drop_duplicates, mask_needed_for, loss_weight, loss_scale_factor
            )
            return _compute_files(dataset, part, output, fmt, tokens, columns, force, started)
        start_engine(engine, address)
        stage("reading keys")
        every_row, dump, duplicates = counted_rows(
            dataset,
            names,
            drop_duplicates,
            config.per_turn is not None,
            engine=engine,
            mask_needed_for=mask_needed_for,
            by=by,
            step_roles=config.compute_step_roles(report=report_path is not None),
        )
        dump, config = dump.with_trainer_rule(config, both_levels=report_path is not None)
        stage("computing statistics")
        advantages = dump.advantages(config)
        report = None
        if report_path is not None:
            report = _compute_report(dump, advantages, duplicates, config, drop_duplicates)
        counts = RunCounts.of(dump, advantages, duplicates)
        summary = _summary(
            dump.dataset, counts, dump.columns, config, output, fmt, report, drop_duplicates
        )
        stage("writing output")
        if engine == Engine.RAY:
            load_ray_engine().write_advantages(
                dataset, dump, advantages, config, output, tokens, force, columns
            )
        else:
            values = row_values(
                every_row, dump, duplicates, advantages, loss_weight, loss_scale_factor
            )
            # Only the per-row values go on: the rest is freed for the streaming write's buffers.
            del dump, every_row, duplicates, advantages
            release_freed_memory()
            one_batch = [(dataset, summary.columns, values)]
            write_rows(dataset, one_batch, output, fmt, tokens, force, columns)
    if report is not None and report_path is not None:
        _write_compute_report(report, report_path, report_kind == "json", output, force=force)
    return replace(summary, seconds=time.perf_counter() - started)


def _write_compute_report(
    report: Report, path: Path, as_json: bool, output: Path, *, force: bool
) -> None:
    """Write ``compute --report``'s report, once ``output`` is: an error says it was written."""
    text = render_json(report) if as_json else renderers(report).markdown(report)
    try:
        write_text(path, text, force=force)
    except AdvcliError as error:
        raise AdvcliError(f"{error}; the output {output} was written") from None


def _compute_files(
    dataset: Dataset,
    settings: PartSettings,
    output: Path,
    fmt: OutputFormat,
    tokens: bool,
    columns: OutputColumns,
    force: bool,
    started: float,
) -> ComputeSummary:
    """``compute --by file`` one file at a time (:mod:`advcli.run.compute_parts`), and its summary
    (its time counted from ``started``)."""
    counts = RunCounts()
    parts = file_parts(dataset, settings, counts)
    write_rows(dataset, parts, output, fmt, tokens, force, columns)
    config, dropped = settings.config, settings.drop_duplicates
    summary = _summary(dataset, counts, run_columns(counts), config, output, fmt, None, dropped)
    return replace(summary, seconds=time.perf_counter() - started)


def _summary(
    dataset: Dataset,
    counts: RunCounts,
    columns: ColumnRoles,
    config: AdvantageConfig,
    output: Path,
    fmt: OutputFormat,
    report: Report | None,
    drop_duplicates: bool,
) -> ComputeSummary:
    """What ``compute`` tells of its run, from its batches' ``counts`` and the roles it was
    read with (its time is set once the output is written)."""
    return ComputeSummary(
        rows=dataset.num_rows,
        groups=counts.groups,
        trajectories=counts.trajectories,
        singleton_groups=counts.singleton_groups,
        zero_std_groups=counts.zero_std_groups,
        config=config,
        columns=columns,
        output=output,
        output_format=fmt,
        seconds=0.0,
        threads=pl.thread_pool_size(),
        earlier_outputs=earlier_outputs(dataset.schema.names()),
        report=report,
        duplicate_rows=counts.duplicate_rows,
        duplicates_dropped=drop_duplicates,
        duplicates_confirmed=counts.duplicates_confirmed,
        padding_rows=counts.padding_rows,
    )


def _check_compute_options(
    output: Path,
    output_format: OutputFormat | None,
    engine: Engine,
    loss_weight: LossMode | None,
    loss_scale_factor: float | None,
    by: str | None,
) -> None:
    """Refuse the options of ``compute`` that do not go together, before any input is opened."""
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


def _compute_report(
    dump: LoadedDump,
    advantages: Advantages,
    duplicates: DuplicateRows,
    config: AdvantageConfig,
    drop_duplicates: bool,
) -> Report:
    """``compute --report``'s report: the bias report, the other level from the same key
    projection beside ``advantages`` (``config.level``'s); under per-turn rewards the termination
    report, every grouping on the same rows."""
    if config.per_turn is not None:
        return dump.termination_report(config, report_settings(dump, drop_duplicates), duplicates)
    turn, trajectory = both_levels(
        dump.projection, config, dump.naming, dump.trajectories, dump.batch, computed=advantages
    )
    report = bias_report(
        turn,
        trajectory,
        config=config,
        settings=report_settings(dump, drop_duplicates),
        version=__version__,
    )
    if config.step is not None:
        attach_step_credit(report.summary, dump.step_credit(config, advantages))
    report.summary["duplicate_rows"] = duplicates.report(dump.dataset.locate)
    return report


def _mask_needed_for(
    config: AdvantageConfig, fmt: OutputFormat, tokens: bool, loss_weight: LossMode | None
) -> str | None:
    """What in a compute run needs each row's token count, if anything."""
    if loss_weight is not None:
        return "--loss-weight needs one"
    if fmt in (OutputFormat.NPZ, OutputFormat.PT):
        return f"the .{fmt.value} output's response_mask array needs one"
    if tokens:
        return "the per-token output needs one; pass --no-tokens for one advantage per row"
    return config.mask_needed_for


def compare(  # noqa: PLR0913
    inputs: Inputs,
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
    jobs: int = 1,
    on_stage: Callable[[str], None] | None = None,
) -> Report:
    """The bias report of ``config.estimator``: turn level against trajectory level, written to
    ``files`` and returned; ``on_stage`` is told as each stage begins (the CLI's progress bar).
    Under per-turn rewards (``config.per_turn``) the termination report: every step grouping on
    the same rows against the zero-padded one (``by`` is refused).

    ``by="file"`` (or a column name, e.g. ``step``) also reports each input file (each value of
    the column) on its own, as a series over training steps in ``summary["by_step"]``
    (:func:`advcli.run.parts.by_parts` and :func:`~advcli.run.parts.in_one_pass` say when
    one part at a time, in ``jobs`` processes).

    ``summary["duplicate_rows"]`` counts the duplicated rows (:mod:`advcli.read.duplicates`), which
    both levels count as the trainer did, or, with ``drop_duplicates``, once.

    The report files are checked (not an input, not existing unless ``force``, one at most on
    standard output, the PNG not on a terminal) before any work is done.

    Examples
    --------
    >>> report = compare(["sample_data/rollouts.parquet"])
    >>> report.summary["counts"]["trajectories"], report.summary["trajectories"]["sign_flips"]
    (512, 0)
    """
    check_engine(engine, address, config, compare=True, by=by)
    figure = files.plot is not None or files.html is not None
    parts = by_parts(by, config, figure=figure, jobs=jobs)
    check_standard_output(files.options(), binary={"--plot"})
    if files.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise AdvcliError(f"{files.plot}: --plot needs matplotlib: pip install 'advcli[plot]'")
    with opened(inputs) as dataset:
        check_outputs([files.json, files.markdown, files.plot, files.html], dataset, force=force)
        check_by(dataset, by)
        start_engine(engine, address)
        stage = on_stage or (lambda name: None)
        if parts and not in_one_pass(dataset, by or "", jobs, engine):
            assert by is not None
            stage(f"comparing each {'file' if by == 'file' else by + ' value'}")
            report = compare_parts(dataset, by, config, names, top, drop_duplicates, jobs, engine)
            _write_report_files(report, files, force=force)
            return report
        stage("reading keys")
        _, dump, duplicates = counted_rows(
            dataset,
            names,
            drop_duplicates,
            config.per_turn is not None,
            engine=engine,
            mask_needed_for=config.mask_needed_for,
            by=by,
            step_roles=config.compare_step_roles(),
        )
        dump, config = dump.with_trainer_rule(config)
        settings = report_settings(dump, drop_duplicates)
        if config.per_turn is not None:
            termination = dump.termination_report(config, settings, duplicates)
            dataset.check_unchanged()
            _write_report_files(termination, files, force=force)
            return termination
        steps = step_order(dump, by) if by is not None else None
        stage("comparing both levels")
        # The index is made first: its sort runs before the turn level's advantages are held.
        turn, trajectory = both_levels(
            dump.projection, config, dump.naming, dump.trajectories, dump.batch
        )
        credit = dump.step_credit(config) if config.step is not None else None
        # The report needs the trajectories only: the rows (and their index) go first.
        del dump
        trajectory = trajectory.without_index()
        release_freed_memory()
        report = bias_report(
            turn, trajectory, config=config, settings=settings, version=__version__, top=top
        )
        if credit is not None:
            attach_step_credit(report.summary, credit)
        if steps is not None and by is not None:
            values, labels = steps
            report.summary["by_step"] = {
                "by": by,
                "steps": by_step(report, values.name, values, labels),
            }
        report.summary["duplicate_rows"] = duplicates.report(dataset.locate)
        # Stage 1 has read the inputs for the last time: the report is theirs if they are as
        # they were opened.
        dataset.check_unchanged()
    _write_report_files(report, files, force=force)
    return report


def _write_report_files(report: Report, files: ReportFiles, *, force: bool) -> None:
    """Write ``report`` to each of ``files`` given, in order, the one on standard output last
    (a failure before it sends nothing down the pipe); an error names the ones written."""
    render = renderers(report)
    writers: list[tuple[Path | None, Callable[[Path], None]]] = [
        (files.json, lambda path: write_text(path, render_json(report), force=force)),
        (files.markdown, lambda path: write_text(path, render.markdown(report), force=force)),
        (files.plot, lambda path: write_bytes(path, render.png(report, path), force=force)),
        (files.html, lambda path: write_text(path, render.html(report), force=force)),
    ]
    write_reports(writers)


def inspect(
    inputs: Inputs,
    names: ColumnNames = ColumnNames(),
    *,
    anchor_scope: AnchorScope | None = None,
    by: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """What a user should know about a dump before ``compute``, read from the key columns only;
    ``anchor_scope``: where its step groups are taken (gigpo's default when None); ``by``
    (``"file"`` or a column): each part its own batch, its groups keyed by ``(step, group)``;
    ``on_stage`` is told as each stage begins (the CLI's progress bar).

    Examples
    --------
    >>> inspect(["sample_data/rollouts.parquet"])["counts"]["trajectories"]
    512
    """
    with opened(inputs) as dataset:
        check_by(dataset, by)
        stage = on_stage or (lambda name: None)
        stage("reading keys")
        dump = load_dump(dataset, names, unique_turns=False, step_roles="anchor", by=by)
        duplicates = find_duplicates(dataset, dump.columns, dump.projection)
        stage("inspecting")
        summary = inspect_dump(
            dump.projection,
            dump.columns,
            inputs=[dataset.label(i) for i in range(len(dataset.files))],
            input_format=dataset.container or dataset.given_format,
            locate=dataset.locate,
            padding_rows=dump.padding.height,
            anchor_scope=anchor_scope or StepTerm().scope,
            trainer_advantages=dump.trainer_advantages(),
        )
        summary["duplicate_rows"] = duplicates.report(dataset.locate)
        dataset.check_unchanged()
        return summary

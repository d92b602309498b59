"""``compare --by`` one part at a time: the parts (each input file, or each value of a column,
whose rows one streaming pass over that column finds) in the series' order, each through stage
1, stage 2 and its own report where the part runner runs it (:mod:`advcli.run.runner`: in this
process, in ``--jobs`` worker processes or as Ray tasks); the whole run's report combined from
the parts' figures (:mod:`advcli.report.figures`) as they come, so that the memory held is
about one part's whatever their number."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from advcli import __version__
from advcli.advantages.levels import both_levels
from advcli.errors import AdvcliError, UsageError, first_line
from advcli.names import shown_path
from advcli.read.alike import ReadAlike
from advcli.read.columns import ColumnRoles, unused_name
from advcli.read.dataset import Dataset, FileIdentity, StepRows
from advcli.read.duplicates import EXAMPLES
from advcli.read.inputs import open_dataset
from advcli.read.scan import closing_sources, release_freed_memory
from advcli.report.bias import BiasReport, part_report
from advcli.report.by_step import empty_step, step_entry
from advcli.report.figures import PartFigures, bias_summary, merged
from advcli.report.summary import StepEntry
from advcli.run.loading import (
    LoadedDump,
    by_reason,
    counted_rows,
    null_step,
    report_settings,
    step_type,
)
from advcli.run.runner import results_in_order
from advcli.settings.config import AdvantageConfig, ColumnNames, Engine


@dataclass(frozen=True)
class PartTask:
    """One part's work, as a worker process or a Ray task receives it: its input files
    (``paths``, opened again there, named by ``labels``), its number, its rows and those
    before it, ``step`` (a column's value: its rows among every input's; None: the one file of
    ``paths``, whole), and the compare settings."""

    paths: tuple[Path, ...]
    labels: tuple[str, ...]
    part: int
    rows: int
    first_row: int
    step: StepRows | None
    config: AdvantageConfig
    names: ColumnNames
    top: int
    drop_duplicates: bool
    # Where ``paths`` are the run's Arrow files of JSON lines: the JSON lines and their
    # identities, which the worker checks and reads the raw text of as the run would.
    json_lines: tuple[Path, ...] = ()
    json_identities: tuple[FileIdentity, ...] = ()

    def named(self) -> str:
        """The part as messages name it: its file, or its inputs and the column's value."""
        first = self.labels[0] if self.labels else shown_path(self.paths[0])
        if self.step is None:
            return first
        more = f" (and {len(self.paths) - 1} more)" if len(self.paths) > 1 else ""
        return f"{first}{more} ({self.step.column}={self.step.value!r})"


@dataclass(frozen=True)
class PartResult:
    """A part's figures and its ``by_step`` entry (None for a file without rows), its
    duplicates report and its padding rows, the roles it was read with and its name."""

    figures: PartFigures | None
    entry: StepEntry | None
    duplicates: dict[str, Any]
    padding_rows: int
    columns: ColumnRoles | None = None
    name: str = ""


# A file without rows: its place in the series, with no figures.
EMPTY = PartResult(None, None, {}, 0)


def by_parts(by: str | None, config: AdvantageConfig, *, figure: bool, jobs: int) -> bool:
    """Whether ``compare`` takes its inputs one part at a time: with ``--by`` (each file, or
    each value of a column), but for what needs every trajectory of the run at once (the
    figure's panels, drawn for ``--plot`` and ``--html``: ``figure``; GiGPO's step credit).
    ``jobs`` above 1 is refused (a usage error) where it would not be used."""
    parts = by is not None and not figure and config.step is None
    if jobs > 1 and not parts:
        raise UsageError(
            "--jobs runs the parts of --by (its files, or its column's values) in parallel; it "
            "does not go without --by, nor with --plot or --html (their figure needs every "
            "trajectory at once) or --estimator gigpo"
        )
    return parts


# A dump of at most this many rows is compared --by COLUMN in one grouped pass (each group keyed
# by its step), whose series is the parts' to the bit: a part's own reading and report cost some
# 40 ms whatever its rows (47 s for 1,000 steps of 32 rows, against 0.1 s for their plain
# report), and one pass holds about what the plain compare of the dump holds (1M rows in 27,027
# steps: 530 MiB against 462 MiB, docs/performance.md). A larger dump goes a value at a time,
# holding one value's rows.
ONE_PASS_ROWS = 1_000_000


def in_one_pass(dataset: Dataset, by: str, jobs: int, engine: Engine) -> bool:
    """Whether ``compare --by by`` reads ``dataset`` in one grouped pass rather than a part at
    a time: a column's values, in this process (``--jobs 1``, the local engine), at most
    :data:`ONE_PASS_ROWS` rows."""
    return (
        by != "file" and jobs == 1 and engine == Engine.LOCAL and dataset.num_rows <= ONE_PASS_ROWS
    )


def compare_parts(  # noqa: PLR0913
    dataset: Dataset,
    by: str,
    config: AdvantageConfig,
    names: ColumnNames,
    top: int,
    drop_duplicates: bool,
    jobs: int = 1,
    engine: Engine = Engine.LOCAL,
    reading: ReadAlike | None = None,
) -> BiasReport:
    """The bias report of ``dataset`` with each part (each file with ``by="file"``, else each
    value of column ``by``) its own batch, each part compared alone and the whole run's
    figures combined; its ``trajectories`` and ``groups`` frames are empty (the run's are
    never held at once). Every part must be read as the first is (``reading``: the run's
    roles so far, for a run compared a part at a time, as ``--follow`` does)."""
    settings = (config, names, top, drop_duplicates)
    json_lines = dataset.translated_from == "json"
    if by == "file":
        labels: list[Any] = list(dataset.file_steps())
        tasks = [
            PartTask(
                (path,),
                dataset.labels[index : index + 1],
                index,
                dataset.row_counts[index],
                sum(dataset.row_counts[:index]),
                None,
                *settings,
                dataset.origins[index : index + 1] if json_lines else (),
                dataset.identities[index : index + 1] if json_lines else (),
            )
            for index, path in enumerate(dataset.files)
        ]
    else:
        steps = column_steps(dataset, by)
        labels = [step.value for step in steps]
        tasks = [
            PartTask(
                dataset.files,
                dataset.labels,
                index,
                step.rows,
                0,
                step,
                *settings,
                dataset.origins if json_lines else (),
                dataset.identities if json_lines else (),
            )
            for index, step in enumerate(steps)
        ]
    results = results_in_order(
        tasks,
        lambda task: _run(_part_of(dataset, task), task),
        elsewhere=run_part,
        named=PartTask.named,
        jobs=jobs,
        engine=engine,
    )
    # Closed on an error or Ctrl-C here too, which ends the workers.
    with contextlib.closing(results):
        every = "every file" if by == "file" else f"each {by} value"
        alike = ReadAlike(every) if reading is None else reading

        def read_again(index: int, names: ColumnNames) -> PartResult:
            task = replace(tasks[index], names=names)
            return _run(_part_of(dataset, task), task)

        parts = _Parts(dataset, by, labels, names, alike, read_again)
        report = _combined(parts, results, config, top)
    # The report is the inputs' if they are as they were opened.
    dataset.check_unchanged()
    return report


def column_steps(dataset: Dataset, by: str) -> list[StepRows]:
    """Each value of column ``by`` and its rows, the values sorted (the series' order), from
    one streaming pass over that column alone: each value's count and first and last row, so
    that what is held grows with the values, not the rows. A null value is an error naming
    its first row, as is a column of more values than a run has steps."""
    row = unused_name(dataset.schema)
    try:
        with closing_sources():
            found = (
                dataset.column(by)
                .select(pl.col(by).cast(step_type(dataset.schema[by])).alias("value"))
                .with_row_index(row)
                .group_by("value")
                .agg(
                    pl.len().alias("rows"),
                    pl.col(row).min().alias("start"),
                    pl.col(row).max().alias("last"),
                )
                .collect(engine="streaming")
            )
    except pl.exceptions.PolarsError as error:
        raise AdvcliError(
            f"{dataset.describe()}: cannot read the column '{by}' (--by) ({first_line(error)})"
        ) from None
    nulls = found.filter(pl.col("value").is_null())
    if not nulls.is_empty():
        raise null_step(dataset, by, nulls["start"].item())
    if found.height > MAX_STEPS:
        raise AdvcliError(
            f"{dataset.describe()}: column '{by}' (--by) has {found.height:,} distinct values; "
            f"compare --by reports at most {MAX_STEPS:,} steps (is '{by}' the training step?)"
        )
    return [
        StepRows(by, value, start, last + 1, rows)
        for value, rows, start, last in found.sort("value").iter_rows()
    ]


# The most steps compare --by reports (docs, "Step files"): a column of more distinct values
# is not a training step (a row or trajectory id, say).
MAX_STEPS = 100_000


def step_order(dump: LoadedDump, by: str) -> tuple[pl.Series, list[Any]]:
    """The steps of ``compare --by``'s series in order, as ``dump.steps`` holds them, and how
    the report names each: every input file as given (one without rows too), by its step
    number where the files' names say one, else its label, or
    the column's values sorted."""
    steps = dump.steps
    assert steps is not None
    if by == "file":
        files = range(len(dump.dataset.files))
        return pl.Series(steps.name, files, dtype=steps.dtype), list(dump.dataset.file_steps())
    values = [step.value for step in column_steps(dump.dataset, by)]
    return pl.Series(steps.name, values, dtype=steps.dtype), values


def run_part(task: PartTask) -> PartResult:
    """One part's work in a worker (a process or a Ray task): its files opened there."""
    if not task.rows:
        return EMPTY
    opened = open_dataset([str(path) for path in task.paths])
    if task.json_lines:
        opened = replace(
            opened,
            origins=task.json_lines,
            identities=task.json_identities,
            translated_from="json",
        )
    return _run(replace(opened, labels=task.labels or opened.labels, step=task.step), task)


def _part_of(dataset: Dataset, task: PartTask) -> Dataset:
    """The part of ``task`` in this process: its file, or its rows of every input."""
    return dataset.part(task.part) if task.step is None else replace(dataset, step=task.step)


def _run(dataset: Dataset, task: PartTask) -> PartResult:
    if not task.rows:
        return EMPTY
    _, dump, duplicates = counted_rows(
        dataset,
        task.names,
        task.drop_duplicates,
        mask_needed_for=task.config.mask_needed_for,
        step_roles=task.config.compare_step_roles(),
        # A value's rows are loaded as --by loads them: its groups keyed by (step, group).
        by=None if task.step is None else task.step.column,
    )
    dump, config = dump.with_trainer_rule(task.config)
    settings = report_settings(dump, task.drop_duplicates)
    columns = dump.columns
    turn, trajectory = both_levels(
        dump.projection, config, dump.naming, dump.trajectories, dump.batch
    )
    del dump
    release_freed_memory()
    report, figures = part_report(
        turn,
        trajectory.without_index(),
        config=config,
        settings=settings,
        version=__version__,
        top=task.top,
    )
    figures = figures.placed(
        part=task.part if task.step is None else None, first_row=task.first_row
    )
    dataset.check_unchanged()
    return PartResult(
        figures,
        step_entry(report.summary, None),
        # Its rows named as the run's report names them, without the part's value.
        duplicates.report(replace(dataset, step=None).locate),
        settings["padding_rows"],
        columns,
        dataset.describe(),
    )


@dataclass(frozen=True)
class _Parts:
    """A run's parts as combining them needs, besides their results: the inputs, ``by``, the
    parts' labels, the names given for the roles, the run's reading (``reading``) and how to
    read part ``index`` again with other names (``read_again``)."""

    dataset: Dataset
    by: str
    labels: list[Any]
    names: ColumnNames
    reading: ReadAlike
    read_again: Callable[[int, ColumnNames], PartResult]


def _combined(
    parts: _Parts,
    results: Iterable[PartResult],
    config: AdvantageConfig,
    top: int,
) -> BiasReport:
    """The run's report from its parts' results, each merged in as it comes, so that what is
    held does not grow with their number but for the ``by_step`` entries; each part read as
    the first (:meth:`ReadAlike.as_run`)."""
    dataset, by, labels = parts.dataset, parts.by, parts.labels
    run: PartFigures | None = None
    entries: list[StepEntry] = []
    padding_rows = 0
    duplicates: dict[str, Any] = {}
    # Each part's notes: those of every part are the run's, the others named by their part
    # (a trainer's note on one step's groups).
    part_notes: list[tuple[Any, tuple[str, ...]]] = []
    for index, read in enumerate(results):
        if read.figures is None or read.entry is None:
            entries.append(empty_step(labels[index]))
            continue
        result = parts.reading.as_run(
            read.name,
            read,
            _roles,
            parts.names,
            functools.partial(parts.read_again, index),
        )
        assert result.figures is not None and result.entry is not None
        part_notes.append((labels[index], _roles(result).notes))
        entries.append({**result.entry, "step": labels[index]})
        run = result.figures if run is None else merged(run, result.figures, top)
        padding_rows += result.padding_rows
        file = index if by == "file" else None
        duplicates = _duplicates(duplicates, file, result.duplicates)
    if run is None:
        raise AdvcliError(f"{dataset.describe()}: no rows in any input file")
    # The run's settings are the first part's, but for its inputs and padding rows, and for a
    # file's groups, which the run keys by the file too (a value's are keyed by it already).
    settings = {
        **run.settings,
        "inputs": [dataset.label(index) for index in range(len(dataset.files))],
        "padding_rows": padding_rows,
    }
    reading = run.settings["reading"]
    if by == "file":
        roles = reading["roles"]
        group = {**roles["group"], "why": by_reason(roles["group"]["why"], "file", "file")}
        reading = {**reading, "roles": {**roles, "group": group}}
    every = set.intersection(*(set(notes) for _, notes in part_notes))
    own = [f"{label}: {note}" for label, notes in part_notes for note in notes if note not in every]
    first_own = set(part_notes[0][1]) - every
    settings["reading"] = {
        **reading,
        "notes": [
            *(note for note in reading["notes"] if note not in first_own),
            *own,
            *dataset.unread,
        ],
    }
    summary = bias_summary(run, estimator=config.estimator.value, settings=settings)
    summary["by_step"] = {"by": by, "steps": entries}
    summary["duplicate_rows"] = duplicates
    return BiasReport(summary, run.top_trajectories.clear(), run.top_groups.clear())


def _roles(result: PartResult) -> ColumnRoles:
    assert result.columns is not None
    return result.columns


def _duplicates(run: dict[str, Any], file: int | None, report: dict[str, Any]) -> dict[str, Any]:
    """The duplicated rows of the parts so far (``run``, empty before the first) and of the
    next part's ``report`` as one report: the run's first few copies, each group keyed by its
    file as the run's are (``file``: the part's number; None: a value's groups, keyed by it
    already)."""
    first = report["first"]
    if file is not None:
        first = [{**copy, "group": {"file": file, "group": copy["group"]}} for copy in first]
    if not run:
        return {**report, "first": first}
    return {
        "count": run["count"] + report["count"],
        "compared": run["compared"],
        "token_ids_compared": run["token_ids_compared"] and report["token_ids_compared"],
        "confirmed_by": run["confirmed_by"] if report["confirmed_by"] is not None else None,
        "first": [*run["first"], *first][:EXAMPLES],
    }

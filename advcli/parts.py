"""``compare --by file`` one part (one input file) at a time: each part through stage 1, stage 2
and its own report, in this process, in ``--jobs`` worker processes or as Ray tasks; the whole
run's report combined from the parts' figures (:mod:`advcli.report.parts`), so that the memory
held is about one part's whatever their number."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.pool
import signal
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

from advcli import __version__
from advcli.advantages.levels import both_levels
from advcli.errors import AdvcliError, UsageError
from advcli.loading import (
    by_reason,
    compare_step_roles,
    counted_rows,
    estimator_needs_mask,
    load_ray_engine,
    report_settings,
)
from advcli.read.dataset import Dataset
from advcli.read.duplicates import EXAMPLES
from advcli.read.inputs import open_dataset
from advcli.read.scan import release_freed_memory
from advcli.report.bias import BiasReport, bias_report
from advcli.report.by_step import empty_step, step_entry
from advcli.report.parts import PartFigures, combined_summary, merged, part_figures
from advcli.settings import AdvantageConfig, ColumnNames, Engine


@dataclass(frozen=True)
class PartTask:
    """One part's work, as a worker process or a Ray task receives it: the file (``path``,
    opened again there), its number, its rows and those before it, and the compare settings."""

    path: Path
    part: int
    rows: int
    first_row: int
    config: AdvantageConfig
    names: ColumnNames
    top: int
    drop_duplicates: bool


@dataclass(frozen=True)
class PartResult:
    """A part's figures and its ``by_step`` entry (None for a file without rows), its
    duplicates report and its padding rows."""

    figures: PartFigures | None
    entry: dict[str, Any] | None
    duplicates: dict[str, Any]
    padding_rows: int


# A file without rows: its place in the series, with no figures.
EMPTY = PartResult(None, None, {}, 0)


def by_parts(by: str | None, config: AdvantageConfig, *, plot: bool, jobs: int) -> bool:
    """Whether ``compare`` takes its inputs one file at a time: with ``--by file``, but for
    what needs every trajectory of the run at once (the plot's panels, GiGPO's step credit).
    ``jobs`` above 1 is refused (a usage error) where it would not be used."""
    parts = by == "file" and not plot and config.step is None
    if jobs > 1 and not parts:
        raise UsageError(
            "--jobs runs the files of --by file in parallel; it does not go with --by a column, "
            "--plot or --estimator gigpo"
        )
    return parts


def compare_parts(
    dataset: Dataset,
    config: AdvantageConfig,
    names: ColumnNames,
    top: int,
    drop_duplicates: bool,
    jobs: int = 1,
    engine: Engine = Engine.LOCAL,
) -> BiasReport:
    """The bias report of ``dataset`` with each file its own batch (``compare --by file``),
    each file compared alone and the whole run's figures combined; its ``trajectories`` and
    ``groups`` frames are empty (the run's are never held at once)."""
    tasks = [
        PartTask(
            path,
            index,
            dataset.row_counts[index],
            sum(dataset.row_counts[:index]),
            config,
            names,
            top,
            drop_duplicates,
        )
        for index, path in enumerate(dataset.files)
    ]
    if engine == Engine.RAY:
        results = load_ray_engine().run_parts(run_part, tasks)
    elif jobs > 1 and len(tasks) > 1:
        results = _in_workers(dataset, tasks, jobs)
    else:
        results = (_run(dataset.part(task.part), task) for task in tasks)
    # Closed on an error or Ctrl-C here too, which ends the workers.
    with contextlib.closing(results):
        report = _combined(dataset, results, config, top)
    # The report is the inputs' if they are as they were opened.
    dataset.check_unchanged()
    return report


def run_part(task: PartTask) -> PartResult:
    """One part's work in a worker (a process or a Ray task): its file opened there."""
    if not task.rows:
        return EMPTY
    return _run(open_dataset([str(task.path)]), task)


def _in_workers(
    dataset: Dataset, tasks: list[PartTask], jobs: int
) -> Generator[PartResult, None, None]:
    """``tasks`` shared by this process and ``jobs - 1`` spawned workers, results in part order
    as they come. This process takes the next part whenever the one due is still running in a
    worker, so that it works while the workers start (each imports advcli anew) and ``jobs``
    processes compare at once. A part that fails here is raised when its turn comes, as with one
    job: the first failing part in order is the one named. The workers leave Ctrl-C to this
    process, which ends them, as it does on an error in any part."""
    workers = min(jobs, len(tasks)) - 1
    pool = multiprocessing.get_context("spawn").Pool(
        workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    )
    results: dict[int, AsyncResult[PartResult] | PartResult | AdvcliError] = {}
    handed, failed_here = 0, False
    try:
        for due in range(len(tasks)):
            while True:
                handed = _hand_to_workers(pool, tasks, results, handed, limit=2 * workers)
                waiting = results[due]
                if (
                    not isinstance(waiting, AsyncResult)
                    or waiting.ready()
                    or handed == len(tasks)
                    or failed_here
                ):
                    break
                try:
                    results[handed] = _run(dataset.part(handed), tasks[handed])
                except AdvcliError as error:
                    results[handed], failed_here = error, True
                handed += 1
            result = results.pop(due)
            if isinstance(result, AdvcliError):
                raise result
            yield result.get() if isinstance(result, AsyncResult) else result
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()


def _hand_to_workers(
    pool: multiprocessing.pool.Pool,
    tasks: list[PartTask],
    results: dict[int, AsyncResult[PartResult] | PartResult | AdvcliError],
    handed: int,
    limit: int,
) -> int:
    """The parts from number ``handed`` on to the workers, in order, until ``limit`` of theirs
    are unfinished (one waiting behind each running one, so that a worker never waits for this
    process); returns the number of parts handed out so far."""
    running = sum(1 for r in results.values() if isinstance(r, AsyncResult) and not r.ready())
    while running < limit and handed < len(tasks):
        results[handed] = pool.apply_async(run_part, (tasks[handed],))
        handed, running = handed + 1, running + 1
    return handed


def _run(dataset: Dataset, task: PartTask) -> PartResult:
    if not task.rows:
        return EMPTY
    _, dump, duplicates = counted_rows(
        dataset,
        task.names,
        task.drop_duplicates,
        mask_needed_for=estimator_needs_mask(task.config),
        step_roles=compare_step_roles(task.config),
    )
    settings = report_settings(dump, task.drop_duplicates)
    turn, trajectory = both_levels(
        dump.projection, task.config, dump.naming, dump.trajectories, dump.batch
    )
    del dump
    release_freed_memory()
    report = bias_report(
        turn,
        trajectory.without_index(),
        config=task.config,
        settings=settings,
        version=__version__,
        top=task.top,
    )
    figures = part_figures(report, turn, part=task.part, first_row=task.first_row, top=task.top)
    dataset.check_unchanged()
    return PartResult(
        figures,
        step_entry(report.summary, None),
        duplicates.report(dataset.locate),
        settings["padding_rows"],
    )


def _combined(
    dataset: Dataset, results: Iterable[PartResult], config: AdvantageConfig, top: int
) -> BiasReport:
    """The run's report from its parts' results, each merged in as it comes, so that what is
    held does not grow with their number but for the ``by_step`` entries."""
    run: PartFigures | None = None
    entries, padding_rows = [], 0
    duplicates: dict[str, Any] = {}
    for index, result in enumerate(results):
        label = dataset.label(index)
        if result.figures is None or result.entry is None:
            entries.append(empty_step(label))
            continue
        entries.append({**result.entry, "step": label})
        run = result.figures if run is None else merged(run, result.figures, top)
        padding_rows += result.padding_rows
        duplicates = _duplicates(duplicates, index, result.duplicates)
    if run is None:
        raise AdvcliError(f"{dataset.describe()}: no rows in any input file")
    # The run's settings are the first part's, but for what tells the parts apart.
    roles = run.settings["reading"]["roles"]
    group = {**roles["group"], "why": by_reason(roles["group"]["why"], "file", "file")}
    settings = {
        **run.settings,
        "reading": {**run.settings["reading"], "roles": {**roles, "group": group}},
        "inputs": [dataset.label(index) for index in range(len(dataset.files))],
        "padding_rows": padding_rows,
    }
    summary = combined_summary(run, top=top, estimator=config.estimator.value, settings=settings)
    summary["by_step"] = {"by": "file", "steps": entries}
    summary["duplicate_rows"] = duplicates
    return BiasReport(summary, run.top_trajectories.clear(), run.top_groups.clear())


def _duplicates(run: dict[str, Any], part: int, report: dict[str, Any]) -> dict[str, Any]:
    """The duplicated rows of the parts so far (``run``, empty before the first) and of part
    number ``part`` as one report: the run's first few copies, each group keyed by its file
    as the run's are."""
    first = [{**copy, "group": {"file": part, "group": copy["group"]}} for copy in report["first"]]
    if not run:
        return {**report, "first": first}
    return {
        "count": run["count"] + report["count"],
        "compared": run["compared"],
        "token_ids_compared": run["token_ids_compared"] and report["token_ids_compared"],
        "first": [*run["first"], *first][:EXAMPLES],
    }

"""``compare --by file`` one part (one input file) at a time: each part through stage 1, stage 2
and its own report, in this process, in ``--jobs`` worker processes or as Ray tasks; the whole
run's report combined from the parts' figures (:mod:`advcli.report.parts`), so that the memory
held is about one part's whatever their number."""

from __future__ import annotations

import multiprocessing
import signal
from dataclasses import dataclass
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
from advcli.report.parts import PartFigures, combined_summary, part_figures
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
    """A part's figures (None for a file without rows), its duplicates report and its input's
    settings."""

    figures: PartFigures | None
    duplicates: dict[str, Any]
    settings: dict[str, Any]


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


# A file without rows: its place in the series, with no figures.
EMPTY = PartResult(None, {}, {})


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
        results = _in_workers(tasks, jobs)
    else:
        results = [_run(dataset.part(task.part), task) for task in tasks]
    report = _combined(dataset, results, config, top)
    # The report is the inputs' if they are as they were opened.
    dataset.check_unchanged()
    return report


def run_part(task: PartTask) -> PartResult:
    """One part's work in a worker (a process or a Ray task): its file opened there."""
    if not task.rows:
        return EMPTY
    return _run(open_dataset([str(task.path)]), task)


def _in_workers(tasks: list[PartTask], jobs: int) -> list[PartResult]:
    """``tasks`` in ``jobs`` spawned worker processes, results in part order. The workers leave
    Ctrl-C to this process, which ends them, as it does on an error in any part."""
    pool = multiprocessing.get_context("spawn").Pool(
        min(jobs, len(tasks)), initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    )
    try:
        results = pool.map(run_part, tasks, chunksize=1)
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()
    return results


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
    return PartResult(figures, duplicates.report(dataset.locate), settings)


def _combined(
    dataset: Dataset, results: list[PartResult], config: AdvantageConfig, top: int
) -> BiasReport:
    kept = [(index, result) for index, result in enumerate(results) if result.figures is not None]
    if not kept:
        raise AdvcliError(f"{dataset.describe()}: no rows in any input file")
    parts = [result.figures for _, result in kept if result.figures is not None]
    # The run's settings are the first part's, but for what tells the parts apart.
    own = parts[0].summary["settings"]
    roles = own["reading"]["roles"]
    group = {**roles["group"], "why": by_reason(roles["group"]["why"], "file", "file")}
    settings = {
        **own,
        "reading": {**own["reading"], "roles": {**roles, "group": group}},
        "inputs": [dataset.label(index) for index in range(len(dataset.files))],
        "padding_rows": sum(result.settings["padding_rows"] for _, result in kept),
    }
    summary = combined_summary(parts, top=top, estimator=config.estimator.value, settings=settings)
    summary["by_step"] = {
        "by": "file",
        "steps": [
            empty_step(dataset.label(index))
            if result.figures is None
            else step_entry(result.figures.summary, dataset.label(index))
            for index, result in enumerate(results)
        ],
    }
    summary["duplicate_rows"] = _duplicates(kept)
    return BiasReport(summary, parts[0].top_trajectories.clear(), parts[0].top_groups.clear())


def _duplicates(kept: list[tuple[int, PartResult]]) -> dict[str, Any]:
    """The parts' duplicated rows as one report: the run's first few copies, each group
    keyed by its file as the run's are."""
    reports = [(index, result.duplicates) for index, result in kept]
    first = [
        {**copy, "group": {"file": index, "group": copy["group"]}}
        for index, report in reports
        for copy in report["first"]
    ]
    return {
        "count": sum(report["count"] for _, report in reports),
        "compared": reports[0][1]["compared"],
        "token_ids_compared": all(report["token_ids_compared"] for _, report in reports),
        "first": first[:EXAMPLES],
    }

"""``compute --by file`` one file at a time (by the part runner, :mod:`advcli.run.runner`):
each file through stage 1 and stage 2 as a batch of its own, then its rows streamed to the
output after the files before it, so that what is held is about one file's whatever their
number. The run's figures are the files' summed."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import polars as pl

from advcli.advantages.estimators import Advantages
from advcli.errors import AdvcliError, first_line
from advcli.read.alike import ReadAlike
from advcli.read.columns import ColumnRoles
from advcli.read.dataset import Dataset
from advcli.read.duplicates import DuplicateRows
from advcli.read.scan import release_freed_memory
from advcli.run.loading import LoadedDump, by_reason, counted_rows
from advcli.run.row_values import row_values
from advcli.run.runner import results_in_order
from advcli.settings.config import AdvantageConfig, ColumnNames, LossMode


@dataclass
class RunCounts:
    """What ``compute`` tells of the batches done so far (one, or the files so far): their
    figures summed, and for files, the run's reading (:class:`~advcli.read.alike.ReadAlike`:
    the first file's, which every file is read with)."""

    groups: int = 0
    trajectories: int = 0
    singleton_groups: int = 0
    zero_std_groups: int = 0
    duplicate_rows: int = 0
    duplicates_confirmed: bool = True
    padding_rows: int = 0
    reading: ReadAlike = field(default_factory=ReadAlike)

    @classmethod
    def of(cls, dump: LoadedDump, advantages: Advantages, duplicates: DuplicateRows) -> RunCounts:
        """The counts of one batch: ``dump``'s, its advantages' and its duplicated rows'."""
        counts = cls()
        counts.add(dump, advantages, duplicates)
        return counts

    def add(self, dump: LoadedDump, advantages: Advantages, duplicates: DuplicateRows) -> None:
        """Count in one batch's figures: ``dump``'s, its advantages' and its duplicated rows'."""
        self.groups += advantages.groups.height
        self.trajectories += dump.trajectory_count()
        self.singleton_groups += advantages.singleton_groups
        self.zero_std_groups += advantages.zero_std_groups
        self.duplicate_rows += duplicates.count
        self.duplicates_confirmed &= duplicates.confirmed
        self.padding_rows += dump.padding.height


@dataclass(frozen=True)
class PartSettings:
    """How each file is computed: compute's own settings."""

    names: ColumnNames
    config: AdvantageConfig
    drop_duplicates: bool
    mask_needed_for: str | None
    loss_weight: LossMode | None
    loss_scale_factor: float | None


def file_parts(
    dataset: Dataset, settings: PartSettings, counts: RunCounts
) -> Iterator[tuple[Dataset, ColumnRoles, pl.DataFrame]]:
    """Each file of ``dataset`` with rows, as it is asked for (the part runner's, in this
    process): the file as a dataset of its own, the roles it was read with and its rows'
    values (:func:`advcli.row_values.row_values`), its figures added to ``counts``."""
    files = [index for index, rows in enumerate(dataset.row_counts) if rows]
    return results_in_order(files, functools.partial(_file_part, dataset, settings, counts))


def _file_part(
    dataset: Dataset, settings: PartSettings, counts: RunCounts, index: int
) -> tuple[Dataset, ColumnRoles, pl.DataFrame]:
    """File ``index``'s part of the output: the file, its roles and its rows' values."""
    part = dataset.part(index)
    # A file changed since the run began is named as such, not as a file that cannot be read.
    part.check_unchanged()
    try:
        columns, values = _computed(part, settings, counts)
    except pl.exceptions.PolarsError as error:
        # Stage 1's reads name their file already; what Polars raises past them is named here,
        # not after the output the sink was writing.
        raise AdvcliError(f"{part.describe()}: cannot compute ({first_line(error)})") from None
    # Only the rows' values go on to the write, as in a run of one batch: what the file's
    # stages held is let go first.
    release_freed_memory()
    return part, columns, values


def _computed(
    part: Dataset, settings: PartSettings, counts: RunCounts
) -> tuple[ColumnRoles, pl.DataFrame]:
    """One file's stage 1 and 2: the roles it was read with and its rows' values, its figures
    added to ``counts``."""
    config = settings.config
    read = functools.partial(
        counted_rows,
        part,
        drop_duplicates=settings.drop_duplicates,
        turn_rewards=config.per_turn is not None,
        mask_needed_for=settings.mask_needed_for,
        step_roles=config.compute_step_roles(report=False),
    )
    every_row, dump, duplicates = counts.reading.as_run(
        part.describe(),
        read(names=settings.names),
        lambda rows: rows[1].columns,
        settings.names,
        lambda names: read(names=names),
    )
    dump, config = dump.with_trainer_rule(config, both_levels=False)
    advantages = dump.advantages(config)
    counts.add(dump, advantages, duplicates)
    values = row_values(
        every_row,
        dump,
        duplicates,
        advantages,
        settings.loss_weight,
        settings.loss_scale_factor,
    )
    return dump.columns, values


def run_columns(counts: RunCounts) -> ColumnRoles:
    """The roles the run was read with, as a run of every file at once names them: its groups
    keyed by the file too."""
    columns = counts.reading.columns
    assert columns is not None
    reasons = {**columns.reasons, "group": by_reason(columns.reasons["group"], "file", "file")}
    return replace(columns, reasons=reasons)

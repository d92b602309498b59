"""Stage 1 for the commands: the inputs opened as one dataset (:func:`opened`), their column
roles and checked key projection (:func:`load_dump`, locally or on Ray Data), each row's step
with ``--by``, and the rows stage 2 counts (:func:`counted_rows`, duplicates as the trainer
counted them or dropped). A :class:`LoadedDump` hands its projection to stage 2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from advcli import __version__
from advcli.advantages.estimators import Advantages, compute_advantages
from advcli.advantages.groupings import every_grouping
from advcli.advantages.per_turn import per_turn_advantages
from advcli.advantages.step_groups import gigpo_advantages
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import Trajectories, count_trajectories, index_trajectories
from advcli.errors import AdvcliError, UsageError, first_line
from advcli.keys import ANCHOR, COPY_OF, GROUP, ROW
from advcli.read.columns import ColumnRoles, with_trainer_rules
from advcli.read.dataset import Dataset
from advcli.read.dialects import ROLES, STEP_ROLES, dialect_named
from advcli.read.dtypes import is_enum
from advcli.read.duplicates import TOKEN_COLUMNS, DuplicateRows, find_duplicates
from advcli.read.file_roles import FileRoles, named_by_file
from advcli.read.inputs import STDIN, open_dataset
from advcli.read.picker import COMMAND_LINE, Options
from advcli.read.projection import (
    check_consecutive_turns,
    check_unique_turns,
    key_projection,
    split_padding,
)
from advcli.read.roles import read_roles
from advcli.read.scan import closing_sources
from advcli.read.trainer_advantage import with_trainer_advantage
from advcli.read.trainer_dumps import TrainerDump
from advcli.read.turn_rewards import check_last_steps, check_turn_rewards
from advcli.report.step_credit import not_measured, step_credit
from advcli.report.termination import TerminationReport, termination_report
from advcli.report.views import counted
from advcli.settings.config import (
    AdvantageConfig,
    ColumnNames,
    Engine,
    Level,
    StepRoles,
    TrajScore,
)
from advcli.write.outputs import check_not_written_into

# What the library calls take as inputs: one path, or a sequence of them (``-``: standard input).
Inputs = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class LoadedDump:
    """A dump after stage 1: its files, its column roles and its checked key projection, less
    its padding rows (SkyRL's), which are in ``padding``."""

    dataset: Dataset
    columns: ColumnRoles
    projection: pl.DataFrame
    # With --by, each row's step (its file's number, or its value of the --by column); a part
    # of one value's (compare --by, one part at a time), that value alone.
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

    def trainer_advantages(self) -> pl.Series | None:
        """The trainer's own advantage of each row of the projection, where the dump holds
        them (null where it has none for a row)."""
        column = self.columns.trainer_advantage
        if column is None:
            return None
        return self.dataset.read_columns([column]).to_series().gather(self.projection[ROW])

    def with_trainer_rule(
        self, config: AdvantageConfig, *, both_levels: bool = True
    ) -> tuple[LoadedDump, AdvantageConfig]:
        """The dump and ``config`` with its trainer's rule for a trajectory whose rows differ,
        where the settings choose none and the trajectory level is computed (``both_levels``,
        else at ``config.level`` only): verl-agent's own, ``--traj-score own``, stated in the
        reading. Where its rows agree the rule gives the numbers of any other. A dump whose
        trainer removed its rewards has no advantages to compute: an error saying so."""
        if self.columns.reward_removed is not None:
            raise AdvcliError(f"{self.dataset.describe()}: {self.columns.reward_removed}")
        at_trajectory = both_levels or config.level is Level.TRAJECTORY
        rule = self.columns.traj_score_rule
        if rule is not None and at_trajectory and config.takes_trainer_score_rule:
            score_rule, why = rule
            note = f"{why} (--traj-score {score_rule.value}; another --traj-score replaces it)"
            columns = replace(self.columns, notes=(*self.columns.notes, note))
            return replace(self, columns=columns), replace(config, traj_score=score_rule)
        trainer = self.columns.own_scores_of
        if trainer is None or not at_trajectory or not config.takes_own_scores:
            return self, config
        note = (
            f"a trajectory's rows may differ by {trainer}'s invalid-action penalty: "
            "at trajectory level each trajectory's first row is in its group's statistics and "
            f"every row is centred on its own score, {trainer}'s rule for counting each "
            "trajectory once (--traj-score own, a group whose first rows tie divided by 1 + ε; "
            "another --traj-score replaces it)"
        )
        columns = replace(self.columns, notes=(*self.columns.notes, note))
        return replace(self, columns=columns), replace(config, traj_score=TrajScore.OWN)

    def advantages(self, config: AdvantageConfig) -> Advantages:
        if config.per_turn is not None:
            return per_turn_advantages(
                self.projection, config, self.naming, self.trajectories, self.batch
            )
        if config.step is not None:
            return gigpo_advantages(
                self.projection, config, self.naming, self.trajectories, self.batch
            )
        trajectories = self.trajectories if config.level is Level.TRAJECTORY else None
        return compute_advantages(self.projection, config, self.naming, trajectories, self.batch)

    def step_credit(
        self, config: AdvantageConfig, computed: Advantages | None = None
    ) -> dict[str, Any]:
        """The report's ``step_credit`` for gigpo: from ``computed`` (the gigpo result, if the
        caller has it) or a gigpo run at ``config.level``; said to be not measured without an
        anchor column."""
        if ANCHOR not in self.projection.columns:
            reason = "the dump has no anchor column (name one with --anchor-col)"
            return not_measured(self.projection, self.trajectories, config, reason)
        steps = (computed or self.advantages(config)).steps
        assert steps is not None
        columns = self.columns
        sources = {
            "turn_order": (
                f"the turn column '{columns.turn}'"
                if columns.turn is not None
                else "row order (no turn column)"
            ),
            "returns": (
                f"the step returns in '{columns.step_return}', as they are"
                if columns.step_return is not None
                else f"the step rewards in '{columns.step_reward}', discounted by gamma"
            ),
            "returns_given": columns.step_return is not None,
        }
        return step_credit(self.projection, self.trajectories, steps, config, sources, self.batch)

    def termination_report(
        self, config: AdvantageConfig, settings: dict[str, Any], duplicates: DuplicateRows
    ) -> TerminationReport:
        """The termination report of the rows under ``config`` (per-turn rewards): every
        grouping on them (``settings``: what the report says of the input; ``duplicates``: its
        duplicated rows)."""
        rows = every_grouping(self.projection, config, self.naming, self.trajectories, self.batch)
        report = termination_report(rows, config=config, settings=settings, version=__version__)
        report.summary["duplicate_rows"] = duplicates.report(self.dataset.locate)
        return report

    def with_turn_rewards(self, confirmed: bool = False) -> LoadedDump:
        """The dump read for per-turn rewards: its turn indices checked consecutive in each
        trajectory, its last-step flags against that order, its rewards checked not to be an
        outcome score repeated on every turn (unless ``confirmed``: an option named the reward
        column), and its reading notes saying which order the rewards-to-go follow."""
        columns = self.columns
        if COPY_OF in self.projection.columns:
            copies = self.projection[COPY_OF].is_not_null().sum()
            raise AdvcliError(
                f"{self.dataset.describe()}: per-turn rewards take each turn once, and the "
                f"dump holds {copies:,} of {columns.turn_copies_of}'s padding copies, which "
                "repeat a turn: pass --drop-duplicates to count each once"
            )
        if columns.turn is not None:
            check_consecutive_turns(
                self.projection, self.dataset, columns, self.trajectories.of_row
            )
            order = f"the turn column '{columns.turn}'"
        else:
            order = "row order (no turn column)"
        check_last_steps(self.projection, self.dataset, columns)
        check_turn_rewards(self.trajectories.table, self.dataset, columns, confirmed)
        note = f"per-turn rewards: each trajectory's rewards-to-go follow {order}"
        dump = replace(self, columns=replace(columns, notes=(*columns.notes, note)))
        # The same rows: their index, made for the checks above, serves the new dump too.
        dump.__dict__["trajectories"] = self.trajectories
        return dump

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
            # Rows a trainer's dump sets apart otherwise than as padding say what they are.
            **(
                {"padding_label": self.columns.padding_label}
                if self.columns.left_out is not None
                else {}
            ),
        }


def _turn_hint(columns: ColumnRoles) -> str:
    """For a turn column read for its name: what to do if it is the training step."""
    if columns.turn is None or "turn" not in columns.by_name:
        return ""
    return (
        f" (or, if '{columns.turn}', read as the turn index for its name, is the training step, "
        f"--by {columns.turn})"
    )


def load_dump(  # noqa: PLR0913
    dataset: Dataset,
    names: ColumnNames = ColumnNames(),
    *,
    unique_turns: bool = True,
    engine: Engine = Engine.LOCAL,
    mask_needed_for: str | None = None,
    by: str | None = None,
    step_roles: StepRoles = False,
    turn_rewards: bool = False,
    trainer_advantage: bool = False,
) -> LoadedDump:
    """Stage 1: pick the columns, read and check the key projection (on Ray Data with
    ``engine="ray"``, after :func:`start_engine`). ``mask_needed_for`` says what needs the
    token counts, if anything does: without it a dump with no mask column is read too.

    ``by`` (``"file"`` or a column) makes each part its own batch: its groups are keyed by
    ``(step, group)``, so ids that repeat across steps (dataset indices) stay apart. ``step_roles``:
    GiGPO's roles are read too (the anchor, the step reward or return; as
    :func:`advcli.read.columns.resolve_columns` takes ``steps``); ``turn_rewards``: the reward is
    each turn's own (``--reward-mode per-turn``); ``trainer_advantage``: each row's advantage as
    the trainer computed it is read into the projection too (``audit``'s, local engine only).

    A file advcli wrote names its columns' roles in its metadata
    (:mod:`advcli.read.file_roles`): they stand where no option names a role, and its training
    step is never read as the turn. Read as one batch, a group with rows of two training steps
    is an error: a group is one step's rollouts of a prompt."""
    names = _named_by_files(names, dataset, turn_rewards)
    training_step = _training_step(dataset, names)
    step_columns = (by,) if by not in (None, "file") else ()
    columns = read_roles(
        dataset.schema,
        dataset.describe(),
        names,
        dataset.read_columns,
        mask_needed_for=mask_needed_for,
        not_turns=(*step_columns, *([training_step] if training_step else [])),
        options=_options_for(dataset.view),
        steps=step_roles,
        turn_rewards=turn_rewards,
    )
    columns = _as_the_files_say(columns, dataset, training_step)
    if trainer_advantage:
        columns = with_trainer_advantage(
            columns, dataset.schema, dataset.describe(), names.advantage
        )
    # A trainer's padding copies repeat a turn: the turns are checked once they are found.
    unique_turns = unique_turns and columns.turn_copies_of is None
    if by not in (None, "file") and names.turn is None:
        _check_by_is_not_the_turn(by, columns, dataset.describe())
    # A part of one value of --by is its value's rows alone.
    rows = dataset.step.rows if dataset.step else dataset.num_rows
    if columns.group_size is not None and rows % columns.group_size:
        raise AdvcliError(
            f"{dataset.describe()}: {rows:,} rows are not whole groups of "
            f"--group-size {columns.group_size}"
        )
    if engine == Engine.RAY:
        _check_ray_reading(dataset, columns, step_roles, turn_rewards)
    # With --by the repeated turns are looked for once the groups are keyed by step.
    unique = unique_turns and by is None
    if engine == Engine.RAY:
        read = load_ray_engine().key_projection(dataset, columns, unique_turns=unique)
    else:
        read = key_projection(
            dataset, columns, unique_turns=unique, trainer_advantage=trainer_advantage
        )
    projection, padding = split_padding(read, dataset, columns)
    if by is None:
        if training_step is not None:
            _check_groups_in_one_step(dataset, projection, training_step)
        notes = (
            *columns.notes,
            *dataset.unread,
            *_spanning_files(dataset, projection),
            *_dump_notes(dataset, projection),
        )
        return LoadedDump(dataset, replace(columns, notes=notes), projection, padding=padding)
    steps = _step_labels(dataset, by)
    # A part of one value (compare --by one part at a time): that value is every row's step.
    step = (
        steps.new_from_index(0, projection.height)
        if dataset.step
        else steps.gather(projection[ROW])
    )
    if columns.group_size is not None and not dataset.step:
        _check_blocks_within_parts(dataset, projection, step, columns.group_size, by)
    projection = projection.with_columns(pl.struct(step, pl.col(GROUP).alias("group")).alias(GROUP))
    if unique_turns and columns.turn is not None:
        check_unique_turns(projection, dataset, columns)
    reasons = {**columns.reasons, "group": by_reason(columns.reasons["group"], by, steps.name)}
    # A part of one value is no run's reading: the run says its folders' notes once.
    unread = dataset.unread if dataset.step is None else ()
    notes = (*columns.notes, *unread, *_dump_notes(dataset, projection))
    columns = replace(columns, reasons=reasons, notes=notes)
    return LoadedDump(dataset, columns, projection, steps=steps, padding=padding)


def _check_ray_reading(
    dataset: Dataset, columns: ColumnRoles, step_roles: StepRoles, turn_rewards: bool
) -> None:
    """Refuse a reading Ray's blocks cannot do: GiGPO, rows without group and trajectory ids,
    per-turn rewards without a turn column."""
    # Per-turn rewards' anchor step groups run on Ray: its stage 2 has the whole projection.
    if step_roles is True or (columns.anchor is not None and not turn_rewards):
        raise AdvcliError("--estimator gigpo runs on the local engine only")
    if columns.group is None or columns.trajectory is None:
        raise AdvcliError(
            f"{dataset.describe()}: --engine ray needs group and trajectory id columns (its "
            "blocks do not know their rows' numbers); use the local engine"
        )
    if turn_rewards and columns.turn is None:
        raise AdvcliError(
            f"{dataset.describe()}: --engine ray needs a turn column under --reward-mode "
            "per-turn (its blocks do not know their rows' numbers, and a row's reward-to-go "
            "depends on its place in its trajectory); pass --turn-col, or use the local engine"
        )


def _check_blocks_within_parts(
    dataset: Dataset, projection: pl.DataFrame, step: pl.Series, size: int, by: str
) -> None:
    """Refuse groups of ``size`` consecutive rows (``--group-size``) that cross from one part
    of ``--by`` into the next: each part is its own batch, so its rows are whole groups (as
    each file's must be when the files are written one at a time)."""
    mixed = _first_mixed(projection[ROW] // size, step, projection[ROW])
    if mixed is None:
        return
    row, earlier, value = mixed
    if by == "file":
        raise AdvcliError(
            f"{dataset.label(earlier)}: {dataset.row_counts[earlier]:,} rows are not whole groups "
            f"of --group-size {size}"
        )
    raise AdvcliError(
        f"{dataset.locate(row)}: its group of --group-size {size} rows has rows of '{by}' "
        f"{earlier!r} and {value!r}; each value is its own batch (--by {by}), so its rows must "
        "be whole groups"
    )


def by_reason(reason: str, by: str, step: str) -> str:
    """Why the groups are what they are under ``--by``: ``reason`` (the dump's), and the step
    (named ``step``) that keys them too."""
    part = "file" if by == "file" else f"value of '{by}'"
    return f"{reason}; each {part} is its own batch (--by {by}): a group is a ({step}, group) pair"


def _first_mixed(key: pl.Series, values: pl.Series, rows: pl.Series) -> tuple[int, Any, Any] | None:
    """The first row (its number in ``rows``) whose value differs from the first value of its
    ``key``: (row, that first value, its own), None where every key holds one value."""
    frame = pl.DataFrame({"key": key, "value": values, "row": rows})
    first = pl.col("value").first().over("key")
    mixed = frame.with_columns(first.alias("first")).filter(pl.col("value") != pl.col("first"))
    if mixed.is_empty():
        return None
    row, earlier, value = mixed.select("row", "first", "value").row(0)
    return row, earlier, value


def _training_step(dataset: Dataset, names: ColumnNames) -> str | None:
    """The training step's column the files' advcli metadata names, unless an option named
    it for a role."""
    step = dataset.file_roles.training_step if dataset.file_roles is not None else None
    named = {getattr(names, role) for role in (*ROLES, *STEP_ROLES)}
    return step if step not in named else None


def _check_groups_in_one_step(dataset: Dataset, projection: pl.DataFrame, step: str) -> None:
    """Refuse a group with rows of two training steps (column ``step``): read as one batch,
    steps whose group ids repeat (a dataset index) would have their groups merged."""
    steps = dataset.read_columns([step]).to_series().gather(projection[ROW])
    mixed = _first_mixed(projection[GROUP], steps, projection[ROW])
    if mixed is None:
        return
    row, earlier, value = mixed
    raise AdvcliError(
        f"{dataset.locate(row)}: its group has rows of training steps {earlier} and {value} "
        f"('{step}'): the steps' group ids repeat, and read as one batch their groups would be "
        f"merged; pass --by {step} to read each step as its own batch"
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
    """Each input row's step: its file's number (``by="file"``) or its value of column ``by``
    (of a part of one value, that value alone)."""
    if by == "file":
        return dataset.file_numbers()
    if dataset.step is not None:
        return pl.Series("step", [dataset.step.value], dtype=step_type(dataset.schema[by]))
    labels = dataset.read_columns([by]).to_series().alias("step")
    labels = labels.cast(step_type(labels.dtype))
    if labels.null_count():
        raise null_step(dataset, by, int(labels.is_null().arg_max() or 0))
    return labels


def null_step(dataset: Dataset, by: str, row: int) -> AdvcliError:
    """The error for row number ``row``, whose value of the ``--by`` column is null."""
    return AdvcliError(f"{dataset.locate(row)}: column '{by}' (--by) is null")


def step_type(dtype: Any) -> Any:
    """The type ``--by``'s steps are held in: a Categorical or Enum column's values as text (the
    steps in the order of their text), another's as they are."""
    return pl.String if dtype == pl.Categorical or is_enum(dtype) else dtype


def check_engine(
    engine: Engine, address: str | None, config: AdvantageConfig, **per_turn: Any
) -> None:
    """Refuse a cluster address without the engine that uses one, and what ``config`` does not
    run with (:func:`check_per_turn`, given ``per_turn``'s flags)."""
    if address is not None and engine != Engine.RAY:
        raise UsageError("--address goes with --engine ray")
    check_per_turn(config, **per_turn)


def start_engine(engine: Engine, address: str | None) -> None:
    """Connect to (or start) the engine's cluster; nothing to do for the local engine."""
    if engine == Engine.RAY:
        load_ray_engine().start(address)


def load_ray_engine() -> Any:
    """The module of ``--engine ray`` (:mod:`advcli.run.ray_engine`), imported only when it is
    asked for: Ray is an optional extra."""
    try:
        from advcli.run import ray_engine
    except ImportError:
        raise AdvcliError("--engine ray needs Ray: pip install 'advcli[ray]'") from None
    return ray_engine


def check_per_turn(
    config: AdvantageConfig, *, by: str | None = None, compare: bool = False
) -> None:
    """Refuse what per-turn rewards do not run with yet, before any input is opened:
    ``compare --by`` (the termination report is of one batch)."""
    if config.per_turn is None:
        return
    if compare and by is not None:
        raise UsageError(
            "compare --by does not take --reward-mode per-turn: the termination report is of "
            "one batch"
        )


def counted_rows(
    dataset: Dataset,
    names: ColumnNames,
    drop_duplicates: bool,
    turn_rewards: bool = False,
    **options: Any,
) -> tuple[LoadedDump, LoadedDump, DuplicateRows]:
    """Stage 1 (:func:`load_dump` with ``options``) for a command that counts rows: the dump
    of every row, the dump as stage 2 counts it, and its duplicated rows. Stage 2 counts every
    row, as the trainer counted them, or with ``drop_duplicates`` only the first row of each
    identical set. ``turn_rewards``: the counted rows are read for per-turn rewards
    (:meth:`LoadedDump.with_turn_rewards`)."""
    every_row = load_dump(
        dataset, names, unique_turns=not drop_duplicates, turn_rewards=turn_rewards, **options
    )
    duplicates = find_duplicates(dataset, every_row.columns, every_row.projection)
    confirmed = names.reward is not None
    if every_row.columns.turn_copies_of is not None and not drop_duplicates:
        every_row = _with_counted_copies(every_row, duplicates)
    if not drop_duplicates:
        every_row = every_row.with_turn_rewards(confirmed) if turn_rewards else every_row
        return every_row, every_row, duplicates
    dump = every_row
    if duplicates.count and not duplicates.confirmed:
        raise AdvcliError(
            f"{dump.dataset.describe()}: --drop-duplicates needs the rows' token ids "
            f"({', '.join(TOKEN_COLUMNS)}) to tell a copy from a turn alike in score and tokens; "
            f"the dump has none, so its {counted(duplicates.count, 'row')} alike in keys, score "
            "and tokens are only possible copies"
        )
    if duplicates.count:
        dump = replace(dump, projection=duplicates.drop_from(dump.projection))
    if dump.columns.turn is not None:
        # A copy repeats its turn: the turns are checked once the copies are gone (ROLL
        # pads its batch with copies of whole rows).
        check_unique_turns(dump.projection, dump.dataset, dump.columns)
    return every_row, dump.with_turn_rewards(confirmed) if turn_rewards else dump, duplicates


def _with_counted_copies(dump: LoadedDump, duplicates: DuplicateRows) -> LoadedDump:
    """A dump whose trainer's padding copies repeat a turn (ROLL's), the copies counted as the
    trainer counted them: any other repeated turn is an error, each copy names the row it
    copies (``copy_of``), and the reading says how many there are."""
    if not duplicates.count or not duplicates.confirmed:
        check_unique_turns(dump.projection, dump.dataset, dump.columns)
        return dump
    copies = duplicates.copies
    projection = dump.projection.join(
        copies.select(ROW, COPY_OF), on=ROW, how="left", maintain_order="left"
    )
    check_unique_turns(projection.filter(pl.col(COPY_OF).is_null()), dump.dataset, dump.columns)
    trainer = dump.columns.turn_copies_of
    note = (
        f"{counted(copies.height, 'row')} {'repeats' if copies.height == 1 else 'repeat'} an "
        "earlier row's group, trajectory and turn "
        f"('{dump.columns.turn}') and its reward and mask: {trainer}'s padding copies "
        f"(batch_adjust_mode copy), counted as {trainer} counted them (--drop-duplicates "
        "counts each once)"
    )
    columns = replace(dump.columns, notes=(*dump.columns.notes, note))
    return replace(dump, columns=columns, projection=projection)


def report_settings(dump: LoadedDump, drop_duplicates: bool) -> dict[str, Any]:
    """What a bias report says of its input and of how its rows were counted."""
    return {**dump.report_settings(), "drop_duplicates": drop_duplicates}


def _as_the_files_say(
    columns: ColumnRoles, dataset: Dataset, training_step: str | None
) -> ColumnRoles:
    """The roles with what the files say besides the columns: a file advcli wrote, its
    metadata; a trainer's own dump, its reading."""
    if dataset.file_roles is not None:
        columns = _as_the_file_says(columns, dataset.file_roles, training_step)
    if dataset.view is not None:
        columns = _as_the_dump_says(columns, dataset.view)
    return columns


def _dump_notes(dataset: Dataset, projection: pl.DataFrame) -> tuple[str, ...]:
    """What a trainer's own dump's reading says of the groups it found."""
    return dataset.view.notes_on(projection[GROUP]) if dataset.view is not None else ()


def _as_the_file_says(
    columns: ColumnRoles, file_roles: FileRoles, training_step: str | None
) -> ColumnRoles:
    """The roles of a file advcli wrote with what its metadata says besides the columns: its
    training step is never a turn, and its trainer (whose remedy the report gives) and that
    trainer's rules (verl-agent's own score rule, ROLL's padding copies) stand for the file as
    for the batch it was written from."""
    if training_step is not None:
        note = (
            f"'{training_step}' is the training step, as {file_roles.source} says "
            f"(written by {file_roles.written_by}): never a turn"
        )
        columns = replace(columns, notes=(*columns.notes, note))
    trainer = dialect_named(file_roles.trainer)
    if trainer is not None:
        columns = with_trainer_rules(columns, trainer)
        if trainer.trainer != columns.dialect:
            columns = replace(columns, written_from=trainer.trainer)
    return columns


def _named_by_files(names: ColumnNames, dataset: Dataset, turn_rewards: bool) -> ColumnNames:
    """``names`` with the roles the files name (:func:`named_by_file`), and, for a trainer's
    dump whose groups are blocks of rows of one value (TRL's), their size where no option
    gives the groups. Where options name ids, a trainer's dump's ids are not read (its other
    roles are)."""
    view, roles = dataset.view, dataset.file_roles
    if view is not None and roles is not None and (names.group or names.trajectory or names.turn):
        ids = ("group", "trajectory", "turn")
        roles = replace(roles, columns=tuple(c for c in roles.columns if c[1] not in ids))
    names = named_by_file(names, roles, turn_rewards=turn_rewards)
    if view is None or view.blocks_of is None or names.group or names.group_size:
        return names
    try:
        with closing_sources():
            values = dataset.rows().select(view.block_values()).collect(engine="streaming")
    except pl.exceptions.PolarsError as error:
        raise AdvcliError(
            f"{dataset.describe()}: cannot read the column '{view.blocks_of}' ({first_line(error)})"
        ) from None
    size, why = view.group_size(values, dataset.describe())
    why = f"{view.roles.source}: {why}; --group-size sets it"
    return replace(names, group_size=size, named_in={**names.named_in, "group": why})


def _options_for(view: TrainerDump | None) -> Options:
    """The command line's options, for a trainer's dump that keeps a trajectory in a row with
    a trajectory a row where it has no trajectory column."""
    if view is None or not view.rows_are_trajectories:
        return COMMAND_LINE
    return replace(COMMAND_LINE, rows_without_trajectory=True)


def _as_the_dump_says(columns: ColumnRoles, view: TrainerDump) -> ColumnRoles:
    """The roles of a trainer's own dump with what its reading says besides the columns: the
    layout it was read in, and the trainer's rule for a trajectory whose rows differ where the
    reading found the trajectories the trainer scores by it. Where the options name other ids,
    the dump is read by them, and the reading says so."""
    if view.reward_removed is not None:
        # Its column stands in for the role: no number of any row is read from it.
        reasons = {**columns.reasons, "reward": view.roles.named_in("reward")}
        columns = replace(columns, reward_removed=view.reward_removed, reasons=reasons)
    if not view.keys_taken(columns):
        note = (
            f"the options name the ids, so the file is read by them and its columns' names, "
            f"not as {view.layout}"
        )
        return replace(columns, notes=(*columns.notes, note))
    columns = replace(columns, read_from=view.layout, notes=(*columns.notes, *view.notes))
    if columns.trainer is None:
        columns = replace(columns, written_from=view.trainer)
    if view.left_out is not None:
        columns = replace(columns, left_out=view.left_out, padding_label=view.left_out_label)
    if view.advantage is not None:
        why = f"{view.roles.source}: {view.advantage_why}; the trainer's, never read as a reward"
        reasons = {**columns.reasons, "trainer_advantage": why}
        columns = replace(columns, trainer_advantage=view.advantage, reasons=reasons)
    if columns.trajectory is None and view.rows_are_trajectories:
        why = view.roles.named_in("trajectory")
        columns = replace(columns, reasons={**columns.reasons, "trajectory": why})
    if view.traj_score is not None:
        columns = replace(columns, traj_score_rule=(view.traj_score, view.traj_score_why))
    return columns


def _check_by_is_not_the_turn(by: str, columns: ColumnRoles, where: str) -> None:
    """Refuse ``--by`` on the column the dump's trainer keeps its turn in (ROLL's ``step``):
    each part would be one turn of every trajectory, not a training step."""
    dialect = dialect_named(columns.dialect)
    if dialect is not None and by in dialect.turn:
        raise AdvcliError(
            f"{where}: '{by}' is the turn column of {dialect.trainer}'s dumps, so --by {by} "
            "would make each turn a batch of its own; pass --turn-col if it is not the turn, "
            "or --by the training-step column (or file)"
        )


def check_by(dataset: Dataset, by: str | None) -> None:
    """Refuse a ``--by`` column that is missing or not integers or strings, before any work
    (None: no ``--by``), and ``--by file`` (or ``watch``) over files that each hold many
    training steps (open-instruct's shards)."""
    view = dataset.view
    if by == "file" and view is not None and view.steps_in_rows:
        raise AdvcliError(
            f"{dataset.describe()}: each of {view.trainer}'s files holds many training steps (its "
            "'step' column), so --by file and watch would take a file for a step: --by step "
            "reads each step as its own batch"
        )
    if by is None or by == "file":
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


def input_names(inputs: Inputs) -> list[str]:
    """The inputs' names: one path given alone is one input, not the characters of its name."""
    if isinstance(inputs, (str, os.PathLike)):
        return [os.fspath(inputs)]
    return [os.fspath(name) for name in inputs]


@contextlib.contextmanager
def opened(
    inputs: Inputs, *, empty_ok: bool = False, train_files: bool = True
) -> Iterator[Dataset]:
    """Open the inputs (one path, or a sequence of them) as one dataset (without rows an error
    unless ``empty_ok``); standard input (``-``), a trainer's dump that is no table (rLLM's
    episode files: :mod:`advcli.read.containers`) and JSON lines read into Arrow
    (:mod:`advcli.read.json_translation`) are spooled to a temporary folder that is removed
    afterwards. Without them no folder is made (a run killed by SIGKILL, which no
    cleanup outlives, would leave it behind). An error in the block is reported as an input's
    change when one changed (:meth:`Dataset.changes_reported`). Standard output that is an
    input file (``advcli compare dump.parquet >> dump.parquet``) is refused whatever the
    command, as ``cat`` refuses it: what a command prints would go into the input.
    ``train_files``: as :func:`~advcli.read.containers.translated` takes it."""
    names = input_names(inputs)
    with contextlib.ExitStack() as stack:

        def spool() -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="advcli-spool-")))

        dataset = open_dataset(names, spool=spool, empty_ok=empty_ok, train_files=train_files)
        check_not_written_into(Path(STDIN), dataset)
        with dataset.changes_reported():
            yield dataset

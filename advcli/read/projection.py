"""Stage 1: the key projection and its row checks.

:func:`key_projection` reads only the small columns (keys, the reward list summed in float64, the
mask length) and checks every row (nulls, NaN, masks, exact integer sums, repeated turns), so that
the statistics never touch token data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from advcli.errors import AdvcliError, first_line
from advcli.keys import (
    ANCHOR,
    GROUP,
    LAST_STEP,
    PADDING,
    ROW,
    SCORE,
    STEP_RETURN,
    STEP_REWARD,
    TOKENS,
    TRAJECTORY,
    TURN,
    repeated_turns,
)
from advcli.read.columns import ColumnRoles, unused_name
from advcli.read.dataset import Dataset
from advcli.read.dtypes import is_enum, sequence_of
from advcli.read.json_lines import check_json_lines
from advcli.read.scan import closing_sources
from advcli.read.trainer_advantage import trainer_advantage_exprs
from advcli.settings.rules import EXACT_INTEGER_LIMIT


@dataclass(frozen=True)
class KeyExpressions:
    """The per-row expressions of stage 1, shared by every engine.

    ``exprs`` turn a batch (or a whole scan) of input rows into ``group``, ``trajectory``,
    [``turn``], ``score``, ``tokens`` and ``problem``: 0 for a sound row, k for the k-th broken rule
    of ``messages``; for SkyRL's step-wise dumps also ``last_step`` and ``padding``. Trajectories
    made of runs of rows (skyrl 0.4.0) depend on the rows before, so :meth:`check` numbers them,
    over the whole projection, and ``exprs`` have no ``trajectory``.
    """

    exprs: list[pl.Expr]
    messages: list[str]

    @classmethod
    def of(
        cls,
        schema: pl.Schema,
        columns: ColumnRoles,
        row_number: str | None = None,
        file_rules: Sequence[tuple[pl.Expr, str]] = (),
        trainer_advantage: bool = False,
    ) -> KeyExpressions:
        """``row_number`` names a column of global row numbers, which stand in for the group
        (blocks of ``group_size`` rows) or the trajectory (each row one) where the dump has no
        such column. ``file_rules``: (broken, message) of the rules of a trainer's dump
        (:meth:`~advcli.read.trainer_dumps.TrainerDump.row_rules`), checked first.
        ``trainer_advantage``: each row's advantage as the trainer computed it is read too
        (``audit``'s, :func:`~advcli.read.trainer_advantage.trainer_advantage_exprs`)."""
        rows_are_trajectories = columns.trajectory is None and not columns.trajectory_from_last_step
        if (columns.group is None or rows_are_trajectories) and row_number is None:
            raise ValueError("groups or trajectories made from rows need the row number")
        row = pl.col(row_number) if row_number is not None else pl.lit(None)
        group = (
            _as_key(columns.group, schema)
            if columns.group is not None
            else row // pl.lit(columns.group_size, dtype=pl.UInt32)
        )
        trajectory = _as_key(columns.trajectory, schema) if columns.trajectory is not None else row
        keys = [group.alias(GROUP)]
        if not columns.trajectory_from_last_step:
            keys.append(trajectory.alias(TRAJECTORY))
        if columns.turn is not None:
            keys.append(pl.col(columns.turn).alias(TURN))
        # Summed in float64 whatever the list's type: float16 and float32 lose the small terms
        # of long lists (3000 float16 ones sum to 2048), and integers wrap around.
        score = (
            columns.reward_list().cast(pl.List(pl.Float64)).list.sum()
            if columns.reward_kind == "token_rewards"
            else pl.col(columns.reward).cast(pl.Float64)
        )
        if columns.mask is None:
            tokens = pl.lit(None, dtype=pl.Int64)  # unknown without a mask column
        else:
            tokens = (
                columns.mask_list().list.sum()
                if columns.mask_kind == "mask"
                else pl.col(columns.mask)
            )
            # Not strict: a NaN or inf in a float mask becomes null here and is reported by the
            # 0/1 rule below, not as a failed cast.
            tokens = tokens.cast(pl.Int64, strict=False)

        rules = [*file_rules, *_row_rules(schema, columns, score, tokens)]
        trainer: list[pl.Expr] = []
        if trainer_advantage:
            trainer, trainer_rules = trainer_advantage_exprs(schema, columns, tokens)
            rules += trainer_rules
        # One small code per row (0 = fine, k = the k-th rule broken) instead of a column per
        # rule, so the projection stays a handful of scalars per row.
        problem: Any = pl.when(rules[0][0]).then(pl.lit(1, dtype=pl.UInt8))
        for code, (broken, _) in enumerate(rules[1:], start=2):
            problem = problem.when(broken).then(pl.lit(code, dtype=pl.UInt8))
        problem = problem.otherwise(pl.lit(0, dtype=pl.UInt8))
        if columns.left_out is not None:
            # The rows the trainer leaves out (an errored trace) need no reward or mask.
            problem = (
                pl.when(pl.col(columns.left_out)).then(pl.lit(0, dtype=pl.UInt8)).otherwise(problem)
            )
        exprs = [
            *keys,
            score.alias(SCORE),
            tokens.alias(TOKENS),
            *trainer,
            problem.alias("problem"),
        ]
        if columns.last_step is not None:
            exprs.append(pl.col(columns.last_step).alias(LAST_STEP))
        if columns.padding_ids is not None and columns.group is not None:
            exprs.append(_is_padding(schema, columns, tokens).alias(PADDING))
        elif columns.left_out is not None:
            exprs.append(pl.col(columns.left_out).alias(PADDING))
        exprs += _step_keys(schema, columns)
        return cls(exprs, [message for _, message in rules])

    def check(
        self,
        projection: pl.DataFrame,
        dataset: Dataset,
        columns: ColumnRoles,
        *,
        unique_turns: bool = True,
    ) -> pl.DataFrame:
        """Raise for the first broken row (input order); return the projection without
        ``problem``. ``projection`` must carry ``row``, the input row number."""
        first_problem = projection.select(
            pl.col(ROW, "problem").filter(pl.col("problem") > 0).first()
        ).row(0)
        if first_problem[0] is not None:
            row, code = first_problem
            raise AdvcliError(f"{dataset.locate(row)}: {self.messages[code - 1]}")
        projection = projection.drop("problem")
        if columns.trajectory_from_last_step:
            projection = _trajectories_from_last_step(projection, dataset, columns)
        if unique_turns and columns.turn is not None:
            check_unique_turns(projection, dataset, columns)
        return projection


def key_projection(
    dataset: Dataset,
    columns: ColumnRoles,
    *,
    unique_turns: bool = True,
    trainer_advantage: bool = False,
) -> pl.DataFrame:
    """Read and check the small per-row columns: row, group, trajectory, [turn], score, tokens.

    With ``unique_turns`` a repeated ``(group, trajectory, turn)`` is an error; ``inspect`` turns
    it off to count them instead. ``trainer_advantage``: the trainer's own advantage of each row
    is read too (:meth:`KeyExpressions.of`).

    ``score`` is the row's reward (the sum of its token-level rewards) as Float64; ``tokens`` is the
    number of response tokens (the sum of the mask, or the response length). Token data is read
    once, batch by batch, and reduced to these scalars on the way.
    """
    if dataset.given_format == "json":
        # An anchor is compared as an id is: "0" and 0 must not become one state.
        ids = [
            name for name in (columns.group, columns.trajectory, columns.anchor) if name is not None
        ]
        reward = columns.reward
        if dataset.view is not None:  # the file's columns a trainer's dump's roles are made from
            ids = list(dict.fromkeys(dataset.view.stored(name) for name in ids))
            reward = dataset.view.stored(reward)
        check_json_lines(dataset, ids, reward)
    row_number = unused_name(dataset.schema)
    view = dataset.view
    file_rules = view.row_rules() if view is not None and view.keys_taken(columns) else ()
    plan = KeyExpressions.of(
        dataset.schema, columns, row_number, file_rules, trainer_advantage=trainer_advantage
    )
    try:
        with closing_sources():
            projection = (
                dataset.rows(row_number)
                .select(pl.col(row_number).alias(ROW), *plan.exprs)
                .collect(engine="streaming")
            )
    except pl.exceptions.PolarsError as error:
        raise AdvcliError(
            f"{dataset.describe()}: cannot read the key columns ({first_line(error)})"
        ) from None
    return plan.check(projection, dataset, columns, unique_turns=unique_turns)


def split_padding(
    projection: pl.DataFrame, dataset: Dataset, columns: ColumnRoles
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the rows that count, the padding rows): a checked projection split on ``padding``, which
    neither keeps. Padding rows (SkyRL's ``pad_batch``: ids ``pad0``, ``pad1``, ... and no loss
    tokens) are never groups or trajectories; ``compute`` writes them with advantage 0."""
    if PADDING not in projection.columns:
        return projection, projection.clear()
    padding_rows = projection[PADDING]
    if not padding_rows.any():
        projection = projection.drop(PADDING)
        return projection, projection.clear()
    padding = projection.filter(padding_rows).drop(PADDING)
    projection = projection.filter(~padding_rows).drop(PADDING)
    if projection.is_empty():
        what = (
            f"one of the {columns.padding_label}"
            if columns.left_out is not None
            else f"a padding row (ids like 'pad0' and no '{columns.mask}' tokens)"
        )
        raise AdvcliError(f"{dataset.describe()}: every row is {what}; there is nothing to compute")
    if columns.left_out is not None:
        return projection, padding
    # A padding row's ids on a row with tokens: the padding row would be part of a real
    # trajectory, so neither reading is safe.
    keys = [GROUP, TRAJECTORY]
    shared = projection.join(padding.select(keys), on=keys, how="semi")
    if not shared.is_empty():
        first = shared.row(0, named=True)
        raise AdvcliError(
            f"{dataset.locate(first[ROW])}: trajectory ({columns.group}={first[GROUP]!r}, "
            f"{columns.trajectory or 'trajectory'}={first[TRAJECTORY]!r}) has '{columns.mask}' "
            "tokens, but its ids are those of padding rows (no tokens) too; padding ids must not "
            "name a real trajectory"
        )
    return projection, padding


def _is_padding(schema: pl.Schema, columns: ColumnRoles, tokens: pl.Expr) -> pl.Expr:
    """A row whose group and trajectory ids (where the dump has them) are padding ids, with no
    response tokens; a padding id on a row with tokens is a real row. Integer ids are never
    padding ids."""
    whole = f"^(?:{columns.padding_ids})$"
    matches = [
        _as_key(name, schema).str.contains(whole)
        if schema[name] == pl.String or schema[name] == pl.Categorical or is_enum(schema[name])
        else pl.lit(False)
        for name in (columns.group, columns.trajectory)
        if name is not None
    ]
    # Unknown tokens (no mask column) never make a row padding.
    return pl.all_horizontal(*matches, tokens == 0).fill_null(False)


def _trajectories_from_last_step(
    projection: pl.DataFrame, dataset: Dataset, columns: ColumnRoles
) -> pl.DataFrame:
    """Number the trajectories of a dump without a trajectory column as skyrl 0.4.0 does: a
    trajectory is a run of rows ending at a last-step row, in row order over every input, and
    its number is how many last-step rows come before its rows. A run must stay in one group
    and the last row must end one."""
    flag = columns.last_step
    flagged = pl.col(LAST_STEP).cast(pl.UInt32)
    numbered = projection.select(
        ROW, GROUP, (flagged.cum_sum() - flagged).alias(TRAJECTORY), pl.exclude(ROW, GROUP)
    )
    same_run = pl.col(TRAJECTORY) == pl.col(TRAJECTORY).shift(1)
    crossing = numbered.select(
        pl.col(ROW).filter(same_run & (pl.col(GROUP) != pl.col(GROUP).shift(1))).first()
    ).item()
    if crossing is not None:
        position = int(numbered[ROW].search_sorted(crossing))
        before, here = numbered[GROUP][position - 1], numbered[GROUP][position]
        raise AdvcliError(
            f"{dataset.locate(crossing)}: column '{columns.group}' is {here!r} here but "
            f"{before!r} on the row before, which is not flagged '{flag}': a trajectory is the "
            f"run of rows up to a row flagged '{flag}', and this one would span two groups"
        )
    if numbered.height and not numbered[LAST_STEP][-1]:
        last = numbered.row(-1, named=True)
        start = numbered.filter(pl.col(TRAJECTORY) == last[TRAJECTORY])[ROW][0]
        raise AdvcliError(
            f"{dataset.locate(last[ROW])}: the rows from {dataset.locate(start)} on end without a "
            f"row flagged '{flag}': a trajectory is the run of rows up to a row so flagged"
        )
    return numbered


def _row_rules(
    schema: pl.Schema, columns: ColumnRoles, score: pl.Expr, tokens: pl.Expr
) -> list[tuple[pl.Expr, str]]:
    """(broken, message) for every per-row rule, in the order they are reported for one row."""
    reward, mask = columns.reward, columns.mask
    rules: list[tuple[pl.Expr, str]] = [
        (pl.col(name).is_null(), f"column '{name}' ({role} id) is null")
        for role, name in (("group", columns.group), ("trajectory", columns.trajectory))
        if name is not None
    ]
    if columns.turn is not None:
        rules.append(
            (pl.col(columns.turn).is_null(), f"column '{columns.turn}' (turn index) is null")
        )
    if columns.last_step is not None:
        rules.append(
            (
                pl.col(columns.last_step).is_null(),
                f"column '{columns.last_step}' (last-step flag) is null",
            )
        )
    if columns.reward_removed is None:
        rules.append((pl.col(reward).is_null(), f"column '{reward}' (reward) is null"))
    if columns.reward_kind == "token_rewards":
        rules.append(
            (
                columns.reward_list().list.eval(pl.element().null_count()).list.first() > 0,
                f"column '{reward}' has a null element",
            )
        )
    rules += _exactness_rules(schema, columns)
    rules += [
        (score.is_nan(), f"column '{reward}': the score is NaN"),
        (score == float("inf"), f"column '{reward}': the score is +inf"),
        (score == float("-inf"), f"column '{reward}': the score is -inf"),
    ]
    rules += _step_rules(columns)
    if mask is None:
        return rules
    rules.append((pl.col(mask).is_null(), f"column '{mask}' (response mask) is null"))
    if columns.mask_kind == "mask":
        mask_list = columns.mask_list()
        rules.append(
            (
                mask_list.list.eval(pl.element().null_count()).list.first() > 0,
                f"column '{mask}' has a null element",
            )
        )
        if sequence_of(schema[mask])[0] != pl.Boolean:
            # Compared, not looked up: a float mask (0.0/1.0) is as good as an integer one.
            zero_or_one = (pl.element() == 0) | (pl.element() == 1)
            rules.append(
                (
                    mask_list.list.eval(~zero_or_one).list.any(),
                    f"column '{mask}' holds a value other than 0 and 1",
                )
            )
        if columns.reward_kind == "token_rewards":
            rules.append(
                (
                    mask_list.list.len() != columns.reward_list().list.len(),
                    f"column '{mask}' and column '{reward}' have different lengths",
                )
            )
    else:
        rules.append((tokens < 0, f"column '{mask}' (response length) is negative"))
        if columns.reward_kind == "token_rewards":
            rules.append(
                (
                    tokens > columns.reward_list().list.len(),
                    f"column '{mask}' (response length) is longer than the row's list in "
                    f"column '{reward}'",
                )
            )
    return rules


def _step_keys(schema: pl.Schema, columns: ColumnRoles) -> list[pl.Expr]:
    """GiGPO's keys: the anchor hashed (Categorical values as their text; a null stays null,
    for its row rule), and the step reward or return as float64."""
    if columns.anchor is None:
        return []
    exprs = [anchor_key(columns.anchor, schema[columns.anchor])]
    for key, name in ((STEP_REWARD, columns.step_reward), (STEP_RETURN, columns.step_return)):
        if name is not None:
            exprs.append(pl.col(name).cast(pl.Float64).alias(key))
    return exprs


def anchor_key(name: str, dtype: Any) -> pl.Expr:
    """The anchor column ``name`` (of type ``dtype``) hashed as ``anchor``: Categorical values
    as their text, a null kept null. :mod:`advcli.verl` hashes a batch's anchors with it, so
    the direct call and its written dump group the same rows."""
    as_text = _categories_as_text(dtype)
    anchor = pl.col(name) if as_text == dtype else pl.col(name).cast(as_text)
    return pl.when(anchor.is_not_null()).then(anchor.hash()).alias(ANCHOR)


def _categories_as_text(dtype: Any) -> Any:
    """``dtype`` with every Categorical or Enum in it (inside lists and structs too) as String:
    the values hash by their text, not by codes that differ between files."""
    if dtype == pl.Categorical or is_enum(dtype):
        return pl.String
    if isinstance(dtype, pl.List):
        return pl.List(_categories_as_text(dtype.inner))
    if isinstance(dtype, pl.Array):
        return pl.Array(_categories_as_text(dtype.inner), dtype.size)
    if isinstance(dtype, pl.Struct):
        return pl.Struct([pl.Field(f.name, _categories_as_text(f.dtype)) for f in dtype.fields])
    return dtype


def _step_rules(columns: ColumnRoles) -> list[tuple[pl.Expr, str]]:
    """GiGPO's per-row rules: an anchor and a finite step reward (or return) on every row."""
    if columns.anchor is None:
        return []
    rules = [(pl.col(columns.anchor).is_null(), f"column '{columns.anchor}' (anchor) is null")]
    for role, name in (("step reward", columns.step_reward), ("step return", columns.step_return)):
        if name is None:
            continue
        value = pl.col(name).cast(pl.Float64)
        rules += [
            (pl.col(name).is_null(), f"column '{name}' ({role}) is null"),
            (value.is_nan(), f"column '{name}' ({role}) is NaN"),
            (value.is_infinite(), f"column '{name}' ({role}) is infinite"),
        ]
    return rules


def _exactness_rules(schema: pl.Schema, columns: ColumnRoles) -> list[tuple[pl.Expr, str]]:
    """Integer rewards whose score float64 cannot hold exactly: refused, never rounded."""
    reward = columns.reward
    dtype = schema[reward]
    inner = sequence_of(dtype)[0] if columns.reward_kind == "token_rewards" else dtype
    if not inner.is_integer():
        return []
    if columns.reward_kind == "token_rewards":
        # While the sum of |reward| stays within 2**53 every partial sum is an exact integer. It
        # is summed exactly, in Int128 (no row of 64-bit integers overflows it): a float64 sum
        # rounds one just beyond 2**53 down to it, and cannot tell 2**53 itself (exact) from it.
        magnitude = columns.reward_list().list.eval(pl.element().cast(pl.Int128).abs())
        return [
            (
                magnitude.list.sum() > EXACT_INTEGER_LIMIT,
                f"column '{reward}': the integer rewards of the row add up beyond 2^53, where "
                "float64 cannot hold every integer",
            )
        ]
    if inner in (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16, pl.UInt32):
        return []  # float64 holds every one of their values
    beyond = pl.col(reward) > EXACT_INTEGER_LIMIT
    if inner.is_signed_integer():
        beyond = beyond | (pl.col(reward) < -EXACT_INTEGER_LIMIT)
    return [
        (
            beyond,
            f"column '{reward}': the integer reward is beyond 2^53, where float64 cannot hold "
            "every integer",
        )
    ]


def _as_key(name: str, schema: pl.Schema) -> pl.Expr:
    # Categorical ids compare and join as strings; the physical codes may differ between files.
    dtype = schema[name]
    return (
        pl.col(name).cast(pl.String) if dtype == pl.Categorical or is_enum(dtype) else pl.col(name)
    )


def check_unique_turns(projection: pl.DataFrame, dataset: Dataset, columns: ColumnRoles) -> None:
    """Refuse a ``(group, trajectory, turn)`` that two rows have, saying where both are; in two
    files, the ids repeat across files (step files whose group ids are dataset indices)."""
    repeated = repeated_turns(projection)
    if repeated.is_empty():
        return
    key = repeated.row(0, named=True)
    first = projection.filter(
        (pl.col(GROUP) == key[GROUP])
        & (pl.col(TRAJECTORY) == key[TRAJECTORY])
        & (pl.col(TURN) == key[TURN])
    )[ROW][0]
    message = (
        f"{dataset.locate(key[ROW])}: duplicate turn: ({columns.group}={key[GROUP]!r}, "
        f"{columns.trajectory}={key[TRAJECTORY]!r}, {columns.turn}={key[TURN]!r}) "
        f"appears more than once (first at {dataset.locate(first)})"
    )
    if dataset.file_of(first) != dataset.file_of(key[ROW]):
        message += (
            "; the ids repeat across files: if each file is a training step, pass --by file "
            "to read each as its own batch"
        )
    elif "turn" in columns.by_name:
        message += (
            f"; '{columns.turn}' was read as the turn index for its name: if it is not one, "
            "name the turn column with --turn-col (or, for a training step, pass --by "
            f"{columns.turn})"
        )
    elif columns.read_from is None:  # a trainer's own dump is no padded batch
        message += (
            "; if the second row is a copy the trainer padded its batch with (ROLL's "
            "batch_adjust_mode copy), pass --drop-duplicates to count it once"
        )
    raise AdvcliError(message)


def check_consecutive_turns(
    projection: pl.DataFrame, dataset: Dataset, columns: ColumnRoles, trajectory_of_row: np.ndarray
) -> None:
    """Refuse a trajectory whose turn indices have a gap (per-turn rewards discount along them),
    naming it and its turns; a repeated turn is :func:`check_unique_turns`' error.
    ``trajectory_of_row``: each row's trajectory as a number (the trajectory index's), a key
    cheaper to group by than the ids."""
    turn = pl.col(TURN)
    trajectory = pl.Series("__trajectory", trajectory_of_row)
    gaps = (
        projection.select(TURN, ROW)
        .with_columns(trajectory)
        .group_by("__trajectory")
        .agg(
            (turn.max() - turn.min() + 1 != pl.len()).alias("__gap"),
            pl.col(ROW).min().alias(ROW),
        )
        .filter(pl.col("__gap"))
    )
    if gaps.is_empty():
        return
    first = gaps.sort(ROW).row(0, named=True)
    rows = projection.filter(trajectory == first["__trajectory"])
    shown = rows[TURN].sort().head(SHOWN_TURNS).to_list()
    turns = ", ".join(map(str, shown)) + (", ..." if rows.height > SHOWN_TURNS else "")
    raise AdvcliError(
        f"{dataset.locate(first[ROW])}: trajectory ({columns.group or 'group'}="
        f"{rows[GROUP][0]!r}, {columns.trajectory or 'trajectory'}={rows[TRAJECTORY][0]!r}) has "
        f"turns {turns} in '{columns.turn}': per-turn rewards need consecutive turn indices "
        "(a gap)"
    )


# The turns a gap's error shows.
SHOWN_TURNS = 10

"""Per-turn rewards (``--reward-mode per-turn``): each row's score is its reward-to-go, and each
row is a unit normalized within its step group (:func:`per_turn_advantages`).

The reward-to-go is GiGPO's step return over the rows' own rewards
(:func:`advcli.advantages.step_groups.step_returns`); the step groups are the rows at one turn
position, the same padded with the group's trajectories that have no row there, every row of the
group, or equal anchors (``advcli.rules.STEP_GROUPINGS``); the estimator's rule is applied by
:func:`advcli.advantages.estimators.compute_advantages` at turn level, the padded groups'
statistics made here from per-(group, position) sums. Under ``turn-rewards`` the rule is applied
to the rewards at each turn position and the advantage is the reward-to-go of the normalized
rewards (:func:`summed_reward_advantages`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from advcli.advantages.estimators import Advantages, check_finite, compute_advantages
from advcli.advantages.statistics import group_statistics
from advcli.advantages.step_groups import anchor_scope, step_returns, turn_order
from advcli.advantages.unit_scores import Naming, build_units
from advcli.advantages.units import Trajectories
from advcli.errors import AdvcliError
from advcli.keys import ANCHOR, GROUP, ROW, SCORE, STEP_REWARD, TURN
from advcli.settings.config import AdvantageConfig, Level, PerTurn
from advcli.settings.rules import PADDED_RETURN, STD_DDOF, ZERO_STD

# Each row's trajectory-group size while the padded statistics are made.
MEMBERS = "__members"


def per_turn_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
) -> Advantages:
    """Each row's advantage from its reward-to-go ``G_t = r_t + γ G_{t+1}`` (its trajectory's
    rows in turn order) normalized within its step group by ``config.estimator``'s rule.

    The result is at turn level: its units are the rows (``score`` is ``G_t``), its groups the
    step groups, keyed by a struct of the task group and the turn position (``turn``,
    ``turn-padded``), the task group (``pooled``) or the anchor's scope and the anchor
    (``anchor``). Under ``turn-padded`` a group's size is its task group's trajectory count."""
    per_turn = config.per_turn
    if per_turn is None:
        raise ValueError("per-turn advantages need the per-turn settings")
    grouping = per_turn.grouping
    if grouping.anchors and ANCHOR not in projection.columns:
        raise AdvcliError(
            "--step-groups anchor needs each row's anchor state: name its column with --anchor-col"
        )
    rewards = projection.select(
        pl.col(SCORE).alias(STEP_REWARD), *([TURN] if TURN in projection.columns else [])
    )
    # One sort by trajectory and turn serves the returns and the positions.
    order = turn_order(projection, trajectories)
    returns = pl.Series(SCORE, step_returns(rewards, trajectories, per_turn.gamma, order))
    if grouping.by_position:
        position = pl.Series("turn", turn_positions(projection, trajectories, order))
        fields = projection.select(pl.col(GROUP).alias("group"), position)
    elif grouping.anchors:
        scope = anchor_scope(per_turn.scope, batch).alias("scope")
        fields = projection.select(scope, pl.col(ANCHOR))
    else:
        fields = projection.select(GROUP)
    key = fields.to_series() if fields.width == 1 else fields.select(pl.struct(pl.all()))[:, 0]
    packed = packed_key(fields) if fields.width > 1 else None
    at_turn = replace(config, per_turn=None, level=Level.TURN)
    rows = projection.with_columns((key if packed is None else packed).alias(GROUP))
    if grouping.normalizes_rewards:
        result = summed_reward_advantages(
            rows, at_turn, naming, trajectories, per_turn, returns, order
        )
        return with_key(result, key, packed)
    rows = rows.with_columns(returns)
    statistics = None
    if grouping.padded:
        members = trajectories.table.select(pl.len().over(GROUP)).to_series().to_numpy()
        statistics = padded_statistics(
            rows.select(GROUP, SCORE, ROW, pl.Series(MEMBERS, members[trajectories.of_row])),
            config.std_ddof,
        )
    result = compute_advantages(rows, at_turn, naming, None, None, statistics=statistics)
    return with_key(result, key, packed)


def packed_key(fields: pl.DataFrame) -> pl.Series | None:
    """The step-group key's fields (the task group and the turn position, or the anchor's scope
    and the anchor) as one integer per row, equal where every field is equal: each field's dense
    rank, packed. Sorting, grouping and joining on it is several times faster than on their
    struct. None where a field is itself a struct (``--by``'s (step, group)) or the packed
    ranks would not fit 64 bits."""
    packed = np.zeros(fields.height, dtype=np.uint64)
    room = 1
    for field in fields.iter_columns():
        if isinstance(field.dtype, pl.Struct):
            return None
        dense = field.rank("dense").cast(pl.UInt64).to_numpy() - 1
        size = int(dense.max()) + 1 if len(dense) else 1
        room *= size
        if room >= 2**64:
            return None
        packed = packed * np.uint64(size) + dense
    return pl.Series(GROUP, packed)


def with_key(result: Advantages, key: pl.Series, packed: pl.Series | None) -> Advantages:
    """``result`` computed on the ``packed`` key, with the step groups keyed by their struct
    ``key`` again (one per row, in the projection's order, as the turn-level units are)."""
    if packed is None:
        return result
    keys = pl.DataFrame([packed.alias("__packed"), key.alias(GROUP)]).filter(
        pl.col("__packed").is_first_distinct()
    )
    groups = (
        result.groups.rename({GROUP: "__packed"})
        .join(keys, on="__packed", how="left", maintain_order="left")
        .select(GROUP, pl.exclude(GROUP, "__packed"))
    )
    return replace(result, units=result.units.with_columns(key.alias(GROUP)), groups=groups)


def summed_reward_advantages(
    rows: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    per_turn: PerTurn,
    returns: pl.Series,
    order: np.ndarray | None = None,
) -> Advantages:
    """``--step-groups turn-rewards``: each row's reward normalized among its step group's
    rewards by ``config``'s estimator (turn level), then each row's advantage the reward-to-go
    of the normalized rewards, ``Σ_{k≥t} γ^(k−t) z_k``. Under ``per_turn.variance_epsilon``
    (LightRFT) the divisor is ``sqrt(population variance + variance_epsilon)``. The units'
    ``score`` is each row's reward-to-go ``returns``; the groups are the rewards' step groups."""
    statistics = None
    if per_turn.variance_epsilon is not None:
        statistics = group_statistics(build_units(rows, config, naming))
        count = pl.col("units").cast(pl.Float64)
        population_variance = pl.col("std").pow(2) * (count - STD_DDOF) / count
        statistics = statistics.with_columns(
            pl.when(pl.col("zero_std"))
            .then(pl.col("std"))
            .otherwise((population_variance + per_turn.variance_epsilon).sqrt())
            .alias("std")
        )
    normalized = compute_advantages(rows, config, naming, None, None, statistics=statistics)
    turn = [rows[TURN]] if TURN in rows.columns else []
    steps = pl.DataFrame([normalized.units["advantage"].alias(STEP_REWARD), *turn])
    advantage = pl.Series("advantage", step_returns(steps, trajectories, per_turn.gamma, order))
    units = normalized.units.with_columns(returns, advantage)
    check_finite(units, naming)
    return replace(normalized, units=units)


def turn_positions(
    projection: pl.DataFrame, trajectories: Trajectories, order: np.ndarray | None = None
) -> np.ndarray:
    """Each row's position in its trajectory's turn order (:func:`turn_order`, or ``order``
    when the caller has it), from 0, in the projection's order."""
    n = projection.height
    order = turn_order(projection, trajectories) if order is None else order
    trajectory = trajectories.of_row[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = trajectory[1:] != trajectory[:-1]
    start_of_run = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    positions = np.empty(n, dtype=np.int64)
    positions[order] = np.arange(n) - start_of_run
    return positions


def padded_statistics(rows: pl.DataFrame, ddof: int = STD_DDOF) -> pl.DataFrame:
    """The figures :func:`compute_advantages` reads (``units``, ``mean``, ``std``,
    ``zero_std``, ``top_row``, ``first_row``) of each padded step group, from its real rows'
    count, sum and sum of squares and its size n (``__members``, the task group's trajectory
    count): the n − m virtual members carry PADDED_RETURN (0), so mean = Σ G / n and the
    sample variance (Σ G² − (Σ G)² / n) / (n − ddof), never materializing them. A group whose n
    members are equal (every real row the same, and 0 where there are virtual ones) has that
    value as its mean and std ZERO_STD, as every estimator's groups do."""
    value = pl.col(SCORE)
    figures = (
        rows.sort(GROUP, SCORE)
        .group_by(GROUP, maintain_order=True)
        .agg(
            pl.col(MEMBERS).first().cast(pl.UInt32).alias("units"),
            pl.len().alias("__real"),
            value.sum().alias("__sum"),
            (value * value).sum().alias("__squares"),
            value.max().alias("__max"),
            value.min().alias("__min"),
            pl.col(ROW).min().alias("first_row"),
        )
    )
    n = pl.col("units").cast(pl.Float64)
    mean = pl.col("__sum") / n
    variance = ((pl.col("__squares") - pl.col("__sum") * mean) / (n - ddof)).clip(0.0)
    all_equal = (pl.col("__max") == pl.col("__min")) & (
        (pl.col("__real") == pl.col("units")) | (pl.col("__max") == PADDED_RETURN)
    )
    several = pl.col("units") > 1
    return figures.select(
        GROUP,
        "units",
        pl.when(all_equal).then(pl.col("__max")).otherwise(mean).alias("mean"),
        pl.when(all_equal & several)
        .then(ZERO_STD)
        .when(several)
        .then(variance.sqrt())
        .alias("std"),
        (all_equal & several).alias("zero_std"),
        pl.col("first_row").alias("top_row"),
        "first_row",
    ).sort("first_row")

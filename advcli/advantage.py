"""The advantage math: stage 2 of the data flow, pure Polars, no files.

A *unit* is what counts once in its group's statistics: a row at turn level, a trajectory
(``(group, trajectory)`` pair) at trajectory level. :func:`build_units` turns the key projection
into units, :func:`group_statistics` computes every group quantity any estimator needs in one
group-by, and :func:`compute_advantages` applies the chosen estimator and broadcasts each unit's
advantage back to its rows.

Every numeric rule is stated where it is applied; the README's table lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import polars as pl

from advcli.dataset import GROUP, ROW, SCORE, TOKENS, TRAJECTORY, TURN
from advcli.errors import AdvcliError

# Relative tolerance for "all rows of a trajectory carry the same score".
SCORE_TOLERANCE = 1e-6


class Level(str, Enum):
    TRAJECTORY = "trajectory"
    TURN = "turn"


class Estimator(str, Enum):
    GRPO = "grpo"
    DRGRPO = "drgrpo"


class TrajScore(str, Enum):
    """How a trajectory's score is made from its rows' scores when they differ."""

    FIRST = "first"
    LAST = "last"
    MEAN = "mean"
    MAX = "max"
    SUM = "sum"


@dataclass(frozen=True)
class AdvantageConfig:
    """Everything that decides the numbers.

    Parameters
    ----------
    level
        ``trajectory``: each trajectory counts once in its group; ``turn``: every row counts.
    estimator
        ``grpo``: ``(s - mean) / (std + epsilon)``; ``drgrpo``: ``s - mean``.
    epsilon
        Added to the group std before dividing.
    traj_score
        Rule for a trajectory whose rows carry different scores; ``None`` makes that an error.
    """

    level: Level = Level.TRAJECTORY
    estimator: Estimator = Estimator.GRPO
    epsilon: float = 1e-6
    traj_score: TrajScore | None = None


@dataclass(frozen=True)
class Advantages:
    """Stage 2's result.

    ``units``: one row per unit (``group``, ``trajectory``, ``score``, ``tokens``, ``turns``,
    ``first_row``, ``advantage``). ``groups``: one row per group (``group``, ``units``,
    ``baseline``, ``std`` — the value subtracted and the divisor before epsilon, after the singleton
    rule — and ``zero_std``). ``rows``: one row per input row in input order (``row``, ``score``,
    ``advantage``).
    """

    units: pl.DataFrame
    groups: pl.DataFrame
    rows: pl.DataFrame

    @property
    def singleton_groups(self) -> int:
        return int((self.groups["units"] == 1).sum())

    @property
    def zero_std_groups(self) -> int:
        return int(self.groups["zero_std"].sum())


def build_units(
    projection: pl.DataFrame, config: AdvantageConfig, names: dict[str, str]
) -> pl.DataFrame:
    """One row per unit with ``group``, ``trajectory``, ``score``, ``tokens``, ``turns`` and
    ``first_row`` (the unit's first input row, which fixes the units' order).

    ``names`` maps ``group`` / ``trajectory`` to the user's column names, for error messages.
    """
    if config.level is Level.TURN:
        return projection.select(
            pl.col(GROUP),
            pl.col(TRAJECTORY),
            pl.col(SCORE),
            pl.col(TOKENS),
            pl.lit(1, dtype=pl.UInt32).alias("turns"),
            pl.col(ROW).alias("first_row"),
        )

    # "first" and "last" follow turn_index when the dump has one, else the input row order.
    order = [TURN, ROW] if TURN in projection.columns else [ROW]
    score = pl.col(SCORE).sort_by(order)
    rule = config.traj_score
    trajectory_score = {
        None: score.first(),
        TrajScore.FIRST: score.first(),
        TrajScore.LAST: score.last(),
        TrajScore.MEAN: pl.col(SCORE).mean(),
        TrajScore.MAX: pl.col(SCORE).max(),
        TrajScore.SUM: pl.col(SCORE).sum(),
    }[rule]
    units = (
        projection.group_by(GROUP, TRAJECTORY)
        .agg(
            trajectory_score.alias(SCORE),
            pl.col(TOKENS).sum(),
            pl.len().alias("turns"),
            pl.col(ROW).min().alias("first_row"),
            pl.col(SCORE).min().alias("score_min"),
            pl.col(SCORE).max().alias("score_max"),
        )
        .sort("first_row")
    )
    if rule is None:
        _check_consistent_scores(projection, units, names)
    return units.drop("score_min", "score_max")


def _check_consistent_scores(
    projection: pl.DataFrame, units: pl.DataFrame, names: dict[str, str]
) -> None:
    spread = pl.col("score_max") - pl.col("score_min")
    magnitude = pl.max_horizontal(pl.col("score_max").abs(), pl.col("score_min").abs())
    offenders = units.filter(spread > SCORE_TOLERANCE * magnitude)
    if offenders.is_empty():
        return
    first = offenders.row(0, named=True)
    scores = (
        projection.filter(
            (pl.col(GROUP) == first[GROUP]) & (pl.col(TRAJECTORY) == first[TRAJECTORY])
        )[SCORE]
        .unique(maintain_order=True)
        .to_list()
    )
    raise AdvcliError(
        f"trajectory ({names['group']}={first[GROUP]!r}, {names['trajectory']}="
        f"{first[TRAJECTORY]!r}) has rows with different scores {scores}; choose a rule with "
        "--traj-score first|last|mean|max|sum, or use --level turn"
    )


def group_statistics(units: pl.DataFrame) -> pl.DataFrame:
    """Raw statistics of each group's units, before any singleton rule.

    ``std`` is the unbiased sample std (ddof=1, as torch.std and verl), null for a single unit.
    When every unit of a group has the same score, ``mean`` is set to that score exactly and ``std``
    to 0, so the advantages are exactly 0 rather than rounding noise divided by epsilon.
    """
    all_equal = pl.col("score_max") == pl.col("score_min")
    return (
        units.group_by(GROUP)
        .agg(
            pl.len().alias("units"),
            pl.col(SCORE).mean().alias("mean"),
            pl.col(SCORE).std(ddof=1).alias("std"),
            pl.col(SCORE).max().alias("score_max"),
            pl.col(SCORE).min().alias("score_min"),
            pl.col("first_row").min().alias("first_row"),
        )
        .with_columns(
            pl.when(all_equal).then(pl.col("score_max")).otherwise(pl.col("mean")).alias("mean"),
            pl.when(all_equal & (pl.col("units") > 1))
            .then(0.0)
            .otherwise(pl.col("std"))
            .alias("std"),
            (all_equal & (pl.col("units") > 1)).alias("zero_std"),
        )
        .sort("first_row")
    )


def compute_advantages(
    projection: pl.DataFrame, config: AdvantageConfig, names: dict[str, str]
) -> Advantages:
    """Stage 2: the key projection in, per-unit, per-group and per-row advantages out."""
    units = build_units(projection, config, names)
    stats = group_statistics(units)

    # A group with a single unit has mean 0 and std 1 (verl's rule), so its advantage is
    # s / (1 + epsilon) under grpo and s under drgrpo.
    singleton = pl.col("units") == 1
    baseline = pl.when(singleton).then(0.0).otherwise(pl.col("mean"))
    if config.estimator is Estimator.GRPO:
        std = pl.when(singleton).then(1.0).otherwise(pl.col("std"))
    else:
        std = pl.lit(1.0, dtype=pl.Float64)
    groups = stats.select(
        pl.col(GROUP),
        pl.col("units"),
        baseline.alias("baseline"),
        std.alias("std"),
        pl.col("zero_std"),
    )

    centred = pl.col(SCORE) - pl.col("baseline")
    if config.estimator is Estimator.GRPO:
        # A zero-std group has centred == 0 exactly; keep it 0 even when epsilon is 0 (not 0/0).
        advantage = (
            pl.when(centred == 0).then(0.0).otherwise(centred / (pl.col("std") + config.epsilon))
        )
    else:
        advantage = centred
    units = (
        units.join(
            groups.select(GROUP, "baseline", "std"), on=GROUP, how="left", maintain_order="left"
        )
        .with_columns(advantage.alias("advantage"))
        .drop("baseline", "std")
    )

    if config.level is Level.TURN:
        rows = units.select(pl.col("first_row").alias(ROW), pl.col(SCORE), pl.col("advantage"))
    else:
        rows = (
            projection.select(ROW, GROUP, TRAJECTORY)
            .join(
                units.select(GROUP, TRAJECTORY, SCORE, "advantage"),
                on=[GROUP, TRAJECTORY],
                how="left",
                maintain_order="left",
            )
            .select(ROW, SCORE, "advantage")
        )
    return Advantages(units=units, groups=groups, rows=rows)

"""The advantage math: stage 2 of the data flow, pure Polars, no files.

:func:`compute_advantages` is stage 2's one entry: it makes the units
(:func:`advcli.advantages.unit_scores.build_units`), their groups' statistics
(:func:`advcli.advantages.statistics.group_statistics`), then applies the chosen estimator's
four facts (baseline, divisor, singleton rule, post-step) and broadcasts each unit's advantage
back to its rows.

Every numeric rule is stated where it is applied; the README's table lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from advcli.advantages.statistics import (
    BATCH,
    batch_key,
    batch_stds,
    group_statistics,
    token_whitening,
)
from advcli.advantages.unit_scores import Naming, build_units
from advcli.advantages.units import Trajectories, index_trajectories
from advcli.errors import AdvcliError
from advcli.keys import GROUP, ROW, SCORE, TOKENS
from advcli.settings.config import (
    AdvantageConfig,
    GigpoNorm,
    Level,
    Scale,
    Singleton,
    TrajScore,
)
from advcli.settings.rules import (
    FLOAT32_MAX,
    RULES,
    SINGLETON_MEAN,
    SINGLETON_STD,
    ZERO_STD,
    Baseline,
    EstimatorRule,
)


@dataclass(frozen=True)
class Advantages:
    """Stage 2's result.

    ``units``: one row per unit (``group``, ``trajectory``, ``score``, ``tokens``, ``turns``,
    ``first_row``, ``advantage``). ``groups``: one row per group (``group``, ``units``,
    ``baseline``, ``std`` — the value subtracted and the divisor before epsilon, after the singleton
    rule — and ``zero_std``). At trajectory level ``trajectories`` says which unit each row is.
    Nothing of the rows is kept: :meth:`rows` makes their table when a caller needs it.
    """

    level: Level
    units: pl.DataFrame
    groups: pl.DataFrame
    trajectories: Trajectories | None
    # REINFORCE++ at trajectory level: a row without response tokens gets 0, as verl's mask does.
    empty_rows_zero: bool = False
    # GiGPO: each row's advantage (episode term + ω · step term), in the projection's order,
    # where the units' advantage is the episode term alone; and each row's step figures
    # (:func:`advcli.advantages.step_groups.gigpo_advantages`).
    row_advantage: pl.Series | None = None
    steps: pl.DataFrame | None = None
    # --traj-score own: each row's score is its own, the one its row advantage is centred on.
    own_scores: bool = False

    def without_index(self) -> Advantages:
        """The same result without the index of the rows' trajectories (4 bytes a row, and its
        table), for a caller that is done with the rows, such as the report."""
        return replace(self, trajectories=None)

    @property
    def singleton_groups(self) -> int:
        return int((self.groups["units"] == 1).sum())

    @property
    def zero_std_groups(self) -> int:
        return int(self.groups["zero_std"].sum())

    def rows(self, projection: pl.DataFrame) -> pl.DataFrame:
        """One row per row of ``projection`` (the key projection these advantages were computed
        from), in input order: ``row``, ``score``, ``advantage``."""
        if self.row_advantage is not None:
            advantage = self.row_advantage.alias("advantage")
            if self.own_scores:
                return pl.DataFrame([projection[ROW], projection[SCORE], advantage])
            episode = replace(self, row_advantage=None).rows(projection)
            return episode.with_columns(advantage)
        if self.level is Level.TURN:  # the units are the rows
            return self.units.select(pl.col("first_row").alias(ROW), SCORE, "advantage")
        if self.trajectories is None:
            raise ValueError("the index of the rows' trajectories was let go (without_index)")
        unit = pl.Series(self.trajectories.of_row)
        advantage = self.units["advantage"].gather(unit)
        if self.empty_rows_zero:
            advantage = pl.select(
                pl.when(projection[TOKENS] > 0).then(advantage).otherwise(0.0).alias("advantage")
            ).to_series()
        return pl.DataFrame([projection[ROW], self.units[SCORE].gather(unit), advantage])


def baseline(rule: EstimatorRule) -> pl.Expr:
    """The value a unit's score is centred on, over the group statistics' columns (groups of
    more than one unit). For rloo it is the group mean: each unit's leave-one-out baseline follows
    from it in :func:`_centred_advantage`."""
    if rule.baseline is Baseline.TOKEN_WEIGHTED_MEAN:
        # All-equal units: the mean (set to that score exactly), not a token-weighted rounding.
        return (
            pl.when(pl.col("zero_std"))
            .then(pl.col("mean"))
            .when(pl.col("tokens_sum") > 0)
            .then(pl.col("tokens_score_sum") / pl.col("tokens_sum"))
            .otherwise(0.0)
        )
    if rule.baseline is Baseline.SECOND_BEST:
        return pl.col("score_second")
    return pl.col("mean")


def divisor(
    config: AdvantageConfig,
    std: pl.Expr = pl.col("std"),
    batch_std: pl.Expr = pl.col("batch_std"),
) -> pl.Expr:
    """What a centred score is divided by before epsilon (1 when the estimator does not divide;
    GiGPO's episode term: the std under --gigpo-norm mean_std, else 1), over the group's
    ``std`` and the batch's ``batch_std`` (each of the std's denominator in force)."""
    if config.step is not None:
        return std if config.step.norm is GigpoNorm.MEAN_STD else pl.lit(1.0)
    return {
        Scale.GROUP: std,
        Scale.BATCH: batch_std,
        Scale.NONE: pl.lit(1.0),
    }[config.effective_scale]


def unit_advantage(
    rule: EstimatorRule,
    config: AdvantageConfig,
    baseline: pl.Expr = pl.col("baseline"),
    divisor: pl.Expr = pl.col("divisor"),
    batch_std: pl.Expr = pl.col("batch_std"),
) -> pl.Expr:
    """A unit's advantage before any post-step, over its group's columns joined to it
    (``units``, ``top_row``) and its own (``score``, ``first_row``): the singleton rule in a
    group of one unit, else its score centred on ``baseline`` and divided by ``divisor`` plus
    epsilon as ``config`` says (``divisor``: the unit's, :func:`unit_divisor`). ``batch_std``:
    the batch's std, for ``--scale batch``'s singletons. The one statement of the rule, for
    ``compute`` and for ``audit``'s candidates."""
    return (
        pl.when(pl.col("units") == 1)
        .then(_singleton_advantage(rule, config, batch_std))
        .otherwise(_centred_advantage(rule, config, baseline, divisor))
    )


def _centred_advantage(
    rule: EstimatorRule, config: AdvantageConfig, baseline: pl.Expr, divisor: pl.Expr
) -> pl.Expr:
    """The advantage of a unit in a group of more than one unit, over the joined group columns."""
    centred = centred_score(rule, baseline)
    if config.effective_scale is Scale.NONE:
        return centred
    if config.step is not None and config.step.std_floor is not None:
        # GiGPO's episode term under ROLL's normalization: a group of std at most the floor gets 0.
        centred = pl.when(divisor <= config.step.std_floor).then(0.0).otherwise(centred)
    if rule.others_std and config.effective_scale is Scale.GROUP:
        # Undivided where the other units tie (OTHERS_STD: others_std is null there); a centred
        # score of 0 stays 0, also over a std that underflowed to 0 with epsilon 0.
        undivided = divisor.is_null() | (centred == 0)
        return pl.when(undivided).then(centred).otherwise(centred / (divisor + config.epsilon))
    # A zero-std group has centred == 0 exactly; keep it 0 even when epsilon is 0 (not 0/0).
    return pl.when(centred == 0).then(0.0).otherwise(centred / (divisor + config.epsilon))


def unit_divisor(
    rule: EstimatorRule, config: AdvantageConfig, baseline: pl.Expr, divisor: pl.Expr
) -> pl.Expr:
    """What a unit's centred score is divided by before epsilon, in a group of more than one
    unit: its group's ``divisor``, or under grpo_loo at the group scale the std of its group's
    other units (:func:`others_std`, ``divisor`` being the group's std and ``baseline`` its
    mean)."""
    if rule.others_std and config.effective_scale is Scale.GROUP:
        return others_std(divisor, baseline, config.std_ddof)
    return divisor


def centred_score(rule: EstimatorRule, baseline: pl.Expr) -> pl.Expr:
    """A unit's score centred as ``rule`` centres it (in a group of more than one unit), before
    any divisor."""
    centred = pl.col(SCORE) - baseline
    if rule.baseline is Baseline.LEAVE_ONE_OUT:
        # s minus the mean of the other n - 1 units = n / (n - 1) * (s - mean).
        return pl.col("units") / (pl.col("units") - 1) * centred
    if rule.baseline is Baseline.SECOND_BEST:
        # Only the top unit (first in input order on a tie) gets s_max - s_second.
        return pl.when(pl.col("first_row") == pl.col("top_row")).then(centred).otherwise(0.0)
    return centred


def others_std(std: pl.Expr, mean: pl.Expr, ddof: int) -> pl.Expr:
    """The std of a unit's group's other units (OTHERS_STD), over its group's ``std`` (of
    ``ddof``), ``mean``, ``units``, ``zero_std`` and extremes (EXTREME_COLUMNS:
    ``score_min``, ``score_max``, ``count_min``, ``count_max``, ``m2_above_min``,
    ``m2_below_max``) joined to it, and its ``score``.

    The others' sum of squared deviations, divided by n − 1 − ddof: for a unit alone at its
    group's lowest or highest score, that of the units above or below it, made directly; for
    any other unit, whose others hold the group's lowest and highest scores (so their spread is
    of the group's order), M2 − d² · n / (n − 1), with d = s − mean and M2 = std² · (n − ddof)
    the group's (their mean is d / (n − 1) off the group's). Null where the others all carry
    one score (their std exactly 0, the rule leaves the unit undivided): where the group has
    two units, or none differ, or the unit is the only one off a score every other carries,
    told by the counts, not by a rounded sum (which may also underflow to 0 where the others
    differ by subnormal amounts, and is then divided by as 0)."""
    n = pl.col("units")
    score = pl.col(SCORE)
    lowest = (score == pl.col("score_min")) & (pl.col("count_min") == 1)
    highest = (score == pl.col("score_max")) & (pl.col("count_max") == 1)
    tied = (
        (n <= 2)
        | pl.col("zero_std")
        | (lowest & (pl.col("count_max") == n - 1))
        | (highest & (pl.col("count_min") == n - 1))
    )
    deviation = score - mean
    others_m2 = (
        pl.when(lowest)
        .then(pl.col("m2_above_min"))
        .when(highest)
        .then(pl.col("m2_below_max"))
        .otherwise(std.pow(2) * (n - ddof) - deviation.pow(2) * n / (n - 1))
    )
    spread = (others_m2.clip(lower_bound=0.0) / (n - 1 - ddof)).sqrt()
    return pl.when(~tied).then(spread)


# What others_std reads of a group beside its mean and std.
EXTREME_COLUMNS = [
    "score_min",
    "score_max",
    "count_min",
    "count_max",
    "m2_above_min",
    "m2_below_max",
]


def _singleton_advantage(
    rule: EstimatorRule, config: AdvantageConfig, batch_std: pl.Expr
) -> pl.Expr:
    """A single-unit group's advantage: with ``--singleton raw`` the unit keeps its score, as
    (s − SINGLETON_MEAN) / (std + ε) when the estimator divides, the std being SINGLETON_STD
    with the group scale and the batch std, which every other unit shares, with ``--scale
    batch`` (SINGLETON_STD when the batch std is 0: no other unit is divided then, each being
    exactly 0); 0 with ``zero`` or where the rule says so."""
    if config.singleton is Singleton.ZERO or not rule.singleton_keeps_score:
        return pl.lit(0.0)
    centred = pl.col(SCORE) - SINGLETON_MEAN
    if config.effective_scale is Scale.NONE:
        return centred
    if config.effective_scale is Scale.BATCH:
        std = pl.when(batch_std != ZERO_STD).then(batch_std).otherwise(SINGLETON_STD)
        # Times the reciprocal: what Polars makes of a division by a constant, so one batch's
        # numbers are the same whether its std is a constant or a column of one per batch.
        return centred * (1.0 / (std + config.epsilon))
    return centred / (SINGLETON_STD + config.epsilon)


def compute_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming | None = None,
    trajectories: Trajectories | None = None,
    batch: str | None = None,
    statistics: pl.DataFrame | None = None,
) -> Advantages:
    """Stage 2: the key projection in, per-unit and per-group advantages out (and each row's,
    through :meth:`Advantages.rows`). ``trajectories``: the projection's index, if already made.
    ``statistics``: the groups' figures as :func:`group_statistics` makes them, when the caller
    makes them otherwise (per-turn rewards' padded step groups, whose members are not all rows).

    ``batch``: a field of the projection's (struct) group key whose each value is its own batch
    (``--by``: the step), for the batch-wide quantities (``--scale batch``, REINFORCE++
    whitening); by default the whole input is one batch."""
    naming = naming or Naming()
    if config.level is Level.TRAJECTORY:
        trajectories = trajectories or index_trajectories(projection)
        if config.traj_score is TrajScore.OWN:
            return _own_score_advantages(projection, config, naming, trajectories, batch)
    else:
        trajectories = None
    units = build_units(projection, config, naming, trajectories)
    rule = RULES[config.estimator]
    second_best = rule.baseline is Baseline.SECOND_BEST
    stats = (
        group_statistics(
            units, second_best=second_best, ddof=config.std_ddof, extremes=rule.others_std
        )
        if statistics is None
        else statistics
    )
    by_batch = config.effective_scale is Scale.BATCH
    if by_batch:
        stats = stats.with_columns(batch_key(batch)).join(
            batch_stds(units, batch, config.std_ddof), on=BATCH, how="left", maintain_order="left"
        )
    batch_columns = ["batch_std"] if by_batch else []
    # grpo_loo's others' std is each unit's own, made from its group's extremes (others_std).
    extreme_columns = EXTREME_COLUMNS if rule.others_std else []
    singleton = pl.col("units") == 1
    groups = stats.select(
        pl.col(GROUP),
        pl.col("units"),
        pl.col("top_row"),
        pl.when(singleton).then(SINGLETON_MEAN).otherwise(baseline(rule)).alias("baseline"),
        pl.when(singleton).then(SINGLETON_STD).otherwise(divisor(config)).alias("divisor"),
        pl.col("zero_std"),
        *batch_columns,
        *extreme_columns,
    )
    # Streaming, and only the advantage comes out: the group columns are never copied out to
    # every unit (at turn level, every row).
    advantage = (
        units.lazy()
        .select(GROUP, SCORE, "first_row")
        .join(
            groups.lazy().select(
                GROUP,
                "units",
                "top_row",
                "baseline",
                "divisor",
                *batch_columns,
                *(["zero_std", *extreme_columns] if rule.others_std else []),
            ),
            on=GROUP,
            how="left",
            maintain_order="left",
        )
        .select(
            unit_advantage(
                rule,
                config,
                divisor=unit_divisor(rule, config, pl.col("baseline"), pl.col("divisor")),
            ).alias("advantage")
        )
        .collect(engine="streaming")
        .to_series()
    )
    units = units.with_columns(advantage)
    if rule.whitens:
        units = _whitened(units, projection, trajectories, batch)
    masked_rows = (projection, trajectories) if rule.whitens and trajectories is not None else None
    check_finite(units, naming, masked_rows)
    groups = groups.rename({"divisor": "std"}).drop("top_row", *batch_columns, *extreme_columns)
    return Advantages(
        level=config.level,
        units=units,
        groups=groups,
        trajectories=trajectories,
        empty_rows_zero=masked_rows is not None,
    )


def _whitened(
    units: pl.DataFrame,
    projection: pl.DataFrame,
    trajectories: Trajectories | None,
    batch: str | None,
) -> pl.DataFrame:
    """The units with REINFORCE++'s post-step applied to their ``advantage``: whitened over
    every response token of each batch (:func:`token_whitening`)."""
    if trajectories is None:  # turn level: the units are the rows
        rows = units.select("advantage", TOKENS, batch_key(batch))
    else:
        rows = projection.select(TOKENS, batch_key(batch)).with_columns(
            units["advantage"].gather(pl.Series(trajectories.of_row))
        )
    whitening = token_whitening(rows, batch)
    del rows
    units = units.with_columns(batch_key(batch)).join(
        whitening, on=BATCH, how="left", maintain_order="left"
    )
    # Times the reciprocal, as for --scale batch's singletons (_singleton_advantage).
    whitened = (pl.col("advantage") - pl.col("whiten_mean")) * (1.0 / pl.col("whiten_scale"))
    # verl multiplies the whitened values by the mask: a row without response tokens gets 0
    # (at turn level the units are the rows; at trajectory level Advantages.rows does it).
    if trajectories is None:
        whitened = pl.when(pl.col(TOKENS) > 0).then(whitened).otherwise(0.0)
    return units.with_columns(whitened.alias("advantage")).drop(
        BATCH, "whiten_mean", "whiten_scale"
    )


def _own_score_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None,
) -> Advantages:
    """``--traj-score own`` (verl-agent's rule for rows that disagree by a penalty): each
    trajectory's first row (in row order) in its group's statistics, every row centred on its
    own score and divided as the estimator divides.

    A group whose first rows tie has std 0: verl-agent divides a penalized row's −0.1 by ε
    there; advcli divides every row of such a group by SINGLETON_STD + ε (mean 0, std 1, as a
    lone unit), so the penalty stays its own size."""
    firsts = projection[trajectories.first_position()]
    first_rows = compute_advantages(firsts, replace(config, level=Level.TURN), naming, None, batch)
    groups = first_rows.groups.select(GROUP, "units", "baseline", "std", "zero_std")
    rows = projection.select(GROUP, SCORE).join(groups, on=GROUP, how="left", maintain_order="left")
    centred = pl.col(SCORE) - pl.col("baseline")
    if config.effective_scale is Scale.NONE:
        advantage = centred
    else:
        divisor = pl.when(pl.col("zero_std")).then(SINGLETON_STD).otherwise(pl.col("std"))
        advantage = pl.when(centred == 0).then(0.0).otherwise(centred / (divisor + config.epsilon))
    if config.singleton is Singleton.ZERO:
        advantage = pl.when(pl.col("units") == 1).then(0.0).otherwise(advantage)
    row_advantage = rows.select(advantage.alias("advantage")).to_series()
    check_finite(
        pl.DataFrame([projection[ROW].alias("first_row"), projection[SCORE], row_advantage]),
        naming,
    )
    # A trajectory's rows, turns and tokens are its own; its score is its first row's (the one
    # in the statistics) and its advantage the mean of its rows', as the turn level's is: its
    # first row's exactly where its rows agree, not a rounding of it.
    table = trajectories.table
    row_means = trajectories.mean(pl.DataFrame([row_advantage]), pl.col("advantage"))
    agree = table["score_min"] == table["score_max"]
    advantage_of_unit = pl.select(
        pl.when(agree).then(first_rows.units["advantage"]).otherwise(pl.Series(row_means))
    ).to_series()
    units = first_rows.units.with_columns(
        table["turns"], table["tokens"].alias(TOKENS), advantage_of_unit.alias("advantage")
    )
    return Advantages(
        level=Level.TRAJECTORY,
        units=units,
        groups=first_rows.groups,
        trajectories=trajectories,
        row_advantage=row_advantage,
        own_scores=True,
    )


def check_finite(
    units: pl.DataFrame,
    naming: Naming,
    masked_rows: tuple[pl.DataFrame, Trajectories] | None = None,
) -> None:
    """Scores near the float64 limit overflow the statistics; beyond the float32 limit they
    overflow the output. Either is an error naming the first row written with such a value, never
    a silent inf or NaN.

    ``masked_rows`` (the projection and its index) where a row without response tokens is written
    as 0 whatever its unit's advantage (REINFORCE++ at trajectory level): the advantage counts
    only in the rows with tokens."""
    bad_score = pl.col(SCORE).abs() > FLOAT32_MAX
    bad_advantage = ~pl.col("advantage").is_finite() | (pl.col("advantage").abs() > FLOAT32_MAX)
    if masked_rows is None:
        row = units.select(pl.col("first_row").filter(bad_score | bad_advantage).min()).item()
    else:
        projection, trajectories = masked_rows
        row = units.select(pl.col("first_row").filter(bad_score).min()).item()
        unit_is_bad = units.select(bad_advantage).to_series().to_numpy()
        written_bad = unit_is_bad[trajectories.of_row] & (projection[TOKENS] > 0).to_numpy()
        if written_bad.any():
            first = int(projection[ROW][int(written_bad.argmax())])
            row = first if row is None else min(row, first)
    if row is not None:
        raise AdvcliError(
            f"{naming.locate(row)}: the score or its advantage does not fit a float32 (the "
            "scores are too large; rescale the rewards)"
        )

"""Which rule a trainer's advantages follow (``audit``): stage 2 for every candidate rule at once.

Each level's statistics are made once (:func:`~advcli.advantages.statistics.group_statistics`,
with the std of both denominators, and the batch's); a candidate rule is then one expression over
them, :func:`~advcli.advantages.estimators.unit_advantage`, the statement ``compute`` applies, and
every candidate's matching rows are counted in one select. The candidate that explains the most
rows is the rule; candidates that explain the same rows are named beside it, with why the dump
cannot tell them apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from advcli.advantages.estimators import baseline, divisor, unit_advantage
from advcli.advantages.statistics import BATCH, batch_key, batch_stds, group_statistics
from advcli.advantages.unit_scores import Naming, build_units
from advcli.advantages.units import Trajectories
from advcli.errors import AdvcliError
from advcli.keys import (
    GROUP,
    ROW,
    SCORE,
    TOKENS,
    TRAINER_FIRST,
    TRAINER_HIGH,
    TRAINER_LOW,
    TURN,
)
from advcli.settings.config import (
    AdvantageConfig,
    Estimator,
    Level,
    Scale,
    Singleton,
    StdDenominator,
)
from advcli.settings.rules import RULES

# A trainer's advantage matches a rule's within float32: |expected − found| ≤ 1e-5 + 1e-5·|found|.
MATCH_ABSOLUTE = 1e-5
MATCH_RELATIVE = 1e-5
# bfloat16's precision: a relative difference of this much is one rounding step.
BFLOAT16_RELATIVE = 2.0**-7
# The epsilons tried, in the order preferred where several fit alike (verl's default first).
EPSILONS = (1e-6, 1e-8, 1e-4, 0.0)
# The estimators tried: the outcome estimators without a post-step.
FIT_ESTIMATORS = (
    Estimator.GRPO,
    Estimator.DRGRPO,
    Estimator.RLOO,
    Estimator.OPO,
    Estimator.GRPO_PASSK,
)
# The settings a rule is told by, in the order they are reported.
SETTINGS = ("level", "estimator", "scale", "singleton", "epsilon", "std_ddof")


def matches(expected: pl.Expr, found: pl.Expr) -> pl.Expr:
    """Whether ``found`` is ``expected`` within float32 (MATCH_ABSOLUTE, MATCH_RELATIVE)."""
    return (expected - found).abs() <= MATCH_ABSOLUTE + MATCH_RELATIVE * found.abs()


def matches_bfloat16(expected: pl.Expr, found: pl.Expr) -> pl.Expr:
    """Whether ``found`` is ``expected`` within bfloat16's precision (a relative step of
    BFLOAT16_RELATIVE)."""
    return (expected - found).abs() <= MATCH_ABSOLUTE + BFLOAT16_RELATIVE * found.abs()


def candidate_rules(levels: Sequence[Level], token_counts: bool) -> list[AdvantageConfig]:
    """Every rule tried, in the order preferred where several fit alike: each level (trajectory
    first), estimator, scale (group, batch; grpo_passk undivided too: grpo's is drgrpo),
    singleton rule, epsilon and std denominator where the rule divides. ``token_counts``: the
    dump has a mask, without which the token-weighted baseline (opo) is not tried."""
    rules = []
    for level, estimator in itertools.product(levels, FIT_ESTIMATORS):
        rule = RULES[estimator]
        if rule.counts_tokens and not token_counts:
            continue
        scales: tuple[Scale | None, ...] = (None,)
        if rule.divides:
            scales = (Scale.GROUP, Scale.BATCH)
            if estimator is Estimator.GRPO_PASSK:
                scales += (Scale.NONE,)
        # grpo_passk gives a lone unit 0 under either singleton rule: named by what it does.
        singletons = (
            (Singleton.RAW, Singleton.ZERO) if rule.singleton_keeps_score else (Singleton.ZERO,)
        )
        for scale, singleton in itertools.product(scales, singletons):
            divides = rule.divides and scale is not Scale.NONE
            epsilons = EPSILONS if divides else (0.0,)
            stds = tuple(StdDenominator) if divides else (None,)
            for epsilon, std in itertools.product(epsilons, stds):
                rules.append(
                    AdvantageConfig(
                        level=level,
                        estimator=estimator,
                        epsilon=epsilon,
                        scale=scale,
                        singleton=singleton,
                        std=std,
                    )
                )
    return rules


def rule_settings(config: AdvantageConfig) -> dict[str, Any]:
    """A rule's settings as the reports name them: epsilon and std_ddof None where nothing is
    divided."""
    divides = config.std_in_use is not None
    return {
        "level": config.level.value,
        "estimator": config.estimator.value,
        "scale": config.effective_scale.value,
        "singleton": config.singleton.value,
        "epsilon": config.epsilon if divides else None,
        "std_ddof": config.std_ddof if divides else None,
    }


@dataclass(frozen=True)
class RuleFit:
    """The rule that explains the most of a trainer's advantages.

    ``config``: that rule, the candidate explaining the most rows within bfloat16, then within
    float32 (the first of :func:`candidate_rules` on a tie); None where it explains no row
    within float32 and fewer than half within bfloat16 (a trainer in bfloat16 is named by its
    rule; a few rows explained within bfloat16 by chance name none). ``rows``: the rows
    audited (a trainer advantage, one value over the row's response tokens);
    ``rows_matched``: those the rule explains within float32. ``alike``: for each setting
    other candidates explaining the same rows give otherwise, its values (the rule's first) and
    why the dump cannot tell them apart. ``checked``: one row per audited row (``row``,
    ``group``, ``score``, ``unit``, ``last_of_unit`` as :func:`_level_rows` makes them,
    ``expected``, ``found`` and ``expected_bfloat16``), the rule's advantage beside the
    trainer's and the rule's over statistics held in bfloat16 (the best candidate's, named or
    not). ``unfitted``: a level no candidate was tried at, and why.
    """

    config: AdvantageConfig | None
    rows: int
    rows_matched: int
    max_abs_diff: float | None
    alike: dict[str, tuple[list[Any], str]]
    checked: pl.DataFrame
    unfitted: dict[str, str] = field(default_factory=dict)


def fit_rule(
    projection: pl.DataFrame,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
) -> RuleFit:
    """The rule among :func:`candidate_rules` that explains the most audited rows of
    ``projection`` (the key projection with the trainer's advantage, TRAINER_*). ``batch``: as
    :func:`~advcli.advantages.estimators.compute_advantages` takes it."""
    audited = pl.col(TRAINER_FIRST).is_not_null() & matches(
        pl.col(TRAINER_LOW), pl.col(TRAINER_HIGH)
    )
    frames: dict[Level, pl.DataFrame] = {}
    unfitted: dict[str, str] = {}
    for level in (Level.TRAJECTORY, Level.TURN):
        try:
            frames[level] = _level_rows(projection, level, naming, trajectories, batch).filter(
                audited
            )
        except AdvcliError as error:
            unfitted[level.value] = str(error)
    token_counts = projection[TOKENS].null_count() < projection.height
    counts = _counts(frames, candidate_rules(list(frames), token_counts))
    audited_rows = next(iter(frames.values())).height
    # The most rows within bfloat16, then within float32: a trainer that computes in bfloat16
    # is named by its rule too (its low precision is a finding), and among the candidates that
    # agree at that precision (epsilons, say), float32 tells.
    best, score = max(counts.items(), key=lambda item: item[1])
    rows = frames[best.level]
    in_low_precision = rows.with_columns(
        in_bfloat16(pl.col(name)).alias(name) for name in BFLOAT16_ROUNDED
    )
    checked = rows.select(
        ROW,
        GROUP,
        SCORE,
        "unit",
        "last_of_unit",
        _candidate(best).alias("expected"),
        pl.col(TRAINER_FIRST).alias("found"),
    ).with_columns(
        in_low_precision.select(
            in_bfloat16(_candidate(best)).alias("expected_bfloat16")
        ).to_series()
    )
    coarse, exact = score
    if exact == 0 and 2 * coarse < audited_rows:
        return RuleFit(None, audited_rows, 0, None, {}, checked, unfitted)
    max_abs_diff = checked.select((pl.col("expected") - pl.col("found")).abs().max()).item()
    fitting = [config for config, count in counts.items() if count == score]
    one_row_each = trajectories.count == projection.height
    alike = _alike(best, fitting, rows, one_row_each)
    return RuleFit(best, audited_rows, exact, max_abs_diff, alike, checked, unfitted)


def _counts(
    frames: dict[Level, pl.DataFrame], rules: list[AdvantageConfig]
) -> dict[AdvantageConfig, tuple[int, int]]:
    """Each candidate's rows matched within bfloat16 and within float32, in one select a level."""
    counts = {}
    found = pl.col(TRAINER_FIRST)
    for level, rows in frames.items():
        of_level = [config for config in rules if config.level is level]
        sums = rows.select(
            expr
            for index, config in enumerate(of_level)
            for expr in (
                matches_bfloat16(_candidate(config), found).sum().alias(f"coarse{index}"),
                matches(_candidate(config), found).sum().alias(f"exact{index}"),
            )
        ).row(0)
        for index, config in enumerate(of_level):
            counts[config] = (sums[2 * index], sums[2 * index + 1])
    return counts


# What a trainer working in bfloat16 holds in it: the scores, and their groups' and batch's
# means and stds, each rounded before the rule divides (and the advantage after).
BFLOAT16_ROUNDED = (
    SCORE,
    "mean",
    "score_second",
    "std_sample",
    "std_population",
    "batch_std_sample",
    "batch_std_population",
)


def in_bfloat16(value: pl.Expr) -> pl.Expr:
    """``value`` rounded to bfloat16's 8 significant bits (half to even), as a float64."""
    ulp = pl.lit(2.0).pow(value.abs().log(2).floor() - 7)
    return pl.when(value == 0).then(0.0).otherwise((value / ulp).round() * ulp)


STD_COLUMN = {StdDenominator.SAMPLE: "std_sample", StdDenominator.POPULATION: "std_population"}


def _candidate(config: AdvantageConfig) -> pl.Expr:
    """A candidate rule's advantage over a level's rows (:func:`_level_rows`)."""
    std = config.effective_std
    return unit_advantage(
        RULES[config.estimator],
        config,
        baseline(RULES[config.estimator]),
        divisor(config, pl.col(STD_COLUMN[std]), pl.col(f"batch_{STD_COLUMN[std]}")),
        pl.col(f"batch_{STD_COLUMN[std]}"),
    )


def _level_rows(
    projection: pl.DataFrame,
    level: Level,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None,
) -> pl.DataFrame:
    """One row per projection row: its unit's score and group statistics at ``level`` (both
    std denominators, the group's and the batch's), the unit's ``first_row``, and the row's
    own number and trainer advantage, its trajectory (``unit``, whatever the level) and whether
    it is the trajectory's last row (in turn order, else row order: ``last_of_unit``)."""
    units = build_units(
        projection,
        AdvantageConfig(level=level),
        naming,
        trajectories if level is Level.TRAJECTORY else None,
    )
    stats = group_statistics(units, second_best=True)
    stats = stats.with_columns(
        pl.col("std").alias("std_sample"),
        pl.when(pl.col("units") > 1)
        .then(pl.col("std") * ((pl.col("units") - 1) / pl.col("units")).sqrt())
        .otherwise(pl.col("std"))
        .alias("std_population"),
    )
    batches = (
        batch_stds(units, batch)
        .rename({"batch_std": "batch_std_sample"})
        .join(
            batch_stds(units, batch, ddof=0).rename({"batch_std": "batch_std_population"}),
            on=BATCH,
            how="left",
        )
    )
    per_unit = (
        units.select(GROUP, SCORE, TOKENS, "first_row", batch_key(batch))
        .join(
            stats.select(
                GROUP,
                "units",
                "mean",
                "std_sample",
                "std_population",
                "score_second",
                "top_row",
                "tokens_sum",
                "tokens_score_sum",
                "zero_std",
            ),
            on=GROUP,
            how="left",
            maintain_order="left",
        )
        .join(batches, on=BATCH, how="left", maintain_order="left")
    )
    rows = per_unit if level is Level.TURN else per_unit[trajectories.of_row]
    order = projection[TURN].to_numpy() if TURN in projection.columns else None
    unit = pl.Series("unit", trajectories.of_row, dtype=pl.UInt32)
    last = trajectories.last_position(order)[trajectories.of_row] == np.arange(projection.height)
    trainer = projection.select(ROW, TRAINER_FIRST, TRAINER_LOW, TRAINER_HIGH)
    return rows.with_columns(*trainer, unit, pl.Series("last_of_unit", last))


def _alike(
    best: AdvantageConfig,
    fitting: list[AdvantageConfig],
    rows: pl.DataFrame,
    one_row_each: bool,
) -> dict[str, tuple[list[Any], str]]:
    """For each setting the candidates in ``fitting`` (each explaining as many rows as
    ``best``) give otherwise, its values, ``best``'s first, and why they fit alike. ``rows``:
    ``best``'s level's audited rows; ``one_row_each``: every trajectory is one row."""
    values: dict[str, list[Any]] = {name: [] for name in SETTINGS}
    for config in [best, *fitting]:
        for name, value in rule_settings(config).items():
            if value not in values[name]:
                values[name].append(value)
    singletons = rows.filter(pl.col("units") == 1).height
    why = {
        "level": "every trajectory is one row"
        if one_row_each
        else "a token-weighted mean is the same over rows as over trajectories"
        if best.estimator is Estimator.OPO
        else "both levels explain the same rows",
        "singleton": "no group has a single unit"
        if singletons == 0
        else "the rules explain the same rows",
        "epsilon": "no group's std is small enough for epsilon to change an advantage beyond "
        "float32's precision",
    }
    return {
        name: (found, why.get(name, "the rules explain the same rows"))
        for name, found in values.items()
        if len(found) > 1
    }

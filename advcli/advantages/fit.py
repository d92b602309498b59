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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from advcli.advantages.estimators import (
    EXTREME_COLUMNS,
    baseline,
    centred_score,
    divisor,
    others_std,
    unit_advantage,
)
from advcli.advantages.statistics import BATCH, batch_key, batch_stds, group_statistics
from advcli.advantages.step_groups import SharedParts, gigpo_advantages
from advcli.advantages.unit_scores import Naming, build_units
from advcli.advantages.units import Trajectories
from advcli.errors import AdvcliError
from advcli.keys import (
    ANCHOR,
    GROUP,
    ROW,
    SCORE,
    STEP_RETURN,
    STEP_REWARD,
    TOKENS,
    TRAINER_FIRST,
    TRAINER_HIGH,
    TRAINER_LOW,
    TURN,
)
from advcli.settings.config import (
    AdvantageConfig,
    Estimator,
    GigpoNorm,
    Level,
    Scale,
    Singleton,
    StdDenominator,
)
from advcli.settings.recipes import RECIPES
from advcli.settings.resolve import resolve_config
from advcli.settings.rules import POPULATION_DDOF, RULES, STD_DDOF, WHITEN_EPSILON

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
    Estimator.GRPO_LOO,
    Estimator.REINFORCE_PP_BASELINE,
)
# GiGPO's discounts tried where a dump gives step rewards, beside each recipe's own: those the
# peers' configs and examples set. A dump's step returns are read as they are (no γ).
GIGPO_GAMMAS = (1.0, 0.99, 0.95, 0.9)
# The settings a rule is told by, in the order they are reported.
SETTINGS = ("level", "estimator", "scale", "singleton", "epsilon", "std_ddof", "step")


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
        if rule.others_std:
            # No trainer divides a leave-one-out centred score by the batch's std; undivided,
            # it is rloo.
            scales = (Scale.GROUP,)
        elif rule.divides:
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


def gigpo_rules(projection: pl.DataFrame, levels: Sequence[Level]) -> list[AdvantageConfig]:
    """GiGPO's candidates, where the key projection has the anchors and the step rewards or
    returns: each peer's recipe (its level, episode rule, step groups' scope, singleton rule and
    ε under ``mean``) under both norms, with each of GIGPO_GAMMAS and the recipe's γ where the
    dump gives step rewards; Trinity-RFT's (its episode score the step rewards' sum) only
    there."""
    if ANCHOR not in projection.columns:
        return []
    rewards = STEP_REWARD in projection.columns
    rules = []
    for recipe, settings in RECIPES.items():
        if settings.level not in levels or (settings.step.episode_from_steps and not rewards):
            continue
        gammas = dict.fromkeys((settings.step.gamma, *GIGPO_GAMMAS)) if rewards else (None,)
        for norm, gamma in itertools.product(GigpoNorm, gammas):
            given = {"recipe": recipe.value, "gigpo_norm": norm.value}
            rules.append(resolve_config(given if gamma is None else {**given, "gamma": gamma}))
    return rules


def rule_settings(config: AdvantageConfig, gamma_read: bool = True) -> dict[str, Any]:
    """A rule's settings as the reports name them: epsilon and std_ddof None where nothing is
    divided; ``step`` GiGPO's step term (None for the other estimators): the recipe whose
    settings it has, γ (None where the dump's step returns were read: ``gamma_read`` False),
    ω, the norm and the anchors' scope."""
    divides = config.std_in_use is not None
    step = config.step
    return {
        "level": config.level.value,
        "estimator": config.estimator.value,
        "scale": config.effective_scale.value,
        "singleton": config.singleton.value,
        "epsilon": config.epsilon if divides else None,
        "std_ddof": config.std_ddof if divides else None,
        "step": None
        if step is None
        else {
            "recipe": _recipe_of(config),
            "gamma": step.gamma if gamma_read else None,
            "step_weight": step.weight,
            "gigpo_norm": step.norm.value,
            "anchor_scope": step.scope.value,
        },
    }


def _recipe_of(config: AdvantageConfig) -> str | None:
    """The GiGPO recipe whose level and step term ``config`` has (its γ, ω and norm aside)."""
    step = config.step
    assert step is not None
    for recipe, settings in RECIPES.items():
        own = replace(settings.step, gamma=step.gamma, weight=step.weight, norm=step.norm)
        if settings.level is config.level and own == step:
            return recipe.value
    return None


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
    ``group``, ``score``, ``unit``, ``last_of_unit``, ``counted`` as :func:`_level_rows` makes them,
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
    # The rule --expect names, beside the trainer's advantages: as ``checked`` (without
    # ``expected_bfloat16``), None where none is expected.
    expected: pl.DataFrame | None = None
    # Whether GiGPO's γ was applied (the dump's step rewards discounted), not its step returns
    # read as they are.
    gamma_read: bool = True
    # For each group with rows the rule misses, the first other candidate that explains every
    # one of them, the groups no candidate explains left out: a rule that changed within the
    # dump (between steps read as one).
    explained_by: ExplainedBy | None = None

    def settings(self, config: AdvantageConfig) -> dict[str, Any]:
        """:func:`rule_settings` of ``config`` as this dump was read."""
        return rule_settings(config, self.gamma_read)


def fit_rule(
    projection: pl.DataFrame,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
    expected: AdvantageConfig | None = None,
) -> RuleFit:
    """The rule among :func:`candidate_rules` that explains the most audited rows of
    ``projection`` (the key projection with the trainer's advantage, TRAINER_*). ``batch``: as
    :func:`~advcli.advantages.estimators.compute_advantages` takes it. ``expected``: a rule
    (an outcome estimator without a post-step) whose advantages are set beside the trainer's
    too (``RuleFit.expected``); at a level not fitted, an error saying why."""
    audited = pl.col(TRAINER_FIRST).is_not_null() & matches(
        pl.col(TRAINER_LOW), pl.col(TRAINER_HIGH)
    )
    frames: dict[Level, pl.DataFrame] = {}
    unfitted: dict[str, str] = {}
    for level in (Level.TRAJECTORY, Level.TURN):
        try:
            frames[level] = _level_rows(projection, level, naming, trajectories, batch)
        except AdvcliError as error:
            unfitted[level.value] = str(error)
    steps = gigpo_rules(projection, list(frames))
    columns = _gigpo_columns(projection, naming, trajectories, batch, steps, expected)
    frames = {
        level: frame.with_columns(
            column for config, column in columns.items() if config.level is level
        ).filter(audited)
        for level, frame in frames.items()
    }
    beside = None
    if expected is not None:
        if expected.level not in frames:
            raise AdvcliError(
                f"the rule --expect names is at {expected.level.value} level, which does not "
                f"fit this dump: {unfitted[expected.level.value]}"
            )
        beside = _beside(frames[expected.level], expected)
    audited_rows = frames[Level.TURN].height if Level.TURN in frames else 0
    if audited_rows == 0:
        raise AdvcliError(
            "no row has an advantage of the trainer's to audit: every row's response is empty "
            "(its mask all 0) or its advantage null"
        )
    token_counts = projection[TOKENS].null_count() < projection.height
    rules = [*candidate_rules(list(frames), token_counts), *(c for c in steps if c in columns)]
    best, coarse, exact, tied = _best(frames, rules)
    if exact < audited_rows:
        fitted = _with_fitted_epsilon(best, frames[best.level])
        if fitted is not None:
            best, coarse, exact, tied = fitted
    rows = frames[best.level]
    in_low_precision = rows.with_columns(
        in_bfloat16(pl.col(name)).alias(name) for name in BFLOAT16_ROUNDED
    )
    checked = _beside(rows, best).with_columns(
        in_low_precision.select(
            in_bfloat16(_candidate(best)).alias("expected_bfloat16")
        ).to_series()
    )
    if 2 * coarse < audited_rows:
        return RuleFit(None, audited_rows, 0, None, {}, checked, unfitted, beside)
    max_abs_diff = checked.select((pl.col("expected") - pl.col("found")).abs().max()).item()
    one_row_each = trajectories.count == projection.height
    gamma_read = STEP_RETURN not in projection.columns
    alike = _alike(best, _same_rows(best, tied, frames), rows, one_row_each, gamma_read)
    return RuleFit(
        best,
        audited_rows,
        exact,
        max_abs_diff,
        alike,
        checked,
        unfitted,
        beside,
        gamma_read,
        _explained_by(best, rules, frames, checked, gamma_read),
    )


def _explained_by(
    best: AdvantageConfig,
    rules: list[AdvantageConfig],
    frames: dict[Level, pl.DataFrame],
    checked: pl.DataFrame,
    gamma_read: bool,
) -> ExplainedBy | None:
    """For each group with rows ``best`` misses within float32, the first other candidate (in
    ``rules``' order) that explains every one of those rows within float32; None where
    ``best`` misses no row. Each candidate is evaluated
    over its level's whole frame (REINFORCE++'s whitening is over the batch), then read at the
    missed rows alone."""
    missed = checked.filter(~matches(pl.col("expected"), pl.col("found"))).select(ROW)
    if missed.is_empty():
        return None
    others = [config for config in rules if config != best]
    tables = []
    for level, frame in frames.items():
        of_level = [(index, config) for index, config in enumerate(others) if config.level is level]
        flags = frame.select(
            ROW,
            GROUP,
            *(
                matches(_candidate(config), pl.col(TRAINER_FIRST)).alias(str(index))
                for index, config in of_level
            ),
        )
        tables.append(
            flags.join(missed, on=ROW, how="semi")
            .drop(ROW)
            .group_by(GROUP, maintain_order=True)
            .agg(pl.all().all())
        )
    table = tables[0]
    for other in tables[1:]:
        table = table.join(other, on=GROUP, how="left", maintain_order="left")
    columns = [str(index) for index in range(len(others)) if str(index) in table.columns]
    groups = table.select(
        GROUP,
        pl.concat_list(pl.col(name) for name in columns).list.arg_max().alias("other"),
        pl.any_horizontal(pl.col(name) for name in columns).alias("any"),
    ).filter(pl.col("any"))
    return ExplainedBy(
        groups.drop("any"), [rule_settings(others[int(name)], gamma_read) for name in columns]
    )


@dataclass(frozen=True)
class ExplainedBy:
    """The groups with rows the rule misses that another candidate explains whole: ``groups``
    (``group``, ``other``: the index of that candidate's settings in ``rules``)."""

    groups: pl.DataFrame
    rules: list[dict[str, Any]]

    def of(self, group: Any) -> dict[str, Any] | None:
        """The settings of the candidate that explains ``group``'s missed rows, if any."""
        found = self.groups.filter(pl.col(GROUP) == group)["other"]
        return self.rules[found[0]] if found.len() else None


def _gigpo_columns(
    projection: pl.DataFrame,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None,
    rules: list[AdvantageConfig],
    expected: AdvantageConfig | None,
) -> dict[AdvantageConfig, pl.Series]:
    """Each GiGPO candidate's advantages, a row each in the projection's order, under
    :func:`gigpo_column`'s name: ``compute``'s computation, its parts made once for every
    candidate that shares them (:class:`~advcli.advantages.step_groups.SharedParts`: an
    episode term a recipe and norm, the returns a γ, the step groups' figures a γ and scope),
    each candidate then one expression over them. A recipe the dump cannot run (an advantage
    beyond float32) is no candidate. The GiGPO rule ``--expect`` names (``expected``) is made
    too where it is no candidate (a γ or ω of its own): an error where the dump cannot run
    it."""
    shared = SharedParts()

    def column(config: AdvantageConfig) -> pl.Series:
        advantages = gigpo_advantages(projection, config, naming, trajectories, batch, shared)
        assert advantages.row_advantage is not None
        return advantages.row_advantage.alias(gigpo_column(config))

    columns = {}
    for config in rules:
        try:
            columns[config] = column(config)
        except AdvcliError:
            continue
    if expected is not None and expected.step is not None and expected not in columns:
        if ANCHOR not in projection.columns:
            raise AdvcliError(
                "the rule --expect names is GiGPO's, whose step groups need the dump's anchors "
                "and step rewards or returns (--anchor-col, --step-reward-col, "
                "--step-return-col); this dump was read without them"
            )
        columns[expected] = column(expected)
    return columns


def gigpo_column(config: AdvantageConfig) -> str:
    """The name of a GiGPO candidate's advantages in a level's rows."""
    settings = (config.level, config.epsilon, config.singleton, config.traj_score, config.step)
    return f"gigpo {settings}"


def _beside(rows: pl.DataFrame, config: AdvantageConfig) -> pl.DataFrame:
    """A level's audited rows with ``config``'s advantage (``expected``) beside the trainer's
    (``found``)."""
    return rows.select(
        ROW,
        GROUP,
        SCORE,
        "unit",
        "last_of_unit",
        "counted",
        _candidate(config).alias("expected"),
        pl.col(TRAINER_FIRST).alias("found"),
    )


def _best(
    frames: dict[Level, pl.DataFrame], rules: list[AdvantageConfig]
) -> tuple[AdvantageConfig, int, int, list[AdvantageConfig]]:
    """The candidate that explains the most rows of non-zero advantage within bfloat16, then
    the most rows within bfloat16, then within float32 (the first of ``rules`` on a tie), the
    rows it explains within bfloat16 and within float32, and the other candidates that score
    alike. An advantage of 0 is weak evidence: many rules give it (a tied group, a lone unit),
    and a trainer that zeroes rows by mistake (SkyRL #1492's earlier steps, most of its rows)
    would otherwise have them name the rule. A trainer that computes in bfloat16 is named by
    its rule too (its low precision is a finding); among the candidates that agree at that
    precision (epsilons, say), float32 tells."""
    exact = _counts(frames, rules, matches)
    rows = next(iter(frames.values())).height
    if max(exact.values()) == rows:
        # A rule explains every row within float32, and so within bfloat16: the others need
        # no count at bfloat16's precision.
        every = [config for config, count in exact.items() if count == rows]
        return every[0], rows, rows, every[1:]
    coarse = _counts(frames, rules, matches_bfloat16)
    telling = _counts(
        frames, rules, lambda expected, found: matches_bfloat16(expected, found) & (found != 0)
    )
    scores = {config: (telling[config], coarse[config], exact[config]) for config in rules}
    best = max(scores, key=lambda config: scores[config])
    tied = [config for config in rules if scores[config] == scores[best] and config != best]
    return best, coarse[best], exact[best], tied


def _with_fitted_epsilon(
    best: AdvantageConfig, rows: pl.DataFrame
) -> tuple[AdvantageConfig, int, int, list[AdvantageConfig]] | None:
    """``best`` with the epsilon the trainer's advantages imply, where ``best`` divides: each
    row's (s − baseline) / A − divisor (rows of more than one unit, a centred score and an
    advantage not 0), at its median to two significant digits; with the rows it explains
    within bfloat16 and within float32, where it explains more within float32 than ``best``
    (an epsilon not among the candidates, 1e-5 say) and most of the rows ``best`` misses that it
    comes near (within bfloat16), else None. A trainer's real epsilon explains each of those;
    advantages rounded to bfloat16 imply a scatter of epsilons, whose median explains its own
    row exactly and the others only within bfloat16."""
    if best.std_in_use is None or best.step is not None:
        return None
    rule = RULES[best.estimator]
    centred = centred_score(rule, baseline(rule))
    divided_by = _unit_divisor(best)
    found = pl.col(TRAINER_FIRST)
    implied = (
        rows.filter(
            (pl.col("units") > 1)
            & (centred != 0)
            & (found.abs() > MATCH_ABSOLUTE)
            & divided_by.is_not_null()
        )
        .select((centred / found - divided_by).median())
        .item()
    )
    if implied is None or not 0 < implied < math.inf:
        return None
    fitted = replace(best, epsilon=float(f"{implied:.2g}"))
    frames = {best.level: rows}
    exact = _counts(frames, [best, fitted], matches)
    missed = ~matches(_candidate(best), found)
    explained, near = rows.select(
        (missed & matches(_candidate(fitted), found)).sum().alias("explained"),
        (missed & matches_bfloat16(_candidate(fitted), found)).sum().alias("near"),
    ).row(0)
    if exact[fitted] <= exact[best] or 2 * explained <= near:
        return None
    return fitted, _counts(frames, [fitted], matches_bfloat16)[fitted], exact[fitted], []


def _counts(
    frames: dict[Level, pl.DataFrame],
    rules: list[AdvantageConfig],
    match: Callable[[pl.Expr, pl.Expr], pl.Expr],
) -> dict[AdvantageConfig, int]:
    """Each candidate's rows that ``match`` the trainer's, in one select a level."""
    counts: dict[AdvantageConfig, int] = {}
    for level, rows in frames.items():
        of_level = [config for config in rules if config.level is level]
        sums = rows.select(
            match(_candidate(config), pl.col(TRAINER_FIRST)).sum().alias(str(index))
            for index, config in enumerate(of_level)
        ).row(0)
        counts.update(zip(of_level, sums, strict=True))
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
    """A candidate rule's advantage over a level's rows (:func:`_level_rows`); a GiGPO
    candidate's, its column there (:func:`_gigpo_columns`)."""
    if config.step is not None:
        return pl.col(gigpo_column(config))
    rule = RULES[config.estimator]
    batch_std = pl.col(f"batch_{STD_COLUMN[config.effective_std]}")
    advantage = unit_advantage(rule, config, baseline(rule), _unit_divisor(config), batch_std)
    return _whitened(advantage) if rule.whitens else advantage


def _whitened(value: pl.Expr) -> pl.Expr:
    """REINFORCE++'s post-step over a level's rows, as
    :func:`~advcli.advantages.statistics.token_whitening` states it: each row's ``value``
    whitened over every response token of its batch (each row counted its own tokens' times),
    a row without response tokens 0. Over the rows audited: a row left out (its tokens
    disagree) counts in no candidate's whitening."""
    weight = pl.col(ROW_TOKENS).cast(pl.Float64)
    total = weight.sum().over(BATCH)
    mean = (weight * value).sum().over(BATCH) / total
    variance = (weight * (value - mean) ** 2).sum().over(BATCH) / (total - 1)
    whitened = (value - mean) / (variance + WHITEN_EPSILON).sqrt()
    return pl.when(weight > 0).then(whitened).otherwise(0.0)


# Each row's own response tokens in a level's rows (at trajectory level ``tokens`` is its
# trajectory's).
ROW_TOKENS = "row_tokens"


def _unit_divisor(config: AdvantageConfig) -> pl.Expr:
    """What a candidate divides a unit's centred score by, over a level's rows: the std of
    its group or batch (:func:`~advcli.advantages.estimators.divisor`), or the other units'
    (grpo_loo), made once a level (:func:`_level_rows`)."""
    std = STD_COLUMN[config.effective_std]
    if RULES[config.estimator].others_std and config.effective_scale is Scale.GROUP:
        return pl.col(f"others_{std}")
    return divisor(config, pl.col(std), pl.col(f"batch_{std}"))


def _level_rows(
    projection: pl.DataFrame,
    level: Level,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None,
) -> pl.DataFrame:
    """One row per projection row: its unit's score and group statistics at ``level`` (both
    std denominators, the group's and the batch's), the unit's ``first_row``, and the row's
    own number and trainer advantage, its trajectory (``unit``, whatever the level), whether
    it is the trajectory's last row (in turn order, else row order: ``last_of_unit``) and
    whether its score is one of its group's units' (``counted``)."""
    units = build_units(
        projection,
        AdvantageConfig(level=level),
        naming,
        trajectories if level is Level.TRAJECTORY else None,
    )
    stats = group_statistics(units, second_best=True, extremes=True)
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
                *EXTREME_COLUMNS,
            ),
            on=GROUP,
            how="left",
            maintain_order="left",
        )
        .join(batches, on=BATCH, how="left", maintain_order="left")
        .with_columns(
            others_std(pl.col("std_sample"), pl.col("mean"), STD_DDOF).alias("others_std_sample"),
            others_std(pl.col("std_population"), pl.col("mean"), POPULATION_DDOF).alias(
                "others_std_population"
            ),
        )
        .drop(EXTREME_COLUMNS)
    )
    rows = per_unit if level is Level.TURN else per_unit[trajectories.of_row]
    order = projection[TURN].to_numpy() if TURN in projection.columns else None
    unit = pl.Series("unit", trajectories.of_row, dtype=pl.UInt32)
    last = trajectories.last_position(order)[trajectories.of_row] == np.arange(projection.height)
    trainer = projection.select(
        ROW, TRAINER_FIRST, TRAINER_LOW, TRAINER_HIGH, pl.col(TOKENS).alias(ROW_TOKENS)
    )
    rows = rows.with_columns(*trainer, unit, pl.Series("last_of_unit", last))
    # The rows whose scores are the group's units': each row at turn level, a trajectory's
    # first at trajectory level.
    return rows.with_columns(
        (pl.col("first_row") == pl.col(ROW)).alias("counted")
        if level is Level.TRAJECTORY
        else pl.lit(True).alias("counted")
    )


def _same_rows(
    best: AdvantageConfig, tied: list[AdvantageConfig], frames: dict[Level, pl.DataFrame]
) -> list[AdvantageConfig]:
    """The candidates of ``tied`` (each explaining as many rows as ``best``) that explain the
    very same rows, within float32 and within bfloat16. Every level's frame holds the audited
    rows in the projection's order, so their rows line up."""
    found = pl.col(TRAINER_FIRST)

    def explained(config: AdvantageConfig) -> pl.DataFrame:
        expected = _candidate(config)
        return frames[config.level].select(
            matches(expected, found).alias("exact"),
            matches_bfloat16(expected, found).alias("coarse"),
        )

    rows = explained(best)
    return [config for config in tied if explained(config).equals(rows)]


def _alike(
    best: AdvantageConfig,
    fitting: list[AdvantageConfig],
    rows: pl.DataFrame,
    one_row_each: bool,
    gamma_read: bool,
) -> dict[str, tuple[list[Any], str]]:
    """For each setting the candidates in ``fitting`` (each explaining the rows ``best``
    explains) give otherwise, its values, ``best``'s first, and why they fit alike. ``rows``:
    ``best``'s level's audited rows; ``one_row_each``: every trajectory is one row."""
    values: dict[str, list[Any]] = {name: [] for name in SETTINGS}
    for config in [best, *fitting]:
        for name, value in rule_settings(config, gamma_read).items():
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
    }
    if None not in values["epsilon"]:
        why["epsilon"] = (
            "no group whose advantages the rule explains has a std small enough for epsilon "
            "to change an advantage beyond float32's precision"
        )
    return {
        name: (found, why.get(name, "the rules explain the same rows"))
        for name, found in values.items()
        if len(found) > 1
    }

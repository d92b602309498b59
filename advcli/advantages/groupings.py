"""Per-turn rewards under every step grouping on the same rows, for the termination report
(:func:`every_grouping`): each row's advantage under the estimator and under its centring alone,
from the one per-turn engine (:func:`advcli.advantages.per_turn.per_turn_advantages`), and the
trajectory level on the returns (:func:`advcli.advantages.estimators.compute_advantages`).
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from advcli.advantages.estimators import Advantages, compute_advantages
from advcli.advantages.per_turn import per_turn_advantages, turn_positions
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import Trajectories
from advcli.keys import ANCHOR, GROUP, ROW, SCORE
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    Estimator,
    Level,
    PerTurn,
    StepGroups,
    TrajScore,
)
from advcli.settings.rules import PER_TURN_ESTIMATORS, RULES, STEP_GROUPINGS

# The comparison beside the step groupings: one unit per trajectory, its score the return from
# its first turn G_0, the advantage broadcast to its rows (TorchRL's "sum", Trinity-RFT's and
# SkyRL's step-wise GRPO).
TRAJECTORY = "trajectory"


def groupings_of(projection: pl.DataFrame, in_use: StepGroups) -> list[str]:
    """The groupings the report computes on this dump, in ``StepGroups``' order then
    :data:`TRAJECTORY`: every step grouping, those of anchors only when the dump has an anchor
    column or they are the grouping in use (whose missing anchors are then the engine's error)."""
    named = [
        groups.value
        for groups in StepGroups
        if not STEP_GROUPINGS[groups.value].anchors
        or ANCHOR in projection.columns
        or groups is in_use
    ]
    return [*named, TRAJECTORY]


def centring(estimator: Estimator) -> Estimator:
    """The per-turn estimator that centres as ``estimator`` does and divides by nothing: its
    advantage is the return less the baseline (grpo: drgrpo; drgrpo and rloo: themselves)."""
    baseline = RULES[estimator.value].baseline
    return Estimator(
        next(
            name
            for name in PER_TURN_ESTIMATORS
            if RULES[name].baseline is baseline and not RULES[name].divides
        )
    )


def every_grouping(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
) -> pl.DataFrame:
    """One row per projection row, in its order: ``group`` (the task group), ``trajectory``
    (its index), ``turn`` (its position, from 0), ``turns`` (its trajectory's rows), ``return``
    (``G_t``), and for each grouping ``g`` of :func:`groupings_of` ``advantage:g`` (under
    ``config.estimator``), ``baseline:g`` (``G_t`` less the advantage under :func:`centring`,
    the value the grouping subtracts from the return) and ``loo:g`` (the same under rloo: the
    baseline without the row itself, the derivation's ``b_{i,t}``).

    ``config`` is per-turn; its grouping is one of those computed, its gamma, singleton rule and
    ε are every grouping's."""
    per_turn = config.per_turn
    if per_turn is None:
        raise ValueError("the groupings are of per-turn rewards")
    # Each estimator is run once: grpo needs three runs, drgrpo two, rloo one.
    # The centring estimators divide by no std: --std is not theirs.
    runs = {
        "advantage": config,
        "baseline": replace(config, estimator=centring(config.estimator), std=None),
        "loo": replace(config, estimator=Estimator.RLOO, std=None),
    }
    rows = pl.DataFrame(
        {
            ROW: projection[ROW],
            "group": projection[GROUP],
            "trajectory": trajectories.of_row,
            "turn": turn_positions(projection, trajectories),
            "turns": trajectories.table["turns"].to_numpy()[trajectories.of_row],
        }
    )
    returns: pl.Series | None = None
    for name in groupings_of(projection, per_turn.groups):
        results: dict[AdvantageConfig, pl.DataFrame] = {}
        for chosen in dict.fromkeys(runs.values()):
            if name == TRAJECTORY:
                assert returns is not None  # the step groupings come first
                run = _trajectory_level(projection, returns, chosen, naming, trajectories, batch)
            else:
                settings = replace(chosen, per_turn=_grouping(per_turn, StepGroups(name)))
                run = per_turn_advantages(projection, settings, naming, trajectories, batch)
            results[chosen] = run.rows(projection)
        if returns is None:
            returns = _aligned(rows, results[config], SCORE)
            rows = rows.with_columns(returns.alias("return"))
        rows = rows.with_columns(
            _aligned(rows, results[config], "advantage").alias(f"advantage:{name}"),
            *(
                (pl.col("return") - _aligned(rows, results[runs[kind]], "advantage")).alias(
                    f"{kind}:{name}"
                )
                for kind in ("baseline", "loo")
            ),
        )
    return rows.drop(ROW)


def _grouping(per_turn: PerTurn, groups: StepGroups) -> PerTurn:
    """``per_turn`` with step groups ``groups``: its anchor scope for anchors only, its divisor
    of per-index rewards (LightRFT's) for the grouping that normalizes rewards only."""
    grouping = STEP_GROUPINGS[groups.value]
    return replace(
        per_turn,
        groups=groups,
        scope=per_turn.scope if grouping.anchors else AnchorScope.GROUP,
        variance_epsilon=per_turn.variance_epsilon if grouping.normalizes_rewards else None,
    )


def _aligned(rows: pl.DataFrame, result: pl.DataFrame, column: str) -> pl.Series:
    """``result``'s ``column`` (one value per row, keyed by ``row``) in ``rows``' order."""
    joined = rows.select(ROW).join(
        result.select(ROW, column), on=ROW, how="left", maintain_order="left"
    )
    return joined[column]


def _trajectory_level(
    projection: pl.DataFrame,
    returns: pl.Series,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None,
) -> Advantages:
    """:data:`TRAJECTORY`: each trajectory a unit whose score is its first turn's return (the
    ``first`` rule over the returns, in the turn order the returns follow)."""
    scored = projection.with_columns(returns.alias(SCORE))
    at_trajectory = replace(
        config, per_turn=None, level=Level.TRAJECTORY, traj_score=TrajScore.FIRST
    )
    return compute_advantages(scored, at_trajectory, naming, trajectories, batch)

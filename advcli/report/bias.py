"""The bias report: how much the choice of level changes baselines and advantages.

:func:`bias_report` is a pure function over the two stage-2 results (turn level and trajectory
level, same estimator, same key projection) that never aggregates the rows again; it returns a
:class:`BiasReport` whose ``summary`` is the JSON document the docs' compare page defines, made
by the one producer of its figures (:mod:`advcli.report.figures`). Its judgement
(level, remedies, verdict) lives in :mod:`advcli.report.verdict`, the series over steps in
:mod:`advcli.report.by_step`; its documents in :mod:`advcli.report.documents` and
:mod:`advcli.report.figure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from advcli.advantages.estimators import Advantages
from advcli.advantages.levels import TurnLevel
from advcli.keys import GROUP, SCORE, TOKENS, TRAJECTORY
from advcli.report.figures import PartFigures, bias_summary, part_figures
from advcli.report.summary import BiasSummary, Counts
from advcli.settings.config import AdvantageConfig


@dataclass(frozen=True)
class BiasReport:
    """``summary``: the JSON report. ``trajectories``: one row per trajectory (``group``,
    ``trajectory``, ``turns``, ``tokens``, ``advantage_turn``, ``advantage_trajectory``,
    ``diff``). ``groups``: one row per group (``group``, ``rows``, ``trajectories``,
    ``longest_share``, both baselines and stds, ``baseline_shift``, ``std_shift``)."""

    summary: BiasSummary
    trajectories: pl.DataFrame
    groups: pl.DataFrame


def bias_report(
    turn: TurnLevel,
    trajectory: Advantages,
    *,
    config: AdvantageConfig,
    settings: dict[str, Any],
    version: str,
    top: int = 10,
) -> BiasReport:
    """Compare the turn-level and trajectory-level results of one estimator on one dump: a pure
    function of the two stage-2 results (the turn level's summed by
    :func:`advcli.advantages.levels.turn_level`).

    The trajectory-level units are the trajectories (their turns, tokens and advantage); a
    trajectory's turn-level advantage ``a_turn`` is the mean of its turn-level units' (its rows')
    advantages, equal when its rows carry the same score; ``diff = a_traj - a_turn``.
    ``settings`` (what the caller says of the input) and ``version`` (advcli's) go into the
    report's ``settings`` as they are. The summary is the dump's figures as one part's
    (:mod:`advcli.report.figures`), finished as a run's of many parts is.
    """
    return part_report(
        turn, trajectory, config=config, settings=settings, version=version, top=top
    )[0]


def part_report(
    turn: TurnLevel,
    trajectory: Advantages,
    *,
    config: AdvantageConfig,
    settings: dict[str, Any],
    version: str,
    top: int,
) -> tuple[BiasReport, PartFigures]:
    """:func:`bias_report`, and the figures its summary was finished from, for a run to merge
    with its other parts'."""
    if not turn.per_trajectory["turn_first_row"].equals(trajectory.units["first_row"]):
        raise ValueError("the two levels' trajectories must come from one index, in one order")
    per_trajectory = _per_trajectory(turn, trajectory)
    per_group = _per_group(per_trajectory, turn, trajectory)
    report_settings = _settings(config, settings, version)
    figures = part_figures(
        per_trajectory,
        per_group,
        counts=_counts(turn, trajectory, per_trajectory, per_group),
        settings=report_settings,
        nonempty_rows=turn.nonempty_rows,
        top=top,
    )
    summary = bias_summary(figures, estimator=config.estimator.value, settings=report_settings)
    return BiasReport(summary, per_trajectory, per_group), figures


def _per_trajectory(turn: TurnLevel, trajectory: Advantages) -> pl.DataFrame:
    """One row per trajectory: its keys, turns, tokens and score, its advantage at both levels,
    its token mass at both and ``diff``."""
    return (
        trajectory.units.select(
            GROUP,
            TRAJECTORY,
            "turns",
            pl.col(TOKENS).alias("tokens"),
            pl.col(SCORE).alias("score"),
            "first_row",
            pl.col("advantage").alias("advantage_trajectory"),
        )
        # Both in the trajectories' input order (their first rows').
        .hstack(turn.per_trajectory.drop("turn_first_row"))
        .with_columns(
            pl.col("loss_tokens_advantage").alias("mass_turn"),
            (pl.col("advantage_trajectory") * pl.col("tokens")).alias("mass_trajectory"),
            (pl.col("advantage_trajectory") - pl.col("advantage_turn")).alias("diff"),
        )
    )


def _per_group(
    per_trajectory: pl.DataFrame, turn: TurnLevel, trajectory: Advantages
) -> pl.DataFrame:
    """One row per group, in input order: its rows, trajectories and longest share, its baseline
    and std at both levels and their shifts."""
    return (
        per_trajectory.group_by(GROUP)
        .agg(
            pl.col("turns").sum().alias("rows"),
            pl.len().alias("trajectories"),
            (pl.col("turns").max() / pl.col("turns").sum()).alias("longest_share"),
            pl.col("first_row").min(),
        )
        .join(_level_columns(turn.groups, "turn"), on=GROUP, how="left")
        .join(_level_columns(trajectory.groups, "trajectory"), on=GROUP, how="left")
        .with_columns(
            (pl.col("baseline_trajectory") - pl.col("baseline_turn")).abs().alias("baseline_shift"),
            (pl.col("std_trajectory") - pl.col("std_turn")).abs().alias("std_shift"),
        )
        .sort("first_row")
    )


def _counts(
    turn: TurnLevel, trajectory: Advantages, per_trajectory: pl.DataFrame, per_group: pl.DataFrame
) -> Counts:
    return {
        "rows": turn.rows,
        "groups": per_group.height,
        "trajectories": per_trajectory.height,
        "tokens": turn.tokens,
        "singleton_groups": int((per_group["trajectories"] == 1).sum()),
        "zero_std_groups_turn": turn.zero_std_groups,
        "zero_std_groups_trajectory": trajectory.zero_std_groups,
    }


def _settings(config: AdvantageConfig, settings: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "estimator": config.estimator.value,
        "epsilon": config.epsilon,
        "scale": config.effective_scale.value,
        "singleton": config.singleton.value,
        "std": config.std_in_use.value if config.std_in_use else None,
        "traj_score": config.traj_score.value if config.traj_score else None,
        **settings,
        "advcli_version": version,
    }


def _level_columns(groups: pl.DataFrame, level: str) -> pl.DataFrame:
    return groups.select(
        GROUP,
        pl.col("baseline").alias(f"baseline_{level}"),
        pl.col("std").alias(f"std_{level}"),
    )

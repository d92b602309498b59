"""The bias report: how much the choice of level changes baselines and advantages.

:func:`bias_report` is a pure function over the two stage-2 results (turn level and trajectory
level, same estimator, same key projection) that never aggregates the rows again; it returns a
:class:`BiasReport` whose ``summary`` is the JSON document defined in the README. Its judgement
(level, remedies, verdict) lives in :mod:`advcli.report.verdict`, the series over steps in
:mod:`advcli.report.by_step`; its documents in :mod:`advcli.report.documents` and
:mod:`advcli.report.figure`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from advcli.advantages.estimators import Advantages
from advcli.advantages.levels import TurnLevel
from advcli.advantages.loss import LOSS_MODES, MODE_SOURCES, trajectory_weight
from advcli.keys import GROUP, SCORE, TOKENS, TRAJECTORY
from advcli.report.verdict import assess, diff_means, verdict
from advcli.settings.config import AdvantageConfig


@dataclass(frozen=True)
class BiasReport:
    """``summary``: the JSON report. ``trajectories``: one row per trajectory (``group``,
    ``trajectory``, ``turns``, ``tokens``, ``advantage_turn``, ``advantage_trajectory``,
    ``diff``). ``groups``: one row per group (``group``, ``rows``, ``trajectories``,
    ``longest_share``, both baselines and stds, ``baseline_shift``, ``std_shift``)."""

    summary: dict[str, Any]
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
    report's ``settings`` as they are.
    """
    tokens_known = turn.tokens is not None
    if not turn.per_trajectory["turn_first_row"].equals(trajectory.units["first_row"]):
        raise ValueError("the two levels' trajectories must come from one index, in one order")
    per_trajectory = _per_trajectory(turn, trajectory)
    per_group = _per_group(per_trajectory, turn, trajectory)
    by_turns = _by_turns(per_trajectory, tokens_known)
    abs_diff = per_trajectory["diff"].abs()
    summary: dict[str, Any] = {
        "counts": _counts(turn, trajectory, per_trajectory, per_group),
        "turns_per_trajectory": _turns_per_trajectory(per_trajectory["turns"], by_turns),
        "groups": _group_figures(per_group),
        "trajectories": _trajectory_figures(per_trajectory, abs_diff),
        "by_turns": by_turns_entries(by_turns),
        "top_groups": top_groups(per_group, top),
        "settings": _settings(config, settings, version),
        "top_trajectories": top_trajectories(per_trajectory, abs_diff, top),
        "loss_weights": loss_weights(turn, per_trajectory) if tokens_known else None,
    }
    summary["assessment"] = assess(summary, config.estimator.value)
    summary["verdict"] = verdict(summary, diff_means(per_trajectory), config.estimator.value)
    return BiasReport(summary=summary, trajectories=per_trajectory, groups=per_group)


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


def _by_turns(per_trajectory: pl.DataFrame, tokens_known: bool) -> pl.DataFrame:
    """For each turn count: the trajectories' mean advantage and token mass at both levels."""
    by_turns = by_turn_count(
        per_trajectory,
        {
            "mean_advantage_turn": pl.col("advantage_turn"),
            "mean_advantage_trajectory": pl.col("advantage_trajectory"),
            "token_mass_turn": pl.col("mass_turn"),
            "token_mass_trajectory": pl.col("mass_trajectory"),
        },
    ).with_columns(
        pl.col("mean_advantage_turn", "mean_advantage_trajectory") / pl.col("trajectories")
    )
    # Without a mask column the token counts are unknown (null): the token figures say so
    # rather than sum to 0.
    if not tokens_known:
        by_turns = by_turns.with_columns(
            pl.lit(None, dtype=pl.Float64).alias(name)
            for name in ("token_mass_turn", "token_mass_trajectory")
        )
    return by_turns


def _counts(
    turn: TurnLevel, trajectory: Advantages, per_trajectory: pl.DataFrame, per_group: pl.DataFrame
) -> dict[str, Any]:
    return {
        "rows": turn.rows,
        "groups": per_group.height,
        "trajectories": per_trajectory.height,
        "tokens": turn.tokens,
        "singleton_groups": int((per_group["trajectories"] == 1).sum()),
        "zero_std_groups_turn": turn.zero_std_groups,
        "zero_std_groups_trajectory": trajectory.zero_std_groups,
    }


def _turns_per_trajectory(turns: pl.Series, by_turns: pl.DataFrame) -> dict[str, Any]:
    return {
        "min": int(turns.min()),  # type: ignore[arg-type]
        "median": float(turns.median()),  # type: ignore[arg-type]
        "max": int(turns.max()),  # type: ignore[arg-type]
        "histogram": {
            str(t): int(n) for t, n in zip(by_turns["turns"], by_turns["trajectories"], strict=True)
        },
    }


def _group_figures(per_group: pl.DataFrame) -> dict[str, Any]:
    return {
        "baseline_shift_max": number(per_group["baseline_shift"].max()),
        "baseline_shift_mean": number(per_group["baseline_shift"].mean()),
        "std_shift_max": number(per_group["std_shift"].max()),
        "std_shift_mean": number(per_group["std_shift"].mean()),
        # Signed: positive when counting every turn lowers the baselines.
        "baseline_drop_mean": number(
            (per_group["baseline_trajectory"] - per_group["baseline_turn"]).mean()
        ),
    }


def _trajectory_figures(per_trajectory: pl.DataFrame, abs_diff: pl.Series) -> dict[str, Any]:
    return {
        "sign_flips": int(
            (per_trajectory["advantage_turn"] * per_trajectory["advantage_trajectory"] < 0).sum()
        ),
        "advantage_diff_max": number(abs_diff.max()),
        "advantage_diff_mean": number(abs_diff.mean()),
        "corr_turns_diff": pearson(
            per_trajectory["turns"].cast(pl.Float64), per_trajectory["diff"]
        ),
    }


def by_turns_entries(by_turns: pl.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            key: _plain(row[key])
            for key in (
                "turns",
                "trajectories",
                "mean_advantage_turn",
                "mean_advantage_trajectory",
                "token_mass_turn",
                "token_mass_trajectory",
            )
        }
        for row in by_turns.iter_rows(named=True)
    ]


def top_groups(per_group: pl.DataFrame, top: int) -> list[dict[str, Any]]:
    """The ``top`` groups of largest baseline shift, the first in input order on a tie."""
    top_groups = per_group.sort(["baseline_shift", "first_row"], descending=[True, False]).head(top)
    return [
        {
            "group": row[GROUP],
            "rows": row["rows"],
            "trajectories": row["trajectories"],
            "baseline_turn": number(row["baseline_turn"]),
            "baseline_trajectory": number(row["baseline_trajectory"]),
            "std_turn": number(row["std_turn"]),
            "std_trajectory": number(row["std_trajectory"]),
            "baseline_shift": number(row["baseline_shift"]),
        }
        for row in top_groups.iter_rows(named=True)
    ]


def _settings(config: AdvantageConfig, settings: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "estimator": config.estimator.value,
        "epsilon": config.epsilon,
        "scale": config.effective_scale.value,
        "singleton": config.singleton.value,
        "traj_score": config.traj_score.value if config.traj_score else None,
        **settings,
        "advcli_version": version,
    }


def top_trajectories(
    per_trajectory: pl.DataFrame, abs_diff: pl.Series, top: int
) -> list[dict[str, Any]]:
    return [
        {
            "group": row[GROUP],
            "trajectory": row[TRAJECTORY],
            "turns": row["turns"],
            "score": number(row["score"]),
            "advantage_turn": number(row["advantage_turn"]),
            "advantage_trajectory": number(row["advantage_trajectory"]),
            "diff": number(row["diff"]),
        }
        for row in largest_diffs(per_trajectory, abs_diff, top).iter_rows(named=True)
    ]


def largest_diffs(per_trajectory: pl.DataFrame, abs_diff: pl.Series, top: int) -> pl.DataFrame:
    """The ``top`` trajectories of largest ``|diff|``, the first in input order on a tie. Only
    the rows at or above the top-th largest value are sorted: a sort of every trajectory holds
    a copy of them all (80 MiB for 1.4M)."""
    if top <= 0 or per_trajectory.is_empty():
        return per_trajectory.clear()
    threshold = abs_diff.top_k(top).min()
    return (
        per_trajectory.filter(abs_diff >= threshold)
        .sort([pl.col("diff").abs(), pl.col("first_row")], descending=[True, False])
        .head(top)
    )


def loss_weights(turn: TurnLevel, per_trajectory: pl.DataFrame) -> dict[str, Any]:
    """For each loss aggregation mode (:data:`advcli.advantages.loss.LOSS_MODES`): by turn count,
    the trajectories' mean weight relative to equal weight per trajectory (1 = a fair share), their
    share of the batch's weight, and the signed gradient mass Σ weight × advantage under each
    level. ``turn``: the turn level's counts (known tokens)."""
    # The trajectories' sums of advcli.advantages.loss.trajectory_terms come with the turn level's
    # own per-trajectory figures: every mode's weight follows from them, with no pass over the rows.
    if turn.tokens is None or turn.nonempty_rows is None:
        raise ValueError("the loss weights need the rows' token counts")
    batch_tokens, nonempty_rows = float(turn.tokens), turn.nonempty_rows
    modes: dict[str, Any] = {}
    for mode in LOSS_MODES:
        weight, mass_turn = trajectory_weight(
            mode, batch_tokens=batch_tokens, nonempty_rows=nonempty_rows, rows=turn.rows
        )
        total = per_trajectory.select(weight.sum()).item()
        count = per_trajectory.height
        by_turns = by_turn_count(
            per_trajectory,
            {
                "relative_weight": weight / total * count,
                "weight_share": weight,
                "mass_turn": mass_turn,
                "mass_trajectory": weight * pl.col("advantage_trajectory"),
            },
        ).with_columns(
            pl.col("relative_weight") / pl.col("trajectories"), pl.col("weight_share") / total
        )
        relative = by_turns["relative_weight"]
        modes[mode] = {
            "source": MODE_SOURCES[mode],
            # How much more weight a trajectory of the most turns gets than one of the fewest.
            "longest_vs_shortest": number(relative[-1] / relative[0]) if relative[0] else None,
            "by_turns": [
                {key: _plain(value) for key, value in entry.items()}
                for entry in by_turns.iter_rows(named=True)
            ],
        }
    return modes


def by_turn_count(per_trajectory: pl.DataFrame, sums: dict[str, pl.Expr]) -> pl.DataFrame:
    """For each turn count, in ascending order: ``turns``, ``trajectories`` (how many have it) and
    the sum of each of ``sums`` over them.

    Added one by one in the trajectories' input order (``numpy.bincount``), so the figures do not
    depend on the thread count or the run: a Polars group-by on unsorted keys splits the float
    sums between its threads (measured: 5 different results in 20 runs on 1.4M values, with
    ``maintain_order`` too)."""
    turns = per_trajectory["turns"].to_numpy()
    trajectories = np.bincount(turns)
    present = np.flatnonzero(trajectories)
    columns = [
        pl.Series("turns", present, dtype=per_trajectory["turns"].dtype),
        pl.Series("trajectories", trajectories[present], dtype=pl.UInt32),
    ]
    for name, value in sums.items():
        values = per_trajectory.select(value.cast(pl.Float64)).to_series().to_numpy()
        columns.append(pl.Series(name, np.bincount(turns, weights=values)[present]))
    return pl.DataFrame(columns)


def _level_columns(groups: pl.DataFrame, level: str) -> pl.DataFrame:
    return groups.select(
        GROUP,
        pl.col("baseline").alias(f"baseline_{level}"),
        pl.col("std").alias(f"std_{level}"),
    )


def number(value: Any) -> float | None:
    """A finite float, or None (JSON null) for a missing, NaN or infinite value."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def histogram(values: pl.Series) -> dict[str, int]:
    """Counts of each distinct value, keyed by the value as text, in increasing order."""
    counts = values.value_counts().sort(values.name)
    return {str(value): int(count) for value, count in counts.iter_rows()}


def _plain(value: Any) -> Any:
    return number(value) if isinstance(value, float) else value


def pearson(x: pl.Series, y: pl.Series) -> float | None:
    """Pearson correlation, or None when either side is constant (or fewer than two points)."""
    if len(x) < 2 or x.std() in (0, None) or y.std() in (0, None):
        return None
    return number(pl.DataFrame({"x": x, "y": y}).select(pl.corr("x", "y")).item())

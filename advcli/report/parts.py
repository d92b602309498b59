"""``compare --by file`` one part at a time: what each part's report keeps for the whole run
(:class:`PartFigures`, a few numbers per turn count and the top candidates, never its rows), and
the whole run's report combined from them (:func:`combined_summary`).

How each figure combines (docs/compare.md, "Memory"): counts, histograms and sign flips add;
maxima are the maxima of the parts'; means are sums over counts; the median turn count comes
from the combined histogram; the top groups and trajectories are the top of each part's top;
the correlation merges each part's means and co-moments. Exact but for the floating-point
sums, which add in another order than one pass over the run (a few units in the last place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from advcli.advantages.levels import TurnLevel
from advcli.advantages.loss import LOSS_MODES, MODE_SOURCES
from advcli.keys import GROUP
from advcli.report.bias import (
    BiasReport,
    by_turn_count,
    by_turns_entries,
    largest_diffs,
    number,
    top_groups,
    top_trajectories,
)
from advcli.report.verdict import assess, verdict

# What each part sums by turn count, for the whole run's by-turns and loss-weight figures.
_TOKENS = pl.col("tokens").cast(pl.Float64)
_SUMS = {
    "advantage_turn": pl.col("advantage_turn"),
    "advantage_trajectory": pl.col("advantage_trajectory"),
    "mass_turn": pl.col("mass_turn"),
    "mass_trajectory": pl.col("mass_trajectory"),
    "diff": pl.col("diff"),
    "abs_diff": pl.col("diff").abs(),
}
_LOSS_SUMS = {
    "tokens": _TOKENS,
    "tokens_advantage": pl.col("loss_tokens_advantage"),
    "tokens_x_trajectory": _TOKENS * pl.col("advantage_trajectory"),
    "counted": pl.col("loss_counted"),
    "counted_advantage": pl.col("loss_counted_advantage"),
    "counted_x_trajectory": pl.col("loss_counted") * pl.col("advantage_trajectory"),
    "nonempty": (pl.col("tokens") > 0).cast(pl.Float64),
    "nonempty_x_trajectory": pl.when(pl.col("tokens") > 0)
    .then(pl.col("advantage_trajectory"))
    .otherwise(0.0),
    "nonempty_mean_advantage": pl.when(pl.col("tokens") > 0)
    .then(pl.col("loss_tokens_advantage") / _TOKENS)
    .otherwise(0.0),
}
_GROUP_SHIFTS = {
    "baseline_shift": pl.col("baseline_shift"),
    "std_shift": pl.col("std_shift"),
    "baseline_drop": pl.col("baseline_trajectory") - pl.col("baseline_turn"),
}


@dataclass(frozen=True)
class PartFigures:
    """What the whole run keeps of one part's report: its own ``summary`` (its ``by_step``
    entry is read from it), sums by turn count (``by_turns``), each group figure's sum, count
    of values and maximum (``groups``), its trajectories' moments for the correlation, its
    top candidates (``top_groups``, ``top_trajectories``: the rows of the report's frames, the
    group keyed by the part), the turn level's counts and how many rows come before it."""

    summary: dict[str, Any]
    by_turns: pl.DataFrame
    groups: dict[str, tuple[float, int, float | None]]
    moments: tuple[int, float, float, float, float, float]
    diff_range: tuple[float | None, float | None]
    top_groups: pl.DataFrame
    top_trajectories: pl.DataFrame
    nonempty_rows: int | None


def part_figures(
    report: BiasReport, turn: TurnLevel, *, part: int, first_row: int, top: int
) -> PartFigures:
    """The figures of part number ``part`` (its report and turn level) the whole run's report
    combines; ``first_row``: the rows before the part's, so that its rows keep their place in
    the run."""
    trajectories, groups = report.trajectories, report.groups
    sums = {**_SUMS, **(_LOSS_SUMS if turn.tokens is not None else {})}
    shifts = {
        name: (
            float(groups.select(value.sum()).item()),
            int(groups.select(value.count()).item()),
            groups.select(value.max()).item(),
        )
        for name, value in _GROUP_SHIFTS.items()
    }
    y = trajectories["diff"]
    dx, dy = trajectories["turns"].to_numpy().astype(np.float64), y.to_numpy()
    mean_x, mean_y = (float(dx.mean()), float(dy.mean())) if dx.size else (0.0, 0.0)
    dx, dy = dx - mean_x, dy - mean_y
    moments = (
        trajectories.height,
        mean_x,
        mean_y,
        float(dx @ dx),
        float(dy @ dy),
        float(dx @ dy),
    )

    def keyed(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(
            pl.struct(
                pl.lit(part, dtype=pl.Int64).alias("file"), pl.col(GROUP).alias("group")
            ).alias(GROUP),
            pl.col("first_row") + first_row,
        )

    candidates = groups.sort(["baseline_shift", "first_row"], descending=[True, False]).head(top)
    return PartFigures(
        summary=report.summary,
        by_turns=by_turn_count(trajectories, sums),
        groups=shifts,
        moments=moments,
        diff_range=(y.min(), y.max()),  # type: ignore[arg-type]
        top_groups=keyed(candidates),
        top_trajectories=keyed(largest_diffs(trajectories, y.abs(), top)),
        nonempty_rows=turn.nonempty_rows,
    )


def combined_summary(
    parts: list[PartFigures], *, top: int, estimator: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """The whole run's report (as :func:`advcli.report.bias.bias_report` makes it over every
    part's rows at once, each part its own batch) from the parts' figures; ``settings``: the
    run's."""
    by_turns = _combined_by_turns(parts)
    trajectories = int(by_turns["trajectories"].sum())
    counts = [part.summary["counts"] for part in parts]
    tokens_known = counts[0]["tokens"] is not None
    summary: dict[str, Any] = {
        "counts": {
            name: (
                sum(count[name] for count in counts) if tokens_known or name != "tokens" else None
            )
            for name in counts[0]
        },
        "turns_per_trajectory": _turns_per_trajectory(by_turns),
        "groups": _group_figures(parts),
        "trajectories": {
            "sign_flips": sum(part.summary["trajectories"]["sign_flips"] for part in parts),
            "advantage_diff_max": _maximum(
                [part.summary["trajectories"]["advantage_diff_max"] for part in parts]
            ),
            "advantage_diff_mean": number(float(by_turns["abs_diff"].sum()) / trajectories),
            "corr_turns_diff": _correlation(parts, by_turns),
        },
        "by_turns": by_turns_entries(_by_turns_means(by_turns, tokens_known)),
        "top_groups": top_groups(pl.concat([part.top_groups for part in parts]), top),
        "settings": settings,
        "top_trajectories": _top_trajectories(parts, top),
        "loss_weights": _loss_weights(parts, by_turns) if tokens_known else None,
    }
    summary["assessment"] = assess(summary, estimator)
    summary["verdict"] = verdict(
        summary, lambda threshold: _diff_means(by_turns, threshold), estimator
    )
    return summary


def _combined_by_turns(parts: list[PartFigures]) -> pl.DataFrame:
    """Every part's sums by turn count added, in ascending turn count."""
    frame = pl.concat([part.by_turns for part in parts])
    return (
        frame.group_by("turns")
        .agg(pl.col("trajectories").sum(), pl.exclude("turns", "trajectories").sum())
        .sort("turns")
    )


def _turns_per_trajectory(by_turns: pl.DataFrame) -> dict[str, Any]:
    """The turn counts' minimum, median (the middle one, or the mean of the middle two) and
    maximum, and their histogram, from the combined counts."""
    turns, counts = by_turns["turns"].to_numpy(), by_turns["trajectories"].to_numpy()
    ends = np.cumsum(counts)
    total = int(ends[-1])

    def nth(index: int) -> int:
        return int(turns[np.searchsorted(ends, index, side="right")])

    median = (nth((total - 1) // 2) + nth(total // 2)) / 2
    return {
        "min": int(turns[0]),
        "median": float(median),
        "max": int(turns[-1]),
        "histogram": {str(t): int(n) for t, n in zip(turns, counts, strict=True)},
    }


def _group_figures(parts: list[PartFigures]) -> dict[str, Any]:
    def mean(name: str) -> float | None:
        count = sum(part.groups[name][1] for part in parts)
        return number(sum(part.groups[name][0] for part in parts) / count) if count else None

    def maximum(name: str) -> float | None:
        return _maximum([part.groups[name][2] for part in parts])

    return {
        "baseline_shift_max": maximum("baseline_shift"),
        "baseline_shift_mean": mean("baseline_shift"),
        "std_shift_max": maximum("std_shift"),
        "std_shift_mean": mean("std_shift"),
        "baseline_drop_mean": mean("baseline_drop"),
    }


def _maximum(values: list[float | None]) -> float | None:
    """The largest of the parts' maxima, as Polars takes a maximum (nulls left out)."""
    return number(pl.Series(values, dtype=pl.Float64).max())


def _correlation(parts: list[PartFigures], by_turns: pl.DataFrame) -> float | None:
    """Pearson's correlation of turns and diff, the parts' means and co-moments merged (Chan
    et al.); None when either side is constant, as :func:`advcli.report.bias.pearson` says."""
    lows = [part.diff_range[0] for part in parts if part.diff_range[0] is not None]
    highs = [part.diff_range[1] for part in parts if part.diff_range[1] is not None]
    constant_diff = not lows or min(lows) == max(highs)
    if by_turns.height < 2 or constant_diff:
        return None
    n, mean_x, mean_y, sxx, syy, sxy = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    for count, part_x, part_y, part_xx, part_yy, part_xy in (part.moments for part in parts):
        if not count:
            continue
        total = n + count
        dx, dy = part_x - mean_x, part_y - mean_y
        sxx += part_xx + dx * dx * n * count / total
        syy += part_yy + dy * dy * n * count / total
        sxy += part_xy + dx * dy * n * count / total
        mean_x += dx * count / total
        mean_y += dy * count / total
        n = total
    return number(sxy / np.sqrt(sxx * syy))


def _by_turns_means(by_turns: pl.DataFrame, tokens_known: bool) -> pl.DataFrame:
    return by_turns.select(
        "turns",
        "trajectories",
        (pl.col("advantage_turn") / pl.col("trajectories")).alias("mean_advantage_turn"),
        (pl.col("advantage_trajectory") / pl.col("trajectories")).alias(
            "mean_advantage_trajectory"
        ),
        (pl.col("mass_turn") if tokens_known else pl.lit(None, dtype=pl.Float64)).alias(
            "token_mass_turn"
        ),
        (pl.col("mass_trajectory") if tokens_known else pl.lit(None, dtype=pl.Float64)).alias(
            "token_mass_trajectory"
        ),
    )


def _top_trajectories(parts: list[PartFigures], top: int) -> list[dict[str, Any]]:
    candidates = pl.concat([part.top_trajectories for part in parts])
    return top_trajectories(candidates, candidates["diff"].abs(), top)


def _diff_means(by_turns: pl.DataFrame, threshold: int) -> tuple[float | None, float | None]:
    """The mean diff of the trajectories of at least ``threshold`` turns and of fewer."""

    def mean(chosen: pl.DataFrame) -> float | None:
        count = int(chosen["trajectories"].sum())
        return float(chosen["diff"].sum()) / count if count else None

    long = by_turns.filter(pl.col("turns") >= threshold)
    return mean(long), mean(by_turns.filter(pl.col("turns") < threshold))


def _loss_weights(parts: list[PartFigures], by_turns: pl.DataFrame) -> dict[str, Any]:
    """:func:`advcli.report.bias.loss_weights` from the sums by turn count: every mode's
    weight is a sum of the trajectories' terms over a constant of the whole run."""
    batch_tokens = float(sum(part.summary["counts"]["tokens"] for part in parts))
    nonempty_rows = float(sum(part.nonempty_rows or 0 for part in parts))
    rows = float(sum(part.summary["counts"]["rows"] for part in parts))
    count = float(by_turns["trajectories"].sum())
    modes: dict[str, Any] = {}
    for mode in LOSS_MODES:
        weight, mass_turn, mass_trajectory = _mode_sums(
            by_turns, mode, batch_tokens, nonempty_rows, rows
        )
        total = float(weight.sum())
        relative = weight / total * count / by_turns["trajectories"].to_numpy()
        entries = [
            {
                "turns": int(turns),
                "trajectories": int(trajectories),
                "relative_weight": number(relative[index]),
                "weight_share": number(weight[index] / total),
                "mass_turn": number(mass_turn[index]),
                "mass_trajectory": number(mass_trajectory[index]),
            }
            for index, (turns, trajectories) in enumerate(
                zip(by_turns["turns"], by_turns["trajectories"], strict=True)
            )
        ]
        modes[mode] = {
            "source": MODE_SOURCES[mode],
            "longest_vs_shortest": number(relative[-1] / relative[0]) if relative[0] else None,
            "by_turns": entries,
        }
    return modes


def _mode_sums(
    by_turns: pl.DataFrame, mode: str, batch_tokens: float, nonempty_rows: float, rows: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By turn count, the trajectories' weight under ``mode`` (as
    :func:`advcli.advantages.loss.trajectory_weight` weighs one) and their mass at both
    levels."""

    def column(name: str) -> np.ndarray:
        return by_turns[name].to_numpy()

    if mode == "seq-mean-token-mean":
        return (
            column("counted") / nonempty_rows,
            column("counted_advantage") / nonempty_rows,
            column("counted_x_trajectory") / nonempty_rows,
        )
    if mode == "per-rollout-mean":
        # tokens / max(tokens × rows, 1): 1/rows for a trajectory with tokens, else 0.
        return (
            column("nonempty") / rows,
            column("nonempty_mean_advantage") / rows,
            column("nonempty_x_trajectory") / rows,
        )
    constant = {
        "token-mean": batch_tokens,
        "token-sum": 1.0,
        "seq-mean-token-sum": nonempty_rows,
        "seq-mean-token-sum-norm": nonempty_rows,
    }[mode]
    return (
        column("tokens") / constant,
        column("tokens_advantage") / constant,
        column("tokens_x_trajectory") / constant,
    )

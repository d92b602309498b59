"""``compare --by`` one part at a time: what each part's report keeps for the whole run
(:class:`PartFigures`, a few numbers per turn count and the top candidates, never its rows),
merged as the parts come (:func:`merged`), and the whole run's report from them
(:func:`combined_summary`).

How each figure combines (docs/compare.md, "Runs of many step files"): counts, histograms and
sign flips add; maxima are the maxima of the parts'; means are sums over counts; the median turn
count comes from the combined histogram; the top groups and trajectories are the top of each
part's top; the correlation merges the parts' means and co-moments. Exact but for the
floating-point sums, which add in another order than one pass over the run (a few units in the
last place).
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
    """What the whole run keeps of one part's report, or of several merged (:func:`merged`):
    its counts, sign flips, largest |diff| and settings, sums by turn count (``by_turns``),
    each group figure's sum, count of values and maximum (``groups``), the trajectories'
    count, means and co-moments of turns and diff (``moments``) and the range of diff, the top
    candidates (``top_groups``, ``top_trajectories``: rows of the reports' frames, each group
    keyed by its part, each first row numbered in the run) and the turn level's non-empty
    rows."""

    counts: dict[str, int | None]
    sign_flips: int
    diff_max: float | None
    settings: dict[str, Any]
    by_turns: pl.DataFrame
    groups: dict[str, tuple[float, int, float | None]]
    moments: tuple[int, float, float, float, float, float]
    diff_range: tuple[float | None, float | None]
    top_groups: pl.DataFrame
    top_trajectories: pl.DataFrame
    nonempty_rows: int | None


def part_figures(
    report: BiasReport, turn: TurnLevel, *, part: int | None, first_row: int, top: int
) -> PartFigures:
    """The figures of a part (its report and turn level) the whole run's report combines:
    part number ``part`` of ``--by file``, whose groups the run keys by the file too, or a
    column's value (None), whose groups are keyed by it already; ``first_row``: the rows
    before the part's, so that its rows keep their place in the run."""
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
        float((dx * dx).sum()),
        float((dy * dy).sum()),
        float((dx * dy).sum()),
    )

    def keyed(frame: pl.DataFrame) -> pl.DataFrame:
        if part is None:
            return frame.with_columns(pl.col("first_row") + first_row)
        return frame.with_columns(
            pl.struct(
                pl.lit(part, dtype=pl.Int64).alias("file"), pl.col(GROUP).alias("group")
            ).alias(GROUP),
            pl.col("first_row") + first_row,
        )

    summary = report.summary
    return PartFigures(
        counts=summary["counts"],
        sign_flips=summary["trajectories"]["sign_flips"],
        diff_max=y.abs().max(),  # type: ignore[arg-type]
        settings=summary["settings"],
        by_turns=by_turn_count(trajectories, sums),
        groups=shifts,
        moments=moments,
        diff_range=(y.min(), y.max()),  # type: ignore[arg-type]
        top_groups=keyed(_top_group_rows(groups, top)),
        top_trajectories=keyed(largest_diffs(trajectories, y.abs(), top)),
        nonempty_rows=turn.nonempty_rows,
    )


def merged(one: PartFigures, other: PartFigures, top: int) -> PartFigures:
    """The figures of ``one`` and ``other`` (the parts after it) as one part's: what adds
    added, maxima and ranges widened, moments merged, the top candidates of both cut to
    ``top``; the settings are ``one``'s."""

    def add(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a + b

    lows = [value for value in (one.diff_range[0], other.diff_range[0]) if value is not None]
    highs = [value for value in (one.diff_range[1], other.diff_range[1]) if value is not None]
    candidates = pl.concat([one.top_trajectories, other.top_trajectories])
    return PartFigures(
        counts={name: add(value, other.counts[name]) for name, value in one.counts.items()},
        sign_flips=one.sign_flips + other.sign_flips,
        diff_max=_maximum([one.diff_max, other.diff_max]),
        settings=one.settings,
        by_turns=pl.concat([one.by_turns, other.by_turns])
        .group_by("turns")
        .agg(pl.col("trajectories").sum(), pl.exclude("turns", "trajectories").sum())
        .sort("turns"),
        groups={
            name: (
                total + other.groups[name][0],
                count + other.groups[name][1],
                _maximum([most, other.groups[name][2]]),
            )
            for name, (total, count, most) in one.groups.items()
        },
        moments=_merged_moments(one.moments, other.moments),
        diff_range=(min(lows, default=None), max(highs, default=None)),
        top_groups=_top_group_rows(pl.concat([one.top_groups, other.top_groups]), top),
        top_trajectories=largest_diffs(candidates, candidates["diff"].abs(), top),
        nonempty_rows=add(one.nonempty_rows, other.nonempty_rows),
    )


def _top_group_rows(groups: pl.DataFrame, top: int) -> pl.DataFrame:
    """The ``top`` groups as :func:`advcli.report.bias.top_groups` lists them."""
    return groups.sort(["baseline_shift", "first_row"], descending=[True, False]).head(top)


def _merged_moments(
    one: tuple[int, float, float, float, float, float],
    other: tuple[int, float, float, float, float, float],
) -> tuple[int, float, float, float, float, float]:
    """Two sets of trajectories' count, means and co-moments of turns and diff as one (Chan,
    Golub and LeVeque's pairwise update)."""
    n, mean_x, mean_y, sxx, syy, sxy = one
    count, part_x, part_y, part_xx, part_yy, part_xy = other
    if not count or not n:
        return one if count == 0 else other
    total = n + count
    dx, dy = part_x - mean_x, part_y - mean_y
    weight = n * count / total
    return (
        total,
        mean_x + dx * count / total,
        mean_y + dy * count / total,
        sxx + part_xx + dx * dx * weight,
        syy + part_yy + dy * dy * weight,
        sxy + part_xy + dx * dy * weight,
    )


def combined_summary(
    run: PartFigures, *, top: int, estimator: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """The whole run's report (as :func:`advcli.report.bias.bias_report` makes it over every
    part's rows at once, each part its own batch) from its parts' figures merged (``run``);
    ``settings``: the run's."""
    by_turns = run.by_turns
    tokens_known = run.counts["tokens"] is not None
    summary: dict[str, Any] = {
        "counts": run.counts,
        "turns_per_trajectory": _turns_per_trajectory(by_turns),
        "groups": _group_figures(run),
        "trajectories": {
            "sign_flips": run.sign_flips,
            "advantage_diff_max": number(run.diff_max),
            "advantage_diff_mean": number(
                float(by_turns["abs_diff"].sum()) / int(by_turns["trajectories"].sum())
            ),
            "corr_turns_diff": _correlation(run),
        },
        "by_turns": by_turns_entries(_by_turns_means(by_turns, tokens_known)),
        "top_groups": top_groups(run.top_groups, top),
        "settings": settings,
        "top_trajectories": top_trajectories(
            run.top_trajectories, run.top_trajectories["diff"].abs(), top
        ),
        "loss_weights": _loss_weights(run) if tokens_known else None,
    }
    summary["assessment"] = assess(summary, estimator)
    summary["verdict"] = verdict(
        summary, lambda threshold: _diff_means(by_turns, threshold), estimator
    )
    return summary


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


def _group_figures(run: PartFigures) -> dict[str, Any]:
    def mean(name: str) -> float | None:
        total, count, _ = run.groups[name]
        return number(total / count) if count else None

    return {
        "baseline_shift_max": number(run.groups["baseline_shift"][2]),
        "baseline_shift_mean": mean("baseline_shift"),
        "std_shift_max": number(run.groups["std_shift"][2]),
        "std_shift_mean": mean("std_shift"),
        "baseline_drop_mean": mean("baseline_drop"),
    }


def _maximum(values: list[float | None]) -> float | None:
    """The largest of the parts' maxima, as Polars takes a maximum (nulls left out; NaN as
    Polars orders it)."""
    most: float | None = pl.Series(values, dtype=pl.Float64).max()  # type: ignore[assignment]
    return most


def _correlation(run: PartFigures) -> float | None:
    """Pearson's correlation of turns and diff from the merged moments; None when either side
    is constant, as :func:`advcli.report.bias.pearson` says."""
    low, high = run.diff_range
    if run.by_turns.height < 2 or low is None or low == high:
        return None
    _, _, _, sxx, syy, sxy = run.moments
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


def _diff_means(by_turns: pl.DataFrame, threshold: int) -> tuple[float | None, float | None]:
    """The mean diff of the trajectories of at least ``threshold`` turns and of fewer."""

    def mean(chosen: pl.DataFrame) -> float | None:
        count = int(chosen["trajectories"].sum())
        return float(chosen["diff"].sum()) / count if count else None

    long = by_turns.filter(pl.col("turns") >= threshold)
    return mean(long), mean(by_turns.filter(pl.col("turns") < threshold))


def _loss_weights(run: PartFigures) -> dict[str, Any]:
    """:func:`advcli.report.bias.loss_weights` from the sums by turn count: every mode's
    weight is a sum of the trajectories' terms over a constant of the whole run."""
    by_turns = run.by_turns
    batch_tokens = float(run.counts["tokens"] or 0)
    nonempty_rows = float(run.nonempty_rows or 0)
    rows = float(run.counts["rows"] or 0)
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

"""The bias report's one producer: a part's figures (:func:`part_figures`, a few numbers per
turn count and the top candidates, never its rows), two parts' figures merged (:func:`merged`),
and the report's summary finished from them (:func:`bias_summary`). The report of one dump is
the summary of its one part; ``compare --by``'s whole run, the summary of its parts merged as
they come; each step of the series, the figures of its own part (:mod:`advcli.report.by_step`).

How each figure combines (docs/compare.md, "Runs of many step files"): counts, histograms and
sign flips add; maxima are the maxima of the parts'; means are sums over counts; the median turn
count comes from the combined histogram; the top groups and trajectories are the top of each
part's top; the correlation merges the parts' means and co-moments; every loss mode's weight
follows from sums by turn count (:func:`advcli.advantages.loss.mode_weights`). Exact but for
the floating-point sums, which add in another order over parts than over one part (a few units
in the last place).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from advcli.advantages.loss import LOSS_MODES, MODE_SOURCES, TRAJECTORY_SUMS, mode_weights
from advcli.keys import GROUP, TRAJECTORY
from advcli.report.summary import (
    BiasSummary,
    ByTurns,
    Counts,
    GroupFigures,
    ModeByTurns,
    ModeWeights,
    SummaryFigures,
    TopGroup,
    TopTrajectory,
    TurnsPerTrajectory,
)
from advcli.report.verdict import SAME_BASELINE, assess, verdict

# What each part sums by turn count, for the by-turns figures and the diff's mean.
_SUMS = {
    "advantage_turn": pl.col("advantage_turn"),
    "advantage_trajectory": pl.col("advantage_trajectory"),
    "mass_turn": pl.col("mass_turn"),
    "mass_trajectory": pl.col("mass_trajectory"),
    "diff": pl.col("diff"),
    "abs_diff": pl.col("diff").abs(),
}
_DROP = pl.col("baseline_trajectory") - pl.col("baseline_turn")
_GROUP_SHIFTS = {
    "baseline_shift": pl.col("baseline_shift"),
    "std_shift": pl.col("std_shift"),
    # Signed: positive when counting every turn lowers the baselines.
    "baseline_drop": _DROP,
    # The groups whose baseline falls, and those whose baseline rises (by their rise): their
    # count and the most each way, for a verdict that says both when they differ.
    "baseline_fall": pl.when(_DROP > SAME_BASELINE).then(_DROP),
    "baseline_rise": pl.when(_DROP < -SAME_BASELINE).then(-_DROP),
}
Moments = tuple[int, float, float, float, float, float]


@dataclass(frozen=True)
class PartFigures:
    """What the report keeps of one part (a dump, a file or a value of ``--by``), or of several
    merged (:func:`merged`): its counts, sign flips, largest |diff| and settings, sums by turn
    count (``by_turns``), each group figure's sum, count of values and maximum (``groups``),
    the trajectories' count, means and co-moments of turns and diff (``moments``) and the
    range of diff, the top candidates (``top_groups``, ``top_trajectories``: rows of the
    part's frames) and the turn level's non-empty rows."""

    counts: Counts
    sign_flips: int
    diff_max: float | None
    settings: dict[str, Any]
    by_turns: pl.DataFrame
    groups: dict[str, tuple[float, int, float | None]]
    moments: Moments
    diff_range: tuple[float | None, float | None]
    top_groups: pl.DataFrame
    top_trajectories: pl.DataFrame
    nonempty_rows: int | None

    def placed(self, part: int | None, first_row: int) -> PartFigures:
        """The figures as the run holds them: each top candidate's first row numbered in the
        run (``first_row``: the rows before the part's), and, for part number ``part`` of
        ``--by file``, each group keyed by its file too (None: a column's value, whose groups
        are keyed by it already)."""

        def keyed(frame: pl.DataFrame) -> pl.DataFrame:
            if part is None:
                return frame.with_columns(pl.col("first_row") + first_row)
            return frame.with_columns(
                pl.struct(
                    pl.lit(part, dtype=pl.Int64).alias("file"), pl.col(GROUP).alias("group")
                ).alias(GROUP),
                pl.col("first_row") + first_row,
            )

        return replace(
            self, top_groups=keyed(self.top_groups), top_trajectories=keyed(self.top_trajectories)
        )


def part_figures(
    trajectories: pl.DataFrame,
    groups: pl.DataFrame,
    *,
    counts: Counts,
    settings: dict[str, Any],
    nonempty_rows: int | None,
    top: int,
) -> PartFigures:
    """The figures of a part from its report's frames (``trajectories``: one row per
    trajectory, ``groups``: one per group, as :class:`advcli.report.bias.BiasReport` holds
    them), its ``counts`` and ``settings``, and its turn level's non-empty rows."""
    tokens_known = counts["tokens"] is not None
    sums = {**_SUMS, **(TRAJECTORY_SUMS if tokens_known else {})}
    shifts = {
        name: (
            float(groups.select(value.sum()).item()),
            int(groups.select(value.count()).item()),
            groups.select(value.max()).item(),
        )
        for name, value in _GROUP_SHIFTS.items()
    }
    diff = trajectories["diff"]
    return PartFigures(
        counts=counts,
        sign_flips=int(
            (trajectories["advantage_turn"] * trajectories["advantage_trajectory"] < 0).sum()
        ),
        diff_max=diff.abs().max(),  # type: ignore[arg-type]
        settings=settings,
        by_turns=by_turn_count(trajectories, sums),
        groups=shifts,
        moments=_moments(trajectories["turns"], diff),
        diff_range=(diff.min(), diff.max()),  # type: ignore[arg-type]
        top_groups=_top_group_rows(groups, top),
        top_trajectories=largest_diffs(trajectories, diff.abs(), top),
        nonempty_rows=nonempty_rows,
    )


def _moments(turns: pl.Series, diff: pl.Series) -> Moments:
    """The trajectories' count, the means of turns and diff, and their co-moments."""
    dx, dy = turns.to_numpy().astype(np.float64), diff.to_numpy()
    mean_x, mean_y = (float(dx.mean()), float(dy.mean())) if dx.size else (0.0, 0.0)
    dx, dy = dx - mean_x, dy - mean_y
    return (
        len(turns),
        mean_x,
        mean_y,
        float((dx * dx).sum()),
        float((dy * dy).sum()),
        float((dx * dy).sum()),
    )


def merged(one: PartFigures, other: PartFigures, top: int) -> PartFigures:
    """The figures of ``one`` and ``other`` (the parts after it) as one part's: what adds
    added, maxima and ranges widened, moments merged, the top candidates of both cut to
    ``top``; the settings are ``one``'s."""

    def add(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a + b

    counts, more = one.counts, other.counts

    lows = [value for value in (one.diff_range[0], other.diff_range[0]) if value is not None]
    highs = [value for value in (one.diff_range[1], other.diff_range[1]) if value is not None]
    candidates = pl.concat([one.top_trajectories, other.top_trajectories])
    return PartFigures(
        counts={
            "rows": counts["rows"] + more["rows"],
            "groups": counts["groups"] + more["groups"],
            "trajectories": counts["trajectories"] + more["trajectories"],
            "tokens": add(counts["tokens"], more["tokens"]),
            "singleton_groups": counts["singleton_groups"] + more["singleton_groups"],
            "zero_std_groups_turn": counts["zero_std_groups_turn"] + more["zero_std_groups_turn"],
            "zero_std_groups_trajectory": (
                counts["zero_std_groups_trajectory"] + more["zero_std_groups_trajectory"]
            ),
        },
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
    """The ``top`` groups of largest baseline shift, the first in input order on a tie."""
    return groups.sort(["baseline_shift", "first_row"], descending=[True, False]).head(top)


def _merged_moments(one: Moments, other: Moments) -> Moments:
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


def bias_summary(figures: PartFigures, *, estimator: str, settings: dict[str, Any]) -> BiasSummary:
    """The bias report's summary (the JSON document the docs' compare page defines) of a part's
    figures, or of every part's merged (their top groups and trajectories, the report's top,
    made with the figures); ``settings``: the report's."""
    by_turns = figures.by_turns
    tokens_known = figures.counts["tokens"] is not None
    sections: SummaryFigures = {
        "counts": figures.counts,
        "turns_per_trajectory": _turns_per_trajectory(by_turns),
        "groups": _group_figures(figures),
        "trajectories": {
            "sign_flips": figures.sign_flips,
            "advantage_diff_max": number(figures.diff_max),
            "advantage_diff_mean": diff_mean(by_turns["abs_diff"], by_turns["trajectories"]),
            "corr_turns_diff": _correlation(figures),
        },
        "by_turns": by_turns_entries(_by_turns_means(by_turns, tokens_known)),
        "top_groups": top_groups(figures.top_groups),
        "settings": settings,
        "top_trajectories": top_trajectories(figures.top_trajectories),
        "loss_weights": _loss_weights(figures) if tokens_known else None,
    }
    assessment = assess(sections, estimator)
    means = functools.partial(_diff_means, by_turns)
    return {
        "counts": sections["counts"],
        "turns_per_trajectory": sections["turns_per_trajectory"],
        "groups": sections["groups"],
        "trajectories": sections["trajectories"],
        "by_turns": sections["by_turns"],
        "top_groups": sections["top_groups"],
        "settings": sections["settings"],
        "top_trajectories": sections["top_trajectories"],
        "loss_weights": sections["loss_weights"],
        "assessment": assessment,
        "verdict": verdict(sections, assessment, means, estimator),
    }


def diff_mean(abs_diff: pl.Series, trajectories: pl.Series) -> float | None:
    """The trajectories' mean |diff| from its sums and counts by turn count."""
    return number(float(abs_diff.sum()) / int(trajectories.sum()))


def _turns_per_trajectory(by_turns: pl.DataFrame) -> TurnsPerTrajectory:
    """The turn counts' minimum, median (the middle one, or the mean of the middle two) and
    maximum, and their histogram, from the counts by turn count."""
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


def _group_figures(figures: PartFigures) -> GroupFigures:
    def mean(name: str) -> float | None:
        total, count, _ = figures.groups[name]
        return number(total / count) if count else None

    return {
        "baseline_shift_max": number(figures.groups["baseline_shift"][2]),
        "baseline_shift_mean": mean("baseline_shift"),
        "std_shift_max": number(figures.groups["std_shift"][2]),
        "std_shift_mean": mean("std_shift"),
        "baseline_drop_mean": mean("baseline_drop"),
        "baseline_fall_groups": figures.groups["baseline_fall"][1],
        "baseline_fall_max": number(figures.groups["baseline_fall"][2]),
        "baseline_rise_groups": figures.groups["baseline_rise"][1],
        "baseline_rise_max": number(figures.groups["baseline_rise"][2]),
    }


def _maximum(values: list[float | None]) -> float | None:
    """The largest of the parts' maxima, as Polars takes a maximum (nulls left out; NaN as
    Polars orders it)."""
    most: float | None = pl.Series(values, dtype=pl.Float64).max()  # type: ignore[assignment]
    return most


def _correlation(figures: PartFigures) -> float | None:
    """Pearson's correlation of turns and diff from the moments; None when either side is
    constant (or there are fewer than two trajectories)."""
    low, high = figures.diff_range
    if figures.by_turns.height < 2 or low is None or low == high:
        return None
    _, _, _, sxx, syy, sxy = figures.moments
    return number(sxy / np.sqrt(sxx * syy))


def _by_turns_means(by_turns: pl.DataFrame, tokens_known: bool) -> pl.DataFrame:
    """For each turn count: the trajectories' mean advantage and token mass at both levels;
    without a mask column the token counts are unknown, and the token figures null rather than
    sums of 0."""
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


def _loss_weights(figures: PartFigures) -> dict[str, ModeWeights]:
    """For each loss aggregation mode (:data:`advcli.advantages.loss.LOSS_MODES`): by turn count,
    the trajectories' mean weight relative to equal weight per trajectory (1 = a fair share),
    their share of the batch's weight, and the signed gradient mass Σ weight × advantage under
    each level; every mode's weight a sum of the trajectories' terms over a constant of the
    batch (:func:`advcli.advantages.loss.mode_weights`)."""
    by_turns = figures.by_turns
    trajectories = by_turns["trajectories"].to_numpy()
    modes: dict[str, ModeWeights] = {}
    for mode in LOSS_MODES:
        weight, mass_turn, mass_trajectory = _mode_weights(figures, mode)
        relative, share = relative_weights(weight, trajectories)
        entries: list[ModeByTurns] = [
            {
                "turns": int(turns),
                "trajectories": int(count),
                "relative_weight": number(relative[index]),
                "weight_share": number(share[index]),
                "mass_turn": number(mass_turn[index]),
                "mass_trajectory": number(mass_trajectory[index]),
            }
            for index, (turns, count) in enumerate(
                zip(by_turns["turns"], trajectories, strict=True)
            )
        ]
        modes[mode] = {
            "source": MODE_SOURCES[mode],
            # How much more weight a trajectory of the most turns gets than one of the fewest.
            "longest_vs_shortest": longest_vs_shortest(relative),
            "by_turns": entries,
        }
    return modes


def _mode_weights(figures: PartFigures, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By turn count, the trajectories' weight under ``mode`` and their mass at both levels."""
    by_turns = figures.by_turns
    return mode_weights(
        mode,
        lambda name: by_turns[name].to_numpy(),
        batch_tokens=float(figures.counts["tokens"] or 0),
        nonempty_rows=float(figures.nonempty_rows or 0),
        rows=float(figures.counts["rows"] or 0),
    )


def relative_weights(weight: np.ndarray, trajectories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """By turn count (``weight``: its trajectories' total weight, ``trajectories``: how many):
    a trajectory's mean weight relative to an equal share of the total, and the turn count's
    share of the total."""
    total = float(weight.sum())
    return weight / total * float(trajectories.sum()) / trajectories, weight / total


def longest_vs_shortest(relative: np.ndarray) -> float | None:
    """The relative weight of a trajectory of the most turns over one of the fewest's."""
    return number(relative[-1] / relative[0]) if relative[0] else None


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


def by_turns_entries(by_turns: pl.DataFrame) -> list[ByTurns]:
    return [
        {
            "turns": row["turns"],
            "trajectories": row["trajectories"],
            "mean_advantage_turn": number(row["mean_advantage_turn"]),
            "mean_advantage_trajectory": number(row["mean_advantage_trajectory"]),
            "token_mass_turn": number(row["token_mass_turn"]),
            "token_mass_trajectory": number(row["token_mass_trajectory"]),
        }
        for row in by_turns.iter_rows(named=True)
    ]


def top_groups(rows: pl.DataFrame) -> list[TopGroup]:
    """The top groups as the JSON lists them (``rows``: the figures' top, in order)."""
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
        for row in rows.iter_rows(named=True)
    ]


def top_trajectories(rows: pl.DataFrame) -> list[TopTrajectory]:
    """The top trajectories as the JSON lists them (``rows``: the figures' top, in order)."""
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
        for row in rows.iter_rows(named=True)
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

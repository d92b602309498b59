"""``compare --by``: the headline figures of each training step, from the report of the whole
run in one grouped pass (each value of a column), or from each step's own report (each input
file, :mod:`advcli.run.parts`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from advcli.keys import GROUP
from advcli.report.bias import BiasReport, number
from advcli.report.verdict import bias_level


def by_step(
    report: BiasReport, field: str, steps: pl.Series, labels: list[Any]
) -> list[dict[str, Any]]:
    """The headline figures of each step, for the series ``compare --by`` reports, from the
    report of the whole run (its groups keyed by ``(step, group)``, the step in the group key's
    ``field``) in one grouped pass: ``steps`` are the step values in the series' order, named
    by ``labels``; a step without rows keeps its place, with no figures.

    Each step's figures are those of its part compared alone, bit for bit: its trajectories
    and groups keep their input order within the step, and the step key is flagged sorted, so
    that each step's sums and means are those of its values as one Series."""
    position = pl.DataFrame(
        {STEP: steps, "__step": pl.int_range(steps.len(), dtype=pl.UInt32, eager=True)}
    )

    def by_position(frame: pl.DataFrame) -> pl.DataFrame:
        return (
            frame.with_columns(pl.col(GROUP).struct.field(field).alias(STEP))
            .join(position, on=STEP, how="left", maintain_order="left")
            .sort("__step", maintain_order=True)
            .with_columns(pl.col("__step").set_sorted())
        )

    trajectories = by_position(report.trajectories)
    figures = trajectories.group_by("__step", maintain_order=True).agg(
        pl.col("turns").sum().alias("rows"),
        pl.len().alias("trajectories"),
        pl.col("diff").abs().mean().alias("advantage_diff_mean"),
        pl.col("diff").abs().max().alias("advantage_diff_max"),
        (pl.col("advantage_turn") * pl.col("advantage_trajectory") < 0).sum().alias("sign_flips"),
        pl.col("turns").min().alias("fewest"),
        pl.col("turns").max().alias("most"),
        pl.col("tokens").sum().alias("batch_tokens"),
    )
    shifts = (
        by_position(report.groups)
        .group_by("__step", maintain_order=True)
        .agg(pl.col("baseline_shift").mean().alias("baseline_shift_mean"))
    )
    figures = figures.join(shifts, on="__step", how="left", maintain_order="left")
    tokens_known = report.summary["counts"]["tokens"] is not None
    token_mean = (
        _token_mean_longest_vs_shortest(trajectories, figures, steps.len())
        if tokens_known
        else np.full(steps.len(), np.nan)
    )
    found = dict(zip(figures["__step"], figures.iter_rows(named=True), strict=True))
    series = []
    for index, label in enumerate(labels):
        row = found.get(index)
        if row is None:
            series.append(empty_step(label))
            continue
        diff = number(row["advantage_diff_mean"])
        series.append(
            {
                "step": label,
                "rows": row["rows"],
                "trajectories": row["trajectories"],
                "baseline_shift_mean": number(row["baseline_shift_mean"]),
                "advantage_diff_mean": diff,
                "advantage_diff_max": number(row["advantage_diff_max"]),
                "sign_flips": row["sign_flips"],
                "token_mean_longest_vs_shortest": number(token_mean[index]),
                "level": bias_level(diff or 0.0, row["sign_flips"] / max(row["trajectories"], 1)),
            }
        )
    return series


# The step's value, and its position in the series, while ``by_step`` runs.
STEP = "__step_value"


def _token_mean_longest_vs_shortest(
    trajectories: pl.DataFrame, figures: pl.DataFrame, count: int
) -> np.ndarray:
    """Each step's ``loss_weights["token-mean"]["longest_vs_shortest"]`` (NaN where it has
    none), computed as :func:`advcli.report.bias.loss_weights` computes it for the step alone:
    a trajectory's weight ``tokens / T`` as a share of the step's total times its trajectory
    count, averaged over the trajectories of the most turns and of the fewest (in input order,
    one by one)."""
    # Times the reciprocal, as Polars divides by the constant T of the step alone.
    weighted = trajectories.join(
        figures.select("__step", "batch_tokens", "trajectories", "fewest", "most"),
        on="__step",
        how="left",
        maintain_order="left",
    ).with_columns(
        pl.col("__step").set_sorted(),
        (pl.col("tokens").cast(pl.Float64) * (1.0 / pl.col("batch_tokens").cast(pl.Float64))).alias(
            "weight"
        ),
    )
    totals = weighted.group_by("__step", maintain_order=True).agg(pl.col("weight").sum())
    relative = weighted.join(
        totals.rename({"weight": "total"}), on="__step", how="left", maintain_order="left"
    ).select(
        "__step",
        "turns",
        "fewest",
        "most",
        (
            pl.col("weight") * (1.0 / pl.col("total")) * pl.col("trajectories").cast(pl.Float64)
        ).alias("relative"),
    )

    def mean_where(turns: str) -> np.ndarray:
        chosen = relative.filter(pl.col("turns") == pl.col(turns))
        step = chosen["__step"].to_numpy()
        sums = np.bincount(step, weights=chosen["relative"].to_numpy(), minlength=count)
        return sums / np.maximum(np.bincount(step, minlength=count), 1)

    shortest, longest = mean_where("fewest"), mean_where("most")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(shortest != 0, longest / shortest, np.nan)


def step_entry(summary: dict[str, Any], step: Any) -> dict[str, Any]:
    """The headline figures of a step compared alone (``summary``: its report), the step named
    ``step``: those :func:`by_step` gives it."""
    flips, trajectories = summary["trajectories"]["sign_flips"], summary["counts"]["trajectories"]
    diff = summary["trajectories"]["advantage_diff_mean"]
    weights = summary["loss_weights"]
    return {
        "step": step,
        "rows": summary["counts"]["rows"],
        "trajectories": trajectories,
        "baseline_shift_mean": summary["groups"]["baseline_shift_mean"],
        "advantage_diff_mean": diff,
        "advantage_diff_max": summary["trajectories"]["advantage_diff_max"],
        "sign_flips": flips,
        "token_mean_longest_vs_shortest": (
            weights["token-mean"]["longest_vs_shortest"] if weights is not None else None
        ),
        "level": bias_level(diff or 0.0, flips / max(trajectories, 1)),
    }


def empty_step(step: Any) -> dict[str, Any]:
    """A step (an input file) without rows: its place in the series, with no figures."""
    return {
        "step": step,
        "rows": 0,
        "trajectories": 0,
        "baseline_shift_mean": None,
        "advantage_diff_mean": None,
        "advantage_diff_max": None,
        "sign_flips": 0,
        "token_mean_longest_vs_shortest": None,
        "level": None,
    }

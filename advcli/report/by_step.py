"""``compare --by``: the headline figures of each training step, from the report of the whole
run in one grouped pass (each value of a column), or from each step's own report (each input
file, :mod:`advcli.run.parts`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from advcli.keys import GROUP
from advcli.report.bias import BiasReport
from advcli.report.figures import diff_mean, longest_vs_shortest, number, relative_weights
from advcli.report.summary import BiasSummary, StepEntry
from advcli.report.verdict import bias_level


def by_step(report: BiasReport, field: str, steps: pl.Series, labels: list[Any]) -> list[StepEntry]:
    """The headline figures of each step, for the series ``compare --by`` reports, from the
    report of the whole run (its groups keyed by ``(step, group)``, the step in the group key's
    ``field``) in one grouped pass: ``steps`` are the step values in the series' order, named
    by ``labels``; a step without rows keeps its place, with no figures.

    Each step's figures are those of its part compared alone, bit for bit
    (:mod:`advcli.report.figures` makes both): its trajectories and groups keep their input
    order within the step; the step key is flagged sorted, so that each step's sums are those
    of its values as one Series; and its sums by turn count add its trajectories one by one in
    that order, as a part's do."""
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
        pl.col("diff").abs().max().alias("advantage_diff_max"),
        (pl.col("advantage_turn") * pl.col("advantage_trajectory") < 0).sum().alias("sign_flips"),
        pl.col("tokens").sum().alias("batch_tokens"),
    )
    shifts = (
        by_position(report.groups)
        .group_by("__step", maintain_order=True)
        .agg(
            pl.col("baseline_shift").sum().alias("shift_sum"),
            pl.col("baseline_shift").count().alias("shift_count"),
        )
    )
    figures = figures.join(shifts, on="__step", how="left", maintain_order="left")
    tokens_known = report.summary["counts"]["tokens"] is not None
    by_turns = _by_step_and_turns(trajectories, tokens_known).partition_by("__step", as_dict=True)
    found = dict(zip(figures["__step"], figures.iter_rows(named=True), strict=True))
    series: list[StepEntry] = []
    for index, label in enumerate(labels):
        row = found.get(index)
        if row is None:
            series.append(empty_step(label))
            continue
        step = by_turns[(index,)]
        diff = diff_mean(step["abs_diff"], step["trajectories"])
        token_mean = None
        if tokens_known:
            weight = step["tokens"].to_numpy() / float(row["batch_tokens"])
            relative, _ = relative_weights(weight, step["trajectories"].to_numpy())
            token_mean = longest_vs_shortest(relative)
        shift_count = row["shift_count"] or 0
        series.append(
            {
                "step": label,
                "rows": row["rows"],
                "trajectories": row["trajectories"],
                "baseline_shift_mean": (
                    number(float(row["shift_sum"]) / shift_count) if shift_count else None
                ),
                "advantage_diff_mean": diff,
                "advantage_diff_max": number(row["advantage_diff_max"]),
                "sign_flips": row["sign_flips"],
                "token_mean_longest_vs_shortest": token_mean,
                "level": bias_level(diff or 0.0, row["sign_flips"] / max(row["trajectories"], 1)),
            }
        )
    return series


# The step's value, and its position in the series, while ``by_step`` runs.
STEP = "__step_value"


def _by_step_and_turns(trajectories: pl.DataFrame, tokens_known: bool) -> pl.DataFrame:
    """For each step and turn count, in that order: ``trajectories`` (how many) and the sums of
    |diff| and (``tokens_known``) tokens over them, each added one by one in the step's input
    order, as :func:`advcli.report.figures.by_turn_count` adds a part's."""
    step = trajectories["__step"].to_numpy().astype(np.int64)
    turns = trajectories["turns"].to_numpy().astype(np.int64)
    width = int(turns.max()) + 1 if turns.size else 1
    keys, slot = np.unique(step * width + turns, return_inverse=True)
    columns = {
        "__step": pl.Series(keys // width, dtype=pl.UInt32),
        "trajectories": pl.Series(np.bincount(slot), dtype=pl.UInt32),
        "abs_diff": pl.Series(np.bincount(slot, weights=trajectories["diff"].abs().to_numpy())),
    }
    if tokens_known:
        tokens = trajectories["tokens"].cast(pl.Float64).to_numpy()
        columns["tokens"] = pl.Series(np.bincount(slot, weights=tokens))
    return pl.DataFrame(columns)


def step_entry(summary: BiasSummary, step: Any) -> StepEntry:
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


def empty_step(step: Any) -> StepEntry:
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

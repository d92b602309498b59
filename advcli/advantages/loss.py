"""How a trainer's loss aggregation weighs each row: the other half of the length bias.

Even with trajectory-level baselines every turn row enters the policy loss, and how the loss
aggregates tokens and rows decides how much gradient a long trajectory gets. Each mode below is a
per-token weight ``w`` of a row such that the mode's loss is ``Σ_rows Σ_tokens w · loss_t · mask_t``
over one batch (verl's ``agg_loss`` with one data-parallel rank; agent-lightning's
``normalize_advantages_by_rollout``):

============================  =============================  =================================
mode                          ``w`` of a row with T tokens   a trajectory's total weight
============================  =============================  =================================
``token-mean``                1 / T_batch                    its tokens / T_batch
``token-sum``                 1                              its tokens
``seq-mean-token-sum``        1 / B                          its tokens / B
``seq-mean-token-mean``       1 / (B · (T + 1e-8))           its rows / B
``seq-mean-token-sum-norm``   1 / (B · H)                    its tokens / (B · H)
``per-rollout-mean``          1 / (T_traj · N)               1 / N, the same for every one
============================  =============================  =================================

T_batch is the batch's response tokens, B its rows with at least one token, N all its rows, H
verl's ``loss_scale_factor`` (by default the padded response length), T_traj the trajectory's
tokens. A row without tokens weighs nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import polars as pl

from advcli.keys import GROUP, TOKENS, TRAJECTORY
from advcli.settings.config import LossMode

# verl's loss_agg_mode values, then agent-lightning's per-rollout mean (its loss_mode).
LOSS_MODES = tuple(mode.value for mode in LossMode)
# What verl's seq-mean-token-mean adds to a row's token count before dividing.
SEQ_MEAN_EPSILON = 1e-8
FLOAT64_SMALLEST_NORMAL = sys.float_info.min
# Whose each mode is, for the report.
MODE_SOURCES = {
    "token-mean": "verl's default loss_agg_mode",
    "token-sum": "verl loss_agg_mode",
    "seq-mean-token-sum": "verl loss_agg_mode",
    "seq-mean-token-mean": "verl loss_agg_mode",
    "seq-mean-token-sum-norm": "verl loss_agg_mode",
    "per-rollout-mean": "agent-lightning's loss_mode per_rollout_mean",
}


def token_weight(mode: str, scale_factor: float = 1.0, batch: str | None = None) -> pl.Expr:
    """The per-token weight ``w`` of each row, over a frame with ``group``, ``trajectory`` and
    ``tokens`` (one row per row of the batch). ``scale_factor`` is H, for
    ``seq-mean-token-sum-norm`` only. ``batch``: the field of a struct ``group`` that says each
    row's batch (``--by``'s step), where the frame holds several batches."""

    def over_batch(total: pl.Expr) -> pl.Expr:
        return total if batch is None else total.over(pl.col(GROUP).struct.field(batch))

    tokens = pl.col(TOKENS).cast(pl.Float64)
    has_tokens = pl.col(TOKENS) > 0
    nonempty_rows = over_batch(has_tokens.sum()).cast(pl.Float64)
    if mode == "token-mean":
        weight = 1.0 / over_batch(tokens.sum())
    elif mode == "token-sum":
        weight = pl.lit(1.0)
    elif mode == "seq-mean-token-sum":
        weight = 1.0 / nonempty_rows
    elif mode == "seq-mean-token-mean":
        # verl divides a row's token sum by its tokens + 1e-8.
        weight = 1.0 / (nonempty_rows * (tokens + SEQ_MEAN_EPSILON))
    elif mode == "seq-mean-token-sum-norm":
        weight = 1.0 / (nonempty_rows * scale_factor)
    elif mode == "per-rollout-mean":
        trajectory_tokens = tokens.sum().over(GROUP, TRAJECTORY)
        # agent-lightning clamps the divisor at 1.
        rows = over_batch(pl.len()).cast(pl.Float64)
        weight = 1.0 / pl.max_horizontal(trajectory_tokens * rows, 1.0)
    else:
        raise ValueError(f"unknown loss mode {mode!r}; one of {', '.join(LOSS_MODES)}")
    return pl.when(has_tokens).then(weight).otherwise(0.0)


def trajectory_terms(advantage: str) -> dict[str, pl.Expr]:
    """What every mode's weight of a trajectory follows from besides its token count, as per-row
    terms to sum over its rows (``advantage``: the rows' turn-level advantage column): its tokens
    times the advantage, and its rows counted as seq-mean-token-mean counts them
    (T / (T + 1e-8)), also times the advantage."""
    tokens = pl.col(TOKENS).cast(pl.Float64)
    counted = pl.when(pl.col(TOKENS) > 0).then(tokens / (tokens + SEQ_MEAN_EPSILON)).otherwise(0.0)
    return {
        "loss_tokens_advantage": tokens * pl.col(advantage),
        "loss_counted": counted,
        "loss_counted_advantage": counted * pl.col(advantage),
    }


# What every mode's weight of a set of trajectories follows from, as sums over them (over a
# frame of trajectories with ``tokens``, the :func:`trajectory_terms` sums and
# ``advantage_trajectory``): a mode's weight of a turn count's trajectories, or of one
# trajectory, is a function of their sums (:func:`mode_weights`).
_TOKENS = pl.col(TOKENS).cast(pl.Float64)
_NONEMPTY = pl.col(TOKENS) > 0
TRAJECTORY_SUMS = {
    "tokens": _TOKENS,
    "tokens_advantage": pl.col("loss_tokens_advantage"),
    "tokens_x_trajectory": _TOKENS * pl.col("advantage_trajectory"),
    "counted": pl.col("loss_counted"),
    "counted_advantage": pl.col("loss_counted_advantage"),
    "counted_x_trajectory": pl.col("loss_counted") * pl.col("advantage_trajectory"),
    "nonempty": _NONEMPTY.cast(pl.Float64),
    "nonempty_x_trajectory": pl.when(_NONEMPTY).then(pl.col("advantage_trajectory")).otherwise(0.0),
    "nonempty_mean_advantage": pl.when(_NONEMPTY)
    .then(pl.col("loss_tokens_advantage") / _TOKENS)
    .otherwise(0.0),
}


def mode_weights(
    mode: str,
    column: Callable[[str], np.ndarray],
    *,
    batch_tokens: float,
    nonempty_rows: float,
    rows: float,
    scale_factor: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The total weight under ``mode`` of each set of trajectories whose :data:`TRAJECTORY_SUMS`
    ``column(name)`` holds, and its mass (weight × advantage) at turn level and at trajectory
    level: the sum over their rows of :func:`token_weight` × tokens (× advantage), without a
    per-row pass per mode. ``batch_tokens``, ``nonempty_rows``, ``rows``: the batch's."""
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
        "seq-mean-token-sum-norm": nonempty_rows * scale_factor,
    }.get(mode)
    if constant is None:
        raise ValueError(f"unknown loss mode {mode!r}; one of {', '.join(LOSS_MODES)}")
    return (
        column("tokens") / constant,
        column("tokens_advantage") / constant,
        column("tokens_x_trajectory") / constant,
    )


def unwritable_weight(weights: pl.DataFrame) -> float | None:
    """The first ``loss_weight`` of a row with tokens (``weights``: ``loss_weight`` and
    ``tokens``) that is infinite, 0 or below float64's normal range (where its digits are lost),
    if any: a weight that overflows or underflows is a wrong answer, not a weight."""
    weight = pl.col("loss_weight")
    bad = (pl.col(TOKENS) > 0) & (~weight.is_finite() | (weight.abs() < FLOAT64_SMALLEST_NORMAL))
    first: float | None = weights.select(pl.col("loss_weight").filter(bad).first()).item()
    return first

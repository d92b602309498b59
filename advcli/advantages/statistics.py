"""Stage 2's statistics: every per-group quantity any estimator needs, in one group-by
(:func:`group_statistics`), and the batch-wide ones (the std of ``--scale batch``, REINFORCE++'s
token whitening), each summed in a fixed order so that it does not depend on the row order or
the thread count.
"""

from __future__ import annotations

import polars as pl

from advcli.errors import AdvcliError
from advcli.keys import GROUP, SCORE, TOKENS
from advcli.settings.rules import (
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    WHITEN_MIN_TOKENS,
    ZERO_STD,
)


def group_statistics(
    units: pl.DataFrame,
    units_per_part: int | None = None,
    second_best: bool = False,
    ddof: int = STD_DDOF,
    extremes: bool = False,
) -> pl.DataFrame:
    """Every per-group quantity an estimator needs, in one group-by, before any singleton rule.

    ``std`` is the unbiased sample std (``ddof`` 1, as torch.std and verl), null for a single
    unit; with ``ddof`` 0 the population std (np.std, rLLM), 0 for a single unit.
    When every unit of a group has the same score, ``mean`` is set to that score exactly and ``std``
    to 0, so the advantages are exactly 0 rather than rounding noise divided by epsilon.
    With ``second_best`` (grpo_passk's baseline), ``top_row`` is the first unit (in input order)
    with the group's highest score and ``score_second`` the second highest score (equal to the
    highest on a tie); without, ``top_row`` is the group's first unit and there is no
    ``score_second`` — the two cost several times every other figure together where groups are
    small (each row its own unit). With ``extremes`` (grpo_loo's others' std), the figures of
    :func:`_extreme_figures`. ``units_per_part``: see below.
    """
    all_equal = pl.col("score_max") == pl.col("score_min")
    # Groups are independent: in parts of about a million units, split by a hash of the group,
    # the sort below copies one part at a time, not every unit (every row, at turn level), and
    # each group's figures are the same bit for bit.
    parts = min(255, max(1, -(-units.height // (units_per_part or UNITS_PER_PART))))
    columns = units.select(GROUP, SCORE, TOKENS, "first_row")
    if parts == 1:
        pieces = [_group_figures(columns, second_best, ddof, extremes)]
    else:
        part = columns.select((pl.col(GROUP).hash() % parts).cast(pl.UInt8)).to_series()
        pieces = [
            _group_figures(columns.filter(part == index), second_best, ddof, extremes)
            for index in range(parts)
        ]
    return (
        pl.concat(pieces)
        .with_columns(
            pl.when(all_equal).then(pl.col("score_max")).otherwise(pl.col("mean")).alias("mean"),
            pl.when(all_equal & (pl.col("units") > 1))
            .then(ZERO_STD)
            .otherwise(pl.col("std"))
            .alias("std"),
            (all_equal & (pl.col("units") > 1)).alias("zero_std"),
        )
        .sort("first_row")
    )


# Units per part of group_statistics' sort (at most 255 parts: the part number is a UInt8;
# measured: compare's peak at 4.3M rows 788 → 675 MiB in the turn level's statistics).
UNITS_PER_PART = 1_000_000


def _group_figures(
    units: pl.DataFrame, second_best: bool, ddof: int, extremes: bool
) -> pl.DataFrame:
    # Sorting by (group, score, tokens) first fixes the order in which each group's floats are
    # summed, so the statistics are bit-identical whatever the input files' order or the thread
    # count.
    in_order = units.sort(GROUP, SCORE, TOKENS)
    key, keyed = GROUP, []
    if isinstance(units.schema[GROUP], pl.Struct):
        # The (step, group) keys of --by: Polars sums a sorted struct key's groups another way
        # than a sorted integer or string key's; grouped by the run number of the sorted key,
        # each group's figures are those of its step compared alone, bit for bit.
        in_order = in_order.with_columns(pl.col(GROUP).rle_id().set_sorted().alias(RUN))
        key, keyed = RUN, [pl.col(GROUP).first()]
    return (
        in_order.group_by(key)
        .agg(
            *keyed,
            pl.len().alias("units"),
            pl.col(SCORE).mean().alias("mean"),
            pl.col(SCORE).std(ddof=ddof).alias("std"),
            pl.col(SCORE).max().alias("score_max"),
            pl.col(SCORE).min().alias("score_min"),
            *(
                [
                    pl.col(SCORE).top_k(2).min().alias("score_second"),
                    pl.col("first_row")
                    .filter(pl.col(SCORE) == pl.col(SCORE).max())
                    .min()
                    .alias("top_row"),
                ]
                if second_best
                else [pl.col("first_row").min().alias("top_row")]
            ),
            *(_extreme_figures() if extremes else []),
            pl.col(TOKENS).sum().alias("tokens_sum"),
            (pl.col(TOKENS) * pl.col(SCORE)).sum().alias("tokens_score_sum"),
            pl.col("first_row").min().alias("first_row"),
        )
        .select(pl.exclude(RUN))
    )


def _extreme_figures() -> list[pl.Expr]:
    """How many units carry the group's lowest and highest score, and the sum of squared
    deviations (from their own mean) of the units above the lowest and below the highest: the
    other units' of a unit alone at an extreme, made from them directly (grpo_loo's others'
    std, where a difference from the group's would lose them to rounding)."""
    score = pl.col(SCORE)

    def m2(kept: pl.Expr) -> pl.Expr:
        values = score.filter(kept)
        return ((values - values.mean()) ** 2).sum()

    return [
        (score == score.min()).sum().alias("count_min"),
        (score == score.max()).sum().alias("count_max"),
        m2(score > score.min()).alias("m2_above_min"),
        m2(score < score.max()).alias("m2_below_max"),
    ]


# The run number of a sorted struct group key, while _group_figures runs.
RUN = "__run"


def batch_stds(units: pl.DataFrame, batch: str | None, ddof: int = STD_DDOF) -> pl.DataFrame:
    """The std (``ddof`` 1, or 0: ``--std``) of every unit's score in each batch: the divisor
    of ``--scale batch``.
    One row per batch, ``__batch`` and ``batch_std``; one batch (key 0) when ``batch`` is None.

    A single unit has std 1 (as a singleton group); identical scores have std 0. The scores are
    sorted first (a fixed summation order, as in group_statistics), and the key is flagged
    sorted, so that each batch's std is that of its scores as one Series, bit for bit."""
    return (
        units.select(batch_key(batch), SCORE)
        .sort(BATCH, SCORE)
        .with_columns(pl.col(BATCH).set_sorted())
        .group_by(BATCH, maintain_order=True)
        .agg(
            pl.when(pl.len() == 1)
            .then(SINGLETON_STD)
            .when(pl.col(SCORE).min() == pl.col(SCORE).max())
            .then(ZERO_STD)
            .otherwise(pl.col(SCORE).std(ddof=ddof))
            .alias("batch_std")
        )
    )


# The column naming each unit's (or row's) batch while batch-wide quantities are computed.
BATCH = "__batch"


def batch_key(batch: str | None) -> pl.Expr:
    """Each unit's batch: field ``batch`` of its group key (``--by``: each step is its own batch),
    or one batch for the whole input."""
    if batch is None:
        return pl.lit(0, dtype=pl.UInt8).alias(BATCH)
    return pl.col(GROUP).struct.field(batch).alias(BATCH)


def token_whitening(rows: pl.DataFrame, batch: str | None) -> pl.DataFrame:
    """REINFORCE++ whitening over every response token of each batch (``rows``' ``__batch``):
    one row per batch with ``whiten_mean`` μ and ``whiten_scale`` sqrt(σ² + 1e-8).

    Every token of a row carries the row's value x, so with T = Σ tokens the token mean is
    μ = Σ tokens·x / T and the unbiased token variance σ² = Σ tokens·(x − μ)² / (T − 1);
    x becomes (x − μ) / sqrt(σ² + 1e-8), as verl's masked_whiten.
    """
    weight = pl.col(TOKENS).cast(pl.Float64)
    # Summed in a fixed order (sorted values), so the result does not depend on the row order;
    # the batch key flagged sorted, so each batch's sums are those of its rows alone.
    in_order = (
        rows.select(BATCH, "advantage", TOKENS)
        .sort(BATCH, "advantage", TOKENS)
        .with_columns(pl.col(BATCH).set_sorted())
    )
    totals = in_order.group_by(BATCH, maintain_order=True).agg(
        pl.col(TOKENS).sum().alias("total"),
        (weight * pl.col("advantage")).sum().alias("weighted"),
    )
    short = totals.filter(pl.col("total") < WHITEN_MIN_TOKENS)
    if not short.is_empty():
        total = short["total"][0]
        where = "the input" if batch is None else f"{batch} {short[BATCH][0]!r} (--by)"
        raise AdvcliError(
            "reinforce_pp_baseline whitens over response tokens and needs at least "
            f"{WHITEN_MIN_TOKENS}; {where} has {total}"
        )
    means = totals.select(BATCH, "total", (pl.col("weighted") / pl.col("total")).alias("mean"))
    return (
        in_order.join(means, on=BATCH, how="left", maintain_order="left")
        .with_columns(pl.col(BATCH).set_sorted())
        .group_by(BATCH, maintain_order=True)
        .agg(
            pl.col("mean").first().alias("whiten_mean"),
            (
                (weight * (pl.col("advantage") - pl.col("mean")) ** 2).sum()
                / (pl.col("total").first() - 1)
                + WHITEN_EPSILON
            )
            .sqrt()
            .alias("whiten_scale"),
        )
    )

"""The report's closed form of each loss mode is the per-row form summed: for every mode, a
trajectory's weight from :func:`advcli.advantages.loss.mode_weights` over its
:data:`~advcli.advantages.loss.TRAJECTORY_SUMS` (of the
:func:`~advcli.advantages.loss.trajectory_terms` sums) equals the sum over its rows of
:func:`~advcli.advantages.loss.token_weight` × tokens (× advantage), on any batch."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advcli.advantages.loss import (
    LOSS_MODES,
    TRAJECTORY_SUMS,
    mode_weights,
    token_weight,
    trajectory_terms,
)
from advcli.keys import GROUP, TOKENS, TRAJECTORY

# One row: its group, its trajectory within the group, its response tokens (often none) and its
# turn-level advantage.
ROW = st.tuples(
    st.integers(0, 3),
    st.integers(0, 3),
    st.one_of(st.just(0), st.integers(1, 2000)),
    st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False),
)
# A batch with at least one response token: token-mean divides by the batch's tokens.
BATCHES = st.lists(ROW, min_size=1, max_size=40).filter(lambda rows: any(r[2] for r in rows))


def batch_frame(rows: list[tuple[int, int, int, float]]) -> pl.DataFrame:
    groups, trajectories, tokens, advantages = zip(*rows, strict=True)
    return pl.DataFrame(
        {
            GROUP: list(groups),
            TRAJECTORY: list(trajectories),
            TOKENS: pl.Series(tokens, dtype=pl.Int64),
            "advantage": pl.Series(advantages, dtype=pl.Float64),
        }
    )


@pytest.mark.parametrize("mode", LOSS_MODES)
@settings(max_examples=150, deadline=None)
@given(rows=BATCHES, scale_factor=st.floats(1.0, 8192.0))
def test_closed_form_is_the_per_row_form_summed(mode, rows, scale_factor):
    frame = batch_frame(rows)
    keys = [GROUP, TRAJECTORY]
    per_row = (
        frame.with_columns(token_weight(mode, scale_factor).alias("w"))
        .group_by(keys)
        .agg(
            (pl.col("w") * pl.col(TOKENS)).sum().alias("weight"),
            (pl.col("w") * pl.col(TOKENS) * pl.col("advantage")).sum().alias("mass"),
        )
        .sort(keys)
    )
    closed = (
        frame.group_by(keys)
        .agg(
            pl.col(TOKENS).sum(),
            *(term.sum().alias(name) for name, term in trajectory_terms("advantage").items()),
        )
        # Any advantage at trajectory level: its mass is the weight times it.
        .with_columns(advantage_trajectory=pl.col(GROUP) - 1.5)
        .select(*keys, "advantage_trajectory", *(v.alias(k) for k, v in TRAJECTORY_SUMS.items()))
        .sort(keys)
    )
    weight, mass, mass_trajectory = mode_weights(
        mode,
        lambda name: closed[name].to_numpy(),
        batch_tokens=float(frame[TOKENS].sum()),
        nonempty_rows=float((frame[TOKENS] > 0).sum()),
        rows=float(frame.height),
        scale_factor=scale_factor,
    )
    closed = closed.with_columns(weight=weight, mass=mass)
    np.testing.assert_allclose(
        mass_trajectory, weight * closed["advantage_trajectory"].to_numpy(), rtol=1e-12, atol=0
    )
    assert closed[keys].equals(per_row[keys])
    np.testing.assert_allclose(closed["weight"], per_row["weight"], rtol=1e-12, atol=0)
    # The mass sums advantages of both signs: compared to the scale of its terms.
    scale = float((per_row["weight"] * frame["advantage"].abs().max()).max())
    np.testing.assert_allclose(closed["mass"], per_row["mass"], rtol=1e-12, atol=1e-12 * scale)

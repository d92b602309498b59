"""The two implementations of the rules agree: ``advcli.torch`` on a padded batch and the Polars
path (stage 2, :func:`advcli.estimators.compute_advantages`) on the same rows give the same
advantages, for every estimator both implement, at turn and trajectory level."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from advcli.estimators import compute_advantages  # noqa: E402
from advcli.keys import GROUP, ROW, SCORE, TOKENS, TRAJECTORY, TURN  # noqa: E402
from advcli.settings import AdvantageConfig, Estimator, Level  # noqa: E402
from advcli.torch import (  # noqa: E402
    compute_grpo_outcome_advantage,
    compute_rloo_outcome_advantage,
)

pytestmark = pytest.mark.torch

SCORES = [0.0, 1.0, 0.5, -0.25, 2.0, 1e-3]
WIDTH = 4


@st.composite
def batches(draw):
    """Rows in any order; every row of a trajectory carries its trajectory's score (where the
    two paths' semantics meet: torch normalizes each row's own score)."""
    n = draw(st.integers(1, 30))
    groups = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    trajectories = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    keys = sorted(set(zip(groups, trajectories, strict=True)))
    score_of = {key: draw(st.sampled_from(SCORES)) for key in keys}
    tokens = draw(st.lists(st.integers(1, WIDTH), min_size=n, max_size=n))
    epsilon = draw(st.sampled_from([1e-6, 0.0, 0.1]))
    row_scores = [score_of[key] for key in zip(groups, trajectories, strict=True)]
    return groups, trajectories, row_scores, tokens, epsilon


def polars_advantages(groups, trajectories, scores, tokens, config) -> np.ndarray:
    turn = [0] * len(groups)
    seen: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(groups, trajectories, strict=True)):
        turn[i] = seen[key] = seen.get(key, -1) + 1
    projection = pl.DataFrame(
        {
            ROW: pl.Series(range(len(groups)), dtype=pl.UInt32),
            GROUP: groups,
            TRAJECTORY: trajectories,
            TURN: turn,
            SCORE: pl.Series(scores, dtype=pl.Float64),
            TOKENS: tokens,
        }
    )
    return compute_advantages(projection, config).rows["advantage"].to_numpy()


def torch_advantages(groups, trajectories, scores, tokens, estimator, level, epsilon):
    n = len(groups)
    rewards = torch.zeros(n, WIDTH, dtype=torch.float64)
    mask = torch.zeros(n, WIDTH)
    for i, (score, count) in enumerate(zip(scores, tokens, strict=True)):
        rewards[i, count - 1] = score
        mask[i, :count] = 1
    flags = {"compute_mean_std_cross_all_data": level is Level.TURN}
    index, traj = np.array(groups), np.array(trajectories)
    if estimator is Estimator.RLOO:
        advantages, _ = compute_rloo_outcome_advantage(rewards, mask, index, traj, **flags)
    else:
        advantages, _ = compute_grpo_outcome_advantage(
            rewards,
            mask,
            index,
            traj,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=estimator is Estimator.GRPO,
            **flags,
        )
    # The scalar advantage sits on every unmasked token; the last one is always unmasked.
    return advantages[torch.arange(n), torch.tensor(tokens) - 1].numpy()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=batches(),
    estimator=st.sampled_from([Estimator.GRPO, Estimator.DRGRPO, Estimator.RLOO]),
    level=st.sampled_from(list(Level)),
)
def test_torch_and_polars_give_the_same_advantages(batch, estimator, level):
    groups, trajectories, scores, tokens, epsilon = batch
    config = AdvantageConfig(level=level, estimator=estimator, epsilon=epsilon)
    expected = polars_advantages(groups, trajectories, scores, tokens, config)
    actual = torch_advantages(groups, trajectories, scores, tokens, estimator, level, epsilon)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    # Exact zeros (zero-std groups) are exact in both.
    assert (actual[expected == 0] == 0).all()

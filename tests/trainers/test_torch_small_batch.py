"""advcli.torch's path for small batches (per-token passes by blocks of rows below torch's
parallel grain): the same numbers as the path for large ones, and the caller's thread settings
untouched."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from advcli.torch import compute_advantage, compute_grpo_outcome_advantage  # noqa: E402
from advcli.torch.tensors import is_small  # noqa: E402

pytestmark = pytest.mark.torch

# The last row count of the small path at this response length, and the first of the large one.
SWITCH_ROWS, LENGTH = 32_767, 48


def batch(rows: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """Rows of groups of 8 (trajectories of 1-3 rows) with random float32 rewards on every token,
    so the float64 sums depend on their order, and a random 0/1 mask; a last row beyond
    SWITCH_ROWS is a trajectory of a group of its own, which changes no other row's advantage."""
    rng = np.random.default_rng(7)
    rewards = torch.from_numpy(rng.normal(size=(rows, LENGTH)).astype(np.float32))
    mask = torch.from_numpy((rng.random((rows, LENGTH)) < 0.8).astype(np.float32))
    group = np.arange(rows) // 8
    traj = group * 4 + (np.arange(rows) % 8) // 3
    group[SWITCH_ROWS:] = group[SWITCH_ROWS - 1] + 1
    return rewards, mask, group, traj


@pytest.mark.parametrize(
    "estimator, traj_score",
    [("grpo", "mean"), ("grpo", None), ("rloo", "sum"), ("opo", "last"), ("drgrpo", "max")],
)
def test_small_and_large_paths_agree_around_the_switch(estimator, traj_score):
    """The same rows through the small path (SWITCH_ROWS rows) and the large one (one row more,
    in a group of its own): bit for bit the same advantages for every shared row."""
    assert is_small(SWITCH_ROWS, LENGTH) and not is_small(SWITCH_ROWS + 1, LENGTH)
    rewards, mask, group, traj = batch(SWITCH_ROWS + 1)
    if traj_score is None:  # every row of a trajectory carries its first row's score
        first = {}
        for row, key in enumerate(zip(group.tolist(), traj.tolist(), strict=True)):
            first.setdefault(key, row)
        rewards = rewards[[first[key] for key in zip(group.tolist(), traj.tolist(), strict=True)]]
    strings = np.array([f"t{t}" for t in traj], dtype=object)
    for traj_index in (torch.from_numpy(traj), strings):
        kwargs = {"estimator": estimator, "traj_score": traj_score}
        large = compute_advantage(rewards, mask, group, traj_index, **kwargs)[0]
        n = SWITCH_ROWS
        small = compute_advantage(rewards[:n], mask[:n], group[:n], traj_index[:n], **kwargs)[0]
        assert torch.equal(small, large[:n])
        assert bool((small != 0).any())


def test_drop_in_small_and_large_paths_agree():
    """verl's drop-in (each row's own score) through both paths: the same advantages."""
    rewards, mask, group, traj = batch(SWITCH_ROWS + 1)
    large = compute_grpo_outcome_advantage(rewards, mask, group, traj)[0]
    n = SWITCH_ROWS
    small = compute_grpo_outcome_advantage(rewards[:n], mask[:n], group[:n], traj[:n])[0]
    assert torch.equal(small, large[:n])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_call_leaves_the_thread_count_as_it_was(threads):
    """Neither path changes torch's intra-op thread count, whatever the caller set."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for rows in (SWITCH_ROWS, SWITCH_ROWS + 1):
            rewards, mask, group, traj = batch(rows)
            compute_advantage(rewards, mask, group, traj, traj_score="mean")
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)

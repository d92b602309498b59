"""An agent's rows for GiGPO's tests (:class:`gigpo_reference.GigpoRow`), drawn with a seed."""

from __future__ import annotations

import numpy as np
from gigpo_reference import GigpoRow


def agent_rows(seed: int, groups: int = 3, n: int = 3) -> list[GigpoRow]:
    """verl-agent's rows in collection order: each trajectory's steps in turn order, its
    episode score on every row, anchors drawn from four states (colliding across
    trajectories), per-step rewards."""
    rng = np.random.default_rng(seed)
    rows = []
    for group in range(groups):
        for rollout in range(n):
            score = float(rng.choice([0.0, 1.0]))
            for turn in range(int(rng.integers(1, 5))):
                anchor = int(rng.integers(0, 4))
                step = float(rng.choice([0.0, 0.5, 1.0]))
                rows.append(GigpoRow(group, group * n + rollout, turn, score, anchor, step))
    return rows

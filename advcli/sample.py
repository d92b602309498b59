"""A synthetic multi-turn rollout dump that shows the turn-level bias.

Built with numpy array operations (no loop over rows or trajectories), so millions of rows take
seconds. What makes it realistic:

- each prompt (``data_id``) has a difficulty; each rollout succeeds (reward 1) or fails (reward 0);
- failing trajectories tend to take more turns (an agent that is stuck keeps calling tools);
- every turn row carries its trajectory's outcome reward on its last generated token;
- a non-final turn's response ends with tool-observation tokens, masked out (mask 0);
- rows come in completion order, not grouped by prompt or trajectory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from advcli.dataset import atomic_output


def sample_table(
    groups: int = 64,
    rollouts: int = 8,
    max_turns: int = 6,
    tokens: int = 48,
    seed: int = 0,
) -> pa.Table:
    """A rollout dump of ``groups × rollouts`` trajectories, one row per turn.

    Parameters
    ----------
    groups, rollouts
        Prompts, and trajectories per prompt.
    max_turns
        Most turns a trajectory can take.
    tokens
        Mean response tokens per turn row (generated plus tool observation).
    seed
        Seed of the random generator; the same seed gives the same table.
    """
    rng = np.random.default_rng(seed)
    n_traj = groups * rollouts
    data_id = np.repeat(np.arange(groups, dtype=np.int64), rollouts)
    rollout_id = np.tile(np.arange(rollouts, dtype=np.int64), groups)

    difficulty = rng.beta(2.0, 2.0, size=groups)
    success = rng.random(n_traj) < np.repeat(difficulty, rollouts)
    # Failures keep going: more extra turns on average than successes.
    extra_turn_p = np.where(success, 0.2, 0.6)
    turns = 1 + rng.binomial(max_turns - 1, extra_turn_p)

    traj_of_row = np.repeat(np.arange(n_traj), turns)
    n_rows = len(traj_of_row)
    first_row_of_traj = np.cumsum(turns) - turns
    turn_index = np.arange(n_rows) - np.repeat(first_row_of_traj, turns)
    is_last_turn = turn_index == turns[traj_of_row] - 1

    # Row length: generated tokens, then (except on the last turn) the tool's observation.
    generated = rng.integers(max(1, tokens // 4), max(2, tokens // 2) + 1, size=n_rows)
    observation = np.where(is_last_turn, 0, rng.integers(0, tokens + 1, size=n_rows))
    length = generated + observation
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], length)
    mask = (position < np.repeat(generated, length)).astype(np.int8)
    rewards = np.zeros(offsets[-1], dtype=np.float32)
    rewards[offsets[:-1] + generated - 1] = success[traj_of_row].astype(np.float32)

    # Completion order: a trajectory starts at a random time; each turn takes about a unit of time.
    start = rng.random(n_traj) * max_turns
    finished_at = start[traj_of_row] + (turn_index + 1) * rng.uniform(0.8, 1.2, size=n_rows)
    order = np.argsort(finished_at, kind="stable")

    table = pa.table(
        {
            "data_id": data_id[traj_of_row],
            "rollout_id": rollout_id[traj_of_row],
            "turn_index": turn_index.astype(np.int32),
            "token_level_rewards": pa.LargeListArray.from_arrays(offsets, rewards),
            "response_mask": pa.LargeListArray.from_arrays(offsets, mask),
        }
    )
    return table.take(order)


def write_sample(output: Path, **options: int) -> pa.Table:
    """Write :func:`sample_table` to ``output`` (atomically) and return it."""
    table = sample_table(**options)
    with atomic_output(output) as partial:
        pq.write_table(table, partial, compression="zstd")
    return table

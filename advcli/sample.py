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
import pyarrow.compute
import pyarrow.parquet as pq

from advcli._runtime.process import available_memory, require_stdout
from advcli.errors import AdvcliError
from advcli.names import native_name
from advcli.read.inputs import STDIN
from advcli.write.atomic import atomic_output, check_output_path
from advcli.write.outputs import check_standard_output, staged_for_stdout


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

    # Completion order: a trajectory starts at a random time; each turn takes about a unit of time.
    start = rng.random(n_traj) * max_turns
    finished_at = start[traj_of_row] + (turn_index + 1) * rng.uniform(0.8, 1.2, size=n_rows)
    order = np.argsort(finished_at, kind="stable")

    # Put the per-row scalars in completion order first, then lay the token lists out in that
    # order: far cheaper than reordering millions of list elements afterwards.
    traj_of_row, turn_index, generated = traj_of_row[order], turn_index[order], generated[order]
    length = generated + observation[order]
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], length)
    mask = (position < np.repeat(generated, length)).astype(np.int8)
    rewards = np.zeros(offsets[-1], dtype=np.float32)
    rewards[offsets[:-1] + generated - 1] = success[traj_of_row].astype(np.float32)

    return pa.table(
        {
            "data_id": data_id[traj_of_row],
            "rollout_id": rollout_id[traj_of_row],
            "turn_index": turn_index.astype(np.int32),
            "token_level_rewards": pa.LargeListArray.from_arrays(offsets, rewards),
            "response_mask": pa.LargeListArray.from_arrays(offsets, mask),
        }
    )


# Groups generated (and written as one Parquet row group) at a time: bounds memory for dumps of
# millions of rows and gives readers row groups to parallelize over.
GROUPS_PER_CHUNK = 8192


def write_sample(
    output: Path, *, groups: int = 64, seed: int = 0, force: bool = False, **options: int
) -> int:
    """Write a sample dump of ``groups`` prompts to ``output`` (atomically); return its row count.

    Groups are generated in chunks of :data:`GROUPS_PER_CHUNK`, each with its own seed derived from
    ``seed``, so millions of rows take seconds and bounded memory. A dump of at most one chunk is
    exactly :func:`sample_table` with the same arguments. ``-`` is standard output (not a
    terminal), which gets the file once it is whole.
    """
    check_standard_output({"the sample": output}, binary={"the sample"})
    if str(output) == STDIN:
        require_stdout("the sample")
    else:
        check_output_path(output, force=force)
    # The largest chunk's token lists (rewards and mask, ~12 bytes a token with offsets) must fit
    # in memory: refuse up front rather than be killed half-way.
    chunk_tokens = (
        min(groups, GROUPS_PER_CHUNK)
        * options.get("rollouts", 8)
        * (options.get("max_turns", 6) * options.get("tokens", 48))
    )
    needed, available = chunk_tokens * 12, available_memory()
    if needed > available:
        raise AdvcliError(
            f"{output}: a chunk of {min(groups, GROUPS_PER_CHUNK):,} prompts could need "
            f"{needed / 2**30:,.1f} GiB of memory ({available / 2**30:,.1f} GiB available); "
            "lower --rollouts, --max-turns or --tokens"
        )
    if str(output) == STDIN:
        with staged_for_stdout("sample.parquet") as staged:
            return _write_chunks(staged, groups, seed, options)
    with atomic_output(output, force=force) as partial:
        return _write_chunks(partial, groups, seed, options)


def _write_chunks(path: Path, groups: int, seed: int, options: dict[str, int]) -> int:
    """The sample's chunks as the row groups of one Parquet file at ``path``."""
    rows = 0
    with native_name(path) as target:
        writer: pq.ParquetWriter | None = None
        try:
            for chunk, first_group in enumerate(range(0, groups, GROUPS_PER_CHUNK)):
                size = min(GROUPS_PER_CHUNK, groups - first_group)
                table = sample_table(
                    groups=size, seed=seed if chunk == 0 else seed + 7919 * chunk, **options
                )
                table = table.set_column(
                    0, "data_id", pa.compute.add(table["data_id"], first_group)
                )
                if writer is None:
                    writer = pq.ParquetWriter(target, table.schema, compression="zstd")
                writer.write_table(table, row_group_size=table.num_rows)
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
    return rows

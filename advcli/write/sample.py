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

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from advcli._runtime.process import available_memory, require_stdout
from advcli.errors import AdvcliError
from advcli.names import native_name
from advcli.read.inputs import STDIN
from advcli.settings.config import SampleTrainer
from advcli.write.atomic import atomic_output, check_output_path
from advcli.write.outputs import check_standard_output, staged_for_stdout


class Episodes(NamedTuple):
    """The sample's trajectories and their rows, in trajectory order (each trajectory's turns
    in turn order, trajectories by prompt, then rollout)."""

    data_id: np.ndarray  # per trajectory
    rollout_id: np.ndarray  # per trajectory
    success: np.ndarray  # per trajectory
    traj_of_row: np.ndarray
    turn_index: np.ndarray
    is_last_turn: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.traj_of_row)


def _episodes(rng: np.random.Generator, groups: int, rollouts: int, max_turns: int) -> Episodes:
    """Each prompt's difficulty, each rollout's outcome and turn count: failures keep going."""
    n_traj = groups * rollouts
    data_id = np.repeat(np.arange(groups, dtype=np.int64), rollouts)
    rollout_id = np.tile(np.arange(rollouts, dtype=np.int64), groups)

    difficulty = rng.beta(2.0, 2.0, size=groups)
    success = rng.random(n_traj) < np.repeat(difficulty, rollouts)
    # Failures keep going: more extra turns on average than successes.
    extra_turn_p = np.where(success, 0.2, 0.6)
    turns = 1 + rng.binomial(max_turns - 1, extra_turn_p)

    traj_of_row = np.repeat(np.arange(n_traj), turns)
    first_row_of_traj = np.cumsum(turns) - turns
    turn_index = np.arange(len(traj_of_row)) - np.repeat(first_row_of_traj, turns)
    is_last_turn = turn_index == turns[traj_of_row] - 1
    return Episodes(data_id, rollout_id, success, traj_of_row, turn_index, is_last_turn)


def _token_columns(
    generated: np.ndarray, observation: np.ndarray, reward: np.ndarray
) -> dict[str, pa.Array]:
    """Each row's ``generated`` tokens (mask 1, ``reward`` on the last) then its ``observation``
    tokens (mask 0), as list columns laid out in the rows' order."""
    length = generated + observation
    offsets = np.zeros(len(length) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], length)
    mask = (position < np.repeat(generated, length)).astype(np.int8)
    rewards = np.zeros(offsets[-1], dtype=np.float32)
    rewards[offsets[:-1] + generated - 1] = reward
    return {
        "token_level_rewards": pa.LargeListArray.from_arrays(offsets, rewards),
        "response_mask": pa.LargeListArray.from_arrays(offsets, mask),
    }


def sample_table(
    groups: int = 64,
    rollouts: int = 8,
    max_turns: int = 6,
    tokens: int = 48,
    seed: int = 0,
    turn_reward: float | None = None,
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
    turn_reward
        Per-turn rewards (``--reward-mode per-turn``): each turn before the last carries this
        reward of its own (a tool call's, say) and the last turn the outcome; None: every turn
        carries its trajectory's outcome.
    """
    rng = np.random.default_rng(seed)
    episodes = _episodes(rng, groups, rollouts, max_turns)
    traj_of_row, turn_index = episodes.traj_of_row, episodes.turn_index
    n_rows = episodes.rows

    # Row length: generated tokens, then (except on the last turn) the tool's observation.
    generated = rng.integers(max(1, tokens // 4), max(2, tokens // 2) + 1, size=n_rows)
    observation = np.where(episodes.is_last_turn, 0, rng.integers(0, tokens + 1, size=n_rows))

    # Completion order: a trajectory starts at a random time; each turn takes about a unit of time.
    start = rng.random(groups * rollouts) * max_turns
    finished_at = start[traj_of_row] + (turn_index + 1) * rng.uniform(0.8, 1.2, size=n_rows)
    order = np.argsort(finished_at, kind="stable")

    # Put the per-row scalars in completion order first, then lay the token lists out in that
    # order: far cheaper than reordering millions of list elements afterwards.
    reward = episodes.success[traj_of_row].astype(np.float32)
    if turn_reward is not None:
        reward = np.where(episodes.is_last_turn, reward, np.float32(turn_reward))
    traj_of_row, turn_index = traj_of_row[order], turn_index[order]
    return pa.table(
        {
            "data_id": episodes.data_id[traj_of_row],
            "rollout_id": episodes.rollout_id[traj_of_row],
            "turn_index": turn_index.astype(np.int32),
            **_token_columns(generated[order], observation[order], reward[order]),
        }
    )


class StepOptions(NamedTuple):
    """The verl-agent sample's GiGPO knobs (:func:`verl_agent_table`)."""

    anchor_share: float = 0.5
    invalid_rate: float = 0.1


# The token ids of the verl-agent sample's responses are drawn from this many.
VOCABULARY = 32_000
# verl-agent's invalid_action_penalty_coef (verl/trainer/config/ppo_trainer.yaml, on by
# default): apply_invalid_action_penalty subtracts it from an invalid step's score.
INVALID_ACTION_PENALTY = 0.1


def verl_agent_table(
    groups: int = 64,
    rollouts: int = 8,
    max_turns: int = 6,
    tokens: int = 48,
    seed: int = 0,
    *,
    anchor_share: float = 0.5,
    invalid_rate: float = 0.1,
    first_group: int = 0,
) -> pa.Table:
    """A verl-agent batch of ``groups × rollouts`` trajectories, one row per environment step,
    with GiGPO's columns.

    As verl-agent's ``gather_rollout_data`` lays it out: env slot by env slot (a prompt's
    ``rollouts`` slots together), each slot's steps in order, no turn column. ``uid`` and
    ``traj_uid`` are uuid4 strings; ``anchor_obs`` is the step's observation text: a prompt's
    start state is shared by all its rollouts, a later state is one of two shared per turn with
    probability ``anchor_share`` (else the rollout's own), and after an invalid action the state
    stays as it was (revisited). ``rewards`` is the step's environment reward (1 on a success's
    last step); ``is_action_valid`` is false with probability ``invalid_rate`` (never on the
    step that wins); each row's ``token_level_rewards`` holds the episode's reward on its last
    response token, less :data:`INVALID_ACTION_PENALTY` where its action was invalid, as
    verl-agent's ``EpisodeRewardManager`` and ``apply_invalid_action_penalty`` make it; every
    response token is generated (the observation is the next step's prompt), and ``responses``
    holds their ids. ``first_group`` numbers the prompts in the observations.
    """
    rng = np.random.default_rng(seed)
    episodes = _episodes(rng, groups, rollouts, max_turns)
    traj_of_row, n_rows = episodes.traj_of_row, episodes.rows
    generated = rng.integers(max(1, tokens // 2), max(2, tokens * 3 // 2) + 1, size=n_rows)
    success = episodes.success[traj_of_row]
    # The step that wins is a valid action.
    valid = (rng.random(n_rows) >= invalid_rate) | (success & episodes.is_last_turn)
    score = success - INVALID_ACTION_PENALTY * ~valid
    group_uid = _uuid4(rng, groups)
    columns = {
        "uid": group_uid.take(pa.array(episodes.data_id[traj_of_row])),
        "traj_uid": _uuid4(rng, groups * rollouts).take(pa.array(traj_of_row)),
        "anchor_obs": _anchors(rng, episodes, valid, anchor_share, first_group),
        "rewards": (success & episodes.is_last_turn).astype(np.float32),
        "is_action_valid": valid,
        **_token_columns(generated, np.zeros(n_rows, dtype=np.int64), score),
    }
    # The response's token ids, by which a padding copy is told from a step alike in score.
    offsets = columns["response_mask"].offsets
    ids = rng.integers(0, VOCABULARY, size=int(offsets[-1].as_py()), dtype=np.int32)
    columns["responses"] = pa.LargeListArray.from_arrays(offsets, ids)
    return pa.table(columns)


def _anchors(
    rng: np.random.Generator,
    episodes: Episodes,
    valid: np.ndarray,
    share: float,
    first_group: int,
) -> pa.Array:
    """Each step's observation text (see :func:`verl_agent_table`)."""
    turn, n_rows = episodes.turn_index, episodes.rows
    # A new state at a trajectory's start and after a valid action; else the previous one.
    new = turn == 0
    new[1:] |= valid[:-1]
    state_row = np.maximum.accumulate(np.where(new, np.arange(n_rows), 0))
    shared = rng.random(n_rows) < share
    branch = rng.integers(0, 2, size=n_rows)
    turn, shared, branch = turn[state_row], shared[state_row], branch[state_row]
    rollout = episodes.rollout_id[episodes.traj_of_row][state_row]
    words = pc.if_else(
        pa.array(turn == 0),
        "the start",
        pc.if_else(
            pa.array(shared),
            pc.binary_join_element_wise(
                "room ", _text(turn), pc.if_else(pa.array(branch == 1), "b", "a"), ""
            ),
            pc.binary_join_element_wise("rollout ", _text(rollout), "'s room ", _text(turn), ""),
        ),
    )
    prompt = _text(episodes.data_id[episodes.traj_of_row] + first_group)
    return pc.binary_join_element_wise("task ", prompt, ": you are in ", words, "")


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _uuid4(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` uuid4 strings from ``rng`` (``str(uuid.uuid4())``'s form, seeded)."""
    octets = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    octets[:, 6] = (octets[:, 6] & 0x0F) | 0x40  # version 4
    octets[:, 8] = (octets[:, 8] & 0x3F) | 0x80  # the RFC 4122 variant
    nibbles = np.stack([octets >> 4, octets & 0x0F], axis=-1).reshape(n, 32)
    text = np.full((n, 36), ord("-"), dtype=np.uint8)
    digits = [i for i in range(36) if i not in (8, 13, 18, 23)]
    text[:, digits] = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[nibbles]
    return pc.cast(pa.array(text.view("S36").ravel()), pa.string())


# Groups generated (and written as one Parquet row group) at a time: bounds memory for dumps of
# millions of rows and gives readers row groups to parallelize over.
GROUPS_PER_CHUNK = 8192


def write_sample(
    output: Path,
    *,
    groups: int = 64,
    seed: int = 0,
    force: bool = False,
    trainer: SampleTrainer = SampleTrainer.ADVCLI,
    steps: StepOptions | None = None,
    turn_reward: float | None = None,
    **options: int,
) -> int:
    """Write a sample dump of ``groups`` prompts to ``output`` (atomically); return its row count.

    Groups are generated in chunks of :data:`GROUPS_PER_CHUNK`, each with its own seed derived from
    ``seed``, so millions of rows take seconds and bounded memory. A dump of at most one chunk is
    exactly :func:`sample_table` (``trainer`` verl-agent: :func:`verl_agent_table`, with
    ``steps``; else with ``turn_reward``) with the same arguments. ``-`` is standard output
    (not a terminal), which gets the file once it is whole.
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

    def chunk_table(size: int, chunk_seed: int, first_group: int) -> pa.Table:
        if trainer is SampleTrainer.VERL_AGENT:
            knobs = steps or StepOptions()
            return verl_agent_table(
                groups=size,
                seed=chunk_seed,
                anchor_share=knobs.anchor_share,
                invalid_rate=knobs.invalid_rate,
                first_group=first_group,
                **options,
            )
        table = sample_table(groups=size, seed=chunk_seed, turn_reward=turn_reward, **options)
        return table.set_column(0, "data_id", pc.add(table["data_id"], first_group))

    if str(output) == STDIN:
        with staged_for_stdout("sample.parquet") as staged:
            return _write_chunks(staged, groups, seed, chunk_table)
    with atomic_output(output, force=force) as partial:
        return _write_chunks(partial, groups, seed, chunk_table)


def _write_chunks(
    path: Path, groups: int, seed: int, chunk_table: Callable[[int, int, int], pa.Table]
) -> int:
    """The sample's chunks, ``chunk_table(size, seed, first group)``, as the row groups of one
    Parquet file at ``path``."""
    rows = 0
    with native_name(path) as target:
        writer: pq.ParquetWriter | None = None
        try:
            for chunk, first_group in enumerate(range(0, groups, GROUPS_PER_CHUNK)):
                size = min(GROUPS_PER_CHUNK, groups - first_group)
                table = chunk_table(size, seed if chunk == 0 else seed + 7919 * chunk, first_group)
                if writer is None:
                    writer = pq.ParquetWriter(target, table.schema, compression="zstd")
                writer.write_table(table, row_group_size=table.num_rows)
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
    return rows

"""Each trainer's batch, built with torch the way the trainer fills it and written to Parquet the
natural way, read by `compute`, `compare` and `inspect` with no column options.

The facts come from docs/reference/trainer-sources.md (the source file each test names is the
one read there). Expected advantages come from tests/reference.py, never from advcli.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages

torch = pytest.importorskip("torch")

SEED = 1234
WIDTH = 32  # the padded response length L
GROUP_SIZES = (4, 3, 1, 5, 2)  # group 1 scores all alike (zero std), group 2 is a singleton
ADVCLI = [sys.executable, "-m", "advcli"]
ROLES = ("group", "trajectory", "turn", "reward", "mask")


def role_map(*columns: str | None) -> dict[str, str | None]:
    """The column inspect should report for each role, in ROLES order."""
    return dict(zip(ROLES, columns, strict=True))


def write_batch(path: Path, batch: dict[str, Any]) -> Path:
    """A batch as Parquet, the natural way: (B, L) tensors as fixed-size Array columns (bf16 as
    float32), 1-D arrays as plain columns, object arrays by the type of what they hold."""
    series = []
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        if value.dtype == object:
            value = np.array(value.tolist())
        series.append(pl.Series(name, value))
    pl.DataFrame(series).write_parquet(path)
    return path


@dataclass
class Traj:
    group: int  # the group's number in the plan
    rollout: int  # the rollout's number in its group
    turns: int
    reward: float
    segments: list[tuple[int, int]]  # per turn: (LLM tokens, tool tokens after it)


def plan(rng: np.random.Generator, sizes: tuple[int, ...] = GROUP_SIZES) -> list[Traj]:
    """Trajectories of 1..4 turns (every count present) in groups of ``sizes``."""
    total = sum(sizes)
    turn_counts = rng.permutation([i % 4 + 1 for i in range(total)])
    trajs = []
    for g, size in enumerate(sizes):
        rewards = [1.0] * size if g == 1 else rng.uniform(0, 1, size).round(2).tolist()
        for r in range(size):
            turns = int(turn_counts[len(trajs)])
            segs = [
                (int(rng.integers(2, 5)), int(rng.integers(1, 3)) if t < turns - 1 else 0)
                for t in range(turns)
            ]
            trajs.append(Traj(g, r, turns, float(rewards[r]), segs))
    return trajs


def new_uuid(rng: np.random.Generator) -> uuid.UUID:
    return uuid.UUID(bytes=rng.bytes(16), version=4)


def mask_of(segs: list[tuple[int, int]]) -> tuple[torch.Tensor, int]:
    """A right-padded response mask: 1 on LLM tokens, 0 on tool tokens and padding; and the
    position of the last valid response token."""
    mask = torch.zeros(WIDTH, dtype=torch.int64)
    pos = 0
    for llm, tool in segs:
        mask[pos : pos + llm] = 1
        pos += llm + tool
    return mask, pos - segs[-1][1] - 1


def at(value: float, last: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Token rewards: ``value`` on position ``last``, 0 elsewhere."""
    out = torch.zeros(WIDTH, dtype=dtype)
    out[last] = value
    return out


def stored(value: float, dtype: torch.dtype = torch.float32) -> float:
    """The value as the trainer's tensor holds it."""
    return torch.tensor(value, dtype=dtype).item()


def append(cols: dict[str, list], **values: Any) -> None:
    """Add one row's values to the per-column lists."""
    for key, value in values.items():
        cols.setdefault(key, []).append(value)


def ids(values: list[Any]) -> np.ndarray:
    """A numpy object array, as verl's collate_fn makes non-tensor fields."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@dataclass
class Case:
    batch: dict[str, Any]
    roles: dict[str, str | None]
    rows: list[tuple[Any, Any, int, float, int]]  # reference rows: group, traj, turn, score, tokens
    mask: np.ndarray  # the trainable mask, (B, L)
    flags: tuple[str, ...] = ()
    traj_score: str | None = None


# Names that say "trajectory" (written here from the README's rule, not taken from advcli).
TRAJECTORY_NAME = re.compile(
    r"(traj|trajectory|rollout|episode|session|conversation|convo|dialog|dialogue)"
    r"(id|ids|idx|index|uuid|uid|key|no|num|number)?"
)


def assert_nothing_contradicts_one_row_a_trajectory(dump: Path, group: str | None) -> None:
    """A dump read one row a trajectory has no trajectory-named column whose values repeat
    within a group (checked in plain Python over the file's rows)."""
    frame = pl.read_parquet(dump)
    groups = frame[group].to_list() if group is not None else [0] * frame.height
    for name in frame.columns:
        if not TRAJECTORY_NAME.fullmatch(re.sub(r"[^a-z0-9]", "", name.lower())):
            continue
        values = frame[name].to_list()
        if len(set(values)) > 1:
            assert len(set(zip(groups, values, strict=True))) == frame.height, name


def check_trainer(case: Case, run: Callable, tmp_path: Path) -> None:
    """compute, compare and inspect on the dump, with ``case.flags`` only."""
    dump = write_batch(tmp_path / "dump.parquet", case.batch)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, *case.flags)
    assert result.exit_code == 0, result.stderr

    # inspect reads every trajectory by its first row: it takes no --traj-score.
    inspected = run("inspect", dump, "--json", *(case.flags if case.traj_score is None else ()))
    assert inspected.exit_code == 0, inspected.stderr
    columns = json.loads(inspected.stdout)["columns"]
    assert {role: columns[role]["column"] for role in ROLES} == case.roles
    if columns["trajectory"]["column"] is None:
        assert_nothing_contradicts_one_row_a_trajectory(dump, columns["group"]["column"])

    report_path = tmp_path / "r.json"
    compared = run("compare", dump, "--json", report_path, *case.flags)
    assert compared.exit_code == 0, compared.stderr
    counts = json.loads(report_path.read_text())["counts"]
    assert counts["rows"] == len(case.rows)
    assert counts["groups"] == len({row[0] for row in case.rows})
    assert counts["trajectories"] == len({(row[0], row[1]) for row in case.rows})
    assert counts["tokens"] == int(case.mask.sum())

    expected = np.array(
        reference_advantages(
            case.rows, level="trajectory", estimator="grpo", traj_score=case.traj_score
        )
    )
    frame = pl.read_parquet(out)
    assert frame.height == len(case.rows)
    np.testing.assert_allclose(frame["advantage"].to_numpy(), expected, rtol=0, atol=1e-5)
    assert frame["advantages"].dtype == pl.Array(pl.Float32, WIDTH)
    tokens = frame["advantages"].to_numpy()
    assert np.all(tokens[case.mask == 0] == 0)
    np.testing.assert_allclose(tokens, case.mask * expected[:, None], rtol=0, atol=1e-5)


def agent_lightning(level: str) -> Case:
    rng = np.random.default_rng(SEED)
    data_ids = [str(new_uuid(rng)) for _ in GROUP_SIZES]
    cols: dict[str, list] = {}
    rows = []
    for traj in plan(rng):
        rollout_id = new_uuid(rng).hex
        score = stored(traj.reward, torch.bfloat16)
        # transition: one row per LLM call; trajectory: turns merged two by two into one row.
        step = 1 if level == "transition" else 2
        for turn, start in enumerate(range(0, traj.turns, step)):
            segs = traj.segments[start : start + step]
            if level == "transition":
                mask, last = mask_of([(segs[0][0], 0)])  # verl's compute_response_mask
            else:
                mask, last = mask_of([*segs[:-1], (segs[-1][0], 0)])
            scores = at(traj.reward, last, torch.bfloat16)
            append(cols, data=data_ids[traj.group], rollout=rollout_id, turn=turn, mask=mask)
            append(cols, scores=scores)
            rows.append((traj.group, rollout_id, turn, score, int(mask.sum())))
    batch = {
        "data_id_list": np.array(cols["data"]),  # <U36
        "rollout_id_list": np.array(cols["rollout"]),  # <U32
        "uid": np.array(cols["data"]),
        "token_level_scores": torch.stack(cols["scores"]),
        "response_mask": torch.stack(cols["mask"]),
        "is_drop_mask": torch.zeros(len(rows), dtype=torch.bool),
    }
    assert batch["data_id_list"].dtype == "<U36" and batch["rollout_id_list"].dtype == "<U32"
    turn_col = None
    if level == "transition":
        batch["turn_index_list"] = np.array(cols["turn"], dtype=np.int64)
        turn_col = "turn_index_list"
    roles = role_map(
        "data_id_list", "rollout_id_list", turn_col, "token_level_scores", "response_mask"
    )
    return Case(batch, roles, rows, batch["response_mask"].numpy())


def test_agent_lightning_transition_level(run, tmp_path):
    """agent-lightning 1.0.2 (agentlightning/verl/rollout_adapter.py, trainer.py): at transition
    level one row per LLM call, data_id_list / rollout_id_list as numpy unicode, turn_index_list,
    uid a copy of data_id_list, the rollout's final reward in bf16 token_level_scores on every
    row's last response token."""
    check_trainer(agent_lightning("transition"), run, tmp_path)


def test_agent_lightning_trajectory_level(run, tmp_path):
    """agent-lightning 1.0.2 (agentlightning/verl/rollout_adapter.py; verl/config.yaml defaults to
    level: trajectory): merged turns in one row with 0 on observation tokens, no turn_index_list."""
    check_trainer(agent_lightning("trajectory"), run, tmp_path)


def per_step_case(rng: np.random.Generator, trainer: str) -> Case:
    """verl-agent and rLLM AgentPPOTrainer: one row per env step, a single-turn response each,
    the trajectory's reward on every step's last token."""
    group_ids = [str(new_uuid(rng)) for _ in GROUP_SIZES]
    cols: dict[str, list] = {}
    rows = []
    for index, traj in enumerate(plan(rng)):
        traj_id = str(new_uuid(rng)) if trainer == "verl-agent" else index
        steps = rng.dirichlet(np.ones(traj.turns)) * traj.reward  # per-step env rewards
        for turn, (llm, _) in enumerate(traj.segments):
            mask, last = mask_of([(llm, 0)])
            uid = group_ids[traj.group]
            append(cols, uid=uid, traj=traj_id, scores=at(traj.reward, last), mask=mask)
            append(cols, rewards=float(steps[turn]), episode_rewards=np.float32(traj.reward))
            append(cols, step_ids=f"{uid}_step{turn}", is_last_step=turn == traj.turns - 1)
            rows.append((traj.group, traj_id, turn, stored(traj.reward), llm))
    scores = torch.stack(cols["scores"])
    batch: dict[str, Any] = {"uid": ids(cols["uid"])}
    if trainer == "verl-agent":
        batch |= {
            "traj_uid": ids(cols["traj"]),
            "rewards": ids(cols["rewards"]),
            "episode_rewards": ids(cols["episode_rewards"]),
            "active_masks": ids([True] * len(rows)),
            "token_level_scores": scores,
            "token_level_rewards": scores.clone(),
        }
        trajectory, reward = "traj_uid", "token_level_rewards"
    else:
        batch |= {
            "idxs": np.array(cols["traj"]),
            "step_ids": ids(cols["step_ids"]),
            "is_last_step": np.array(cols["is_last_step"]),
            "token_level_scores": scores,
            "mc_returns": scores.clone(),
        }
        trajectory, reward = "idxs", "token_level_scores"
    batch["response_mask"] = torch.stack(cols["mask"])
    roles = role_map("uid", trajectory, None, reward, "response_mask")
    return Case(batch, roles, rows, batch["response_mask"].numpy())


def test_verl_agent(run, tmp_path):
    """verl-agent (agent_system/multi_turn_rollout/rollout_loop.py, reward_manager/episode.py):
    one row per step, uid / traj_uid object arrays of uuid4 strings, per-step `rewards`, the
    episode reward at the last valid token of every row in token_level_scores/_rewards."""
    check_trainer(per_step_case(np.random.default_rng(SEED), "verl-agent"), run, tmp_path)


def test_rllm_agent_ppo_trainer_stepwise(run, tmp_path):
    """rLLM AgentPPOTrainer (rllm/trainer/verl/agent_ppo_trainer.py, _transform_agent_steps):
    uid per prompt, idxs the int trajectory index, step_ids "{uid}_step{i}", is_last_step, the
    trajectory reward on every step's last token of token_level_scores."""
    check_trainer(per_step_case(np.random.default_rng(SEED), "rllm-5c"), run, tmp_path)


def one_row_case(rng: np.random.Generator, trainer: str) -> Case:
    """verl classic, rLLM's newest transform, OpenRLHF, TRL: a whole multi-turn trajectory in
    one right-padded row, tool tokens masked out."""
    torch.manual_seed(SEED)
    sizes = GROUP_SIZES if trainer in ("verl", "rllm") else (4, 4, 4)
    trajs = plan(rng, sizes)
    group_ids = [str(new_uuid(rng)) for _ in sizes]
    masks, lasts = zip(*(mask_of(t.segments) for t in trajs), strict=True)
    mask = torch.stack(masks)
    rewards = [t.reward for t in trajs]
    token_rewards = torch.stack([at(r, last) for r, last in zip(rewards, lasts, strict=True)])
    B = len(trajs)
    if trainer == "verl":
        batch: dict[str, Any] = {
            "uid": ids([group_ids[t.group] for t in trajs]),
            "__num_turns__": np.array([t.turns for t in trajs], dtype=np.int32),
            "responses": torch.randint(0, 32000, (B, WIDTH)) * mask,
            "token_level_scores": token_rewards,
            "token_level_rewards": token_rewards.clone(),
            "response_mask": mask,
        }
        roles = ("uid", None, None, "token_level_rewards", "response_mask")
        keys = [(t.group, i) for i, t in enumerate(trajs)]
    elif trainer == "rllm":
        # Groups 0 and 1 are two roles of one task: the same episode ids, two groups.
        tasks = [group_ids[0] if t.group == 1 else group_ids[t.group] for t in trajs]
        role = ["judge" if t.group == 1 else "solver" for t in trajs]
        episodes = [f"{task}:{t.rollout}" for task, t in zip(tasks, trajs, strict=True)]
        batch = {
            "episode_ids": ids(episodes),
            "trajectory_ids": ids([f"{a}_{b}" for a, b in zip(tasks, role, strict=True)]),
            "step_ids": ids([str(new_uuid(rng)) for _ in trajs]),
            "is_last_step": np.ones(B, dtype=bool),
            "traj_rewards": token_rewards,
            "step_rewards": torch.zeros(B, WIDTH),
            "response_mask": mask,
        }
        roles = ("trajectory_ids", "episode_ids", None, "traj_rewards", "response_mask")
        keys = [(t.group, e) for t, e in zip(trajs, episodes, strict=True)]
    elif trainer == "openrlhf":
        batch = {
            "index": np.arange(B),
            "rewards": torch.tensor(rewards, dtype=torch.float32),
            "scores": torch.tensor(rewards, dtype=torch.float32) - 0.5,
            "action_mask": mask,
            "response_length": mask.sum(-1),
            "total_length": mask.sum(-1) + 7,
        }
        roles = (None, None, None, "rewards", "action_mask")
        keys = [(i // 4, i) for i in range(B)]
    else:  # TRL: the completion mask is right padding only; tool_mask zeroes the tool results
        completion_mask = (torch.arange(WIDTH) <= torch.tensor(lasts)[:, None]).long()
        batch = {
            "prompt_ids": torch.randint(0, 32000, (B, 8)),
            "completion_ids": torch.randint(0, 32000, (B, WIDTH)) * completion_mask,
            "completion_mask": completion_mask,
            "tool_mask": mask + (1 - completion_mask),
            "rewards": torch.tensor(rewards, dtype=torch.float32),
            "advantages": torch.zeros(B),  # TRL's own scalar per completion
        }
        roles = (None, None, None, "rewards", "completion_mask")
        keys = [(i // 4, i) for i in range(B)]
        mask = completion_mask
    rows = [
        (g, tr, 0, stored(t.reward), int(m.sum()))
        for (g, tr), t, m in zip(keys, trajs, mask, strict=True)
    ]
    flags = ("--group-size", "4") if trainer in ("openrlhf", "trl") else ()
    return Case(batch, role_map(*roles), rows, mask.numpy(), flags)


def test_verl_classic(run, tmp_path):
    """verl 0.9.1 classic agent loop (verl/experimental/agent_loop/agent_loop.py,
    verl/trainer/ppo/ray_trainer.py): one row per whole trajectory, uid an object array of uuid4
    strings shared by a prompt's rollouts, the reward on the last valid token of
    token_level_scores/_rewards, response_mask 0 on tool tokens."""
    check_trainer(one_row_case(np.random.default_rng(SEED), "verl"), run, tmp_path)


def test_rllm_newest_transform(run, tmp_path):
    """rLLM (rllm/trainer/verl/transform.py @0515808): one prefix-merged row per trajectory;
    trajectory_ids "{task_id}_{role}" is the GRPO group, episode_ids "{task_id}:{rollout_idx}"
    the trajectory (shared by a task's roles), the reward in traj_rewards."""
    check_trainer(one_row_case(np.random.default_rng(SEED), "rllm"), run, tmp_path)


def test_openrlhf(run, tmp_path):
    """OpenRLHF 0.11.2 (openrlhf/trainer/ppo_utils/experience.py, experience_maker.py): one row
    per episode, no group id (contiguous blocks of n_samples_per_prompt), a scalar `rewards`
    beside `scores`, action_mask (B, A) int64 with 0 between action spans."""
    check_trainer(one_row_case(np.random.default_rng(SEED), "openrlhf"), run, tmp_path)


def test_trl(run, tmp_path):
    """TRL 1.16.0 (trl/trainer/grpo_trainer.py): one row per completion in blocks of
    num_generations, completion_mask right-padded int64, scalar rewards, and TRL's own scalar
    `advantages` column, which the per-token output replaces."""
    check_trainer(one_row_case(np.random.default_rng(SEED), "trl"), run, tmp_path)


def skyrl_steps(rng: np.random.Generator) -> tuple[dict[str, list], list[tuple]]:
    """SkyRL's step-wise rows (the columns as lists, and the reference rows): uids
    str(dataset index), trajectory_ids "{instance_id}_{repetition_id}", each step's own reward
    (the outcome on the last step only), loss_mask the trainable tokens while response_mask
    covers the observation tokens too, is_last_step."""
    cols: dict[str, list] = {}
    rows = []
    for traj in plan(rng):
        uid = str(100 + traj.group)
        traj_id = f"{uid}_{traj.rollout}"
        for turn, (llm, tool) in enumerate(traj.segments):
            last_step = turn == traj.turns - 1
            reward = traj.reward if last_step else float(rng.choice([0.0, 0.2]))
            loss_mask = torch.zeros(WIDTH)
            loss_mask[:llm] = 1
            response_mask = torch.zeros(WIDTH, dtype=torch.int64)
            response_mask[: llm + tool] = 1
            append(cols, uids=uid, trajectory_ids=traj_id, rewards=at(reward, llm - 1))
            append(cols, loss_mask=loss_mask, response_mask=response_mask, is_last_step=last_step)
            rows.append((uid, traj_id, turn, stored(reward), llm))
    return cols, rows


def test_skyrl_stepwise(run, tmp_path):
    """skyrl-train 0.3.1 (skyrl_train/generators/base.py, the trainer's step-wise batch): uids
    str(dataset index), trajectory_ids "{instance_id}_{repetition_id}", per-step `rewards`
    (only the last step's is the outcome), loss_mask float32 the trainable mask while
    response_mask covers every response token, is_last_step; rows contiguous in step order.
    SkyRL's rule (the is_last_step row's reward) needs no --traj-score;
    tests/trainers/test_skyrl.py has its padding rows and skyrl 0.4.0."""
    cols, rows = skyrl_steps(np.random.default_rng(SEED))
    batch = {
        key: torch.stack(value) if isinstance(value[0], torch.Tensor) else np.array(value)
        for key, value in cols.items()
    }
    batch["is_last_step"] = torch.tensor(cols["is_last_step"])
    roles = role_map("uids", "trajectory_ids", None, "rewards", "loss_mask")
    case = Case(batch, roles, rows, batch["loss_mask"].numpy(), traj_score="last")
    check_trainer(case, run, tmp_path)


def test_verl_v1_multi_trajectory(run, tmp_path):
    """verl 0.9.1 v1 (verl/trainer/ppo/v1/agent_loop_tq.py, trainer_base.py): rows with the
    prompt's `uid` and an int `session_id` (0..n-1), one row per turn, the session's final reward
    copied onto every row's last token of rm_scores -> token_level_scores/_rewards; loss_mask =
    response_mask. Rows come back in no particular order (shuffled here)."""
    rng = np.random.default_rng(SEED)
    group_ids = [str(new_uuid(rng)) for _ in GROUP_SIZES]
    cols: dict[str, list] = {}
    rows = []
    for traj in plan(rng):
        for turn, (llm, _) in enumerate(traj.segments):
            mask, last = mask_of([(llm, 0)])
            append(cols, uid=group_ids[traj.group], session_id=traj.rollout, num_turns=traj.turns)
            append(cols, rm_scores=at(traj.reward, last), response_mask=mask)
            rows.append((traj.group, traj.rollout, turn, stored(traj.reward), llm))
    order = rng.permutation(len(rows))
    batch: dict[str, Any] = {
        "uid": ids([cols["uid"][i] for i in order]),
        "session_id": np.array(cols["session_id"])[order],
        "num_turns": np.array(cols["num_turns"])[order],
    }
    for name in ("rm_scores", "token_level_scores", "token_level_rewards"):
        batch[name] = torch.stack(cols["rm_scores"])[order]
    batch["response_mask"] = torch.stack(cols["response_mask"])[order]
    batch["loss_mask"] = batch["response_mask"].clone()
    rows = [rows[i] for i in order]
    roles = role_map("uid", "session_id", None, "token_level_rewards", "response_mask")
    check_trainer(Case(batch, roles, rows, batch["response_mask"].numpy()), run, tmp_path)


def error_line(result) -> str:
    """The one `Error:` line of a failed run."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def scalar_dump(tmp_path: Path, **extra: list) -> Path:
    columns = {"data_id": ["p", "p", "q"], "rollout_id": ["a", "b", "a"], **extra}
    return write_batch(tmp_path / "dump.parquet", {k: np.array(v) for k, v in columns.items()})


def test_two_trainers_at_once_is_an_error(run, tmp_path):
    """verl-agent's `traj_uid` and verl v1's `session_id` (trainers.md sections 1b and 2) each
    complete `uid` into a dialect of the same width: advcli must not pick one."""
    dump = write_batch(
        tmp_path / "dump.parquet",
        {
            "uid": ids(["u", "u"]),
            "traj_uid": ids(["t1", "t2"]),
            "session_id": np.array([0, 1]),
            "token_level_rewards": torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
            "response_mask": torch.ones(2, 2, dtype=torch.int64),
        },
    )
    line = error_line(run("compute", dump, "-o", tmp_path / "out.parquet"))
    assert "verl-agent" in line and "verl (v1 multi-trajectory)" in line


def test_two_reward_candidates_is_an_error(run, tmp_path):
    """advcli's own dialect (data_id / rollout_id) reads `score` or `reward`: both present is
    ambiguous."""
    dump = scalar_dump(tmp_path, score=[1.0, 0.0, 1.0], reward=[0.0, 1.0, 1.0])
    line = error_line(run("compute", dump, "-o", tmp_path / "out.parquet", "--no-tokens"))
    assert "'score'" in line and "'reward'" in line and "--reward-col" in line


def test_missing_trajectory_column_suggests_the_near_name(run, tmp_path):
    """A typo'd trajectory column gets a suggestion, not a silent row-per-trajectory reading."""
    dump = write_batch(
        tmp_path / "dump.parquet",
        {
            "data_id": np.array(["p", "p"]),
            "rolout_id": np.array(["a", "b"]),
            "score": np.array([1.0, 0.0]),
        },
    )
    line = error_line(run("inspect", dump))
    assert "did you mean 'rolout_id'" in line


def test_scalar_scores_without_a_mask(run, tmp_path):
    """OpenRLHF-like scalar rewards (trainers.md section 6) with no mask column: one advantage
    per row works, the per-token output cannot."""
    scores = [1.0, 0.0, 0.5]
    dump = scalar_dump(tmp_path, score=scores)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens")
    assert result.exit_code == 0, result.stderr
    rows = [("p", "a", 0, 1.0, 0), ("p", "b", 0, 0.0, 0), ("q", "a", 0, 0.5, 0)]
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(pl.read_parquet(out)["advantage"], expected, rtol=0, atol=1e-5)
    line = error_line(run("compute", dump, "-o", tmp_path / "tokens.parquet"))
    assert "pass --no-tokens" in line


@pytest.mark.process
def test_json_lines_on_stdin(tmp_path):
    """verl-agent rows (trainers.md section 2) as JSON lines piped into `compare -`."""
    records = [
        {"uid": g, "traj_uid": t, "token_level_rewards": [0.0, s], "response_mask": [1, 1]}
        for g, t, s in [("p", "a", 1.0), ("p", "a", 1.0), ("p", "b", 0.0), ("q", "c", 0.5)]
    ]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    result = subprocess.run(
        [*ADVCLI, "compare", "-", "--json", "-", "-q"],
        input=data,
        capture_output=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    counts = report["counts"]
    assert (counts["rows"], counts["groups"], counts["trajectories"]) == (4, 2, 3)
    # diff(τ) = a_traj(τ) - mean of τ's turn-level row advantages; 'a' has two rows.
    rows = [
        (r["uid"], r["traj_uid"], i, r["token_level_rewards"][1], 2) for i, r in enumerate(records)
    ]
    turn = reference_advantages(rows, level="turn", estimator="grpo")
    traj = reference_advantages(rows, level="trajectory", estimator="grpo")
    diffs = [traj[0] - (turn[0] + turn[1]) / 2, traj[2] - turn[2], traj[3] - turn[3]]
    assert abs(report["trajectories"]["advantage_diff_max"] - max(map(abs, diffs))) < 1e-9

"""Each trainer's batch, built with torch the way the trainer fills it and written to Parquet the
natural way, read by `compute`, `compare` and `inspect` with no column options.

The facts come from /work/research/trainers.md (the source file each test names is the one read
there). Expected advantages come from tests/reference.py, never from advcli.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from reference import reference_advantages

SEED = 1234
WIDTH = 32  # the padded response length L
GROUP_SIZES = (4, 3, 1, 5, 2)  # group 1 scores all alike (zero std), group 2 is a singleton
ADVCLI = [sys.executable, "-m", "advcli"]
ROLES = ("group", "trajectory", "turn", "reward", "mask")


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


def ids(values: list[Any]) -> np.ndarray:
    """A numpy object array, as verl's collate_fn makes non-tensor fields."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@dataclass
class Case:
    batch: dict[str, Any]
    roles: dict[str, str | None]
    rows: list[tuple[Any, Any, int, float, int]]  # the reference's (group, traj, turn, score, tokens)
    mask: np.ndarray  # the trainable mask, (B, L)
    flags: tuple[str, ...] = ()
    traj_score: str | None = None


def check_trainer(case: Case, run: Callable, tmp_path: Path) -> None:
    """compute, compare and inspect on the dump, with ``case.flags`` only."""
    dump = write_batch(tmp_path / "dump.parquet", case.batch)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, *case.flags)
    assert result.exit_code == 0, result.stderr

    inspected = run("inspect", dump, "--json", *case.flags)
    assert inspected.exit_code == 0, inspected.stderr
    columns = json.loads(inspected.stdout)["columns"]
    assert {role: columns[role]["column"] for role in ROLES} == case.roles

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
    cols: dict[str, list] = {k: [] for k in ("data", "rollout", "turn", "scores", "mask")}
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
                mask, last = mask_of(segs[:-1] + [(segs[-1][0], 0)])
            cols["data"].append(data_ids[traj.group])
            cols["rollout"].append(rollout_id)
            cols["turn"].append(turn)
            cols["scores"].append(at(traj.reward, last, torch.bfloat16))
            cols["mask"].append(mask)
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
    roles = dict(
        zip(ROLES, ("data_id_list", "rollout_id_list", turn_col, "token_level_scores", "response_mask"))
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
            values = {
                "uid": uid,
                "traj": traj_id,
                "scores": at(traj.reward, last),
                "mask": mask,
                "rewards": float(steps[turn]),
                "episode_rewards": np.float32(traj.reward),
                "step_ids": f"{uid}_step{turn}",
                "is_last_step": turn == traj.turns - 1,
            }
            for key, value in values.items():
                cols.setdefault(key, []).append(value)
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
    roles = dict(zip(ROLES, ("uid", trajectory, None, reward, "response_mask")))
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
        completion_mask = (mask.cumsum(-1) < mask.sum(-1, keepdim=True)).long()
        completion_mask[torch.arange(B), torch.tensor(lasts)] = 1
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
    return Case(batch, dict(zip(ROLES, roles)), rows, mask.numpy(), flags)

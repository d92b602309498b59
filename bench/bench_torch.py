"""Benchmark advcli.torch.compute_grpo_outcome_advantage (a script, not a test).

Two comparisons, each the median of several runs, the functions compared taking turns:

1. bs = 20,000 rows with uuid-string ids (about 8 rollouts per group, 1-8 turns per trajectory,
   rows shuffled), response_length 32: speed-up over a per-row Python loop of the same semantics
   (written below, in the style of the usual "dict of lists per id, loop over rows" proposal).
2. bs = 1,000,000 rows with int64 tensor ids, response_length 1 (so the per-token multiply does
   not dominate): our function without and with trajectory dedup, against a plain vectorized GRPO
   without dedup (one torch.unique(return_inverse=True) plus index_add_), written below.

Run from the repository root::

    python bench/bench_torch.py [--json PATH] [--repeats N] [--threads N]

On a shared machine, torch's intra-op threads wait for each other whenever another process
holds a core, which slows the (bs, response_length) sum and multiply of both sides by several
milliseconds each: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from advcli.torch import compute_grpo_outcome_advantage

ROLLOUTS_PER_GROUP = 8
MAX_TURNS = 8


def make_batch(
    bs: int, response_length: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """Rows of whole trajectories: group and trajectory numbers, shuffled (completion order).

    Returns rewards (score on the last token), mask, group numbers and trajectory numbers
    (rollout number within the group), as int64 numpy arrays.
    """
    rng = np.random.default_rng(seed)
    groups = bs // (ROLLOUTS_PER_GROUP * (1 + MAX_TURNS) // 2) + 1
    trajectories = groups * ROLLOUTS_PER_GROUP
    turns = rng.integers(1, MAX_TURNS + 1, trajectories)
    traj_of_row = np.repeat(np.arange(trajectories), turns)[:bs]
    if len(traj_of_row) < bs:  # pad with one-turn trajectories of extra groups
        extra = np.arange(trajectories, trajectories + bs - len(traj_of_row))
        traj_of_row = np.concatenate([traj_of_row, extra])
    order = rng.permutation(bs)
    traj_of_row = traj_of_row[order]
    group = traj_of_row // ROLLOUTS_PER_GROUP
    rollout = traj_of_row % ROLLOUTS_PER_GROUP
    score_of_traj = rng.choice([0.0, 0.5, 1.0], size=int(traj_of_row.max()) + 1)
    rewards = torch.zeros(bs, response_length)
    rewards[:, -1] = torch.from_numpy(score_of_traj[traj_of_row]).float()
    mask = torch.ones(bs, response_length)
    return rewards, mask, group, rollout


def loop_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    traj_index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    compute_mean_std_cross_all_data: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same semantics as advcli.torch, one row at a time (dict of lists per id)."""
    scores = token_level_rewards.to(torch.float64).sum(dim=-1)
    dedup = traj_index is not None and not compute_mean_std_cross_all_data
    id2score: dict[Any, list[torch.Tensor]] = defaultdict(list)
    id2mean: dict[Any, torch.Tensor] = {}
    id2std: dict[Any, torch.Tensor] = {}
    seen: set[tuple[Any, Any]] = set()
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            if dedup:
                pair = (index[i], traj_index[i])
                if pair in seen:
                    continue
                seen.add(pair)
            id2score[index[i]].append(scores[i])
        for idx, group_scores in id2score.items():
            if len(group_scores) == 1:
                id2mean[idx] = torch.tensor(0.0, dtype=torch.float64)
                id2std[idx] = torch.tensor(1.0, dtype=torch.float64)
                continue
            values = torch.stack(group_scores)
            if bool((values == values[0]).all()):
                id2mean[idx], id2std[idx] = values[0], torch.tensor(0.0, dtype=torch.float64)
            else:
                id2mean[idx], id2std[idx] = torch.mean(values), torch.std(values)
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        out = scores.to(torch.float32).unsqueeze(-1) * response_mask
    return out, out


def plain_vectorized_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: verl's GRPO (every row counts) vectorized in the plainest way, float32."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        unique, inverse = torch.unique(index, return_inverse=True)
        groups = unique.numel()
        count = torch.bincount(inverse, minlength=groups).to(scores.dtype)
        mean = scores.new_zeros(groups).index_add_(0, inverse, scores) / count
        centred = scores - mean.index_select(0, inverse)
        var = scores.new_zeros(groups).index_add_(0, inverse, centred * centred) / (count - 1)
        singleton = count == 1
        mean = torch.where(singleton, 0.0, mean)
        std = torch.where(singleton, 1.0, var.sqrt())
        advantage = (scores - mean.index_select(0, inverse)) / (
            std.index_select(0, inverse) + epsilon
        )
        out = advantage.unsqueeze(-1) * response_mask
    return out, out


def median_times(
    functions: dict[str, Callable[[], object]],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median time (seconds) of each function, runs interleaved, after one warm-up each: wall
    time, or by ``clock`` (``time.thread_time``: the calling thread's CPU time)."""
    for function in functions.values():
        function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = clock()
            function()
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def bench_loop(repeats: int) -> dict[str, Any]:
    bs, response_length = 20_000, 32
    rewards, mask, group, rollout = make_batch(bs, response_length, seed=0)
    group_uuid = np.array([str(uuid.UUID(int=int(g) + 1)) for g in range(group.max() + 1)])
    uid = group_uuid[group].astype(object)
    traj_uid = np.array(
        [
            str(uuid.uuid5(uuid.NAMESPACE_OID, f"{g}/{r}"))
            for g, r in zip(group, rollout, strict=True)
        ],
        dtype=object,
    )
    results: dict[str, Any] = {"bs": bs, "response_length": response_length, "rows": []}
    for label, cross in (("dedup (trajectory level)", False), ("no dedup (verl GRPO)", True)):

        def ours(cross: bool = cross) -> object:
            return compute_grpo_outcome_advantage(
                rewards, mask, uid, traj_uid, compute_mean_std_cross_all_data=cross
            )

        def loop(cross: bool = cross) -> object:
            return loop_grpo(rewards, mask, uid, traj_uid, compute_mean_std_cross_all_data=cross)

        diff = float((ours()[0] - loop()[0]).abs().max())  # type: ignore[index]
        times = median_times({"loop": loop, "ours": ours}, repeats)
        loop_time, ours_time = times["loop"], times["ours"]
        results["rows"].append(
            {
                "case": label,
                "loop_s": loop_time,
                "ours_s": ours_time,
                "speedup": loop_time / ours_time,
                "max_abs_diff": diff,
            }
        )
    return results


def bench_vectorized(repeats: int) -> dict[str, Any]:
    bs, response_length = 1_000_000, 1
    rewards, mask, group, rollout = make_batch(bs, response_length, seed=1)
    rng = np.random.default_rng(2)
    variants = {
        # Opaque 62-bit ids (e.g. hashes): factorized with one torch.unique.
        "data_id: random 62-bit ints": rng.integers(0, 2**62, group.max() + 1)[group],
        # Dataset row numbers of a 10M-prompt dataset: wider than the batch, narrower than int64.
        "data_id: indices < 10^7": rng.choice(10**7, group.max() + 1, replace=False)[group],
    }
    traj = torch.from_numpy(rollout)
    results: dict[str, Any] = {"bs": bs, "response_length": response_length, "rows": []}
    for label, ids in variants.items():
        index = torch.from_numpy(ids)
        functions: dict[str, Callable[[], object]] = {
            "baseline": lambda index=index: plain_vectorized_grpo(rewards, mask, index),
            "ours_no_dedup": lambda index=index: compute_grpo_outcome_advantage(
                rewards, mask, index, traj
            ),
            "ours_dedup": lambda index=index: compute_grpo_outcome_advantage(
                rewards, mask, index, traj, compute_mean_std_cross_all_data=False
            ),
        }
        base = functions["baseline"]()[0]  # type: ignore[index]
        ours = functions["ours_no_dedup"]()[0]  # type: ignore[index]
        diff = float((base - ours).abs().max())
        times = median_times(functions, repeats)
        results["rows"].append(
            {
                "case": label,
                "baseline_s": times["baseline"],
                "no_dedup_s": times["ours_no_dedup"],
                "dedup_s": times["ours_dedup"],
                "no_dedup_ratio": times["ours_no_dedup"] / times["baseline"],
                "dedup_ratio": times["ours_dedup"] / times["baseline"],
                "max_abs_diff_vs_baseline": diff,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also save the figures as JSON")
    parser.add_argument("--repeats", type=int, default=9, help="runs per measurement (median)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch.set_num_threads (default: left as torch sets it; the README's figures)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    machine = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": "cpu",
    }
    print(
        f"torch {machine['torch']}, {machine['cpus']} CPUs, {machine['torch_threads']} torch "
        f"threads, python {machine['python']}; median of interleaved runs\n"
    )

    loop = bench_loop(args.repeats)
    print(
        f"(1) vs a per-row Python loop: bs={loop['bs']:,}, uuid-string ids, "
        f"response_length={loop['response_length']} (target: >= 50x)"
    )
    print(f"{'case':<28}{'loop ms':>10}{'ours ms':>10}{'speed-up':>10}{'max |diff|':>12}")
    for row in loop["rows"]:
        print(
            f"{row['case']:<28}{row['loop_s'] * 1e3:>10.1f}{row['ours_s'] * 1e3:>10.2f}"
            f"{row['speedup']:>9.0f}x{row['max_abs_diff']:>12.1e}"
        )

    vectorized = bench_vectorized(args.repeats)
    print(
        f"\n(2) vs a plain vectorized GRPO (no dedup): bs={vectorized['bs']:,}, int64 tensor ids, "
        f"response_length={vectorized['response_length']} "
        "(targets: no dedup <= 1.3x, dedup <= 2.5x)"
    )
    print(
        f"{'case':<30}{'baseline ms':>12}{'no dedup ms':>12}{'ratio':>7}"
        f"{'dedup ms':>10}{'ratio':>7}"
    )
    for row in vectorized["rows"]:
        print(
            f"{row['case']:<30}{row['baseline_s'] * 1e3:>12.1f}{row['no_dedup_s'] * 1e3:>12.1f}"
            f"{row['no_dedup_ratio']:>6.2f}x{row['dedup_s'] * 1e3:>10.1f}"
            f"{row['dedup_ratio']:>6.2f}x"
        )

    if args.json:
        figures = {"machine": machine, "loop_20k": loop, "vectorized_1m": vectorized}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nsaved {args.json}")


if __name__ == "__main__":
    main()

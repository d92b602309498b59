"""Benchmark advcli.torch's per-turn rewards against its grpo on one batch (a script, not a test).

bs = 1,000,000 rows (bench_torch.make_batch: whole trajectories of 1-8 turns, 8 per group, rows
shuffled), int64 ids and turn index (bench_torch_gigpo.step_inputs, which also gives the anchor
ids), response_length 1 (the statistics alone) and 32. grpo runs at trajectory level with its
defaults; per-turn rewards (each row's token rewards summed) under every --step-groups entry of
advcli.rules.STEP_GROUPINGS at γ 1, and turn-padded at γ 0.95 (the doubling scan's passes).

Each figure is the median of interleaved runs. Run from the repository root::

    python bench/bench_torch_per_turn.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import make_batch, median_times
from bench_torch_gigpo import step_inputs

from advcli.settings.rules import STEP_GROUPINGS
from advcli.torch import compute_advantage


def bench(response_length: int, repeats: int) -> dict[str, float]:
    rewards, mask, group, rollout = make_batch(1_000_000, response_length, seed=1)
    index = torch.from_numpy(group)
    traj = torch.from_numpy(group * 8 + rollout)
    turn, anchor, _ = step_inputs(group, rollout, seed=2)

    def grpo() -> object:
        return compute_advantage(rewards, mask, index, traj, turn_index=turn)

    def per_turn(groups: str, gamma: float = 1.0) -> Callable[[], object]:
        anchors = {"anchor_index": anchor} if STEP_GROUPINGS[groups].anchors else {}

        def run() -> object:
            return compute_advantage(
                rewards,
                mask,
                index,
                traj,
                turn_index=turn,
                reward_mode="per-turn",
                step_groups=groups,
                gamma=gamma,
                **anchors,  # type: ignore[arg-type]
            )

        return run

    functions = {"grpo": grpo, **{groups: per_turn(groups) for groups in STEP_GROUPINGS}}
    functions["turn-padded γ 0.95"] = per_turn("turn-padded", 0.95)
    times = median_times(functions, repeats)
    return {name: value * 1e3 for name, value in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (median)")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} threads"
    )
    for response_length in (1, 32):
        times = bench(response_length, args.repeats)
        grpo = times.pop("grpo")
        figures = ", ".join(
            f"{name} {value:.0f} ms ({value / grpo:.2f}x)" for name, value in times.items()
        )
        print(
            f"bs 1,000,000, response_length {response_length}: grpo {grpo:.0f} ms; per-turn "
            f"{figures}"
        )


if __name__ == "__main__":
    main()

"""The trajectory choice for per-turn rewards against Trinity-RFT 0.6.0's own
``StepWiseGRPOAdvantageFn`` (``trinity/algorithm/advantage_fn/multi_step_grpo_advantage.py``):
each run's last step's reward is its score, normalized among its task's runs with the sample
std plus ε (a task of one run: mean 0, std 1), the result broadcast to every step. That is
advcli's trajectory level with ``--traj-score last``, on the same rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

pytestmark = pytest.mark.peers


def _rows(seed: int) -> list[tuple[int, int, int, float]]:
    """(task, run, step, reward) in turn order within each run; rewards on a grid of quarters,
    so sums and means of equal values are exact in float32 as in float64; one task of one run
    and one whose last rewards are all equal."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in range(6):
        for run in range(1 if task == 5 else 4):
            steps = int(rng.integers(1, 5))
            for step in range(steps):
                reward = 0.5 if task == 4 and step == steps - 1 else float(rng.integers(0, 5)) / 4
                rows.append((task, run, step, reward))
    return rows


@pytest.mark.parametrize("seed", [0, 1])
def test_trajectory_level_is_trinitys_step_wise_grpo(seed, run, tmp_path):
    pytest.importorskip("torch")
    module = pytest.importorskip("trinity.algorithm.advantage_fn.multi_step_grpo_advantage")
    experience = pytest.importorskip("trinity.common.experience")
    import torch

    rows = _rows(seed)
    exps = [
        experience.Experience(
            eid=experience.EID(task=task, run=run_id, step=step),
            tokens=torch.tensor([1, 2, 3]),
            prompt_length=1,
            reward=reward,
            action_mask=torch.tensor([1, 1]),
        )
        for task, run_id, step, reward in rows
    ]
    out, _ = module.StepWiseGRPOAdvantageFn(epsilon=1e-6).process(exps)
    theirs = {id(exp): float(exp.advantages[0]) for exp in out}
    expected = [theirs[id(exp)] for exp in exps]

    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    frame = pl.DataFrame(
        rows, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    )
    frame.sample(fraction=1.0, shuffle=True, seed=seed).write_parquet(source)
    result = run(
        "compute", source, "-o", output, "--no-tokens", "-q", "--level", "trajectory",
        "--traj-score", "last",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    got = frame.join(
        pl.read_parquet(output).select("data_id", "rollout_id", "turn_index", "advantage"),
        on=["data_id", "rollout_id", "turn_index"],
        how="left",
    )["advantage"].to_list()
    assert got == pytest.approx(expected, abs=1e-5)
    assert sum(a != 0 for a in expected) > len(expected) // 2  # not trivially 0

"""`compute --recipe R` against the independent plain-Python reference (tests/gigpo_reference.py)
on generated batches: every recipe gives its peer's numbers on the same rows.

The batches: 1-4 groups of 1-4 trajectories of 1-5 steps, each trajectory's outcome score on
every one of its rows (no penalty: the rows of a trajectory agree, where the trajectory-counting
rules coincide), step rewards and anchors drawn from small pools (anchors collide within a
trajectory, across trajectories and across groups), rows shuffled, the turn column giving the
order."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest
from gigpo_reference import GigpoRow, gigpo_recipe

SEEDS = range(12)

# (advcli's recipe and options, the reference's recipe and norm, γ)
PAIRS = [
    (("--recipe", "verl-agent"), "verl-agent upstream", "mean", 1.0),
    (
        ("--recipe", "verl-agent", "--gigpo-norm", "mean_std", "--gamma", "0.95"),
        "verl-agent upstream",
        "mean_std",
        0.95,
    ),
    (("--recipe", "verl-agent-trajectory"), "verl-agent with trajectory counting", "mean", 1.0),
    (
        ("--recipe", "verl-agent-trajectory", "--gigpo-norm", "mean_std", "--gamma", "0.9"),
        "verl-agent with trajectory counting",
        "mean_std",
        0.9,
    ),
    (("--recipe", "trinity"), "Trinity-RFT", "mean_one", 1.0),
    (
        ("--recipe", "trinity", "--gigpo-norm", "mean_std", "--gamma", "0.5"),
        "Trinity-RFT",
        "mean_std",
        0.5,
    ),
    (("--recipe", "roll"), "ROLL", "mean_std", 0.95),
]


def generated_rows(seed: int) -> list[GigpoRow]:
    rng = random.Random(seed)
    rows = []
    for group in range(rng.randint(1, 4)):
        for trajectory in range(rng.randint(1, 4)):
            score = rng.choice([0.0, 0.5, 1.0])
            for turn in range(rng.randint(1, 5)):
                anchor = rng.choice(["s0", "s1", "s2", "s3", f"g{group}"])
                rows.append(
                    GigpoRow(group, trajectory, turn, score, anchor, rng.choice([0.0, 0.25, 1.0]))
                )
    rng.shuffle(rows)
    return rows


def advcli_advantages(run, tmp_path: Path, rows: list[GigpoRow], options) -> list[float]:
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pl.DataFrame(
        {
            "data_id": [row.group for row in rows],
            "rollout_id": [row.trajectory for row in rows],
            "turn_index": [row.turn for row in rows],
            "score": [row.score for row in rows],
            "anchor": [row.anchor for row in rows],
            "step_reward": [row.step_reward for row in rows],
        }
    ).write_parquet(source)
    result = run("compute", source, "-o", output, "--no-tokens", "--force", "-q", *options)
    assert result.exit_code == 0, result.stderr
    return pl.read_parquet(output)["advantage"].to_list()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("options", "recipe", "norm", "gamma"), PAIRS, ids=[" ".join(p[0]) for p in PAIRS]
)
def test_each_recipe_gives_its_peers_numbers(options, recipe, norm, gamma, seed, run, tmp_path):
    rows = generated_rows(seed)
    expected = gigpo_recipe(rows, recipe, norm=norm, gamma=gamma)
    got = advcli_advantages(run, tmp_path, rows, options)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)

"""advcli.torch's gigpo against the independent reference (tests/gigpo_reference.py), against
the Polars path (`advcli compute --estimator gigpo` on the same rows written to Parquet) for
every recipe, and on the issue's worked case, computed here by hand."""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest
from gigpo_reference import GigpoRow, gigpo_recipe, step_returns
from test_gigpo_vs_reference import advcli_advantages

torch = pytest.importorskip("torch")

from advcli.errors import SettingsError  # noqa: E402
from advcli.torch import (  # noqa: E402
    RewardError,
    compute_advantage,
    compute_advantage_with_metrics,
)

EPS = 1e-6
SEEDS = range(8)
# (advcli.torch's keywords, the command line's options, the reference's recipe and norm, γ)
PAIRS = [
    ({"recipe": "verl-agent"}, ("--recipe", "verl-agent"), "verl-agent upstream", "mean", 1.0),
    (
        {"recipe": "verl-agent", "gigpo_norm": "mean_std", "gamma": 0.95},
        ("--recipe", "verl-agent", "--gigpo-norm", "mean_std", "--gamma", "0.95"),
        "verl-agent upstream",
        "mean_std",
        0.95,
    ),
    (
        {"recipe": "verl-agent-trajectory"},
        ("--recipe", "verl-agent-trajectory"),
        "verl-agent with trajectory counting",
        "mean",
        1.0,
    ),
    (
        {"recipe": "verl-agent-trajectory", "gigpo_norm": "mean_std", "gamma": 0.9},
        ("--recipe", "verl-agent-trajectory", "--gigpo-norm", "mean_std", "--gamma", "0.9"),
        "verl-agent with trajectory counting",
        "mean_std",
        0.9,
    ),
    ({"recipe": "trinity"}, ("--recipe", "trinity"), "Trinity-RFT", "mean_one", 1.0),
    (
        {"recipe": "trinity", "gigpo_norm": "mean_std", "gamma": 0.5},
        ("--recipe", "trinity", "--gigpo-norm", "mean_std", "--gamma", "0.5"),
        "Trinity-RFT",
        "mean_std",
        0.5,
    ),
    ({"recipe": "roll"}, ("--recipe", "roll"), "ROLL", "mean_std", 0.95),
]
IDS = [" ".join(pair[1]) for pair in PAIRS]

# The worked case: one group; trajectory 1 visits s0 -> s1 with step rewards 0, 1,
# trajectory 2 visits s0 -> s2 -> s3 with 0, 0, 0; outcome scores 1 and 0.
WORKED = [
    GigpoRow(0, 1, 0, 1.0, "s0", 0.0),
    GigpoRow(0, 1, 1, 1.0, "s1", 1.0),
    GigpoRow(0, 2, 0, 0.0, "s0", 0.0),
    GigpoRow(0, 2, 1, 0.0, "s2", 0.0),
    GigpoRow(0, 2, 2, 0.0, "s3", 0.0),
]


def generated_rows(seed: int) -> list[GigpoRow]:
    """1-4 groups of 1-4 trajectories of 1-5 steps, the trajectory's score on each of its rows,
    anchors colliding within and across trajectories and groups, rows shuffled."""
    rng = random.Random(seed)
    rows = []
    for group in range(rng.randint(1, 4)):
        for trajectory in range(rng.randint(1, 4)):
            score = rng.choice([0.0, 0.5, 1.0])
            for turn in range(rng.randint(1, 5)):
                anchor = rng.choice(["s0", "s1", "s2", "s3", f"g{group}"])
                step = rng.choice([0.0, 0.25, 1.0])
                rows.append(GigpoRow(group, trajectory, turn, score, anchor, step))
    rng.shuffle(rows)
    return rows


def torch_advantages(rows: list[GigpoRow], **keywords) -> list[float]:
    """advcli.torch's gigpo on the rows, each row's score on its last token."""
    rewards = torch.tensor([[0.0, row.score] for row in rows])
    advantages, _ = compute_advantage(
        rewards,
        torch.ones(len(rows), 2),
        np.array([row.group for row in rows]),
        np.array([row.trajectory for row in rows]),
        estimator="gigpo",
        turn_index=np.array([row.turn for row in rows]),
        anchor_index=np.array([row.anchor for row in rows], dtype=object),
        step_rewards=torch.tensor([row.step_reward for row in rows]),
        **keywords,
    )
    assert advantages.dtype == torch.float32
    return advantages[:, 1].tolist()


def test_worked_case_by_hand():
    """γ 0.9, mean_std: the s0 step group {0.9, 0} has mean 0.45 and std 0.45·√2, s1, s2, s3
    are groups of one (0). Every row counted: scores 1, 1, 0, 0, 0 have mean 0.4 and std √0.3;
    each trajectory once: 1 and 0 have mean 0.5 and std √0.5."""
    half = 0.45 / (0.45 * math.sqrt(2) + EPS)
    step = [half, 0.0, -half, 0.0, 0.0]
    every_row = [0.6 / (math.sqrt(0.3) + EPS)] * 2 + [-0.4 / (math.sqrt(0.3) + EPS)] * 3
    once = [0.5 / (math.sqrt(0.5) + EPS)] * 2 + [-0.5 / (math.sqrt(0.5) + EPS)] * 3
    for recipe, episode in (
        ("verl-agent", every_row),
        ("verl-agent-trajectory", once),
        ("trinity", once),
    ):
        got = torch_advantages(WORKED, recipe=recipe, gigpo_norm="mean_std", gamma=0.9)
        expected = [e + s for e, s in zip(episode, step, strict=True)]
        assert got == pytest.approx(expected, abs=1e-6), recipe
    got = torch_advantages(WORKED, recipe="verl-agent", gigpo_norm="mean_std", gamma=0.9)
    assert got == pytest.approx([1.8025, 1.0954, -1.4374, -0.7303, -0.7303], abs=1e-4)
    got = torch_advantages(WORKED, recipe="trinity", gigpo_norm="mean_std", gamma=0.9)
    assert got == pytest.approx([1.4142, 0.7071, -1.4142, -0.7071, -0.7071], abs=1e-4)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("keywords", "options", "recipe", "norm", "gamma"), PAIRS, ids=IDS)
def test_each_recipe_gives_the_references_numbers(keywords, options, recipe, norm, gamma, seed):
    rows = generated_rows(seed)
    expected = gigpo_recipe(rows, recipe, norm=norm, gamma=gamma)
    assert torch_advantages(rows, **keywords) == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize(("keywords", "options", "recipe", "norm", "gamma"), PAIRS, ids=IDS)
def test_each_recipe_gives_the_command_lines_numbers(
    keywords, options, recipe, norm, gamma, seed, run, tmp_path
):
    rows = generated_rows(seed)
    expected = advcli_advantages(run, tmp_path, rows, options)
    assert torch_advantages(rows, **keywords) == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_penalized_rows_are_centred_on_their_own_score(run, tmp_path):
    """verl-agent-trajectory with rows that disagree by the invalid-action penalty: the first
    row of each trajectory in the statistics, every row centred on its own score, and a group
    whose first rows tie divided by 1 + ε (never ε), as the command line does."""
    rows = [
        GigpoRow(0, 0, 0, 1.0, "a", 0.0),
        GigpoRow(0, 0, 1, 0.9, "b", 0.0),  # penalized: 1 − 0.1
        GigpoRow(0, 1, 0, 0.0, "a", 0.0),
        GigpoRow(1, 2, 0, 1.0, "c", 0.0),
        GigpoRow(1, 2, 1, 0.9, "d", 0.0),  # group 1's first rows tie (1, 1)
        GigpoRow(1, 3, 0, 1.0, "c", 0.0),
    ]
    options = ("--recipe", "verl-agent-trajectory", "--gigpo-norm", "mean_std")
    got = torch_advantages(rows, recipe="verl-agent-trajectory", gigpo_norm="mean_std")
    # Group 0: first rows 1 and 0 (mean 0.5, std √0.5); group 1: tie, divided by 1 + ε.
    std = math.sqrt(0.5) + EPS
    expected = [0.5 / std, 0.4 / std, -0.5 / std, 0.0, -0.1 / (1 + EPS), 0.0]
    assert got == pytest.approx(expected, abs=1e-6)
    assert got == pytest.approx(advcli_advantages(run, tmp_path, rows, options), abs=1e-6)


def test_step_returns_follow_the_turn_order_and_never_underflow():
    """Rows given in reverse turn order; a 3000-step trajectory with γ 0.5 whose returns are
    the recurrence's (γ^3000 underflows, never divided by)."""
    steps = 3000
    rewards = np.random.default_rng(0).random(steps)
    expected = np.empty(steps)
    running = 0.0
    for t in reversed(range(steps)):
        running = rewards[t] + 0.5 * running
        expected[t] = running
    reverse = np.arange(steps)[::-1].copy()
    # Each row its own anchor: the step term is 0, so read the returns through step_returns=.
    result = compute_advantage_with_metrics(
        torch.zeros(steps, 1),
        torch.ones(steps, 1),
        np.zeros(steps, dtype=np.int64),
        np.zeros(steps, dtype=np.int64),
        estimator="gigpo",
        turn_index=reverse,
        anchor_index=np.zeros(steps, dtype=np.int64),
        step_rewards=rewards[reverse],
        gigpo_norm="mean",
        epsilon=0.0,
        gamma=0.5,
    )
    # One step group of every row, mean-normalized: A = R − mean(R).
    got = result.advantages[:, 0].double().numpy()
    np.testing.assert_allclose(got, (expected - expected.mean())[reverse], atol=1e-5)


def test_undiscounted_step_returns_sum_the_rest_of_the_trajectory():
    """γ 1 (its factors as a mask): trajectories of 1–40 rows, turns with gaps, rows shuffled;
    each row's return is the plain sum of its trajectory's rewards from its turn on."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 41, size=50)
    traj = np.repeat(np.arange(50), lengths)
    n = len(traj)
    turn = np.concatenate([np.sort(rng.choice(1000, size=k, replace=False)) for k in lengths])
    rewards = rng.choice([0.0, 1.0, -0.1], size=n)
    expected = np.array([rewards[(traj == traj[i]) & (turn >= turn[i])].sum() for i in range(n)])
    shuffle = rng.permutation(n)
    result = compute_advantage_with_metrics(
        torch.zeros(n, 1),
        torch.ones(n, 1),
        np.zeros(n, dtype=np.int64),
        traj[shuffle],
        estimator="gigpo",
        turn_index=turn[shuffle],
        anchor_index=np.zeros(n, dtype=np.int64),
        step_rewards=rewards[shuffle],
        gigpo_norm="mean",
        epsilon=0.0,
        gamma=1.0,
    )
    # One step group of every row, mean-normalized: A = R − mean(R).
    got = result.advantages[:, 0].double().numpy()
    np.testing.assert_allclose(got, (expected - expected.mean())[shuffle], atol=1e-5)


def test_anchor_scope_batch_merges_groups():
    """The anchor "s" in two groups: one step group batch-wide, two within groups."""
    rows = [
        GigpoRow(0, 0, 0, 0.0, "s", 1.0),
        GigpoRow(0, 1, 0, 0.0, "t", 0.0),
        GigpoRow(1, 2, 0, 0.0, "s", 0.0),
        GigpoRow(1, 3, 0, 0.0, "u", 0.0),
    ]
    within = torch_advantages(rows, anchor_scope="group", epsilon=0.0)
    batch = torch_advantages(rows, anchor_scope="batch", epsilon=0.0)
    assert within == pytest.approx([0.0, 0.0, 0.0, 0.0])
    assert batch == pytest.approx([0.5, 0.0, -0.5, 0.0])


def test_roll_gives_a_step_group_of_tiny_std_nothing():
    rows = [GigpoRow(0, t, 0, 0.0, "s", 1e-9 * t) for t in range(3)]
    assert torch_advantages(rows, recipe="roll") == [0.0, 0.0, 0.0]
    assert torch_advantages(rows, recipe="roll", gigpo_norm="mean_std")[2] == 0.0


def test_roll_floors_the_episode_term_as_the_command_line(run, tmp_path):
    """ROLL's normalization gives 0 to an episode group of std at most 1e-6 (scores 0 and 1e-7),
    in the episode term as in the step term; under --gigpo-norm mean it floors neither."""
    rows = [GigpoRow(0, 0, 0, 0.0, "a", 0.0), GigpoRow(0, 1, 0, 1e-7, "b", 0.0)]
    assert torch_advantages(rows, recipe="roll") == [0.0, 0.0]
    assert advcli_advantages(run, tmp_path, rows, ("--recipe", "roll")) == [0.0, 0.0]
    tiny = [GigpoRow(0, t, 0, 0.0, "s", 1e-9 * t) for t in range(3)]
    options = ("--recipe", "roll", "--gigpo-norm", "mean")
    expected = advcli_advantages(run, tmp_path, tiny, options)
    assert expected[2] != 0.0
    got = torch_advantages(tiny, recipe="roll", gigpo_norm="mean")
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_step_returns_given_are_not_discounted_again():
    rows = WORKED
    returns = step_returns(rows, 0.9)
    given = compute_advantage(
        torch.tensor([[row.score] for row in rows]),
        torch.ones(5, 1),
        [0] * 5,
        [row.trajectory for row in rows],
        estimator="gigpo",
        recipe="verl-agent",
        gigpo_norm="mean_std",
        anchor_index=[row.anchor for row in rows],
        step_returns=returns,
    )[0][:, 0]
    discounted = torch_advantages(rows, recipe="verl-agent", gigpo_norm="mean_std", gamma=0.9)
    assert given.tolist() == pytest.approx(discounted, abs=1e-6)


@pytest.mark.parametrize(
    "anchors",
    [
        np.array(["s0", "s1", "s0", "s2", "s3"], dtype=object),
        np.array(["s0", "s1", "s0", "s2", "s3"]),
        np.array([7, 8, 7, 9, 10]),
        torch.tensor([7, 8, 7, 9, 10]),
        [(0, "x"), (1, "x"), (0, "x"), (2, "x"), (3, "x")],
    ],
    ids=["object", "str", "int64", "tensor", "tuples"],
)
def test_anchor_ids_of_any_kind_are_equal_when_their_values_are(anchors):
    got = compute_advantage(
        torch.tensor([[row.score] for row in WORKED]),
        torch.ones(5, 1),
        [0] * 5,
        [row.trajectory for row in WORKED],
        estimator="gigpo",
        gamma=0.9,
        anchor_index=anchors,
        step_rewards=[row.step_reward for row in WORKED],
    )[0][:, 0]
    expected = torch_advantages(WORKED, gamma=0.9)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_step_metrics_count_the_singleton_step_groups():
    result = compute_advantage_with_metrics(
        torch.tensor([[row.score] for row in WORKED]),
        torch.ones(5, 1),
        [0] * 5,
        [row.trajectory for row in WORKED],
        estimator="gigpo",
        anchor_index=[row.anchor for row in WORKED],
        step_rewards=[row.step_reward for row in WORKED],
    )
    assert result.step_metrics is not None
    assert result.step_metrics.as_dict() == {
        "advcli/step_groups": 4,
        "advcli/singleton_step_groups": 3,
        "advcli/singleton_step_row_share": 0.6,
    }


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({}, ValueError, "gigpo's step groups need anchor_index"),
        ({"anchor_index": [0, 0]}, ValueError, "step_rewards .* or step_returns"),
        (
            {"anchor_index": [0, 0], "step_rewards": [0, 1], "step_returns": [0, 1]},
            ValueError,
            "give one",
        ),
        ({"anchor_index": [0, 0], "step_rewards": [0, math.nan]}, RewardError, "row 1"),
        ({"anchor_index": [0, 0], "step_rewards": [0]}, ValueError, "1 ids for 2 rows"),
        (
            {"anchor_index": [0, 0], "step_returns": [0, 1], "recipe": "trinity"},
            ValueError,
            "needs step_rewards",
        ),
        ({"anchor_index": [0, 0], "step_rewards": [0, 1], "gamma": 1.5}, ValueError, "gamma"),
        (
            {"anchor_index": [0, 0], "step_rewards": [0, 1], "step_weight": -1},
            ValueError,
            "step-weight",
        ),
        ({"anchor_index": [0, 0], "step_rewards": [0, 1], "recipe": "x"}, ValueError, "recipe"),
        (
            {"anchor_index": [[0], {}], "step_rewards": [0, 1]},
            TypeError,
            "anchor_index: ids must be hashable",
        ),
    ],
)
def test_bad_step_inputs_are_refused(keywords, error, message):
    with pytest.raises(error, match=message):
        compute_advantage(torch.ones(2, 1), torch.ones(2, 1), [0, 0], estimator="gigpo", **keywords)


def test_step_arguments_apply_to_gigpo_only():
    message = "gamma applies to gigpo, not to grpo (gamma applies to reward_mode='per-turn' too)"
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}$"):
        compute_advantage(torch.ones(2, 1), torch.ones(2, 1), [0, 0], gamma=0.9)
    with pytest.raises(ValueError, match=r"^anchor_index applies to gigpo, not to grpo$"):
        compute_advantage(torch.ones(2, 1), torch.ones(2, 1), [0, 0], anchor_index=[0, 0])

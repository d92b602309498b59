"""The GiGPO reference (tests/gigpo_reference.py) on hand-computed cases, one per peer rule, and
its "Trinity-RFT" recipe against Trinity-RFT 0.6.0's own GiGPOAdvantageFn on generated batches."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from gigpo_reference import RECIPES, GigpoRow, gigpo_advantages, gigpo_recipe, step_returns

EPS = 1e-6


def _close(actual: Sequence[float], expected: Sequence[float], tol: float = 1e-4) -> None:
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert math.isclose(a, e, rel_tol=tol, abs_tol=tol), (i, actual, expected)


# Issue 29's worked case: one group; trajectory 1 visits s0 -> s1 with step rewards 0, 1 (score
# 1), trajectory 2 visits s0 -> s2 -> s3 with 0, 0, 0 (score 0).
WORKED = [
    GigpoRow("p", 1, 0, 1.0, "s0", 0.0),
    GigpoRow("p", 1, 1, 1.0, "s1", 1.0),
    GigpoRow("p", 2, 0, 0.0, "s0", 0.0),
    GigpoRow("p", 2, 1, 0.0, "s2", 0.0),
    GigpoRow("p", 2, 2, 0.0, "s3", 0.0),
]
# Every row counted: scores 1, 1, 0, 0, 0: mu 0.4, sigma sqrt(1.2 / 4) = 0.5477, so
# 0.6 / 0.5477 = 1.0954 and -0.4 / 0.5477 = -0.7303. Step returns (gamma 0.9): 0.9, 1 | 0, 0, 0;
# s0 holds {0.9, 0}: mu 0.45, sigma 0.6364, +-0.7071; s1, s2, s3 are groups of one: 0.
WORKED_TURN = [1.0954 + 0.7071, 1.0954, -0.7303 - 0.7071, -0.7303, -0.7303]
# Each trajectory once: {1, 0}: mu 0.5, sigma 0.7071, +-0.7071; plus the same step term.
WORKED_TRAJECTORY = [0.7071 + 0.7071, 0.7071, -0.7071 - 0.7071, -0.7071, -0.7071]


def test_worked_case_of_the_issue() -> None:
    assert step_returns(WORKED, 0.9) == pytest.approx([0.9, 1.0, 0.0, 0.0, 0.0])
    expected = {
        "verl-agent upstream": WORKED_TURN,
        "verl-agent with trajectory counting": WORKED_TRAJECTORY,
        "verl-agent keyword": WORKED_TRAJECTORY,  # the rows of a trajectory agree: no penalty
        "Trinity-RFT": WORKED_TRAJECTORY,
        "ROLL": WORKED_TURN,  # every row counted too; s0's sigma is far above 1e-6
    }
    assert set(expected) == set(RECIPES)
    for recipe, values in expected.items():
        _close(gigpo_recipe(WORKED, recipe, norm="mean_std", gamma=0.9), values)
    _close(WORKED_TURN, [1.8025, 1.0954, -1.4374, -0.7303, -0.7303])
    _close(WORKED_TRAJECTORY, [1.4142, 0.7071, -1.4142, -0.7071, -0.7071])


def test_given_step_returns_replace_the_discounted_rewards() -> None:
    given = [0.9, 1.0, 0.0, 0.0, 0.0]  # the worked case's returns at gamma 0.9
    from_rewards = gigpo_recipe(WORKED, "verl-agent upstream", norm="mean_std", gamma=0.9)
    from_column = gigpo_recipe(
        WORKED, "verl-agent upstream", norm="mean_std", gamma=0.0, step_returns_given=given
    )
    assert from_column == from_rewards
    # gamma 0 with the rewards: returns 0, 1 | 0, 0, 0, so s0 holds {0, 0}: A_step 0.
    _close(
        gigpo_recipe(WORKED, "verl-agent upstream", norm="mean_std", gamma=0.0),
        [1.0954, 1.0954, -0.7303, -0.7303, -0.7303],
    )


def test_a_state_revisited_inside_one_trajectory_shares_its_group() -> None:
    rows = [
        GigpoRow("q", "a", 0, 1.0, "s0", 0.0),
        GigpoRow("q", "a", 1, 1.0, "s1", 0.0),
        GigpoRow("q", "a", 2, 1.0, "s0", 1.0),  # back in s0
        GigpoRow("q", "b", 0, 0.0, "s0", 0.0),
        GigpoRow("q", "b", 1, 0.0, "s2", 0.0),
    ]
    # gamma 0.5: a's returns 0.25, 0.5, 1; b's 0, 0. s0 holds {0.25, 1, 0}: mu 5/12, so
    # (mean norm) -1/6, 7/12, -5/12; s1 and s2 are groups of one: 0.
    # Episode, every row: scores 1, 1, 1, 0, 0, mu 0.6: 0.4 for a's rows, -0.6 for b's.
    expected = [0.4 - 1 / 6, 0.4, 0.4 + 7 / 12, -0.6 - 5 / 12, -0.6]
    _close(gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=0.5), expected, 1e-12)
    # Each trajectory once: {1, 0}, mu 0.5: +-0.5; the step term is the same.
    expected = [0.5 - 1 / 6, 0.5, 0.5 + 7 / 12, -0.5 - 5 / 12, -0.5]
    _close(
        gigpo_recipe(rows, "verl-agent with trajectory counting", norm="mean", gamma=0.5),
        expected,
        1e-12,
    )


def test_batch_wide_anchors_merge_two_prompts_states() -> None:
    rows = [
        GigpoRow("P", 0, 0, 1.0, "s0", 0.0),
        GigpoRow("P", 0, 1, 1.0, "x", 1.0),
        GigpoRow("P", 1, 0, 0.0, "s0", 0.0),
        GigpoRow("Q", 0, 0, 1.0, "s0", 1.0),
        GigpoRow("Q", 1, 0, 0.0, "y", 0.0),
    ]
    # Episode, R = sum of step rewards: P {1, 0} and Q {1, 0}, mu 0.5: +-0.5, over (1 + eps).
    # Returns (gamma 1): 1, 1 | 0 | 1 | 0.
    # Batch-wide (Trinity): s0 holds P0's 1, P1's 0 and Q0's 1: mu 2/3: 1/3, -2/3, 1/3, over
    # (1 + eps); x and y are groups of one.
    trinity = [0.5 + 1 / 3, 0.5, -0.5 - 2 / 3, 0.5 + 1 / 3, -0.5]
    _close(
        gigpo_recipe(rows, "Trinity-RFT", norm="mean_one", gamma=1.0),
        [v / (1 + EPS) for v in trinity],
        1e-12,
    )
    # Within each group (verl-agent, mean norm): s0 in P holds {1, 0}: +-0.5; s0 in Q is alone.
    _close(
        gigpo_recipe(rows, "verl-agent with trajectory counting", norm="mean", gamma=1.0),
        [0.5 + 0.5, 0.5, -0.5 - 0.5, 0.5, -0.5],
        1e-12,
    )
    # Upstream counts every row: P's scores 1, 1, 0 have mu 2/3: 1/3, 1/3, -2/3.
    _close(
        gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0),
        [1 / 3 + 0.5, 1 / 3, -2 / 3 - 0.5, 0.5, -0.5],
        1e-12,
    )


def test_roll_zeroes_groups_of_one_and_groups_with_sigma_at_most_1e6() -> None:
    tiny = 1.0 + 1e-7
    rows = [
        GigpoRow("g1", "a", 0, 1.0, "s", 1.0),
        GigpoRow("g1", "b", 0, tiny, "s", tiny),
        GigpoRow("g2", "c", 0, 2.0, "t", 2.0),
        GigpoRow("g3", "d", 0, 0.0, "u", 0.0),
        GigpoRow("g3", "e", 0, 1.0, "u", 1.0),
    ]
    # g1's scores and s's returns differ by 1e-7: sigma = 1e-7 / sqrt 2 <= 1e-6, so ROLL gives 0
    # to both terms; g2 / t is a group of one: 0. g3 / u: {0, 1}, sigma 0.7071: each term is
    # +-0.5 / (0.7071 + 1e-6) = +-0.70711; weights 0.5 and 2: +-(0.35355 + 1.41421).
    _close(
        gigpo_recipe(rows, "ROLL", norm="mean_std", gamma=0.95, episode_weight=0.5, omega=2.0),
        [0.0, 0.0, 0.0, -1.76777, 1.76777],
    )
    # verl-agent divides g1's 5e-8 by (7.071e-8 + 1e-6) in each term: 2 * 0.046698 = 0.093396,
    # keeps the lone row's raw score 2 / (1 + eps), and gives g3 +-2 * 0.70711.
    _close(
        gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.95),
        [-0.093396, 0.093396, 2.0, -1.41421, 1.41421],
    )


def test_penalized_rows_with_tied_first_rows() -> None:
    # Two successful episodes of one prompt; a's second action was invalid: verl-agent subtracts
    # 0.1 from that row's score (1 -> 0.9) and from its step reward (1 -> 0.9).
    rows = [
        GigpoRow("q", "a", 0, 1.0, "s0", 0.0),
        GigpoRow("q", "a", 1, 0.9, "s1", 0.9),
        GigpoRow("q", "b", 0, 1.0, "s0", 0.0),
        GigpoRow("q", "b", 1, 1.0, "s2", 1.0),
    ]
    # Returns (gamma 1): 0.9, 0.9 | 1, 1. s0 holds {0.9, 1}: mu 0.95, sigma 0.070711, -+0.70711;
    # s1 and s2 are groups of one.
    # Upstream, every row: scores 1, 0.9, 1, 1: mu 0.975, sigma 0.05: 0.5, -1.5, 0.5, 0.5.
    _close(
        gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=1.0),
        [0.5 - 0.70711, -1.5, 0.5 + 0.70711, 0.5],
    )
    # Trajectory counting, the mean of a trajectory's rows: a 0.95, b 1: -+0.70711 on every row.
    _close(
        gigpo_recipe(rows, "verl-agent with trajectory counting", norm="mean_std", gamma=1.0),
        [-0.70711 - 0.70711, -0.70711, 0.70711 + 0.70711, 0.70711],
    )
    # The keyword flipped: first rows 1, 1 tie (sigma 0); a's second row is centred with its own
    # 0.9: (0.9 - 1) / (0 + 1e-6) = -1e5.
    _close(
        gigpo_recipe(rows, "verl-agent keyword", norm="mean_std", gamma=1.0),
        [-0.70711, (0.9 - 1.0) / EPS, 0.70711, 0.0],
    )


def test_lone_episode_groups_and_the_singleton_rule() -> None:
    rows = [GigpoRow("g", 0, 0, 0.5, "s", 0.25), GigpoRow("g", 0, 1, 0.5, "s", 0.5)]
    # One trajectory whose two rows share s: returns (gamma 1) 0.75, 0.5, mu 0.625, mean norm
    # +-0.125.
    # Counted by row, the group holds two equal scores: A_episode 0.
    _close(
        gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0), [0.125, -0.125], 1e-12
    )
    # Counted by trajectory, it is a lone group: mean 0, scale 1 keep the raw score 0.5.
    counted = gigpo_recipe(rows, "verl-agent with trajectory counting", norm="mean", gamma=1.0)
    _close(counted, [0.5 + 0.125, 0.5 - 0.125], 1e-12)
    # advcli's --singleton zero gives the lone group 0 instead.
    zero = gigpo_advantages(
        rows,
        level="trajectory",
        traj_score="mean",
        norm="mean",
        gamma=1.0,
        anchor_scope="group",
        singleton="zero",
    )
    _close(zero, [0.125, -0.125], 1e-12)
    # Trinity: R = 0.25 + 0.5 over (1 + eps) whatever fnorm; s's sigma is 0.25 / sqrt 2, so the
    # step term is +-0.125 / 0.17678 = +-0.70711.
    _close(
        gigpo_recipe(rows, "Trinity-RFT", norm="mean_std", gamma=1.0),
        [0.75 / (1 + EPS) + 0.70711, 0.75 / (1 + EPS) - 0.70711],
    )


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="no norm"):
        gigpo_recipe(WORKED, "Trinity-RFT", norm="mean", gamma=1.0)
    with pytest.raises(ValueError, match="anchor_scope"):
        gigpo_advantages(WORKED, level="turn", norm="mean", gamma=1.0, anchor_scope="prompt")
    with pytest.raises(ValueError, match="traj_score"):
        gigpo_advantages(WORKED, level="trajectory", norm="mean", gamma=1.0, anchor_scope="group")


# --- Trinity-RFT 0.6.0's own function -------------------------------------------------------


@pytest.fixture(scope="module")
def trinity_gigpo() -> type:
    # Imported here, not at collection: trinity pulls in ray, and only these tests need it.
    module = pytest.importorskip("trinity.algorithm.advantage_fn.gigpo_advantage")
    return module.GiGPOAdvantageFn


def _trinity(
    fn_class: type, rows: Sequence[GigpoRow], *, fnorm: str, gamma: float, omega: float
) -> list[float]:
    """Trinity's advantage of each row: a row is an Experience of task ``group``, run
    ``trajectory``, step ``turn``, its step reward and anchor in ``info``."""
    from trinity.common.experience import EID, Experience

    experiences = [
        Experience(
            eid=EID(batch=0, task=row.group, run=row.trajectory, step=row.turn),
            tokens=[0, 1, 2],
            prompt_length=1,
            reward=row.score,
            info={"step_reward": row.step_reward, "env_state_hash": row.anchor},
        )
        for row in rows
    ]
    out, _ = fn_class(omega=omega, gamma=gamma, fnorm=fnorm).process(experiences)
    assert [e.eid for e in out] == [e.eid for e in experiences]
    return [float(e.advantages[0]) for e in out]


def _batch(seed: int, size: int, rewards: Sequence[float]) -> list[GigpoRow]:
    """``size`` rows in shuffled order: 1-4 task groups, runs of 1-5 steps (the last run cut at
    ``size``), anchors drawn from 4 states shared by every group (collisions within a run,
    across runs and across groups), step rewards from ``rewards``. Scores are random: Trinity
    does not read them."""
    rng = random.Random(seed)
    n_groups = rng.randint(1, 4)
    groups: list[int | str] = list(range(n_groups)) if seed % 2 else [f"task{i}" for i in "abcd"]
    anchors: list[int | str] = [f"s{i}" for i in range(4)] if seed % 3 else [7, 8, 9, 10]
    runs = {g: 0 for g in groups[:n_groups]}
    rows: list[GigpoRow] = []
    while len(rows) < size:
        group = rng.choice(groups[:n_groups])
        run = runs[group]
        runs[group] += 1
        for turn in range(rng.randint(1, 5)):
            anchor = rng.choice(anchors)
            rows.append(GigpoRow(group, run, turn, rng.random(), anchor, rng.choice(rewards)))
    rows = rows[:size]
    rng.shuffle(rows)
    return rows


# fnorm "none" divides by 1 + eps: float32 rounding stays at 1e-7, any gamma and rewards.
# fnorm "std" divides by sigma + eps; in float32 a tied group's mean can miss its values by an
# ulp, which that division by eps blows up (see the reference's "Exact ties"), so these batches
# use dyadic rewards and gamma, where float32 sums and means of equal values are exact.
MODES = [
    ("none", "mean_one", 0.9, 1.0, (0.0, 0.1, 0.3, 1.0, -0.7)),
    ("none", "mean_one", 1.0, 0.4, (0.0, 1.0)),
    ("std", "mean_std", 0.5, 1.0, (0.0, 0.5, 1.0, 2.0)),
    ("std", "mean_std", 1.0, 2.5, (0.0, 1.0, -1.0)),
]


@pytest.mark.peers
@pytest.mark.parametrize("seed", range(50))
def test_trinity_recipe_equals_trinitys_gigpo(trinity_gigpo: type, seed: int) -> None:
    size = seed + 1
    for fnorm, norm, gamma, omega, rewards in MODES:
        rows = _batch(seed, size, rewards)
        theirs = _trinity(trinity_gigpo, rows, fnorm=fnorm, gamma=gamma, omega=omega)
        ours = gigpo_recipe(rows, "Trinity-RFT", norm=norm, gamma=gamma, omega=omega)
        for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (fnorm, gamma, i, a, b, rows)


@pytest.mark.peers
def test_trinitys_std_mode_on_a_tied_group_is_float32_rounding_over_eps(
    trinity_gigpo: type,
) -> None:
    # Three runs of one task, one step each, all rewards 0.9: the episode group and the step
    # group tie. The reference gives 0; Trinity's float32 mean of three 0.9s misses them by an
    # ulp (6e-8), divided by (sigma + 1e-6): 0.056 in each term.
    rows = [GigpoRow("t", run, 0, 0.0, "s", 0.9) for run in range(3)]
    assert gigpo_recipe(rows, "Trinity-RFT", norm="mean_std", gamma=1.0) == [0.0, 0.0, 0.0]
    theirs = _trinity(trinity_gigpo, rows, fnorm="std", gamma=1.0, omega=1.0)
    assert min(abs(a) for a in theirs) > 0.1
    # fnorm "none" divides the same ulp by 1 + eps: invisible.
    theirs = _trinity(trinity_gigpo, rows, fnorm="none", gamma=1.0, omega=1.0)
    assert max(abs(a) for a in theirs) < 1e-6

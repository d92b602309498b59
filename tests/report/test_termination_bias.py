"""The per-turn reference on hand-computed cases, and the termination bias of
docs/per-turn-rewards.md shown on simulated rollouts.

Hand cases: one group, trajectory ``a`` with one turn (r = 3), ``b`` with three (r = 1, 1, 2).
Reward-to-go: gamma 1: a0 = 3, b = (4, 3, 2); gamma 0.5: a0 = 3, b2 = 2, b1 = 1 + 0.5*2 = 2,
b0 = 1 + 0.5*2 = 2.

gamma 1, drgrpo:
  turn:        turn 0 {3, 4} mean 3.5 -> a0 -0.5, b0 0.5; b1, b2 alone: raw 3, 2 (zero: 0, 0)
  turn-padded: turn 0 as above; turn 1 {3, 0 virtual} mean 1.5 -> b1 1.5; turn 2 {2, 0} -> b2 1
  pooled:      {3, 4, 3, 2} mean 3 -> a0 0, b0 1, b1 0, b2 -1
  trajectory:  scores 3, 4 -> a -0.5, b 0.5 on its three rows
gamma 1, rloo (s minus the others' mean):
  turn:        a0 3-4 = -1, b0 1; b1, b2 alone: 3, 2
  turn-padded: a0 -1, b0 1, b1 3-0 = 3, b2 2-0 = 2
  pooled:      a0 3-9/3 = 0, b0 4-8/3 = 4/3, b1 3-3 = 0, b2 2-10/3 = -4/3
  trajectory:  a -1, b 1
gamma 1, grpo (std ddof 1, epsilon added):
  turn 0 {3, 4}: std sqrt(0.5) -> -+0.5/(sqrt(0.5)+eps); a lone row s/(1+eps)
  padded turn 1 {3, 0}: std 1.5*sqrt(2) -> 1.5/(1.5*sqrt(2)+eps); turn 2 {2, 0}: 1/(sqrt(2)+eps)
  pooled: std sqrt(2/3) -> a0 0, b0 1/(sqrt(2/3)+eps), b1 0, b2 -1/(sqrt(2/3)+eps)
gamma 0.5, drgrpo:
  turn:        turn 0 {3, 2} -> a0 0.5, b0 -0.5; b1, b2 alone: 2, 2
  turn-padded: b1 {2, 0} -> 1, b2 {2, 0} -> 1
  pooled:      {3, 2, 2, 2} mean 2.25 -> a0 0.75, b -0.25 each
  trajectory:  a 0.5, b -0.5
gamma 0.5, rloo: turn a0 1, b0 -1, b1 2, b2 2; padded b1 2, b2 2; pooled a0 3-2 = 1,
  b 2-7/3 = -1/3 each; trajectory a 1, b -1.
Per-index rewards summed (drgrpo, gamma 1): turn 0 rewards {3, 1} -> a 1, b -1; b1, b2 alone keep
  1, 2; summed: a0 1, b2 2, b1 1+2 = 3, b0 -1+3 = 2.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from per_turn_reference import advantages, per_index_sum_advantages, reward_to_go

EPS = 1e-6
# Input order deliberately not turn order: results come back in input order.
ROWS = [("g", "b", 2, 2.0), ("g", "a", 0, 3.0), ("g", "b", 0, 1.0), ("g", "b", 1, 1.0)]
# Expected values listed as (b2, a0, b0, b1), the input order.
S2, S23 = math.sqrt(2), math.sqrt(2 / 3)
HAND = {
    (1.0, "drgrpo", "turn"): (2, -0.5, 0.5, 3),
    (1.0, "drgrpo", "turn-padded"): (1, -0.5, 0.5, 1.5),
    (1.0, "drgrpo", "pooled"): (-1, 0, 1, 0),
    (1.0, "drgrpo", "trajectory"): (0.5, -0.5, 0.5, 0.5),
    (1.0, "rloo", "turn"): (2, -1, 1, 3),
    (1.0, "rloo", "turn-padded"): (2, -1, 1, 3),
    (1.0, "rloo", "pooled"): (-4 / 3, 0, 4 / 3, 0),
    (1.0, "rloo", "trajectory"): (1, -1, 1, 1),
    (1.0, "grpo", "turn"): (
        2 / (1 + EPS),
        -0.5 / (math.sqrt(0.5) + EPS),
        0.5 / (math.sqrt(0.5) + EPS),
        3 / (1 + EPS),
    ),
    (1.0, "grpo", "turn-padded"): (
        1 / (S2 + EPS),
        -0.5 / (math.sqrt(0.5) + EPS),
        0.5 / (math.sqrt(0.5) + EPS),
        1.5 / (1.5 * S2 + EPS),
    ),
    (1.0, "grpo", "pooled"): (-1 / (S23 + EPS), 0, 1 / (S23 + EPS), 0),
    (0.5, "drgrpo", "turn"): (2, 0.5, -0.5, 2),
    (0.5, "drgrpo", "turn-padded"): (1, 0.5, -0.5, 1),
    (0.5, "drgrpo", "pooled"): (-0.25, 0.75, -0.25, -0.25),
    (0.5, "drgrpo", "trajectory"): (-0.5, 0.5, -0.5, -0.5),
    (0.5, "rloo", "turn"): (2, 1, -1, 2),
    (0.5, "rloo", "turn-padded"): (2, 1, -1, 2),
    (0.5, "rloo", "pooled"): (-1 / 3, 1, -1 / 3, -1 / 3),
    (0.5, "rloo", "trajectory"): (-1, 1, -1, -1),
}


def test_reward_to_go_by_hand():
    assert reward_to_go(ROWS, 1.0) == [2, 3, 4, 3]
    assert reward_to_go(ROWS, 0.5) == [2, 3, 2, 2]


@pytest.mark.parametrize(("gamma", "estimator", "grouping"), sorted(HAND))
def test_groupings_by_hand(gamma, estimator, grouping):
    got = advantages(ROWS, grouping, estimator, gamma=gamma, epsilon=EPS)
    assert got == pytest.approx(HAND[gamma, estimator, grouping], abs=1e-12)


def test_a_lone_row_under_singleton_zero_gets_0():
    assert advantages(ROWS, "turn", "drgrpo", singleton="zero") == [0, -0.5, 0.5, 0]
    # Padding gives the lone rows a virtual partner, so the singleton rule does not apply.
    assert advantages(ROWS, "turn-padded", "drgrpo", singleton="zero") == [1, -0.5, 0.5, 1.5]


def test_per_index_rewards_summed_by_hand():
    assert per_index_sum_advantages(ROWS, "drgrpo") == [2, 1, 2, 3]


def test_turns_with_a_gap_or_a_repeat_are_refused():
    for turns in ((0, 2), (1, 1)):
        rows = [("g", "a", turns[0], 1.0), ("g", "a", turns[1], 1.0)]
        with pytest.raises(ValueError, match="gap or a repeat"):
            reward_to_go(rows)


# The simulated MDP of docs/per-turn-rewards.md: at each turn k < K-1 the policy continues with
# probability P (intermediate reward MU_R + noise) or stops (terminal reward V_k + noise); at turn
# K-1 it must stop (terminal V_{K-1} + noise). V_k = MU_R + GAMMA * V_{k+1}, so from every turn
# E[return | continue] = E[return | stop] = V_k: taking another turn is worth nothing.
K, P, MU_R, V_LAST, NOISE, N, GROUPS, GAMMA = 4, 0.6, 0.5, 1.0, 0.3, 8, 2000, 1.0


def _values() -> list[float]:
    values = [V_LAST]
    for _ in range(K - 1):
        values.insert(0, MU_R + GAMMA * values[0])
    return values


def _rollouts(seed: int) -> tuple[list[tuple[int, int, int, float]], list[str | None]]:
    """The rows and each row's decision: "continue", "stop", or None (the forced stop)."""
    rng = np.random.default_rng(seed)
    values = _values()
    go_on = rng.random((GROUPS, N, K - 1)) < P
    noise = rng.normal(0.0, NOISE, (GROUPS, N, K))
    rows, decisions = [], []
    for g in range(GROUPS):
        for i in range(N):
            for k in range(K):
                if k < K - 1 and go_on[g, i, k]:
                    rows.append((g, i, k, MU_R + noise[g, i, k]))
                    decisions.append("continue")
                    continue
                rows.append((g, i, k, values[k] + noise[g, i, k]))
                decisions.append("stop" if k < K - 1 else None)
                break
    return rows, decisions


def _contrast(rows, decisions, values, turn) -> tuple[float, float]:
    """Mean advantage of "continue" minus that of "stop" at ``turn``, and its standard error
    with the group as the sampling unit (rows of a group share their baselines)."""
    sums = np.zeros((GROUPS, 4))  # continue sum, continue count, stop sum, stop count
    for row, decision, value in zip(rows, decisions, values, strict=True):
        if row[2] == turn and decision is not None:
            column = 0 if decision == "continue" else 2
            sums[row[0], column] += value
            sums[row[0], column + 1] += 1
    mean_c = sums[:, 0].sum() / sums[:, 1].sum()
    mean_s = sums[:, 2].sum() / sums[:, 3].sum()
    residual = (sums[:, 0] - mean_c * sums[:, 1]) / sums[:, 1].mean() - (
        sums[:, 2] - mean_s * sums[:, 3]
    ) / sums[:, 3].mean()
    return mean_c - mean_s, float(residual.std(ddof=1) / math.sqrt(GROUPS))


def _closed_form(turn: int) -> float:
    """The docs' hidden bonus on "continue" at ``turn`` for per-index rewards summed, under the
    leave-one-out baseline: minus the expected discounted group-mean reward of the turns the
    decision adds, each counted when the trajectory reaches it and another member does too."""
    values = _values()
    total = 0.0
    for k in range(turn + 1, K):
        mean_reward = V_LAST if k == K - 1 else P * MU_R + (1 - P) * values[k]
        others_reach = 1 - (1 - P**k) ** (N - 1)
        total += GAMMA ** (k - turn) * P ** (k - turn - 1) * others_reach * mean_reward
    return -total


@pytest.fixture(scope="module")
def rollouts():
    return _rollouts(seed=20261201)


def test_per_index_rewards_summed_bonus_continuing_by_the_closed_form(rollouts):
    rows, decisions = rollouts
    values = per_index_sum_advantages(rows, "rloo", gamma=GAMMA)
    for turn in range(K - 1):
        measured, se = _contrast(rows, decisions, values, turn)
        expected = _closed_form(turn)
        assert abs(expected) > 10 * se  # the bias is there to be seen at this sample size
        assert measured == pytest.approx(expected, abs=4 * se), turn


@pytest.mark.parametrize(
    ("grouping", "estimator"),
    [
        (grouping, estimator)
        for grouping in ("turn-padded", "turn", "trajectory")
        for estimator in ("drgrpo", "rloo")
    ],
)
def test_normalizing_the_reward_to_go_leaves_continuing_unbiased(rollouts, grouping, estimator):
    rows, decisions = rollouts
    values = advantages(rows, grouping, estimator, gamma=GAMMA)
    for turn in range(K - 1):
        measured, se = _contrast(rows, decisions, values, turn)
        assert measured == pytest.approx(0.0, abs=4 * se), turn
        assert se < 0.05 * abs(_closed_form(turn))  # 0 is told apart from the summed form's bias


def test_pooling_lets_a_trajectory_see_its_own_stopping(rollouts):
    """Pooled baselines hold the trajectory's own later rows, whose number and returns the
    decision sets; here (returns fall with the turn) continuing lowers its own baseline."""
    rows, decisions = rollouts
    values = advantages(rows, "pooled", "rloo", gamma=GAMMA)
    for turn in range(K - 1):
        measured, se = _contrast(rows, decisions, values, turn)
        assert measured > 4 * se, turn


@pytest.mark.parametrize(
    ("grouping", "biased"), [("turn-rewards", True), ("turn-padded", False), ("turn", False)]
)
def test_the_engine_shows_the_bias_as_derived(rollouts, grouping, biased, run, tmp_path):
    """The same simulated rollouts through ``advcli compute --reward-mode per-turn``: the
    per-index rewards summed (``turn-rewards``) give "continue" the closed form's bonus, the
    groupings of the reward-to-go none."""
    rows, decisions = rollouts
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pl.DataFrame(
        rows, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    ).write_parquet(source)
    result = run(
        "compute", source, "-o", output, "--no-tokens", "-q", "--reward-mode", "per-turn",
        "--step-groups", grouping, "--estimator", "rloo", "--gamma", str(GAMMA),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    values = pl.read_parquet(output)["advantage"].to_list()
    for turn in range(K - 1):
        measured, se = _contrast(rows, decisions, values, turn)
        expected = _closed_form(turn) if biased else 0.0
        assert measured == pytest.approx(expected, abs=4 * se), turn

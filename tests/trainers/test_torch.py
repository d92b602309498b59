"""advcli.torch: the vectorized trainer-side functions against hand-computed cases and a per-row
reference written here from the specification (plain Python floats, dicts and loops)."""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest
from cases import CASES, LOO_BY_HAND, LOO_NEAR_TIES, LOO_ROWS, Case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference_advantages, reference_own_score

torch = pytest.importorskip("torch")

from advcli.errors import AdvcliError  # noqa: E402
from advcli.torch import (  # noqa: E402
    RewardError,
    compute_advantage,
    compute_advantage_with_metrics,
    compute_grpo_outcome_advantage,
    compute_rloo_outcome_advantage,
)

pytestmark = pytest.mark.torch

TOL = 1e-5
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------------
# The per-row reference
# --------------------------------------------------------------------------------------------


def reference(
    rewards: list[list[float]],
    mask: list[list[float]],
    index: list[Any],
    traj_index: list[Any] | None,
    *,
    estimator: str = "grpo",
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    compute_mean_std_cross_all_data: bool = True,
) -> list[list[float]]:
    """The project's one reference (tests/reference.py), broadcast to the tokens by the mask."""
    if estimator == "grpo" and not norm_adv_by_std_in_grpo:
        estimator = "drgrpo"
    advantages = reference_own_score(
        [math.fsum(row) for row in rewards],
        index,
        traj_index,
        estimator=estimator,
        epsilon=epsilon,
        dedup=traj_index is not None and not compute_mean_std_cross_all_data,
    )
    return [[a * m for m in row_mask] for a, row_mask in zip(advantages, mask, strict=True)]


def as_keys(ids: Any) -> list[Any]:
    """Plain hashable Python values for the reference."""
    if isinstance(ids, torch.Tensor | np.ndarray):
        return ids.tolist()
    return list(ids)


def run(estimator: str, rewards, mask, index, traj_index=None, **flags):
    if estimator == "rloo":
        flags.pop("norm_adv_by_std_in_grpo", None)
        flags.pop("epsilon", None)
        return compute_rloo_outcome_advantage(rewards, mask, index, traj_index, **flags)
    return compute_grpo_outcome_advantage(rewards, mask, index, traj_index, **flags)


def check_against_reference(estimator, rewards, mask, index, traj_index=None, **flags):
    advantages, returns = run(estimator, rewards, mask, index, traj_index, **flags)
    expected = reference(
        rewards.double().tolist(),
        mask.double().tolist(),
        as_keys(index),
        None if traj_index is None else as_keys(traj_index),
        estimator=estimator,
        **flags,
    )
    assert advantages.dtype == torch.float32
    assert advantages is returns
    expected = np.array(expected)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=TOL, atol=TOL)
    # Exact zeros (zero-std groups, masked tokens) stay exact, not rounding noise.
    assert (advantages.numpy()[expected == 0] == 0).all()


def test_reference_by_hand():
    # Group "g": trajectory a scores 1 (rows 0, 2 — row 2 scores 0 but is not counted when
    # deduplicating), trajectory b scores 0 (row 1). Dedup: units [1, 0], mean .5, std sqrt(.5).
    rewards, mask = [[1.0], [0.0], [0.0]], [[1.0], [1.0], [1.0]]
    index, traj = ["g", "g", "g"], ["a", "b", "a"]
    s = math.sqrt(0.5) + 1e-6

    def column(**flags):
        return [row[0] for row in reference(rewards, mask, index, traj, **flags)]

    dedup = column(compute_mean_std_cross_all_data=False)
    assert dedup == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s])
    # Every row counts: units [1, 0, 0], mean 1/3, std sqrt(1/3).
    m, s = 1 / 3, math.sqrt(1 / 3) + 1e-6
    assert column() == pytest.approx([(1 - m) / s, -m / s, -m / s])
    assert column(norm_adv_by_std_in_grpo=False) == pytest.approx([1 - m, -m, -m])
    assert column(estimator="rloo") == pytest.approx([1.5 * (1 - m), -1.5 * m, -1.5 * m])
    assert reference([[2.0]], [[1.0]], [0], None) == [[2 / (1 + 1e-6)]]


# --------------------------------------------------------------------------------------------
# Shared hand-computed cases (tests/cases.py)
# --------------------------------------------------------------------------------------------


def case_tensors(case: Case, dtype=torch.float32):
    """(bs, L) rewards with the score on each row's last valid token, and a 0/1 mask."""
    width = max(row[4] for row in case.rows)
    rewards = torch.zeros(len(case.rows), width, dtype=dtype)
    mask = torch.zeros(len(case.rows), width)
    for i, (_, _, _, score, tokens) in enumerate(case.rows):
        rewards[i, tokens - 1] = score
        mask[i, :tokens] = 1
    index = np.array([row[0] for row in case.rows], dtype=object)
    traj = np.array([row[1] for row in case.rows], dtype=object)
    return rewards, mask, index, traj


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo"])
@pytest.mark.parametrize("level", ["turn", "trajectory"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_computed_case(case: Case, level: str, estimator: str):
    rewards, mask, index, traj = case_tensors(case)
    advantages, returns = compute_grpo_outcome_advantage(
        rewards,
        mask,
        index,
        traj,
        norm_adv_by_std_in_grpo=estimator == "grpo",
        compute_mean_std_cross_all_data=level == "turn",
    )
    expected = torch.tensor(case.expected[(level, estimator)], dtype=torch.float64)
    np.testing.assert_allclose(
        advantages.numpy(), (expected[:, None] * mask).numpy(), rtol=TOL, atol=TOL
    )
    assert advantages is returns


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_turn_level_ignores_traj_index(case: Case):
    rewards, mask, index, traj = case_tensors(case)
    with_traj, _ = compute_grpo_outcome_advantage(rewards, mask, index, traj)
    without, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert torch.equal(with_traj, without)


# --------------------------------------------------------------------------------------------
# Hand-written semantics
# --------------------------------------------------------------------------------------------


def test_dedup_counts_the_first_row_but_normalizes_each_rows_own_score():
    # Trajectory a: rows score 1 then 0 (batch order); b: 0. Units [1, 0]: mean .5, std sqrt(.5).
    rewards = torch.tensor([[1.0], [0.0], [0.0]])
    mask = torch.ones(3, 1)
    s = math.sqrt(0.5) + 1e-6
    adv, _ = compute_grpo_outcome_advantage(
        rewards, mask, ["g"] * 3, ["a", "b", "a"], compute_mean_std_cross_all_data=False
    )
    assert adv[:, 0].tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s])
    # Batch order decides: a's first row now scores 0, so the units are [0, 0] (zero std).
    adv, _ = compute_grpo_outcome_advantage(
        rewards.flip(0), mask, ["g"] * 3, ["a", "b", "a"], compute_mean_std_cross_all_data=False
    )
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, 1 / 1e-6])


@pytest.mark.parametrize("epsilon", [0.0, 1e-6])
def test_zero_std_group_gives_exact_zeros(epsilon):
    # In float64, 0.1 + 0.1 + 0.1 = 0.30000000000000004: a naive mean is not exactly 0.1.
    rewards = torch.tensor([[0.1], [0.1], [0.1], [0.7]], dtype=torch.float64)
    index = [3, 3, 3, 4]
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(4, 1), index, epsilon=epsilon)
    assert adv[:, 0].tolist() == [0.0, 0.0, 0.0, pytest.approx(0.7 / (1 + epsilon))]
    adv, _ = compute_rloo_outcome_advantage(rewards, torch.ones(4, 1), index)
    assert adv[:, 0].tolist() == [0.0, 0.0, 0.0, pytest.approx(0.7)]


def test_rloo_by_hand():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [2.0], [5.0]])
    mask = torch.ones(5, 1)
    index = torch.tensor([1, 1, 1, 2, 3])
    adv, returns = compute_rloo_outcome_advantage(rewards, mask, index)
    # Group 1: 1 - mean(0, 0) = 1, 0 - mean(1, 0) = -0.5; group 2 and 3 are singletons.
    assert adv[:, 0].tolist() == pytest.approx([1.0, -0.5, -0.5, 2.0, 5.0])
    assert adv is returns
    # Dedup: rows 1 and 2 are one trajectory: units [1, 0], 0 - 1 = -1 for both.
    adv, _ = compute_rloo_outcome_advantage(
        rewards, mask, index, [0, 1, 1, 0, 0], compute_mean_std_cross_all_data=False
    )
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1.0, -1.0, 2.0, 5.0])


def test_score_is_the_sum_of_all_token_rewards_and_mask_multiplies():
    rewards = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv, _ = compute_grpo_outcome_advantage(
        rewards, mask, ["q", "q"], norm_adv_by_std_in_grpo=False
    )
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]]
    assert adv.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Tensor hygiene: dtypes, inputs untouched, no autograd graph, device
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.float64, torch.bool, torch.int64])
@pytest.mark.parametrize("reward_dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes_inputs_untouched_and_no_grad(estimator, reward_dtype, mask_dtype):
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.3], [0.7, 0.0]], dtype=reward_dtype)
    rewards.requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]]).to(mask_dtype)
    index = torch.tensor([4, 4, 4])
    traj = np.array(["a", "b", "a"], dtype=object)
    before = (rewards.detach().clone(), mask.clone(), index.clone(), traj.copy())

    advantages, returns = run(
        estimator, rewards, mask, index, traj, compute_mean_std_cross_all_data=False
    )

    assert advantages.dtype == torch.float32
    assert advantages.device == rewards.device
    assert not advantages.requires_grad and advantages.grad_fn is None
    assert advantages is returns
    assert torch.equal(rewards.detach(), before[0]) and rewards.dtype == reward_dtype
    assert torch.equal(mask, before[1]) and torch.equal(index, before[2])
    assert (traj == before[3]).all()
    check_against_reference(
        estimator, rewards.detach(), mask, index, traj, compute_mean_std_cross_all_data=False
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_dense_rewards_are_summed_in_float64(dtype):
    """More than 2**20 reward values: the CPU path sums them by blocks of rows."""
    generator = torch.Generator().manual_seed(3)
    rewards = (torch.randn(1100, 1000, generator=generator) / 30).to(dtype)
    mask = (torch.rand(1100, 1000, generator=generator) > 0.1).float()
    index = torch.randint(0, 40, (1100,), generator=generator)
    traj = torch.randint(0, 3, (1100,), generator=generator)
    for cross in (True, False):
        advantages, _ = compute_grpo_outcome_advantage(
            rewards, mask, index, traj, compute_mean_std_cross_all_data=cross
        )
        # The reference's per-row advantage (a mask of ones, one column), times the real mask.
        expected = reference(
            rewards.double().tolist(),
            [[1.0]] * len(index),
            index.tolist(),
            traj.tolist(),
            compute_mean_std_cross_all_data=cross,
        )
        np.testing.assert_allclose(
            advantages.numpy(), np.array(expected) * mask.numpy(), rtol=TOL, atol=TOL
        )


# --------------------------------------------------------------------------------------------
# Empty batches and reward values no advantage can be computed from
# --------------------------------------------------------------------------------------------

ESTIMATORS = ["grpo", "drgrpo", "rloo", "opo", "grpo_passk", "reinforce_pp_baseline"]
EMPTY_IDS = {
    "list": lambda: [],
    "numpy float64 (np.asarray([]))": lambda: np.array([]),
    "numpy object": lambda: np.array([], dtype=object),
    "numpy str": lambda: np.array([], dtype=str),
    "torch int64": lambda: torch.tensor([], dtype=torch.int64),
    "torch float32 (torch.tensor([]))": lambda: torch.tensor([]),
}


def every_function(rewards, mask, index, traj=None):
    """Each public function of advcli.torch on one batch (verl's drop-ins with and without
    trajectory statistics, compute_advantage for every estimator at both levels), as (name,
    advantages) pairs."""
    for norm in (True, False):
        for cross in (True, False):
            yield (
                f"grpo norm={norm} cross={cross}",
                compute_grpo_outcome_advantage(
                    rewards,
                    mask,
                    index,
                    traj,
                    norm_adv_by_std_in_grpo=norm,
                    compute_mean_std_cross_all_data=cross,
                )[0],
            )
    for cross in (True, False):
        yield (
            f"rloo cross={cross}",
            compute_rloo_outcome_advantage(
                rewards, mask, index, traj, compute_mean_std_cross_all_data=cross
            )[0],
        )
    for estimator in ESTIMATORS:
        for level in ("trajectory", "turn"):
            yield (
                f"{estimator} {level}",
                compute_advantage(rewards, mask, index, traj, estimator=estimator, level=level)[0],
            )


@pytest.mark.parametrize("width", [4, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("ids", sorted(EMPTY_IDS))
def test_empty_batch_gives_empty_results(ids, dtype, width):
    """0 rows: (0, response_length) float32 advantages from every function, whatever container
    holds the (empty) ids."""
    rewards, mask = torch.zeros(0, width, dtype=dtype), torch.zeros(0, width, dtype=dtype)
    for traj in (None, EMPTY_IDS[ids]()):
        for name, advantages in every_function(rewards, mask, EMPTY_IDS[ids](), traj):
            assert advantages.shape == (0, width), name
            assert advantages.dtype == torch.float32, name


@pytest.mark.parametrize("traj_score", [None, "first", "last", "mean", "max", "sum"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_empty_batch_metrics_are_zero(estimator, traj_score):
    """The metrics of an empty batch count nothing; an empty turn_index list (numpy makes it
    float64) is an empty sequence of turns, not a refusal."""
    for unit_tokens in ("sum", "first_row"):
        result = compute_advantage_with_metrics(
            torch.zeros(0, 3),
            torch.zeros(0, 3, dtype=torch.int64),
            [],
            [],
            estimator=estimator,
            traj_score=traj_score,
            turn_index=[],
            unit_tokens=unit_tokens,
        )
        assert result.advantages.shape == (0, 3)
        assert set(result.metrics.as_dict().values()) == {0}
        assert result.metrics.rows == result.metrics.max_rows_per_trajectory == 0


def test_ids_of_length_0_for_rows_are_refused():
    rewards, mask = torch.zeros(3, 2), torch.ones(3, 2)
    with pytest.raises(ValueError, match="index has 0 ids for 3 rows"):
        compute_grpo_outcome_advantage(rewards, mask, np.array([], dtype=object))
    with pytest.raises(ValueError, match="traj_index has 0 ids for 3 rows"):
        compute_advantage(rewards, mask, [0, 0, 0], torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match="turn_index has 0 ids for 3 rows"):
        compute_advantage(rewards, mask, [0, 0, 0], [0, 1, 2], turn_index=[], traj_score="last")
    with pytest.raises(ValueError, match="index has 2 ids for 0 rows"):
        compute_rloo_outcome_advantage(torch.zeros(0, 2), torch.zeros(0, 2), [1, 2])


def refusal(rewards, mask, index, traj=None) -> set[str]:
    """The message of every public function on this batch, each of which must refuse it with a
    RewardError that is both an AdvcliError (the command line's type) and a ValueError."""
    messages = set()
    calls = [
        lambda: compute_grpo_outcome_advantage(rewards, mask, index, traj),
        lambda: compute_grpo_outcome_advantage(
            rewards, mask, index, traj, compute_mean_std_cross_all_data=False
        ),
        lambda: compute_rloo_outcome_advantage(rewards, mask, index, traj),
        *(
            lambda estimator=estimator, level=level: compute_advantage(
                rewards, mask, index, traj, estimator=estimator, level=level
            )
            for estimator in ESTIMATORS
            for level in ("trajectory", "turn")
        ),
    ]
    for call in calls:
        with pytest.raises(RewardError) as caught:
            call()
        assert isinstance(caught.value, AdvcliError) and isinstance(caught.value, ValueError)
        messages.add(str(caught.value))
    return messages


INT_DTYPES = [torch.int64, torch.uint64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_reward_of_2_53_is_kept_exactly(dtype):
    """2^53 is an integer float64 (and float32) holds: RLOO of [0, 2^53] is -2^53, +2^53, with
    no rounding; the singleton group keeps its raw 1."""
    rewards = torch.tensor([[0], [2**53], [1]]).to(dtype)
    advantages, _ = compute_rloo_outcome_advantage(rewards, torch.ones(3, 1), [0, 0, 1])
    assert advantages[:, 0].tolist() == [-(2.0**53), 2.0**53, 1.0]
    advantages, _ = compute_advantage(rewards, torch.ones(3, 1), [0, 0, 1], estimator="drgrpo")
    assert advantages[:, 0].tolist() == [-(2.0**52), 2.0**52, 1.0]


def test_integer_rewards_of_a_row_adding_up_to_2_53_are_kept():
    """Two tokens of 2^52 add up to 2^53 exactly (the float64 screen flags the row; the exact
    int64 sum keeps it)."""
    rewards = torch.tensor([[0, 0], [2**52, 2**52], [1, 0]])
    advantages, _ = compute_rloo_outcome_advantage(rewards, torch.ones(3, 2), [0, 0, 1])
    assert advantages[:, 0].tolist() == [-(2.0**53), 2.0**53, 1.0]


@pytest.mark.parametrize(
    ("row_rewards", "total"),
    [
        ([2**53 + 1, 0], "9007199254740993"),
        ([-(2**53) - 1, 0], "9007199254740993"),
        ([2**52, 2**52 + 1], "9007199254740993"),
        # The score 2^53 - 1 would be exact in this order, but not in every order: the rule is on
        # the sum of |rewards|, as the command line's.
        ([2**53, -1], "9007199254740993"),
        ([2**63 - 1, 0], "about 9.22337e+18"),
        ([-(2**63), 0], "about 9.22337e+18"),
    ],
    ids=["2^53+1", "-2^53-1", "2^52+2^52+1", "2^53,-1", "int64 max", "int64 min"],
)
def test_integer_rewards_beyond_2_53_are_refused(row_rewards, total):
    """Row 1's integer rewards add up beyond 2^53, where float64 would round the score (2^53 + 1
    becomes 2^53): refused by every function, naming the row and the sum."""
    rewards = torch.tensor([[0, 0], row_rewards, [1, 0]])
    assert refusal(rewards, torch.ones(3, 2), [0, 0, 1]) == {
        f"row 1: the integer rewards of the row add up (in absolute value) to {total}, beyond "
        "2^53, where float64 cannot hold every integer"
    }


def test_uint64_reward_beyond_2_63_is_refused():
    rewards = torch.tensor([[0], [2**63 + 5], [1]], dtype=torch.uint64)
    assert refusal(rewards, torch.ones(3, 1), [0, 0, 1]) == {
        "row 1: the integer rewards of the row add up (in absolute value) to about 9.22337e+18, "
        "beyond 2^53, where float64 cannot hold every integer"
    }


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.bool], ids=str)
def test_narrow_integer_rewards_are_summed_exactly(dtype):
    """Integer types that cannot reach 2^53 in a row: exact scores 1, 1, 0, 2 (RLOO by hand:
    group [1, 1, 0] has mean 2/3; 1.5 * (1 - 2/3) = 0.5, 1.5 * (0 - 2/3) = -1)."""
    rewards = torch.tensor([[1, 0], [0, 1], [0, 0], [1, 1]]).to(dtype)
    advantages, _ = compute_rloo_outcome_advantage(rewards, torch.ones(4, 2), [0, 0, 0, 1])
    assert advantages[:, 0].tolist() == pytest.approx([0.5, 0.5, -1.0, 2.0])


NON_FINITE = {"NaN": math.nan, "+inf": math.inf, "-inf": -math.inf}


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.bfloat16, torch.float16],
    ids=["f32", "f64", "bf16", "f16"],
)
@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_non_finite_reward_is_named(name, dtype):
    """A NaN or infinite reward in row 2 (token 1): every function refuses it by row, token and
    value, before any statistic (not as 'scores too large')."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0], [1.0, 0.0]], dtype=dtype)
    rewards[2, 1] = NON_FINITE[name]
    for traj in (None, ["a", "b", "c", "d"]):
        assert refusal(rewards, torch.ones(4, 2), ["q"] * 4, traj) == {
            f"row 2: the reward at token 1 is {name}"
        }


def test_non_finite_reward_on_a_masked_out_token_is_refused():
    """The score is the sum of every token's reward, masked out or not (as verl's and the command
    line's): a NaN on a masked-out token would make the group's statistics NaN."""
    rewards = torch.tensor([[0.0, 1.0], [math.nan, 0.0], [0.5, 0.0]])
    mask = torch.tensor([[1, 1], [0, 1], [1, 1]])
    assert refusal(rewards, mask, [0, 0, 0]) == {"row 1: the reward at token 0 is NaN"}


def test_the_first_bad_row_and_token_are_named():
    """Rows 1 and 3 hold non-finite rewards: row 1, and its first such token (+inf and -inf
    together would sum to NaN)."""
    rewards = torch.zeros(4, 3)
    rewards[3, 0] = math.nan
    rewards[1, 1] = math.inf
    rewards[1, 2] = -math.inf
    assert refusal(rewards, torch.ones(4, 3), [0, 0, 1, 1]) == {
        "row 1: the reward at token 1 is +inf"
    }


def test_finite_float64_rewards_whose_sum_overflows_are_too_large():
    """1.7e308 + 1.7e308 is inf in float64: no reward is infinite, the scores are too large."""
    rewards = torch.tensor([[0.0, 0.0], [1.7e308, 1.7e308], [1.0, 0.0]], dtype=torch.float64)
    assert refusal(rewards, torch.ones(3, 2), [0, 0, 0]) == {
        "row 1: the rewards of the row add up beyond float64 (the scores are too large; rescale "
        "the rewards)"
    }


def test_a_score_beyond_float32_is_too_large_in_every_function():
    """A float64 score of 1e39 does not fit the float32 result (RLOO's 1.5 * (1e39 - mean) was
    inf in verl's drop-in before): its row, the first row at fault, is named. Another row's
    advantage may overflow too (0 - mean in Dr. GRPO): the first such row is named, as the
    command line names it."""
    rewards = torch.tensor([[1e39], [0.0], [0.0]], dtype=torch.float64)
    assert refusal(rewards, torch.ones(3, 1), [0, 0, 0]) == {
        "row 0: the score or its advantage does not fit a float32 (the scores are too large; "
        "rescale the rewards)"
    }
    # Dr. GRPO on [3e38, 3e38, -3e38]: every score fits, the mean is 1e38, and row 2's
    # advantage, -4e38, does not.
    rewards = torch.tensor([[3e38], [3e38], [-3e38]], dtype=torch.float64)
    with pytest.raises(RewardError, match=r"^row 2: the score or its advantage does not fit"):
        compute_grpo_outcome_advantage(
            rewards, torch.ones(3, 1), [0, 0, 0], norm_adv_by_std_in_grpo=False
        )


@pytest.mark.parametrize("name", sorted(NON_FINITE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_non_finite_mask_value_is_named(dtype, name):
    """A NaN or infinite mask value would be a NaN (or inf) advantage at that token and a NaN
    token count: refused by row and token."""
    mask = torch.ones(3, 2, dtype=dtype)
    mask[2, 0] = NON_FINITE[name]
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0]])
    assert refusal(rewards, mask, [0, 0, 0]) == {f"row 2: the response mask at token 0 is {name}"}


def test_a_float16_mask_whose_row_sum_overflows_is_fine():
    """70000 ones sum to inf in float16 (its maximum is 65504), with no value that is not
    finite: the mask is used, not refused. Dr. GRPO by hand: scores 1 and 0, mean 0.5."""
    width = 70_000
    rewards = torch.zeros(2, width)
    rewards[0, -1] = 1.0
    advantages, _ = compute_grpo_outcome_advantage(
        rewards, torch.ones(2, width, dtype=torch.float16), [0, 0], norm_adv_by_std_in_grpo=False
    )
    assert advantages[:, 0].tolist() == [0.5, -0.5]
    assert bool((advantages[:, -1] == advantages[:, 0]).all())


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_id_types_agree():
    rewards = torch.tensor([[1.0], [0.0], [0.5], [2.0], [0.0], [2.0]])
    mask = torch.ones(6, 1)
    groups, trajs = [7, 7, 7, 9, 9, 9], [0, 1, 0, 0, 1, 1]
    variants = [
        (groups, trajs),
        (np.array(groups, dtype=np.int64), np.array(trajs, dtype=np.int32)),
        (np.array(groups, dtype=np.uint64) + np.uint64(2**63), np.array(trajs, dtype=np.uint8)),
        (torch.tensor(groups, dtype=torch.int32), torch.tensor(trajs, dtype=torch.bool)),
        (np.array([f"g{g}" for g in groups], dtype=object), [f"t{t}" for t in trajs]),
        (np.array([f"g{g}" for g in groups]), np.array([str(t) for t in trajs])),  # '<U' dtype
        (torch.tensor(groups, dtype=torch.float64), np.array(trajs, dtype=object)),
        # A reversed view (negative strides), a read-only array, big-endian ints.
        (np.array(groups[::-1], dtype=np.int64)[::-1], np.array(trajs, dtype=">i4")),
        (_read_only(np.array(groups)), _read_only(np.array([f"t{t}" for t in trajs], object))),
    ]
    outputs = [
        compute_grpo_outcome_advantage(
            rewards, mask, index, traj, compute_mean_std_cross_all_data=False
        )[0]
        for index, traj in variants
    ]
    for output in outputs[1:]:
        assert torch.equal(output, outputs[0])
    check_against_reference(
        "grpo", rewards, mask, groups, trajs, compute_mean_std_cross_all_data=False
    )


def test_positions_cache_growth_and_fallback(monkeypatch):
    """String ids are factorized with cached Python ints: growing the cache, then past its cap."""
    import advcli.torch.ids as module

    monkeypatch.setattr(module, "_POSITIONS_CACHED", 12)
    monkeypatch.setattr(module, "_positions_cache", [])
    rng = np.random.default_rng(5)
    for n in (3, 5, 11, 12, 13, 40):
        rewards = torch.from_numpy(rng.choice(SCORES, size=(n, 1))).float()
        groups = [f"g{k}" for k in rng.integers(0, 3, n)]
        trajs = np.array([f"t{k}" for k in rng.integers(0, 3, n)], dtype=object)
        check_against_reference(
            "grpo", rewards, torch.ones(n, 1), groups, trajs, compute_mean_std_cross_all_data=False
        )
    assert module._positions_cache == list(range(12))


def test_bad_inputs():
    rewards, mask = torch.zeros(3, 2), torch.ones(3, 2)
    with pytest.raises(ValueError, match="3 rows"):
        compute_grpo_outcome_advantage(rewards, mask, [1, 2])
    with pytest.raises(ValueError, match="traj_index has 2 ids"):
        compute_grpo_outcome_advantage(
            rewards, mask, [1, 1, 1], [1, 2], compute_mean_std_cross_all_data=False
        )
    with pytest.raises(ValueError, match="response_mask"):
        compute_grpo_outcome_advantage(rewards, torch.ones(3, 3), [1, 1, 1])
    with pytest.raises(ValueError, match="response_length"):
        compute_grpo_outcome_advantage(torch.zeros(3), torch.ones(3), [1, 1, 1])
    with pytest.raises(ValueError, match="1-D"):
        compute_grpo_outcome_advantage(rewards, mask, torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="epsilon"):
        compute_grpo_outcome_advantage(rewards, mask, [1, 1, 1], epsilon=-1.0)
    with pytest.raises(TypeError, match="hashable"):
        compute_grpo_outcome_advantage(rewards, mask, [[1], [1], [1]])


# --------------------------------------------------------------------------------------------
# Hypothesis: equivalence with the reference
# --------------------------------------------------------------------------------------------

SCORES = [-1.0, 0.0, 0.1, 0.25, 0.3, 1.0, 3.0]
MAX_TOKENS = 3


def _mix64(k: int) -> int:
    """A 64-bit signed integer that looks random (so ranges are as wide as int64)."""
    x = (k * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64
    return x - 2**64 if x >= 2**63 else x


ID_KINDS = {
    "str_object": lambda ks: np.array([f"id-{k}" for k in ks], dtype=object),
    "uuid_list": lambda ks: [str(uuid.UUID(int=k + 1)) for k in ks],
    "py_int_list": lambda ks: [k - 3 for k in ks],
    "numpy_int64_wide": lambda ks: np.array([_mix64(k) for k in ks], dtype=np.int64),
    "torch_int64_mid": lambda ks: torch.tensor([k * 10**9 + 7 for k in ks]),
    "torch_int32_small": lambda ks: torch.tensor(ks, dtype=torch.int32),
    # Ranges just under 2**62: combining them with another id overflows int64 unless factorized.
    "numpy_uint64_spread": lambda ks: np.array([k * 2**56 for k in ks], dtype=np.uint64),
}


@st.composite
def batches(draw):
    n = draw(st.integers(1, 40))
    groups = draw(st.integers(1, 5))
    row_group = draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n))
    row_traj = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    # Rows of a trajectory share its score, unless a row is drawn to differ.
    traj_score = {
        key: draw(st.sampled_from(SCORES))
        for key in sorted(set(zip(row_group, row_traj, strict=True)))
    }
    differs = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    scores = [
        draw(st.sampled_from(SCORES)) if differ else traj_score[(g, t)]
        for g, t, differ in zip(row_group, row_traj, differs, strict=True)
    ]
    tokens = draw(st.lists(st.integers(1, MAX_TOKENS), min_size=n, max_size=n))
    split = draw(st.booleans())  # part of the score on the first token, the rest on the last
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
    rewards = torch.zeros(n, MAX_TOKENS)
    mask = torch.zeros(n, MAX_TOKENS)
    for i, (score, count) in enumerate(zip(scores, tokens, strict=True)):
        mask[i, :count] = 1
        rewards[i, count - 1] += score - (0.5 if split else 0.0)
        rewards[i, 0] += 0.5 if split else 0.0
    # Global trajectory ids (uuid-like traj_uid) or rollout numbers reused across groups.
    global_traj = draw(st.booleans())
    traj_keys = [g * 4 + t if global_traj else t for g, t in zip(row_group, row_traj, strict=True)]
    index = ID_KINDS[draw(st.sampled_from(sorted(ID_KINDS)))](row_group)
    traj = ID_KINDS[draw(st.sampled_from(sorted(ID_KINDS)))](traj_keys)
    return rewards.to(dtype), mask, index, traj


@pytest.mark.parametrize("global_traj", [True, False], ids=["traj-global", "traj-per-group"])
@pytest.mark.parametrize("traj_kind", sorted(ID_KINDS))
@pytest.mark.parametrize("index_kind", sorted(ID_KINDS))
def test_every_pair_of_id_kinds(index_kind, traj_kind, global_traj):
    """Each combination of id kinds and ranges (the factorization paths), with dedup."""
    rng = np.random.default_rng(len(index_kind) * 31 + len(traj_kind))
    n = 120
    row_group = rng.integers(0, 12, n).tolist()
    row_traj = rng.integers(0, 4, n).tolist()
    traj_keys = [g * 4 + t if global_traj else t for g, t in zip(row_group, row_traj, strict=True)]
    rewards = torch.from_numpy(rng.choice(SCORES, size=(n, 2))).float()
    mask = torch.ones(n, 2)
    index, traj = ID_KINDS[index_kind](row_group), ID_KINDS[traj_kind](traj_keys)
    for estimator in ("grpo", "rloo"):
        check_against_reference(
            estimator, rewards, mask, index, traj, compute_mean_std_cross_all_data=False
        )


@SETTINGS
@given(
    batch=batches(),
    estimator=st.sampled_from(["grpo", "rloo"]),
    norm=st.booleans(),
    cross=st.booleans(),
    with_traj=st.booleans(),
)
def test_matches_reference(batch, estimator, norm, cross, with_traj):
    rewards, mask, index, traj = batch
    flags: dict[str, Any] = {"compute_mean_std_cross_all_data": cross}
    if estimator == "grpo":
        flags["norm_adv_by_std_in_grpo"] = norm
    check_against_reference(estimator, rewards, mask, index, traj if with_traj else None, **flags)


@SETTINGS
@given(batch=batches(), estimator=st.sampled_from(["grpo", "drgrpo"]))
def test_own_score_rule_matches_reference(batch, estimator):
    """traj_score="own": each trajectory's first row in its group's statistics, every row
    centred on its own score, a group whose first rows tie divided by 1 + ε (not by ε)."""
    rewards, mask, index, traj = batch
    advantages, _ = compute_advantage(
        rewards, mask, index, traj, estimator=estimator, traj_score="own"
    )
    scores = [math.fsum(row) for row in rewards.double().tolist()]
    expected = reference_own_score(
        scores, as_keys(index), as_keys(traj), estimator=estimator, dedup=True, tie_std=1.0
    )
    expected = np.array(
        [[a * m for m in row] for a, row in zip(expected, mask.tolist(), strict=True)]
    )
    assert advantages.dtype == torch.float32
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=TOL, atol=TOL)


def test_own_score_rule_by_hand():
    """Group g: trajectory a's rows score 1 then 0.9 (a penalty), b's row 1: the first rows tie
    (std 0), so each row is divided by 1 + ε: a's second row gets -0.1 / (1 + ε), not -1e5."""
    rewards, mask = torch.tensor([[1.0], [1.0], [0.9]]), torch.ones(3, 1)
    advantages, _ = compute_advantage(rewards, mask, ["g"] * 3, ["a", "b", "a"], traj_score="own")
    expected = [0.0, 0.0, (0.9 - 1.0) / (1 + 1e-6)]
    np.testing.assert_allclose(advantages[:, 0].double().numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("ids", "said"),
    [
        (np.array([1.0, np.nan, 1.0]), "nan"),
        (torch.tensor([1.0, float("nan"), 1.0]), "nan"),
        ([1.0, float("nan"), 1.0], "nan"),
        (np.array(["a", None, "a"], dtype=object), "None"),
        (np.array([np.float32(1), np.float32("nan"), np.float32(1)], dtype=object), "nan"),
    ],
    ids=["numpy float", "tensor", "list", "object None", "object numpy nan"],
)
@pytest.mark.parametrize("argument", ["index", "traj_index"])
def test_a_null_or_nan_id_is_refused_naming_its_row(ids, said, argument):
    """NaN equals no id (each of its rows would be a group of one) and None is no id: either
    is an error naming the argument and the row, never a silent grouping."""
    rewards, mask = torch.tensor([[1.0], [0.0], [1.0]]), torch.ones(3, 1)
    given = {"index": [0, 0, 0], "traj_index": [0, 1, 2], argument: ids}
    with pytest.raises(ValueError, match=rf"^{argument}: row 1 has the id .*{said}"):
        compute_advantage(rewards, mask, given["index"], given["traj_index"])


@pytest.mark.parametrize(
    ("rewards", "mask", "said"),
    [
        (torch.empty(2, 1, device="meta"), None, "token_level_rewards is on the meta device"),
        (None, torch.empty(2, 1, device="meta"), "response_mask is on the meta device"),
        (torch.ones(2, 1, dtype=torch.complex64), None, "token_level_rewards holds complex"),
        (None, torch.ones(2, 1, dtype=torch.complex64), "response_mask holds complex"),
        (torch.ones(2, 1).to_sparse(), None, "token_level_rewards must be a dense tensor"),
    ],
    ids=["meta rewards", "meta mask", "complex rewards", "complex mask", "sparse rewards"],
)
def test_tensors_that_hold_no_real_values_are_refused_by_name(rewards, mask, said):
    """Each one a ValueError naming the argument, not torch's own error from deep inside (a
    meta tensor's .item(), complex values silently cast to real)."""
    rewards = torch.ones(2, 1) if rewards is None else rewards
    mask = torch.ones(2, 1) if mask is None else mask
    with pytest.raises(ValueError, match=f"^{said}"):
        compute_advantage(rewards, mask, [0, 0])


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (torch.ones(2, dtype=torch.complex64), "step_rewards holds complex numbers"),
        (np.ones(2, dtype=complex), "step_rewards holds complex numbers"),
        ([1j, 0], "step_rewards holds complex numbers"),
        (torch.empty(2, device="meta"), "step_rewards is on the meta device"),
    ],
    ids=["complex tensor", "complex numpy", "complex list", "meta tensor"],
)
def test_step_rewards_that_hold_no_real_values_are_refused_by_name(values, said):
    rewards, mask = torch.ones(2, 1), torch.ones(2, 1)
    with pytest.raises(ValueError, match=f"^{said}"):
        compute_advantage(
            rewards,
            mask,
            [0, 0],
            [0, 1],
            estimator="gigpo",
            anchor_index=[0, 0],
            step_rewards=values,
        )


@pytest.mark.parametrize("estimator", ["rloo", "opo", "grpo_passk", "reinforce_pp_baseline"])
def test_own_score_rule_refuses_other_estimators(estimator):
    rewards, mask = torch.tensor([[1.0], [0.0]]), torch.ones(2, 1)
    with pytest.raises(ValueError, match="--traj-score own takes --estimator grpo, drgrpo, gigpo"):
        compute_advantage(rewards, mask, [0, 0], [0, 1], estimator=estimator, traj_score="own")


@settings(max_examples=40, deadline=None)
@given(batch=batches(), seed=st.integers(0, 2**16))
def test_dedup_with_consistent_trajectories_is_row_order_invariant(batch, seed):
    """When every row of a trajectory has its score, permuting the rows permutes the output."""
    rewards, mask, index, traj = batch
    keys = list(zip(as_keys(index), as_keys(traj), strict=True))
    first_score: dict[Any, torch.Tensor] = {}
    for i, key in enumerate(keys):
        first_score.setdefault(key, rewards[i].clone())
    rewards = torch.stack([first_score[key] for key in keys])
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(keys)))

    def permuted(ids):
        if isinstance(ids, torch.Tensor | np.ndarray):
            return ids[order.numpy()] if isinstance(ids, np.ndarray) else ids[order]
        return [ids[i] for i in order.tolist()]

    flags = {"compute_mean_std_cross_all_data": False}
    out, _ = compute_grpo_outcome_advantage(rewards, mask, index, traj, **flags)
    shuffled, _ = compute_grpo_outcome_advantage(
        rewards[order], mask[order], permuted(index), permuted(traj), **flags
    )
    np.testing.assert_allclose(shuffled.numpy(), out[order].numpy(), rtol=TOL, atol=TOL)


# --------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cross", [True, False])
def test_cuda_matches_cpu(cross):
    generator = torch.Generator().manual_seed(0)
    n = 5000
    rewards = torch.randint(0, 3, (n, 8), generator=generator).float() / 2
    mask = (torch.rand(n, 8, generator=generator) > 0.2).float()
    group = torch.randint(0, 300, (n,), generator=generator)
    traj = torch.randint(0, 8, (n,), generator=generator)
    uid = np.array([f"u{g}" for g in group.tolist()], dtype=object)
    for index in (group, uid):
        cpu, _ = compute_grpo_outcome_advantage(
            rewards, mask, index, traj, compute_mean_std_cross_all_data=cross
        )
        cuda_index = index.cuda() if isinstance(index, torch.Tensor) else index
        gpu, gpu_returns = compute_grpo_outcome_advantage(
            rewards.cuda().bfloat16().float(),
            mask.cuda(),
            cuda_index,
            traj.cuda(),
            compute_mean_std_cross_all_data=cross,
        )
        assert gpu.device.type == "cuda" and gpu.dtype == torch.float32 and gpu is gpu_returns
        np.testing.assert_allclose(gpu.cpu().numpy(), cpu.numpy(), rtol=TOL, atol=TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "estimator", ["grpo", "rloo", "opo", "grpo_passk", "reinforce_pp_baseline"]
)
@pytest.mark.parametrize("level", ["turn", "trajectory"])
def test_compute_advantage_on_cuda_matches_cpu(estimator, level):
    generator = torch.Generator().manual_seed(1)
    n = 5000
    traj = torch.randint(0, 2000, (n,), generator=generator)
    group = traj // 8
    scores = torch.randint(0, 3, (2000,), generator=generator).float() / 2
    rewards = torch.zeros(n, 8)
    rewards[:, -1] = scores[traj]
    mask = (torch.rand(n, 8, generator=generator) > 0.2).float()
    mask[:, -1] = 1
    cpu, _ = compute_advantage(rewards, mask, group, traj, estimator=estimator, level=level)
    gpu, _ = compute_advantage(
        rewards.cuda(), mask.cuda(), group.cuda(), traj.cuda(), estimator=estimator, level=level
    )
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def _grpo_loo(rows: list, **settings: Any) -> np.ndarray:
    """compute_advantage's grpo_loo of the rows (one trajectory each), float64 rewards."""
    rewards = torch.zeros(len(rows), 2, dtype=torch.float64)
    rewards[:, 1] = torch.tensor([row[3] for row in rows], dtype=torch.float64)
    advantages, _ = compute_advantage(
        rewards,
        torch.ones(len(rows), 2),
        [row[0] for row in rows],
        [row[1] for row in rows],
        **settings,
    )
    return advantages[:, 0].numpy()


def test_grpo_loo_by_hand():
    """NeMo-RL's GRPO (--recipe nemo-rl) on the tensors: the values worked by hand in
    tests/cases.py, a tie among a unit's others undivided."""
    got = _grpo_loo(LOO_ROWS, recipe="nemo-rl", epsilon=0.0)
    np.testing.assert_allclose(got, LOO_BY_HAND, rtol=1e-6, atol=1e-6)


def test_grpo_loo_keeps_the_precision_of_nearly_tied_others():
    expected = reference_advantages(LOO_NEAR_TIES, level="trajectory", estimator="grpo_loo")
    got = _grpo_loo(LOO_NEAR_TIES, estimator="grpo_loo")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

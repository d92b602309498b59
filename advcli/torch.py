"""Vectorized GRPO-family advantages for a training step, on torch tensors.

This module is the in-trainer counterpart of ``advcli compute``: a drop-in for verl's
``compute_grpo_outcome_advantage`` that works on one batch of rows (one row per turn of a
multi-turn trajectory) without a Python loop over the rows, optionally counting each trajectory
once in its group's statistics.

It needs the optional extra ``advcli[torch]``; it is the only module of advcli that imports torch,
and ``import advcli`` never imports it.

Semantics (``s`` is a row's score, the sum of its token-level rewards):

* The *units* of a group are the rows that enter its statistics: every row when ``traj_index`` is
  ``None`` or ``compute_mean_std_cross_all_data=True`` (verl's GRPO); otherwise only the first row,
  in batch order, of each ``(index, traj_index)`` pair.
* Each row is normalized with its group's statistics using its **own** score:
  ``(s - mean) / (std + epsilon)`` (GRPO), ``s - mean`` (Dr. GRPO), ``n / (n - 1) * (s - mean)``
  (RLOO). The std is unbiased (ddof=1); a group with a single unit has mean 0 and std 1 (RLOO: the
  raw score); when all units of a group have exactly the same score, the mean is that score and
  the std 0, so a row with that score gets exactly 0.
* Statistics are accumulated in float64; the result is float32 ``(bs, response_length)``, the
  scalar advantage times ``response_mask``, on the rewards' device, with no autograd graph.
* Before any statistic, a NaN or infinite reward on any token (the score sums every token, masked
  out or not, as verl's estimators do) or mask value, and integer rewards of a row that add up
  beyond 2^53 in absolute value (float64 would round the score; 2^53 itself is kept), raise
  :class:`RewardError` naming the row (batch index), the token and the value; so do finite
  scores whose advantages do not fit the float32 result ("too large"). verl 0.9.1's own
  estimators return NaN for every row of that reward's group instead, with no error.
* An empty batch (0 rows) gives float32 ``(0, response_length)`` advantages and metrics that
  count 0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("advcli.torch needs torch: pip install 'advcli[torch]'") from error

from advcli.errors import AdvcliError, UsageError
from advcli.rules import (
    EXACT_INTEGER_LIMIT,
    RULES,
    SCORE_TOLERANCE,
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    Baseline,
    EstimatorRule,
)
from advcli.settings import (
    AdvantageConfig,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)
from advcli.tensor_ids import (
    KEY_LIMIT,
    Codes,
    Ids,
    check_length,
    compact,
    dense,
    direct_limit,
    numpy_to_tensor,
    raw_codes,
    unique_codes,
)

__all__ = [
    "AdvantageMetrics",
    "AdvantageResult",
    "RewardError",
    "compute_advantage",
    "compute_advantage_with_metrics",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
]

# Rewards are summed in float64 by blocks of about this many values (see _scores).
_SUM_BLOCK = 1 << 20


class RewardError(AdvcliError, ValueError):
    """Rewards or a mask no advantage can be computed from: a NaN or infinite value, integer
    rewards beyond 2^53, scores too large for the float32 result. The message names the row
    (batch index) and the value. An :class:`~advcli.errors.AdvcliError`, as the command line
    raises for the same rows, and a ``ValueError``, as every other bad input of this module."""


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    compute_mean_std_cross_all_data: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (or Dr. GRPO) outcome advantages, optionally with trajectory-level statistics.

    Parameters
    ----------
    token_level_rewards
        ``(bs, response_length)`` rewards of any floating dtype (bfloat16 included); a row's score
        is the sum of its row.
    response_mask
        ``(bs, response_length)`` mask (bool, int or float); the advantage is multiplied by it.
    index
        ``bs`` group ids (verl's ``uid``): a numpy array of str/objects or ints, a list, or a 1-D
        torch tensor.
    traj_index
        ``bs`` trajectory ids (verl-agent's ``traj_uid``, a rollout id), only needed to be unique
        within a group. Used only with ``compute_mean_std_cross_all_data=False``.
    epsilon
        Added to the group std before dividing (must be ``>= 0``).
    norm_adv_by_std_in_grpo
        ``True``: GRPO, ``(s - mean) / (std + epsilon)``; ``False``: Dr. GRPO, ``s - mean``.
    compute_mean_std_cross_all_data
        ``True``: every row enters its group's mean and std (verl's GRPO). ``False`` with
        ``traj_index``: only the first row (in batch order) of each ``(index, traj_index)`` pair
        does, so each trajectory counts once whatever its number of turns.

    Returns
    -------
    advantages, returns
        The same float32 ``(bs, response_length)`` tensor twice, as verl returns it.

    Raises
    ------
    RewardError
        A NaN or infinite reward (on any token, masked out or not: the score sums them all) or
        mask value, integer rewards of a row adding up beyond 2^53 in absolute value, or scores
        whose advantages do not fit a float32; the message names the row and token. Here advcli
        does not keep verl's behaviour for parity: verl 0.9.1's function returns NaN for every
        row of the group (NaN at the token, for a mask value), with no error.

    Examples
    --------
    >>> import numpy as np, torch
    >>> rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    >>> mask = torch.ones(4, 2)
    >>> uid = np.array(["q", "q", "q", "q"], dtype=object)
    >>> traj = np.array(["a", "b", "b", "b"], dtype=object)  # b: a 3-turn failure
    >>> adv, _ = compute_grpo_outcome_advantage(
    ...     rewards, mask, uid, traj, compute_mean_std_cross_all_data=False
    ... )
    >>> adv[:, -1]
    tensor([ 0.7071, -0.7071, -0.7071, -0.7071])
    """
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    rule = RULES["grpo" if norm_adv_by_std_in_grpo else "drgrpo"]
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        stats = _group_statistics(scores, index, traj_index, compute_mean_std_cross_all_data)
        advantage = _advantages(rule, stats, epsilon)
        _check_fits(scores, advantage, None)
        out = _broadcast(advantage, response_mask)
    return out, out


def _advantages(rule: EstimatorRule, stats: _GroupStatistics, epsilon: float) -> torch.Tensor:
    """Each row's advantage under ``rule`` (from advcli.rules, as the Polars path), per row."""
    if rule.baseline is Baseline.LEAVE_ONE_OUT:
        # s minus the mean of the other n - 1 units = n / (n - 1) * (s - mean); a lone unit keeps
        # its score (its baseline is SINGLETON_MEAN).
        factor = torch.where(stats.count == 1, 1.0, stats.count / (stats.count - 1))
        scale = factor.index_select(0, stats.row_group)
        return torch.mul(stats.centred, scale, out=scale)
    if rule.baseline is not Baseline.MEAN or rule.whitens or not rule.singleton_keeps_score:
        raise NotImplementedError(f"advcli.torch does not implement this rule yet: {rule}")
    if not rule.divides:
        return stats.centred
    # A lone unit is divided by SINGLETON_STD, not by 0 / 0.
    std = torch.where(
        stats.count == 1, SINGLETON_STD, torch.sqrt(stats.m2 / (stats.count - STD_DDOF))
    )
    denominator = (std + epsilon).index_select(0, stats.row_group)
    advantage = torch.div(stats.centred, denominator, out=denominator)
    if epsilon == 0:
        # A zero-std group's equal rows stay exactly 0 (0 / 0 otherwise); with epsilon > 0
        # they are 0 / epsilon = 0 already.
        advantage = torch.where(stats.centred == 0, 0.0, advantage)
    return advantage


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    compute_mean_std_cross_all_data: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO outcome advantages: ``n / (n - 1) * (s - mean)`` over the group's ``n`` units.

    This equals ``s`` minus the mean of the group's *other* units when the row is a unit. A group
    with a single unit keeps the raw score. Units and ids are as in
    :func:`compute_grpo_outcome_advantage`.

    Parameters
    ----------
    token_level_rewards, response_mask, index, traj_index, compute_mean_std_cross_all_data
        As in :func:`compute_grpo_outcome_advantage`.

    Returns
    -------
    advantages, returns
        The same float32 ``(bs, response_length)`` tensor twice.

    Raises
    ------
    RewardError
        As :func:`compute_grpo_outcome_advantage` (verl 0.9.1's RLOO returns NaN or inf for the
        group instead).

    Examples
    --------
    >>> import torch
    >>> rewards = torch.tensor([[1.0], [0.0], [0.0]])
    >>> adv, _ = compute_rloo_outcome_advantage(rewards, torch.ones(3, 1), [7, 7, 7])
    >>> adv[:, 0]
    tensor([ 1.0000, -0.5000, -0.5000])
    """
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        stats = _group_statistics(scores, index, traj_index, compute_mean_std_cross_all_data)
        advantage = _advantages(RULES["rloo"], stats, 0.0)
        _check_fits(scores, advantage, None)
        out = _broadcast(advantage, response_mask)
    return out, out


@dataclass(frozen=True)
class _GroupStatistics:
    """What every estimator needs, in float64.

    ``row_group``: each row's group slot. Per group slot: ``count``, the number of units, and
    ``m2``, Σ(x - mean)² over its units (meaningless for a one-unit group). Per row: ``centred``,
    the row's own score minus its group's baseline (the units' mean, 0 for a one-unit group).
    Slots that no row uses hold NaN or 0; they are never read.
    """

    row_group: torch.Tensor
    count: torch.Tensor
    m2: torch.Tensor
    centred: torch.Tensor


def _group_statistics(
    scores: torch.Tensor, index: Ids, traj_index: Ids | None, cross_all_data: bool
) -> _GroupStatistics:
    """The statistics shared by every estimator: which rows are units, and their group moments."""
    n = scores.shape[0]
    device = scores.device
    group = raw_codes(index, n, device, "index")
    if traj_index is None or cross_all_data:
        if traj_index is not None:
            check_length(traj_index, n, "traj_index")
        group = compact(group, n)
        count, _, m2, deviation = _moments(scores, group.values, group.bound)
        # Every row is a unit: its deviation from the baseline is its centred score.
        return _GroupStatistics(group.values, count, m2, deviation)

    traj = raw_codes(traj_index, n, device, "traj_index")
    positions = torch.arange(n, device=device)
    if traj.first_rows and torch.equal(group.values.index_select(0, traj.values), group.values):
        # Each trajectory id occurs in one group only (verl-agent's uuid traj_uid): the
        # trajectory's first row is the pair's first row, no key to sort.
        group = compact(group, n)
        return _unit_statistics(scores, traj.values == positions, group)
    # Combine (group, trajectory) into one integer key; factorize a side first if the product
    # of the ranges would overflow (dense codes are < n, so it then fits).
    if group.bound * traj.bound >= KEY_LIMIT:
        group = dense(group)
    if group.bound * traj.bound >= KEY_LIMIT:
        traj = dense(traj)
    key = group.codes * traj.bound + traj.codes
    key_bound = group.bound * traj.bound
    if key_bound <= direct_limit(n):
        pair = key
        pair_bound = key_bound
        group = compact(group, n)
    else:
        unique_keys, pair = unique_codes(key, key_bound)
        pair_bound = unique_keys.numel()
        if group.bound > direct_limit(n):
            # unique_keys is sorted, so the group part of each key is non-decreasing: a
            # consecutive-unique pass (no sort) numbers the groups densely.
            groups_of_pairs, pair_group = torch.unique_consecutive(
                torch.div(unique_keys, traj.bound, rounding_mode="floor"), return_inverse=True
            )
            group = Codes(pair_group.index_select(0, pair), groups_of_pairs.numel())
        else:
            group = compact(group, n)
    first = torch.full((pair_bound,), n, dtype=torch.int64, device=device)
    first.scatter_reduce_(0, pair, positions, reduce="amin")
    return _unit_statistics(scores, first.index_select(0, pair) == positions, group)


def _unit_statistics(scores: torch.Tensor, is_unit: torch.Tensor, group: Codes) -> _GroupStatistics:
    """Group statistics over the rows flagged ``is_unit``; every row centred on its baseline."""
    units = torch.nonzero(is_unit).squeeze(1)
    count, baseline, m2, _ = _moments(
        scores.index_select(0, units), group.values.index_select(0, units), group.bound
    )
    centred = baseline.index_select(0, group.values)
    torch.sub(scores, centred, out=centred)
    return _GroupStatistics(group.values, count, m2, centred)


def _moments(
    x: torch.Tensor, unit_group: torch.Tensor, bound: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group of the units ``x``: count, baseline, Σ(x - mean)²; per unit: x - baseline.

    The baseline is the units' mean, or 0 for a group of one unit (verl's rule). Each group's
    values are first shifted by one of its own values, so a group whose units are all equal gets
    exactly that value as its mean and exactly 0 as Σ(x - mean)², with no rounding noise.
    """
    # Per-unit intermediates reuse two buffers (out=): fresh large allocations cost page faults.
    count = torch.bincount(unit_group, minlength=bound).to(torch.float64)
    representative = x.new_zeros(bound).scatter_(0, unit_group, x)
    work = representative.index_select(0, unit_group)
    torch.sub(x, work, out=work)
    mean = representative + x.new_zeros(bound).scatter_add_(0, unit_group, work) / count
    baseline = torch.where(count == 1, SINGLETON_MEAN, mean)
    deviation = baseline.index_select(0, unit_group)
    torch.sub(x, deviation, out=deviation)
    torch.mul(deviation, deviation, out=work)
    m2 = x.new_zeros(bound).scatter_add_(0, unit_group, work)
    return count, baseline, m2, deviation


def _scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each row's score, the sum of its token-level rewards, in float64, after the checks that
    no reward or mask value can make a NaN or a rounded score (:func:`_check_integers`,
    :func:`_check_scores`, :func:`_check_mask`)."""
    if token_level_rewards.dim() != 2:
        raise ValueError(
            "token_level_rewards must be (bs, response_length), got shape "
            f"{tuple(token_level_rewards.shape)}"
        )
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}, token_level_rewards "
            f"{tuple(token_level_rewards.shape)}"
        )
    rewards = token_level_rewards.detach()
    _check_integers(rewards)
    scores = _sum_rows(rewards)
    _check_scores(rewards, scores)
    _check_mask(response_mask.detach())
    return scores


def _sum_rows(rewards: torch.Tensor) -> torch.Tensor:
    """Each row's sum in float64 (exact for the integer rewards _check_integers lets through)."""
    rows, length = rewards.shape
    if length == 1:  # the sum of one token; torch reduces a length-1 dim slowly
        return rewards[:, 0].to(torch.float64)
    block = max(1, _SUM_BLOCK // max(length, 1))
    if rewards.device.type != "cpu" or block >= rows:
        return rewards.sum(dim=-1, dtype=torch.float64)
    # On CPU, sum(dtype=float64) materializes a float64 copy of the whole tensor, which is slow
    # (fresh pages) for a long response_length: convert and sum blocks of rows in one reused
    # buffer instead (a loop over blocks of ~2**20 values, not over rows; same result).
    scores = torch.empty(rows, dtype=torch.float64)
    buffer = torch.empty(block, length, dtype=torch.float64)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        piece = buffer[: stop - start]
        piece.copy_(rewards[start:stop])
        torch.sum(piece, dim=-1, out=scores[start:stop])
    return scores


# Integer sums below this are exact in int64 (with room for the float64 rounding of the
# |rewards| sum that selects them).
_INT64_EXACT_SUMS = 2.0**61


def _check_integers(rewards: torch.Tensor) -> None:
    """Refuse integer rewards whose float64 score could be rounded, as the command line does:
    a row whose rewards add up, in absolute value, beyond 2^53 (every partial sum of a row within
    it is an integer float64 holds exactly, so the score is the exact sum)."""
    if rewards.is_floating_point() or rewards.dtype == torch.bool or not rewards.numel():
        return
    info = torch.iinfo(rewards.dtype)
    largest = max(-info.min, info.max)
    if largest * rewards.shape[1] > EXACT_INTEGER_LIMIT and rewards.dtype == torch.int64:
        low, high = torch.aminmax(rewards)
        largest = max(-int(low), int(high))
    if largest * rewards.shape[1] <= EXACT_INTEGER_LIMIT:
        return  # no row can add up beyond 2^53
    magnitude = rewards.to(torch.float64).abs_().sum(dim=-1)
    # The float64 sum of |rewards| is exact up to 2^53 and at least 2^53 beyond it (rounding is
    # monotone), so only rows that reach 2^53 are looked at, with exact int64 sums where those
    # cannot overflow.
    suspect = torch.nonzero(magnitude >= EXACT_INTEGER_LIMIT).squeeze(1)
    if not suspect.numel():
        return
    near = suspect[magnitude.index_select(0, suspect) <= _INT64_EXACT_SUMS]
    exact = rewards.index_select(0, near).to(torch.int64).abs_().sum(dim=-1)
    far = suspect[magnitude.index_select(0, suspect) > _INT64_EXACT_SUMS]
    beyond = torch.cat([near[exact > EXACT_INTEGER_LIMIT], far])
    if not beyond.numel():
        return
    row = int(beyond.min())
    at = torch.nonzero(near == row)
    total = f"{int(exact[at[0, 0]])}" if at.numel() else f"about {float(magnitude[row]):.6g}"
    raise RewardError(
        f"row {row}: the integer rewards of the row add up (in absolute value) to {total}, "
        "beyond 2^53, where float64 cannot hold every integer"
    )


def _non_finite_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def _check_scores(rewards: torch.Tensor, scores: torch.Tensor) -> None:
    """Refuse a NaN or infinite reward, naming its row and token: it would make its group's
    statistics NaN. Every token counts, masked out or not: the score sums them all (as verl's
    estimators do). A row of finite float64 rewards whose sum overflows is "too large"."""
    if _fits_float32(scores):
        return  # the usual case, one pass; finite scores beyond float32 are _check_fits's
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return
    row = int(torch.nonzero(~finite)[0, 0])
    values = rewards[row]
    tokens = torch.nonzero(~torch.isfinite(values))
    if tokens.numel():
        token = int(tokens[0, 0])
        raise RewardError(
            f"row {row}: the reward at token {token} is {_non_finite_name(float(values[token]))}"
        )
    raise RewardError(
        f"row {row}: the rewards of the row add up beyond float64 (the scores are too large; "
        "rescale the rewards)"
    )


def _check_mask(mask: torch.Tensor) -> None:
    """Refuse a NaN or infinite value in a floating mask, naming its row and token: the
    advantage times it would be NaN there (and the token counts NaN)."""
    if not mask.is_floating_point() or not mask.numel():
        return
    # Sums are a cheap screen (no per-value result): a non-finite value makes the total and its
    # row's sum non-finite. A sum that overflows with finite values only (a float16 mask of more
    # than 65504 ones) is let through.
    if bool(torch.isfinite(mask.sum())):
        return
    suspect = torch.nonzero(~torch.isfinite(mask.sum(dim=-1))).squeeze(1)
    if not suspect.numel():
        return
    bad = torch.nonzero(~torch.isfinite(mask.index_select(0, suspect)))
    if not bad.numel():
        return
    row, token = int(suspect[bad[0, 0]]), int(bad[0, 1])
    raise RewardError(
        f"row {row}: the response mask at token {token} is "
        f"{_non_finite_name(float(mask[row, token]))}"
    )


def _broadcast(advantage: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The float32 ``(bs, response_length)`` result: each row's advantage times its mask."""
    # Cast first: a float64 x float32 multiply into a float32 output is much slower on CPU.
    out = advantage.to(torch.float32).unsqueeze(-1) * response_mask.detach()
    return out if out.dtype == torch.float32 else out.to(torch.float32)


def compute_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    *,
    estimator: str = "grpo",
    level: str = "trajectory",
    scale: str | None = None,
    singleton: str = "raw",
    traj_score: str | None = None,
    turn_index: Ids | None = None,
    epsilon: float = 1e-6,
    unit_tokens: str = "sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any of advcli's estimators on one batch, with the numbers of ``advcli compute``.

    The same settings and rules as the command line (README: "Estimators" and "Formulas and
    edge-case rules"), read from the same table (:data:`advcli.rules.RULES`).

    Parameters
    ----------
    token_level_rewards, response_mask
        ``(bs, response_length)``; a row's score is the sum of its rewards (in float64), its
        token count the sum of its mask.
    index
        ``bs`` group ids (verl's ``uid``).
    traj_index
        ``bs`` trajectory ids, unique within a group; ``None``: each row is a trajectory.
    estimator
        ``grpo``, ``drgrpo``, ``rloo``, ``opo``, ``grpo_passk`` or ``reinforce_pp_baseline``.
    level
        ``trajectory``: each trajectory is one unit of its group, its advantage broadcast to its
        rows; ``turn``: every row is a unit with its own score.
    scale, singleton, epsilon
        As ``--scale`` (grpo and grpo_passk: ``group``, ``batch`` or ``none``), ``--singleton``
        (``raw`` or ``zero``) and ``--epsilon``.
    traj_score
        The trajectory's score when its rows disagree: ``first``, ``last``, ``mean``, ``max``,
        ``sum``; ``None`` refuses such a trajectory (``ValueError``), as the command line does.
        verl's v1 path takes the final turn's: ``"last"`` with ``turn_index``.
    turn_index
        ``bs`` turn numbers that order ``first`` and ``last``; ``None``: the batch order.
    unit_tokens
        A trajectory's token count for opo's weights and REINFORCE++'s whitening: ``"sum"`` of its
        rows' (advcli), or ``"first_row"``, its first row's, whitening over one row per
        trajectory (agent-lightning's rollout-level path, which runs verl's estimator on each
        rollout's first row).

    Returns
    -------
    advantages, returns
        The same float32 ``(bs, response_length)`` tensor twice, on the rewards' device.

    Raises
    ------
    RewardError
        As :func:`compute_grpo_outcome_advantage`, with the command line's rules for the same
        rows.

    Examples
    --------
    >>> import torch
    >>> rewards = torch.tensor([[1.0], [1.0], [1.0], [0.0]])
    >>> uid, traj = ["q"] * 4, ["a", "a", "a", "b"]  # a: a 3-turn success, b: a failure
    >>> compute_advantage(rewards, torch.ones(4, 1), uid, traj, estimator="rloo")[0][:, 0]
    tensor([ 1.,  1.,  1., -1.])
    >>> compute_advantage(rewards, torch.ones(4, 1), uid, traj, level="turn")[0][:, 0]
    tensor([ 0.5000,  0.5000,  0.5000, -1.5000])
    """
    result = compute_advantage_with_metrics(
        token_level_rewards,
        response_mask,
        index,
        traj_index,
        estimator=estimator,
        level=level,
        scale=scale,
        singleton=singleton,
        traj_score=traj_score,
        turn_index=turn_index,
        epsilon=epsilon,
        unit_tokens=unit_tokens,
    )
    return result.advantages, result.advantages


@dataclass(frozen=True)
class AdvantageMetrics:
    """What a trainer logs about a batch: its rows, trajectories (and how many have more than one
    row, and the most rows one has), groups, and the groups of one unit and of equal scores at
    the level used."""

    rows: int
    trajectories: int
    multi_row_trajectories: int
    max_rows_per_trajectory: int
    groups: int
    singleton_groups: int
    zero_std_groups: int

    def as_dict(self, prefix: str = "advcli/") -> dict[str, int]:
        """The metrics keyed ``advcli/rows``, ``advcli/trajectories``, … for a logger."""
        return {f"{prefix}{name}": getattr(self, name) for name in self.__dataclass_fields__}


class AdvantageResult:
    """``advantages``, and the batch's ``metrics``, counted when first asked for (they cost a
    pass over the rows that the advantages alone do not need)."""

    def __init__(
        self,
        advantages: torch.Tensor,
        rows: int,
        trajectories: _Trajectories | None,
        groups: _GroupCounts,
    ) -> None:
        self.advantages = advantages
        self._rows, self._trajectories, self._groups = rows, trajectories, groups

    @functools.cached_property
    def metrics(self) -> AdvantageMetrics:
        rows = self._trajectories.rows() if self._trajectories is not None else None
        return AdvantageMetrics(
            rows=self._rows,
            trajectories=rows.numel() if rows is not None else self._rows,
            multi_row_trajectories=int((rows > 1).sum()) if rows is not None else 0,
            max_rows_per_trajectory=(
                int(rows.max()) if rows is not None and rows.numel() else min(self._rows, 1)
            ),
            groups=self._groups.groups,
            singleton_groups=self._groups.singleton_groups,
            zero_std_groups=self._groups.zero_std_groups,
        )


def compute_advantage_with_metrics(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    *,
    estimator: str = "grpo",
    level: str = "trajectory",
    scale: str | None = None,
    singleton: str = "raw",
    traj_score: str | None = None,
    turn_index: Ids | None = None,
    epsilon: float = 1e-6,
    unit_tokens: str = "sum",
) -> AdvantageResult:
    """:func:`compute_advantage`'s tensor (once) and the batch's :class:`AdvantageMetrics`."""
    config = _config(estimator, level, scale, singleton, traj_score, epsilon)
    if unit_tokens not in ("sum", "first_row"):
        raise ValueError(f"unit_tokens is 'sum' or 'first_row', got {unit_tokens!r}")
    rule = RULES[config.estimator]
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        # Token counts only where the rule weighs by them (opo, REINFORCE++).
        tokens = (
            response_mask.detach().to(torch.float64).sum(dim=-1) if rule.counts_tokens else None
        )
        n = scores.shape[0]
        device = scores.device
        traj = raw_codes(traj_index, n, device, "traj_index") if traj_index is not None else None
        trajectories: _Trajectories | None = None
        if config.level is Level.TRAJECTORY and traj is not None:
            assert traj_index is not None
            trajectories, unit_group = _trajectories_and_groups(index, traj, n, device)
            turn = _turn_numbers(turn_index, n, device) if turn_index is not None else None
            units = _trajectory_units(
                scores, tokens, unit_group, trajectories, turn, config, unit_tokens
            )
            if config.traj_score is None:
                _check_consistent(scores, units.score, trajectories, index, traj_index)
        else:
            group = compact(raw_codes(index, n, device, "index"), n)
            if traj is not None:
                trajectories = _Trajectories.of(group, traj, n)
            units = _Units(scores, tokens, group.values, group.bound, None)
        unit_advantage, stats = _unit_advantages(units, config)
        if rule.whitens and unit_tokens == "first_row":
            # agent-lightning whitens its representative rows, one per trajectory.
            assert units.tokens is not None
            unit_advantage = _whiten(unit_advantage, units.tokens)
        _check_fits(scores, unit_advantage, units.first_row)
        advantage = unit_advantage
        if units.first_row is not None:  # trajectories: each row takes its trajectory's
            assert trajectories is not None
            advantage = trajectories.to_rows(unit_advantage)
        if rule.whitens and unit_tokens == "sum":
            assert tokens is not None
            advantage = _whiten(advantage, tokens)
        out = _broadcast(advantage, response_mask)
    return AdvantageResult(out, n, trajectories, stats)


def _config(
    estimator: str,
    level: str,
    scale: str | None,
    singleton: str,
    traj_score: str | None,
    epsilon: float,
) -> AdvantageConfig:
    """The settings checked by the command line's own :class:`AdvantageConfig` (a bad value is a
    ``ValueError`` here)."""
    try:
        return AdvantageConfig(
            level=Level(level),
            estimator=Estimator(estimator),
            epsilon=epsilon,
            traj_score=TrajScore(traj_score) if traj_score is not None else None,
            scale=Scale(scale) if scale is not None else None,
            singleton=Singleton(singleton),
        )
    except UsageError as error:
        raise ValueError(str(error)) from None


@dataclass(frozen=True)
class _Trajectories:
    """The trajectories of a batch, by *slot*: each row's ``slot`` in ``[0, bound)`` (slots may be
    left unused), each slot's ``first`` row (``n`` where unused), and ``used``, the used slots in
    increasing order: trajectory k of the units is slot ``used[k]``.

    Working in slot space keeps the per-row passes to gathers and scatters by ``slot``: no
    per-row numbering of the trajectories is ever made.
    """

    slot: torch.Tensor
    bound: int
    first: torch.Tensor
    used: torch.Tensor

    @classmethod
    def of(cls, group: Codes, traj: Codes, n: int) -> _Trajectories:
        """The (group, trajectory) pairs of the rows."""
        if traj.first_rows or traj.bound <= direct_limit(n):
            # Trajectory ids that each lie in one group (a global rollout counter, verl-agent's
            # uuids) are the pairs already: no key to combine, and no sort. Checked after the
            # fact: every row's group is its trajectory's first row's.
            slot = traj.values if traj.first_rows else traj.codes
            trajectories = cls.from_slots(slot, n if traj.first_rows else traj.bound, n)
            first_group = group.values.index_select(0, trajectories.first.clamp(max=n - 1))
            if torch.equal(first_group.index_select(0, slot), group.values):
                return trajectories
        if group.bound * traj.bound >= KEY_LIMIT:
            traj = dense(traj)
        key = group.codes * traj.bound + traj.codes
        key_bound = group.bound * traj.bound
        if key_bound > direct_limit(n):
            unique_keys, key = unique_codes(key, key_bound)
            key_bound = unique_keys.numel()
        return cls.from_slots(key, key_bound, n)

    @classmethod
    def from_slots(cls, slot: torch.Tensor, bound: int, n: int) -> _Trajectories:
        positions = torch.arange(n, device=slot.device)
        first = torch.full((bound,), n, dtype=torch.int64, device=slot.device)
        first.scatter_reduce_(0, slot, positions, reduce="amin")
        used = torch.nonzero(first < n).squeeze(1)
        return cls(slot, bound, first, used)

    @property
    def count(self) -> int:
        return self.used.numel()

    def rows(self) -> torch.Tensor:
        """Each trajectory's number of rows, in unit order."""
        return torch.bincount(self.slot, minlength=self.bound).index_select(0, self.used)

    def first_rows(self) -> torch.Tensor:
        """Each trajectory's first row, in unit order."""
        return self.first.index_select(0, self.used)

    def per_slot(self, per_row: torch.Tensor, reduce: str, fill: float) -> torch.Tensor:
        """A per-row value reduced per trajectory (``sum``, ``amin``, ``amax``), in unit order."""
        out = per_row.new_full((self.bound,), fill)
        if reduce == "sum":
            out.scatter_add_(0, self.slot, per_row)
        else:
            out.scatter_reduce_(0, self.slot, per_row, reduce)
        return out.index_select(0, self.used)

    def to_rows(self, per_unit: torch.Tensor) -> torch.Tensor:
        """A per-trajectory value (unit order) at each of its rows."""
        by_slot = per_unit.new_zeros(self.bound).index_copy_(0, self.used, per_unit)
        return by_slot.index_select(0, self.slot)


@dataclass(frozen=True)
class _Units:
    """The units of a batch (rows at turn level, trajectories at trajectory level): ``score``,
    ``tokens`` (None where the rule does not weigh by them), ``group`` (codes in ``[0,
    groups)``) and, for trajectories, each one's ``first_row`` (rows are their own)."""

    score: torch.Tensor
    tokens: torch.Tensor | None
    group: torch.Tensor
    groups: int
    first_row: torch.Tensor | None


def _trajectory_units(
    scores: torch.Tensor,
    tokens: torch.Tensor | None,
    group: Codes,
    trajectories: _Trajectories,
    turn: torch.Tensor | None,
    config: AdvantageConfig,
    unit_tokens: str,
) -> _Units:
    first_row = trajectories.first_rows()
    score = _trajectory_scores(scores, trajectories, first_row, turn, config.traj_score)
    if tokens is None:
        unit_tokens_of = None
    elif unit_tokens == "first_row":
        unit_tokens_of = tokens.index_select(0, first_row)
    else:
        unit_tokens_of = trajectories.per_slot(tokens, "sum", 0.0)
    return _Units(score, unit_tokens_of, group.values, group.bound, first_row)


def _turn_numbers(turn_index: Ids, n: int, device: torch.device) -> torch.Tensor:
    """The turn numbers as int64, in their own order (never hash-coded, which would order them
    by first appearance); anything but integers is refused. An empty 1-D sequence (of an empty
    batch) holds no value that is not one, whatever its dtype (``np.asarray([])`` is float64)."""
    if isinstance(turn_index, torch.Tensor):
        turns = turn_index.detach()
        if turns.dim() == 1 and not turns.numel():
            turns = turns.to(torch.int64)
    else:
        array = np.asarray(turn_index)
        if array.ndim == 1 and not array.size:
            array = array.astype(np.int64)
        if array.dtype == object:
            try:
                array = array.astype(np.int64)
            except (TypeError, ValueError, OverflowError):
                raise ValueError("turn_index must hold integers") from None
        if array.dtype.kind not in "iu":
            raise ValueError(f"turn_index must hold integers, got {array.dtype}")
        turns = numpy_to_tensor(array)
    if turns.dim() != 1 or turns.is_floating_point() or turns.is_complex():
        raise ValueError("turn_index must be a 1-D sequence of integers")
    check_length(turns, n, "turn_index")
    return turns.to(device=device, dtype=torch.int64)


def _trajectories_and_groups(
    index: Ids, traj: Codes, n: int, device: torch.device
) -> tuple[_Trajectories, Codes]:
    """The trajectories and each one's group (codes in unit order)."""
    group = compact(raw_codes(index, n, device, "index"), n)
    trajectories = _Trajectories.of(group, traj, n)
    return trajectories, Codes(group.values.index_select(0, trajectories.first_rows()), group.bound)


def _trajectory_scores(
    scores: torch.Tensor,
    trajectories: _Trajectories,
    first_row: torch.Tensor,
    turn: torch.Tensor | None,
    rule: TrajScore | None,
) -> torch.Tensor:
    """Each trajectory's score under the ``--traj-score`` rule (None: its first row's, by turn,
    as the rows agree)."""
    if rule in (TrajScore.MEAN, TrajScore.SUM):
        total = trajectories.per_slot(scores, "sum", 0.0)
        if rule is TrajScore.SUM:
            return total
        return total / trajectories.rows().to(scores.dtype)
    if rule is TrajScore.MAX:
        return trajectories.per_slot(scores, "amax", -math.inf)
    last = rule is TrajScore.LAST
    if turn is None and not last:
        return scores.index_select(0, first_row)
    positions = torch.arange(scores.shape[0], device=scores.device)
    slot = trajectories.slot
    if turn is None:
        candidates = torch.ones_like(positions, dtype=torch.bool)
    else:
        # The smallest (largest) turn of each trajectory; ties on the turn go to the earliest
        # (latest) of its rows, as a stable sort by turn would.
        extreme = torch.zeros(trajectories.bound, dtype=turn.dtype, device=turn.device)
        extreme.scatter_reduce_(0, slot, turn, "amax" if last else "amin", include_self=False)
        candidates = turn == extreme.index_select(0, slot)
    chosen = torch.full(
        (trajectories.bound,), -1 if last else scores.shape[0], device=scores.device
    )
    chosen.scatter_reduce_(0, slot[candidates], positions[candidates], "amax" if last else "amin")
    return scores.index_select(0, chosen.index_select(0, trajectories.used))


def _check_consistent(
    scores: torch.Tensor,
    unit_score: torch.Tensor,
    trajectories: _Trajectories,
    index: Ids,
    traj_index: Ids,
) -> None:
    """Refuse a trajectory whose rows carry different scores (the command line's tolerance)."""
    if torch.equal(trajectories.to_rows(unit_score), scores):
        return  # every row carries exactly its trajectory's score: the usual case, one pass
    low = trajectories.per_slot(scores, "amin", math.inf)
    high = trajectories.per_slot(scores, "amax", -math.inf)
    disagree = (high - low) > SCORE_TOLERANCE * torch.maximum(high.abs(), low.abs())
    if not bool(disagree.any()):
        return
    rows = torch.nonzero(trajectories.to_rows(disagree.to(torch.float64)) > 0).squeeze(1)
    row = int(rows[0])
    values = torch.unique(scores[trajectories.slot == trajectories.slot[row]]).tolist()
    raise ValueError(
        f"row {row}: trajectory (index={_id_at(index, row)!r}, traj_index="
        f"{_id_at(traj_index, row)!r}) has rows with different scores {values}; pass traj_score "
        "('first', 'last', 'mean', 'max' or 'sum')"
    )


def _id_at(ids: Ids, row: int) -> Any:
    value = ids[row]
    return value.item() if hasattr(value, "item") else value


@dataclass(frozen=True)
class _GroupCounts:
    groups: int
    singleton_groups: int
    zero_std_groups: int


def _unit_advantages(units: _Units, config: AdvantageConfig) -> tuple[torch.Tensor, _GroupCounts]:
    """Each unit's advantage under its estimator's rule (advcli.rules), as
    :func:`advcli.advantages.estimators.compute_advantages` computes it."""
    rule = RULES[config.estimator]
    x, group, bound = units.score, units.group, units.groups
    count = torch.bincount(group, minlength=bound).to(torch.float64)
    high = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, x, "amax")
    low = x.new_full((bound,), math.inf).scatter_reduce_(0, group, x, "amin")
    all_equal = high == low
    # The mean from values shifted by one of the group's own: equal units give their score
    # exactly, and Σ(x − mean)² exactly 0.
    mean = high + x.new_zeros(bound).scatter_add_(0, group, x - high.index_select(0, group)) / count
    mean = torch.where(all_equal, high, mean)
    deviation = x - mean.index_select(0, group)
    m2 = x.new_zeros(bound).scatter_add_(0, group, deviation * deviation)
    std = torch.where(all_equal, 0.0, torch.sqrt(m2 / (count - STD_DDOF)))

    if rule.baseline is Baseline.TOKEN_WEIGHTED_MEAN:
        assert units.tokens is not None
        weight = x.new_zeros(bound).scatter_add_(0, group, units.tokens)
        weighted = x.new_zeros(bound).scatter_add_(0, group, units.tokens * x)
        baseline = torch.where(all_equal, mean, torch.where(weight > 0, weighted / weight, 0.0))
    elif rule.baseline is Baseline.SECOND_BEST:
        order = units.first_row if units.first_row is not None else torch.arange(x.shape[0])
        is_top = _top_units(x, group, bound, high, order.to(x.device))
        second = x.masked_fill(is_top, -math.inf)
        second = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, second, "amax")
        baseline = torch.where(count > 1, second, high)
    else:
        baseline = mean
    scale = config.effective_scale
    batch = _batch_std(x) if scale is Scale.BATCH else 0.0
    if scale is Scale.BATCH:
        divisor = torch.full_like(std, batch)
    elif scale is Scale.GROUP:
        divisor = std
    else:
        divisor = torch.ones_like(std)

    centred = x - baseline.index_select(0, group)
    if rule.baseline is Baseline.LEAVE_ONE_OUT:
        n = count.index_select(0, group)
        advantage = n / (n - 1) * centred
    else:
        if rule.baseline is Baseline.SECOND_BEST:
            centred = torch.where(is_top, centred, 0.0)
        advantage = centred
        if scale is not Scale.NONE:
            quotient = centred / (divisor.index_select(0, group) + config.epsilon)
            advantage = torch.where(centred == 0, 0.0, quotient)

    alone = count.index_select(0, group) == 1
    if config.singleton is Singleton.ZERO or not rule.singleton_keeps_score:
        lone = torch.zeros_like(x)
    else:
        # The batch divisor, with --scale batch, as every other unit (1 when it is 0: no other
        # unit is divided then); the singleton std 1 with the group scale.
        lone = x - SINGLETON_MEAN
        if scale is not Scale.NONE:
            lone_std = batch if scale is Scale.BATCH and batch else SINGLETON_STD
            lone = lone / (lone_std + config.epsilon)
    present = count > 0  # group codes may leave gaps
    counts = _GroupCounts(
        groups=int(present.sum()),
        singleton_groups=int((count == 1).sum()),
        zero_std_groups=int((all_equal & (count > 1)).sum()),
    )
    return torch.where(alone, lone, advantage), counts


def _top_units(
    x: torch.Tensor, group: torch.Tensor, bound: int, high: torch.Tensor, order: torch.Tensor
) -> torch.Tensor:
    """The first unit (by ``order``, its first row) of each group with the group's highest
    score."""
    at_top = x == high.index_select(0, group)
    first = torch.full((bound,), torch.iinfo(torch.int64).max, device=x.device)
    first.scatter_reduce_(0, group[at_top], order[at_top], "amin")
    return first.index_select(0, group) == order


def _batch_std(x: torch.Tensor) -> float:
    """The std (ddof=1) of every unit's score: 1 for a single unit, 0 when all are equal."""
    if x.numel() == 1:
        return SINGLETON_STD
    if bool(x.min() == x.max()):
        return 0.0
    return float(x.std(correction=STD_DDOF))


def _whiten(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s whitening over every response token: each row counts its tokens' times;
    a row without tokens gets 0 (verl multiplies by the mask). An empty batch has nothing to
    whiten: its empty result, as every estimator's."""
    if not values.numel():
        return values
    total = float(tokens.sum())
    if total < 2:
        raise ValueError(
            "reinforce_pp_baseline whitens over response tokens and needs at least 2; the batch "
            f"has {total:g}"
        )
    mean = float((tokens * values).sum()) / total
    variance = float((tokens * (values - mean) ** 2).sum()) / (total - 1)
    whitened = (values - mean) / math.sqrt(variance + WHITEN_EPSILON)
    return torch.where(tokens > 0, whitened, 0.0)


# The largest float32: the result is float32.
_FLOAT32_MAX = 3.4028234663852886e38


def _check_fits(
    scores: torch.Tensor, advantage: torch.Tensor, unit_rows: torch.Tensor | None
) -> None:
    """Refuse scores or advantages that do not fit a float32 (the result's type), as the
    command line does, naming the first row: never a silent inf or NaN. The rewards are finite
    (:func:`_check_scores`), so only finite scores that overflow end here. ``advantage`` may be
    per unit, ``unit_rows`` each unit's first row (None: per row)."""
    if _fits_float32(scores) and _fits_float32(advantage):
        return
    rows = torch.nonzero(~(scores.abs() <= _FLOAT32_MAX)).squeeze(1)
    bad_units = torch.nonzero(~(advantage.abs() <= _FLOAT32_MAX)).squeeze(1)
    if unit_rows is not None:
        bad_units = unit_rows.index_select(0, bad_units)
    row = int(torch.cat([rows, bad_units]).min())
    raise RewardError(
        f"row {row}: the score or its advantage does not fit a float32 (the scores are too "
        "large; rescale the rewards)"
    )


def _fits_float32(values: torch.Tensor) -> bool:
    if not values.numel():
        return True
    low, high = torch.aminmax(values)
    # aminmax propagates NaN, which compares False: it does not fit.
    return bool((low >= -_FLOAT32_MAX) & (high <= _FLOAT32_MAX))

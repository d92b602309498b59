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
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("advcli.torch needs torch: pip install 'advcli[torch]'") from error

from advcli.rules import (
    RULES,
    SCORE_TOLERANCE,
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    Baseline,
    EstimatorRule,
)

__all__ = [
    "AdvantageMetrics",
    "AdvantageResult",
    "compute_advantage",
    "compute_advantage_with_metrics",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
]

#: Row ids: a numpy array (object/str/int), a 1-D torch tensor, or a sequence of hashable values.
Ids: TypeAlias = "np.ndarray | torch.Tensor | Sequence[Any]"

# Integer codes whose range is at most this many times the batch size are used as scatter
# indices directly (no sort); wider ranges are factorized with torch.unique.
_DIRECT_RANGE_FACTOR = 4
_DIRECT_RANGE_MIN = 1 << 16
# Combined (group, trajectory) keys must stay below this to be formed without overflow.
_KEY_LIMIT = 1 << 62
_INT32_LIMIT = 1 << 31
# Python ints kept for the hash factorization of object ids (about 9 MB at most).
_POSITIONS_CACHED = 1 << 18
# Rewards are summed in float64 by blocks of about this many values (see _scores).
_SUM_BLOCK = 1 << 20


@dataclass(frozen=True)
class _Codes:
    """int64 codes of row ids, ``values - offset`` in ``[0, bound)``; equal ids, equal codes.

    ``first_rows``: each value is the position of the first row with the same id (offset 0).
    The offset is subtracted only when the codes are used (:attr:`codes`), so ids that go
    straight to :func:`_dense` skip that pass.
    """

    values: torch.Tensor
    bound: int
    offset: int = 0
    first_rows: bool = False

    @property
    def codes(self) -> torch.Tensor:
        return self.values - self.offset if self.offset else self.values


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
        out = _broadcast(_advantages(rule, stats, epsilon), response_mask)
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
        out = _broadcast(_advantages(RULES["rloo"], stats, 0.0), response_mask)
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
    group = _raw_codes(index, n, device, "index")
    if traj_index is None or cross_all_data:
        if traj_index is not None:
            _check_length(traj_index, n, "traj_index")
        group = _compact(group, n)
        count, _, m2, deviation = _moments(scores, group.values, group.bound)
        # Every row is a unit: its deviation from the baseline is its centred score.
        return _GroupStatistics(group.values, count, m2, deviation)

    traj = _raw_codes(traj_index, n, device, "traj_index")
    positions = torch.arange(n, device=device)
    if traj.first_rows and torch.equal(group.values.index_select(0, traj.values), group.values):
        # Each trajectory id occurs in one group only (verl-agent's uuid traj_uid): the
        # trajectory's first row is the pair's first row, no key to sort.
        group = _compact(group, n)
        return _unit_statistics(scores, traj.values == positions, group)
    # Combine (group, trajectory) into one integer key; factorize a side first if the product
    # of the ranges would overflow (dense codes are < n, so it then fits).
    if group.bound * traj.bound >= _KEY_LIMIT:
        group = _dense(group)
    if group.bound * traj.bound >= _KEY_LIMIT:
        traj = _dense(traj)
    key = group.codes * traj.bound + traj.codes
    key_bound = group.bound * traj.bound
    if key_bound <= _direct_limit(n):
        pair = key
        pair_bound = key_bound
        group = _compact(group, n)
    else:
        unique_keys, pair = _unique(key, key_bound)
        pair_bound = unique_keys.numel()
        if group.bound > _direct_limit(n):
            # unique_keys is sorted, so the group part of each key is non-decreasing: a
            # consecutive-unique pass (no sort) numbers the groups densely.
            groups_of_pairs, pair_group = torch.unique_consecutive(
                torch.div(unique_keys, traj.bound, rounding_mode="floor"), return_inverse=True
            )
            group = _Codes(pair_group.index_select(0, pair), groups_of_pairs.numel())
        else:
            group = _compact(group, n)
    first = torch.full((pair_bound,), n, dtype=torch.int64, device=device)
    first.scatter_reduce_(0, pair, positions, reduce="amin")
    return _unit_statistics(scores, first.index_select(0, pair) == positions, group)


def _unit_statistics(
    scores: torch.Tensor, is_unit: torch.Tensor, group: _Codes
) -> _GroupStatistics:
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
    """Each row's score, the sum of its token-level rewards, in float64."""
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


def _broadcast(advantage: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The float32 ``(bs, response_length)`` result: each row's advantage times its mask."""
    # Cast first: a float64 x float32 multiply into a float32 output is much slower on CPU.
    out = advantage.to(torch.float32).unsqueeze(-1) * response_mask.detach()
    return out if out.dtype == torch.float32 else out.to(torch.float32)


def _check_length(ids: Ids, n: int, name: str) -> None:
    length = ids.shape[0] if isinstance(ids, torch.Tensor | np.ndarray) and ids.ndim else None
    if length is None:
        length = len(ids)
    if length != n:
        raise ValueError(f"{name} has {length} ids for {n} rows")


def _raw_codes(ids: Ids, n: int, device: torch.device, name: str) -> _Codes:
    """Integer codes for the ids, on ``device``; not necessarily dense (see :func:`_compact`)."""
    if isinstance(ids, torch.Tensor) or (isinstance(ids, np.ndarray) and ids.dtype.kind in "biuf"):
        tensor = ids if isinstance(ids, torch.Tensor) else _numpy_to_tensor(ids)
        if tensor.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
        _check_length(tensor, n, name)
        tensor = tensor.detach().to(device)
        if tensor.is_floating_point() or tensor.is_complex():
            return _dense(_Codes(tensor, 0))
        if tensor.dtype == torch.uint64:
            # Reinterpret as int64: a bijection, so equal ids keep equal codes.
            tensor = tensor.view(torch.int64)
        tensor = tensor.to(torch.int64)
        if n == 0:
            return _Codes(tensor, 0)
        low, high = (int(value) for value in torch.aminmax(tensor))
        if high - low >= _KEY_LIMIT:
            return _dense(_Codes(tensor, 0))
        return _Codes(tensor, high - low + 1, offset=low)
    values: Sequence[Any] | np.ndarray
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {ids.shape}")
        # Iterating an object array yields its elements as they are; other dtypes (str_, ...)
        # convert faster in one tolist().
        values = ids if ids.dtype == object else ids.tolist()
    elif isinstance(ids, str | bytes):
        raise TypeError(f"{name} must be a sequence of ids, not a single {type(ids).__name__}")
    else:
        values = ids
    _check_length(values, n, name)
    # Hash-based factorization in C (map over dict.setdefault): each row's code is the position
    # of the first row with an equal id, so codes are < n.
    first_row_of: dict[Any, int] = {}
    try:
        first_rows = np.fromiter(
            map(first_row_of.setdefault, values, _python_positions(n)), dtype=np.int64, count=n
        )
    except TypeError as error:
        raise TypeError(f"{name}: ids must be hashable ({error})") from None
    return _Codes(torch.from_numpy(first_rows).to(device), n, first_rows=True)


_positions_cache: list[int] = []


def _python_positions(n: int) -> Sequence[int]:
    """0, 1, ... n - 1 as Python ints, reused across calls up to ``_POSITIONS_CACHED`` (making
    those int objects is a good part of the cost of the hash factorization); map() stops at the
    shortest input, so a longer list is fine."""
    global _positions_cache
    if n > _POSITIONS_CACHED:
        return range(n)
    cache = _positions_cache
    if len(cache) < n:
        # Rebinding (not extending) keeps a concurrent reader's list intact.
        cache = list(range(min(max(n, 2 * len(cache)), _POSITIONS_CACHED)))
        _positions_cache = cache
    return cache


def _numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A numeric numpy array as a tensor, sharing memory when it can (it is only read)."""
    array = np.ascontiguousarray(array)  # torch.from_numpy refuses negative strides
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        # A read-only array is fine: the tensor is never written to.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _direct_limit(n: int) -> int:
    return max(_DIRECT_RANGE_FACTOR * n, _DIRECT_RANGE_MIN)


def _compact(codes: _Codes, n: int) -> _Codes:
    """Codes usable as indices into per-group buffers: dense, or kept when their range is small."""
    if codes.first_rows:
        # Number the first rows 0, 1, ... in batch order (no sort), so the group buffers have
        # one slot per group rather than one per row.
        of_row, first_rows = _number_by_first_row(codes.values)
        return _Codes(of_row, first_rows.numel())
    if codes.bound <= _direct_limit(n):
        return _Codes(codes.codes, codes.bound)
    return _dense(codes)


def _number_by_first_row(first_of_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Given each row's first row with the same key, number the keys 0, 1, … in the order of
    their first rows: (each row's number, each number's first row). No sort, and no cumulative
    sum (slow on CPU for a bool tensor)."""
    n = first_of_row.numel()
    positions = torch.arange(n, device=first_of_row.device)
    first_rows = torch.nonzero(first_of_row == positions).squeeze(1)
    number_at = torch.empty(n, dtype=torch.int64, device=first_of_row.device)
    number_at.index_copy_(0, first_rows, torch.arange(first_rows.numel(), device=positions.device))
    return number_at.index_select(0, first_of_row), first_rows


def _dense(codes: _Codes) -> _Codes:
    """Factorize to ``0 .. k-1`` with one sort (torch.unique)."""
    if 0 < codes.bound <= _INT32_LIMIT:
        unique, inverse = _unique(codes.codes, codes.bound)
    else:  # floating ids, or a range too wide to shift (bound 0): factorize the values as they are
        unique, inverse = torch.unique(codes.values, return_inverse=True)
    return _Codes(inverse.to(torch.int64), unique.numel())


def _unique(codes: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.unique of codes in ``[0, bound)``, sorted as int32 when they fit (a faster sort)."""
    if bound <= _INT32_LIMIT:
        codes = codes.to(torch.int32)
    unique, inverse = torch.unique(codes, return_inverse=True)
    return unique.to(torch.int64), inverse.to(torch.int64)


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


@dataclass(frozen=True)
class AdvantageResult:
    advantages: torch.Tensor
    metrics: AdvantageMetrics


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
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        # Token counts only where the rule weighs by them (opo, REINFORCE++).
        tokens = (
            response_mask.detach().to(torch.float64).sum(dim=-1)
            if RULES[config.estimator].counts_tokens
            else None
        )
        units, trajectories = _build_units(
            scores, tokens, index, traj_index, turn_index, config, unit_tokens
        )
        unit_advantage, stats = _unit_advantages(units, config)
        if RULES[config.estimator].whitens and unit_tokens == "first_row":
            # agent-lightning whitens its representative rows, one per trajectory.
            assert units.tokens is not None
            unit_advantage = _whiten(unit_advantage, units.tokens)
        _check_finite(scores, unit_advantage)
        advantage = unit_advantage.index_select(0, units.of_row)
        if RULES[config.estimator].whitens and unit_tokens == "sum":
            assert tokens is not None
            advantage = _whiten(advantage, tokens)
        out = _broadcast(advantage, response_mask)
        rows_per = torch.bincount(trajectories.of_row, minlength=trajectories.count)
        metrics = AdvantageMetrics(
            rows=scores.shape[0],
            trajectories=trajectories.count,
            multi_row_trajectories=int((rows_per > 1).sum()),
            max_rows_per_trajectory=int(rows_per.max()) if trajectories.count else 0,
            groups=stats.groups,
            singleton_groups=stats.singleton_groups,
            zero_std_groups=stats.zero_std_groups,
        )
    return AdvantageResult(out, metrics)


def _config(
    estimator: str,
    level: str,
    scale: str | None,
    singleton: str,
    traj_score: str | None,
    epsilon: float,
) -> Any:
    """The settings checked by the command line's own :class:`AdvantageConfig` (a bad value is a
    ``ValueError`` here)."""
    from advcli.errors import UsageError
    from advcli.settings import AdvantageConfig, Estimator, Level, Scale, Singleton, TrajScore

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
    """Each row's trajectory (``of_row``, numbered in the order of their first rows), each
    trajectory's ``first_row``, and their ``count``."""

    of_row: torch.Tensor
    first_row: torch.Tensor
    count: int


@dataclass(frozen=True)
class _Units:
    """The units of a batch (rows at turn level, trajectories at trajectory level), in the order
    of their first rows: ``score``, ``tokens`` (None where the rule does not weigh by them),
    ``group`` (dense codes, ``groups`` of them); ``of_row`` maps each row to its unit."""

    score: torch.Tensor
    tokens: torch.Tensor | None
    group: torch.Tensor
    groups: int
    of_row: torch.Tensor


def _build_units(
    scores: torch.Tensor,
    tokens: torch.Tensor | None,
    index: Ids,
    traj_index: Ids | None,
    turn_index: Ids | None,
    config: Any,
    unit_tokens: str,
) -> tuple[_Units, _Trajectories]:
    from advcli.settings import Level

    n = scores.shape[0]
    device = scores.device
    positions = torch.arange(n, device=device)
    group = _compact(_raw_codes(index, n, device, "index"), n)
    if traj_index is None:
        trajectories = _Trajectories(positions, positions, n)
    else:
        traj = _raw_codes(traj_index, n, device, "traj_index")
        pair, first = _pairs(group, traj, n)
        of_row, first_row = _number_by_first_row(first.index_select(0, pair))
        trajectories = _Trajectories(of_row, first_row, first_row.numel())
    if config.level is Level.TURN or traj_index is None:
        return _Units(scores, tokens, group.values, group.bound, positions), trajectories

    of_row, first_row, count = trajectories.of_row, trajectories.first_row, trajectories.count
    turn = None
    if turn_index is not None:
        turn = _raw_codes(turn_index, n, device, "turn_index").codes
    score = _trajectory_scores(scores, of_row, count, first_row, turn, config.traj_score)
    if config.traj_score is None:
        _check_consistent(scores, score, of_row, count, index, traj_index)
    if tokens is None:
        trajectory_tokens = None
    elif unit_tokens == "first_row":
        trajectory_tokens = tokens.index_select(0, first_row)
    else:
        trajectory_tokens = tokens.new_zeros(count).scatter_add_(0, of_row, tokens)
    group_of = group.values.index_select(0, first_row)
    return _Units(score, trajectory_tokens, group_of, group.bound, of_row), trajectories


def _pairs(group: _Codes, traj: _Codes, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (group, trajectory) pair code and, per code, the pair's first row."""
    device = group.values.device
    positions = torch.arange(n, device=device)
    if traj.bound <= _direct_limit(n) and not traj.first_rows:
        # Trajectory ids that each belong to one group (a global rollout counter, verl-agent's
        # uuids) identify the pair alone: no key to combine and sort.
        codes = traj.codes
        group_of = torch.full((traj.bound,), -1, dtype=torch.int64, device=device)
        group_of.scatter_(0, codes, group.values)
        if torch.equal(group_of.index_select(0, codes), group.values):
            return codes, _first_rows(codes, traj.bound, positions)
    if traj.first_rows and torch.equal(group.values.index_select(0, traj.values), group.values):
        return traj.values, traj.values.clone().scatter_(0, traj.values, traj.values)
    group_codes, traj_codes = group, traj
    if group_codes.bound * traj_codes.bound >= _KEY_LIMIT:
        traj_codes = _dense(traj_codes)
    key = group_codes.codes * traj_codes.bound + traj_codes.codes
    key_bound = group_codes.bound * traj_codes.bound
    if key_bound > _direct_limit(n):
        unique_keys, key = _unique(key, key_bound)
        key_bound = unique_keys.numel()
    return key, _first_rows(key, key_bound, positions)


def _first_rows(codes: torch.Tensor, bound: int, positions: torch.Tensor) -> torch.Tensor:
    first = torch.full((bound,), positions.numel(), dtype=torch.int64, device=positions.device)
    return first.scatter_reduce_(0, codes, positions, reduce="amin")


def _trajectory_scores(
    scores: torch.Tensor,
    of_row: torch.Tensor,
    count: int,
    first_row: torch.Tensor,
    turn: torch.Tensor | None,
    rule: Any,
) -> torch.Tensor:
    """Each trajectory's score under the ``--traj-score`` rule (None: its first row's, by turn,
    as the rows agree)."""
    from advcli.settings import TrajScore

    if rule in (TrajScore.MEAN, TrajScore.SUM):
        total = scores.new_zeros(count).scatter_add_(0, of_row, scores)
        if rule is TrajScore.SUM:
            return total
        return total / torch.bincount(of_row, minlength=count).to(scores.dtype)
    if rule is TrajScore.MAX:
        return scores.new_full((count,), -math.inf).scatter_reduce_(0, of_row, scores, "amax")
    last = rule is TrajScore.LAST
    positions = torch.arange(scores.shape[0], device=scores.device)
    if turn is None:
        if not last:
            return scores.index_select(0, first_row)
        candidates = torch.ones_like(positions, dtype=torch.bool)
    else:
        # The smallest (largest) turn of each trajectory; ties on the turn go to the earliest
        # (latest) of its rows, as a stable sort by turn would.
        extreme = torch.full((count,), 0, dtype=turn.dtype, device=turn.device)
        extreme.scatter_reduce_(0, of_row, turn, "amax" if last else "amin", include_self=False)
        candidates = turn == extreme.index_select(0, of_row)
    chosen = torch.full((count,), -1 if last else scores.shape[0], device=scores.device)
    chosen.scatter_reduce_(0, of_row[candidates], positions[candidates], "amax" if last else "amin")
    return scores.index_select(0, chosen)


def _check_consistent(
    scores: torch.Tensor,
    unit_score: torch.Tensor,
    of_row: torch.Tensor,
    count: int,
    index: Ids,
    traj_index: Ids,
) -> None:
    """Refuse a trajectory whose rows carry different scores (the command line's tolerance)."""
    if torch.equal(unit_score.index_select(0, of_row), scores):
        return  # every row carries exactly its trajectory's score: the usual case, one pass
    low = scores.new_full((count,), math.inf).scatter_reduce_(0, of_row, scores, "amin")
    high = scores.new_full((count,), -math.inf).scatter_reduce_(0, of_row, scores, "amax")
    disagree = (high - low) > SCORE_TOLERANCE * torch.maximum(high.abs(), low.abs())
    if not bool(disagree.any()):
        return
    rows = torch.nonzero(disagree.index_select(0, of_row)).squeeze(1)
    row = int(rows[0])
    unit = int(of_row[row])
    values = scores[of_row == unit].unique().tolist()
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


def _unit_advantages(units: _Units, config: Any) -> tuple[torch.Tensor, _GroupCounts]:
    """Each unit's advantage under its estimator's rule (advcli.rules), as
    :func:`advcli.estimators.compute_advantages` computes it."""
    from advcli.settings import Scale, Singleton

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
        is_top = _top_units(x, group, bound, high)
        second = x.masked_fill(is_top, -math.inf)
        second = x.new_full((bound,), -math.inf).scatter_reduce_(0, group, second, "amax")
        baseline = torch.where(count > 1, second, high)
    else:
        baseline = mean
    scale = config.effective_scale
    if scale is Scale.BATCH:
        divisor = torch.full_like(std, _batch_std(x))
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
        lone = x - SINGLETON_MEAN
        if scale is not Scale.NONE:
            lone = lone / (SINGLETON_STD + config.epsilon)
    present = count > 0  # group codes may leave gaps
    counts = _GroupCounts(
        groups=int(present.sum()),
        singleton_groups=int((count == 1).sum()),
        zero_std_groups=int((all_equal & (count > 1)).sum()),
    )
    return torch.where(alone, lone, advantage), counts


def _top_units(
    x: torch.Tensor, group: torch.Tensor, bound: int, high: torch.Tensor
) -> torch.Tensor:
    """The first unit (in order) of each group with the group's highest score."""
    order = torch.arange(x.shape[0], device=x.device)
    at_top = x == high.index_select(0, group)
    first = torch.full((bound,), x.shape[0], device=x.device)
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
    a row without tokens gets 0 (verl multiplies by the mask)."""
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


def _check_finite(scores: torch.Tensor, advantage: torch.Tensor) -> None:
    """Refuse scores or advantages that do not fit a float32 (the result's type), as the
    command line does, never a silent inf or NaN. ``advantage`` may be per unit: every row's
    is one of them."""
    low, high = torch.aminmax(scores)
    too_large = max(-float(low), float(high)) > _FLOAT32_MAX
    if too_large or not bool(torch.isfinite(advantage).all()):
        too_large = True
    elif advantage.numel():
        low, high = torch.aminmax(advantage)
        too_large = max(-float(low), float(high)) > _FLOAT32_MAX
    if too_large:
        raise ValueError(
            "the scores or their advantages do not fit a float32 (the scores are too large; "
            "rescale the rewards)"
        )

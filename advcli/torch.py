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
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    Baseline,
    EstimatorRule,
)

__all__ = ["compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage"]

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
        # Number the first rows 0, 1, ... in batch order (a cumulative sum, no sort), so the
        # group buffers have one slot per group rather than one per row.
        is_first = codes.values == torch.arange(n, device=codes.values.device)
        rank = torch.cumsum(is_first, dim=0) - 1
        count = int(rank[-1]) + 1 if n else 0
        return _Codes(rank.index_select(0, codes.values), count)
    if codes.bound <= _direct_limit(n):
        return _Codes(codes.codes, codes.bound)
    return _dense(codes)


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

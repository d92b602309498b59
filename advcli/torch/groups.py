"""The group statistics: each group's table from its units, applied to scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from advcli.rules import (
    RULES,
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    Baseline,
    EstimatorRule,
)
from advcli.settings import AdvantageConfig, Scale, Singleton
from advcli.torch.ids import Codes
from advcli.torch.trajectories import Units


@dataclass(frozen=True)
class GroupStatistics:
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


def unit_statistics(scores: torch.Tensor, is_unit: torch.Tensor, group: Codes) -> GroupStatistics:
    """Group statistics over the rows flagged ``is_unit``; every row centred on its baseline."""
    units = torch.nonzero(is_unit).squeeze(1)
    count, baseline, m2, _ = moments(
        scores.index_select(0, units), group.values.index_select(0, units), group.bound
    )
    centred = baseline.index_select(0, group.values)
    torch.sub(scores, centred, out=centred)
    return GroupStatistics(group.values, count, m2, centred)


def moments(
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


def row_advantages(rule: EstimatorRule, stats: GroupStatistics, epsilon: float) -> torch.Tensor:
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


@dataclass(frozen=True)
class GroupCounts:
    groups: int
    singleton_groups: int
    zero_std_groups: int


def unit_advantages(units: Units, config: AdvantageConfig) -> tuple[torch.Tensor, GroupCounts]:
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
    counts = GroupCounts(
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


def whiten(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
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

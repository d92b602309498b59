"""GiGPO's step term on tensors, from the rules of :mod:`advcli.settings.rules` (``STEP_*``) that
the Polars path (:mod:`advcli.advantages.step_groups`) reads: each row's step return over its
trajectory in turn order (:func:`step_returns`), its step group, the rows of one anchor within
a group or batch-wide (:func:`step_groups`), and its return normalized there
(:func:`step_advantages`). The episode term is the estimators' kernel's, ``--traj-score own``
among its rules (:mod:`advcli.torch.advantage`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from advcli.settings.config import (
    AnchorScope,
    Estimator,
    GigpoNorm,
    Scale,
    Singleton,
    StepTerm,
)
from advcli.settings.rules import RULES, SINGLETON_STD, STD_DDOF, STEP_SINGLETON
from advcli.torch.groups import (
    group_centred,
    group_table,
)
from advcli.torch.ids import (
    INT32_LIMIT,
    KEY_LIMIT,
    Codes,
    Ids,
    check_length,
    compact,
    direct_limit,
    raw_codes,
    unique_codes,
)
from advcli.torch.tensors import RewardError, check_holds_numbers
from advcli.torch.trajectories import Trajectories


@dataclass(frozen=True)
class StepMetrics:
    """What a trainer logs about the step term: its step groups, those of one row (their rows'
    step term is 0: no signal) and the share of the batch's rows in them."""

    step_groups: int
    singleton_step_groups: int
    singleton_step_row_share: float

    def as_dict(self, prefix: str = "advcli/") -> dict[str, float]:
        return {f"{prefix}{name}": getattr(self, name) for name in self.__dataclass_fields__}


def step_values(values: object, n: int, device: torch.device, name: str) -> torch.Tensor:
    """A step reward or return per row as float64 on ``device`` (a tensor, a numpy array, an
    object array of numbers, a list), refused where one is NaN or infinite, naming the row."""
    if isinstance(values, torch.Tensor):
        check_holds_numbers(values, name)
        tensor = values.detach()
    else:
        if np.iscomplexobj(np.asarray(values)):
            raise ValueError(f"{name} holds complex numbers; it takes real ones")
        try:
            tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"{name} must hold one number a row") from None
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be (bs,), got shape {tuple(tensor.shape)}")
    check_length(tensor, n, name)
    tensor = tensor.to(device=device, dtype=torch.float64)
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        row = int(torch.nonzero(~finite)[0, 0])
        raise RewardError(f"row {row}: {name} is {float(tensor[row])}")
    return tensor


def step_returns(
    rewards: torch.Tensor,
    trajectories: Trajectories | None,
    turn: torch.Tensor | None,
    gamma: float,
) -> torch.Tensor:
    """Each row's ``R_t = r_t + γ R_{t+1}`` over its trajectory's rows in turn order (``turn``,
    else batch order), in batch order; ``trajectories`` None: each row is a trajectory.

    A doubling scan over the rows sorted by (trajectory, turn), as the Polars path's: after k
    passes each row holds its next 2^k terms and the factor γ^(2^k) (0 once its trajectory
    ends), so no power of γ is divided by and a long trajectory never underflows."""
    if gamma == 0 or trajectories is None:
        return rewards.clone()
    order, last = _trajectory_order(trajectories, turn)
    value = rewards.index_select(0, order) if order is not None else rewards.clone()
    # One buffer for each pass's values ahead, and the result's: fresh large allocations cost
    # page faults. Each pass reads the values and factors before it writes them.
    ahead = torch.empty_like(value)
    if gamma == 1:
        # The factors are 1 or 0: a mask of a byte a row instead of eight.
        _scan(value, torch.logical_not(last), ahead)
    else:
        _scan(value, torch.full_like(value, gamma).masked_fill_(last, 0.0), ahead)
    if order is None:
        return value
    return ahead.index_copy_(0, order, value)


def _scan(value: torch.Tensor, factor: torch.Tensor, ahead: torch.Tensor) -> None:
    """The doubling passes, in place: each row's ``value`` gains its ``factor`` times the
    value ``shift`` rows ahead, and its factor the factor there (0 or False past the batch)."""
    n = value.numel()
    ahead_factor = torch.empty_like(factor)
    shift = 1
    while shift < n and bool(factor.any()):
        ahead[:-shift] = value[shift:]
        ahead[-shift:] = 0.0
        value.addcmul_(factor, ahead)
        ahead_factor[:-shift] = factor[shift:]
        ahead_factor[-shift:] = 0
        factor.mul_(ahead_factor)
        shift *= 2


def _trajectory_order(
    trajectories: Trajectories, turn: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The rows sorted by (trajectory slot, turn), ties in batch order (None: the batch is in
    that order already, verl-agent's collection order), and whether each sorted row is its
    trajectory's last. One stable sort of one key, of int32 where it fits (a faster sort); the
    sorted keys give the slots, so none is gathered."""
    slot = trajectories.slot
    span = 1
    key = slot
    if turn is not None and turn.numel():
        low, high = (int(value) for value in torch.aminmax(turn))
        span = high - low + 1
        if trajectories.bound * span >= KEY_LIMIT:
            # A range too wide to combine: by turn first, then (stably) by slot.
            by_turn = torch.sort(turn, stable=True).indices
            by_slot = slot.index_select(0, by_turn)
            order = by_turn.index_select(0, torch.sort(by_slot, stable=True).indices)
            return order, _last_rows(slot.index_select(0, order))
        offset = turn - low if low else turn
        if trajectories.bound * span <= INT32_LIMIT:
            key = slot.to(torch.int32).mul_(span).add_(offset.to(torch.int32))
        else:
            key = slot * span + offset
    elif trajectories.bound <= INT32_LIMIT:
        key = slot.to(torch.int32)
    if bool((key[1:] >= key[:-1]).all()):
        return None, _last_rows(slot)
    keys, order = torch.sort(key, stable=True)
    return order, _last_rows(keys.div_(span, rounding_mode="floor") if span > 1 else keys)


def _last_rows(sorted_slot: torch.Tensor) -> torch.Tensor:
    """Whether each row of rows sorted by slot is its slot's last."""
    last = torch.ones(sorted_slot.numel(), dtype=torch.bool, device=sorted_slot.device)
    torch.ne(sorted_slot[1:], sorted_slot[:-1], out=last[:-1])
    return last


def step_groups(group: Codes, anchor_index: Ids, scope: AnchorScope, n: int) -> Codes:
    """Each row's step group as codes: its (group, anchor) pair, or its anchor batch-wide;
    equal anchor ids are one state."""
    anchor = compact(raw_codes(anchor_index, n, group.values.device, "anchor_index"), n)
    if scope is AnchorScope.BATCH:
        return anchor
    # Anchors that each lie in one group (a task's own states: the usual case) are the pairs
    # already: one scatter of any of each anchor's groups, checked against every row's.
    some_group = group.values.new_zeros(anchor.bound).scatter_(0, anchor.values, group.values)
    if torch.equal(some_group.index_select(0, anchor.values), group.values):
        return anchor
    key = group.values * anchor.bound + anchor.values
    bound = group.bound * anchor.bound
    if bound > direct_limit(n):
        unique, key = unique_codes(key, bound)
        bound = unique.numel()
    return Codes(key, bound)


def step_advantages(
    returns: torch.Tensor, groups: Codes, step: StepTerm, epsilon: float, ddof: int = STD_DDOF
) -> tuple[torch.Tensor, StepMetrics]:
    """Each row's ``A_step``: its return less its step group's mean, over σ + ε
    (``mean_std``) or 1 + ε (``mean``); STEP_SINGLETON for a group of one row, of equal
    returns, or (ROLL, under ``mean_std``) of std at most ``step.min_std``."""
    if step.std_floor is None and step.norm is GigpoNorm.MEAN and STEP_SINGLETON == 0.0:
        # No spread is read: a group of equal returns is centred on exactly their value (the
        # kernel's mean), so its rows' 0 is STEP_SINGLETON already; one of a row is masked.
        count, _, centred, _ = group_centred(returns, groups.values, groups.bound)
        alone = count == 1
        advantage = centred.div_(SINGLETON_STD + epsilon)
        advantage.masked_fill_(alone.index_select(0, groups.values), STEP_SINGLETON)
        return advantage, _step_metrics(count, returns.numel())
    # The estimators' kernel with ε 0 gives each group's mean and bare std (0 for equal
    # returns, SINGLETON_STD alone); ε is added below, where the norm says. Its singleton rule
    # is never read: a group of one gets STEP_SINGLETON here.
    table = group_table(
        returns,
        groups.values,
        groups.bound,
        RULES[Estimator.GIGPO],
        Scale.GROUP,
        Singleton.RAW,
        0.0,
        ddof=ddof,
    )
    assert table.divisor is not None and table.unit_centred is not None
    std = table.divisor
    # Decided per group (a group alone has all_equal set), then gathered to the rows once.
    dead = table.all_equal
    if step.std_floor is not None:
        dead = dead | (std <= step.std_floor)
    if step.norm is GigpoNorm.MEAN_STD:
        divisor = (std + epsilon).index_select(0, groups.values)
        centred = table.unit_centred.div_(divisor)
    else:
        centred = table.unit_centred.div_(SINGLETON_STD + epsilon)
    advantage = centred.masked_fill_(dead.index_select(0, groups.values), STEP_SINGLETON)
    return advantage, _step_metrics(table.count, returns.numel())


def _step_metrics(count: torch.Tensor, n: int) -> StepMetrics:
    """The metrics of step groups of ``count`` rows each (0: an unused code)."""
    singletons = int((count == 1).sum())
    return StepMetrics(
        step_groups=int((count > 0).sum()),
        singleton_step_groups=singletons,
        singleton_step_row_share=singletons / n if n else 0.0,
    )

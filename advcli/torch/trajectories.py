"""The trajectories of a batch as the units of their groups: which rows form one, its score under
the ``traj_score`` rule and the check that its rows agree."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from advcli.settings.config import AdvantageConfig, TrajScore
from advcli.settings.rules import SCORE_TOLERANCE
from advcli.torch.ids import (
    KEY_LIMIT,
    Codes,
    Ids,
    check_length,
    dense,
    direct_limit,
    numpy_to_tensor,
    unique_codes,
)


@dataclass(frozen=True)
class Trajectories:
    """The trajectories of a batch, by *slot*: each row's ``slot`` in ``[0, bound)`` (slots may be
    left unused), each slot's ``first`` row (``n`` where unused), and ``used``, the used slots in
    increasing order: trajectory k of the units is slot ``used[k]`` (None: every slot is used,
    and trajectory k is slot k, with no per-unit pass to pick them).

    Working in slot space keeps the per-row passes to gathers and scatters by ``slot``: no
    per-row numbering of the trajectories is ever made.
    """

    slot: torch.Tensor
    bound: int
    first: torch.Tensor
    used: torch.Tensor | None

    @classmethod
    def of(cls, group: Codes, traj: Codes, n: int) -> Trajectories:
        """The (group, trajectory) pairs of the rows."""
        if traj.first_rows or traj.bound <= direct_limit(n):
            # Trajectory ids that each lie in one group (a global rollout counter, verl-agent's
            # uuids) are the pairs already: no key to combine, and no sort. Checked after the
            # fact: every row's group is its trajectory's first row's.
            slot = traj.values if traj.first_rows else traj.codes
            trajectories = cls.from_slots(slot, n if traj.first_rows else traj.bound, n)
            first = trajectories.first
            if trajectories.used is not None:
                first = first.clamp(max=n - 1)  # an unused slot's n, never gathered by a row
            first_group = group.values.index_select(0, first)
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
    def from_slots(cls, slot: torch.Tensor, bound: int, n: int) -> Trajectories:
        positions = torch.arange(n, device=slot.device)
        first = torch.full((bound,), n, dtype=torch.int64, device=slot.device)
        first.scatter_reduce_(0, slot, positions, reduce="amin")
        # Ids numbered densely (a rollout counter, the codes of strings) use every slot, which
        # one reduction tells.
        every_slot = bound == 0 or int(first.max()) < n
        used = None if every_slot else torch.nonzero(first < n).squeeze(1)
        return cls(slot, bound, first, used)

    @property
    def count(self) -> int:
        return self.bound if self.used is None else self.used.numel()

    def units(self, by_slot: torch.Tensor) -> torch.Tensor:
        """A per-slot value in unit order."""
        return by_slot if self.used is None else by_slot.index_select(0, self.used)

    def rows(self) -> torch.Tensor:
        """Each trajectory's number of rows, in unit order."""
        return self.units(torch.bincount(self.slot, minlength=self.bound))

    @functools.cached_property
    def first_rows(self) -> torch.Tensor:
        """Each trajectory's first row, in unit order (made once: the units' groups and
        scores both read it)."""
        return self.units(self.first)

    def per_slot(self, per_row: torch.Tensor, reduce: str, fill: float) -> torch.Tensor:
        """A per-row value reduced per trajectory (``sum``, ``amin``, ``amax``), in unit order."""
        out = per_row.new_full((self.bound,), fill)
        if reduce == "sum":
            out.scatter_add_(0, self.slot, per_row)
        else:
            out.scatter_reduce_(0, self.slot, per_row, reduce)
        return self.units(out)

    def to_rows(self, per_unit: torch.Tensor) -> torch.Tensor:
        """A per-trajectory value (unit order) at each of its rows."""
        by_slot = per_unit
        if self.used is not None:
            by_slot = per_unit.new_zeros(self.bound).index_copy_(0, self.used, per_unit)
        return by_slot.index_select(0, self.slot)


@dataclass(frozen=True)
class Units:
    """The units of a batch (rows at turn level, trajectories at trajectory level): ``score``,
    ``tokens`` (None where the rule does not weigh by them), ``group`` (codes in ``[0,
    groups)``) and, for trajectories, each one's ``first_row`` (rows are their own)."""

    score: torch.Tensor
    tokens: torch.Tensor | None
    group: torch.Tensor
    groups: int
    first_row: torch.Tensor | None


def trajectory_units(
    scores: torch.Tensor,
    tokens: torch.Tensor | None,
    group: Codes,
    trajectories: Trajectories,
    turn: torch.Tensor | None,
    config: AdvantageConfig,
    unit_tokens: str,
) -> Units:
    first_row = trajectories.first_rows
    score = _trajectory_scores(scores, trajectories, first_row, turn, config.traj_score)
    if tokens is None:
        unit_tokens_of = None
    elif unit_tokens == "first_row":
        unit_tokens_of = tokens.index_select(0, first_row)
    else:
        unit_tokens_of = trajectories.per_slot(tokens, "sum", 0.0)
    return Units(score, unit_tokens_of, group.values, group.bound, first_row)


def turn_numbers(turn_index: Ids, n: int, device: torch.device) -> torch.Tensor:
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


def _trajectory_scores(
    scores: torch.Tensor,
    trajectories: Trajectories,
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
    return scores.index_select(0, trajectories.units(chosen))


def check_consistent(
    scores: torch.Tensor,
    unit_score: torch.Tensor,
    trajectories: Trajectories,
    index: Ids,
    traj_index: Ids,
    own_rule: bool,
) -> None:
    """Refuse a trajectory whose rows carry different scores (the command line's tolerance);
    ``own_rule``: the estimator takes ``traj_score="own"`` too, which the message offers."""
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
    rules = (
        "'first', 'last', 'mean', 'max', 'sum' or 'own'"
        if own_rule
        else ("'first', 'last', 'mean', 'max' or 'sum'")
    )
    raise ValueError(
        f"row {row}: trajectory {id_at(traj_index, row)!r} of group {id_at(index, row)!r} "
        f"has rows with different scores {values}; pass traj_score ({rules})"
    )


def id_at(ids: Ids, row: int) -> Any:
    value = ids[row]
    return value.item() if hasattr(value, "item") else value

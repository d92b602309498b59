"""Per-turn rewards on tensors (``reward_mode="per-turn"``), from the rules the Polars path
(:mod:`advcli.advantages.per_turn`) reads: each row's reward-to-go ``G_t = r_t + γ G_{t+1}``
over its trajectory in turn order (GiGPO's step returns, :func:`advcli.torch.step_groups.
step_returns`), normalized within its step group (``advcli.rules.STEP_GROUPINGS``: the rows at
one turn position, the same padded with the group's trajectories that have no row there, every
row of the group, or equal anchors) by the estimator's rule in the one group kernel
(:func:`advcli.torch.groups.group_table`), the padded groups' statistics from their real rows
and their size, never materializing the virtual members."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from advcli.settings.config import AdvantageConfig, PerTurn
from advcli.settings.rules import RULES
from advcli.torch.groups import GroupCounts, apply_table_to_units, group_table
from advcli.torch.ids import Codes, Ids, compact, direct_limit, raw_codes, unique_codes
from advcli.torch.step_groups import step_groups, step_returns, step_values
from advcli.torch.tensors import check_fits
from advcli.torch.trajectories import Trajectories, id_at, turn_numbers

# The turns a gap's or a repeat's error shows.
SHOWN_TURNS = 10


@dataclass(frozen=True)
class TurnRows:
    """The batch's rows as per-turn rewards see them: each row's group, its trajectory (None:
    each row is one), its turn number (None: the batch order is the turn order), and the ids
    the errors name."""

    group: Codes
    trajectories: Trajectories | None
    turn: torch.Tensor | None
    index: Ids
    traj_index: Ids | None


def per_turn_advantage(
    rewards: torch.Tensor,
    rows: TurnRows,
    config: AdvantageConfig,
    anchor_index: Ids | None,
) -> tuple[torch.Tensor, GroupCounts]:
    """Each row's advantage from its reward-to-go normalized within its step group by
    ``config.estimator``'s rule (under a grouping that ``normalizes_rewards``: the reward-to-go
    of its step group's rewards normalized so), and the step groups' counts (a padded group
    counts its virtual members)."""
    per_turn = config.per_turn
    assert per_turn is not None
    grouping = per_turn.grouping
    n = rewards.shape[0]
    position = turn_positions(rows, n)
    if grouping.normalizes_rewards:
        values = rewards
    else:
        values = step_returns(rewards, rows.trajectories, rows.turn, per_turn.gamma)
    cells = _step_groups(rows.group, position, per_turn, anchor_index, n)
    members = _members(rows, cells) if grouping.padded else None
    table = group_table(
        values,
        cells.values,
        cells.bound,
        RULES[config.estimator],
        config.effective_scale,
        config.singleton,
        config.epsilon,
        members=members,
        variance_epsilon=per_turn.variance_epsilon,
        ddof=config.std_ddof,
    )
    advantage = apply_table_to_units(table, values, cells.values)
    if grouping.normalizes_rewards:
        advantage = step_returns(advantage, rows.trajectories, rows.turn, per_turn.gamma)
    check_fits(values, advantage, None)
    return advantage, table.counts()


def _step_groups(
    group: Codes, position: torch.Tensor, per_turn: PerTurn, anchor_index: Ids | None, n: int
) -> Codes:
    """Each row's step group as codes: its (group, position) pair, its anchor (within its group
    or batch-wide) or its group."""
    grouping = per_turn.grouping
    if grouping.anchors != (anchor_index is not None):
        raise ValueError(
            f"step_groups={per_turn.groups.value!r} needs anchor_index (one anchor id a row)"
            if grouping.anchors
            else f"anchor_index applies to anchor step groups, not to {per_turn.groups.value!r}"
        )
    if anchor_index is not None:
        return step_groups(group, anchor_index, per_turn.scope, n)
    if not grouping.by_position or not n:
        return group
    span = int(position.max()) + 1
    key = group.values * span + position
    bound = group.bound * span
    if bound > direct_limit(n):
        unique, key = unique_codes(key, bound)
        bound = unique.numel()
    return Codes(key, bound)


def _members(rows: TurnRows, cells: Codes) -> torch.Tensor:
    """Each padded step group's size, its task group's trajectory count (float64; 0 where no
    row uses the code)."""
    group = rows.group
    if rows.trajectories is None:  # each row is a trajectory
        of_group = torch.bincount(group.values, minlength=group.bound)
    else:
        first = group.values.index_select(0, rows.trajectories.first_rows)
        of_group = torch.bincount(first, minlength=group.bound)
    at_row = of_group.index_select(0, group.values).to(torch.float64)
    return at_row.new_zeros(cells.bound).scatter_(0, cells.values, at_row)


def turn_positions(rows: TurnRows, n: int) -> torch.Tensor:
    """Each row's position in its trajectory's turn order, from 0: its turn less its
    trajectory's first turn (turns that are not consecutive, with a gap or a repeat, are a
    ``ValueError`` naming the row), or its rank among the trajectory's rows in batch order."""
    trajectories = rows.trajectories
    device = rows.group.values.device
    if trajectories is None or not n:
        return torch.zeros(n, dtype=torch.int64, device=device)
    slot = trajectories.slot
    if rows.turn is None:
        order = torch.sort(slot, stable=True).indices
        sorted_slot = slot.index_select(0, order)
        starts = torch.ones(n, dtype=torch.bool, device=device)
        torch.ne(sorted_slot[1:], sorted_slot[:-1], out=starts[1:])
        arange = torch.arange(n, device=device)
        start_of_run = torch.cummax(torch.where(starts, arange, 0), dim=0).values
        return torch.empty_like(arange).index_copy_(0, order, arange - start_of_run)
    turn = rows.turn
    first_turn = turn.new_zeros(trajectories.bound)
    first_turn.scatter_reduce_(0, slot, turn, "amin", include_self=False)
    position = turn - first_turn.index_select(0, slot)
    length = torch.bincount(slot, minlength=trajectories.bound)
    beyond = position >= length.index_select(0, slot)
    if bool(beyond.any()):
        _refuse_turns(rows, int(torch.nonzero(beyond)[0, 0]), "a gap")
    # Positions within their trajectory's length: each row has a place of its own in a batch-
    # long array (its trajectory's offset plus its position) unless two rows repeat a turn.
    offset = torch.cumsum(length, dim=0) - length
    place = offset.index_select(0, slot) + position
    taken = torch.bincount(place, minlength=n)
    if bool((taken > 1).any()):
        repeated = (taken > 1).index_select(0, place)
        _refuse_turns(rows, int(torch.nonzero(repeated)[0, 0]), "a repeat")
    return position


def _refuse_turns(rows: TurnRows, row: int, kind: str) -> None:
    """The error for a trajectory whose turn indices are not consecutive, naming ``row``, its
    trajectory and its first turns."""
    assert rows.trajectories is not None and rows.turn is not None and rows.traj_index is not None
    slot = rows.trajectories.slot
    turns = torch.sort(rows.turn[slot == slot[row]]).values.tolist()
    shown = ", ".join(map(str, turns[:SHOWN_TURNS])) + (", ..." if len(turns) > SHOWN_TURNS else "")
    raise ValueError(
        f"row {row}: trajectory {id_at(rows.traj_index, row)!r} of group "
        f"{id_at(rows.index, row)!r} has turns {shown}: per-turn rewards need consecutive turn "
        f"indices ({kind})"
    )


def per_turn_rows(
    scores: torch.Tensor,
    config: AdvantageConfig,
    index: Ids,
    traj_index: Ids | None,
    turn_index: Ids | None,
    anchor_index: Ids | None,
    step_rewards: Any,
    step_returns: Any,
) -> tuple[torch.Tensor, TurnRows, torch.Tensor, GroupCounts]:
    """The batch's per-turn rewards (``step_rewards`` where given, else each row's ``scores``),
    its rows, each row's advantage and the step groups' counts."""
    if step_returns is not None:
        raise ValueError(
            "per-turn rewards are discounted here: give step_rewards (each turn's reward) or "
            "none (each row's rewards' sum), not step_returns"
        )
    n, device = scores.shape[0], scores.device
    rewards = scores
    if step_rewards is not None:
        rewards = step_values(step_rewards, n, device, "step_rewards")
    group = compact(raw_codes(index, n, device, "index"), n)
    trajectories = None
    if traj_index is not None:
        trajectories = Trajectories.of(group, raw_codes(traj_index, n, device, "traj_index"), n)
    turn = turn_numbers(turn_index, n, device) if turn_index is not None else None
    rows = TurnRows(group, trajectories, turn, index, traj_index)
    advantage, counts = per_turn_advantage(rewards, rows, config, anchor_index)
    return rewards, rows, advantage, counts

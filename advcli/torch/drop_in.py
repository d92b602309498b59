"""verl's signatures: ``compute_grpo_outcome_advantage`` and ``compute_rloo_outcome_advantage``,
with an optional ``traj_index`` that counts each trajectory once in its group."""

from __future__ import annotations

import torch

from advcli.settings.config import Scale, Singleton
from advcli.settings.rules import RULES
from advcli.torch.groups import apply_table, apply_table_to_units, group_table
from advcli.torch.ids import (
    KEY_LIMIT,
    Codes,
    Ids,
    check_length,
    compact,
    dense,
    direct_limit,
    raw_codes,
    unique_codes,
)
from advcli.torch.tensors import broadcast, check_fits, row_scores


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
    estimator = "grpo" if norm_adv_by_std_in_grpo else "drgrpo"
    scale = Scale.GROUP if norm_adv_by_std_in_grpo else Scale.NONE
    with torch.no_grad():
        scores = row_scores(token_level_rewards, response_mask)
        advantage = _own_score_advantages(
            scores, index, traj_index, compute_mean_std_cross_all_data, estimator, scale, epsilon
        )
        check_fits(scores, advantage, None)
        out = broadcast(advantage, response_mask)
    return out, out


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
        scores = row_scores(token_level_rewards, response_mask)
        advantage = _own_score_advantages(
            scores, index, traj_index, compute_mean_std_cross_all_data, "rloo", Scale.NONE, 0.0
        )
        check_fits(scores, advantage, None)
        out = broadcast(advantage, response_mask)
    return out, out


def _own_score_advantages(
    scores: torch.Tensor,
    index: Ids,
    traj_index: Ids | None,
    cross_all_data: bool,
    estimator: str,
    scale: Scale,
    epsilon: float,
) -> torch.Tensor:
    """Each row's advantage from its own score, under the table of its group's units."""
    group, is_unit = _unit_rows(scores, index, traj_index, cross_all_data)
    if is_unit is None:
        unit_scores, unit_group = scores, group.values
    else:
        units = torch.nonzero(is_unit).squeeze(1)
        unit_scores = scores.index_select(0, units)
        unit_group = group.values.index_select(0, units)
    rule = RULES[estimator]
    table = group_table(unit_scores, unit_group, group.bound, rule, scale, Singleton.RAW, epsilon)
    if is_unit is None:
        return apply_table_to_units(table, scores, group.values)
    return apply_table(table, scores, group.values)


def _unit_rows(
    scores: torch.Tensor, index: Ids, traj_index: Ids | None, cross_all_data: bool
) -> tuple[Codes, torch.Tensor | None]:
    """Each row's group (compact codes) and which rows are units (None: every row)."""
    n = scores.shape[0]
    device = scores.device
    group = raw_codes(index, n, device, "index")
    if traj_index is None or cross_all_data:
        if traj_index is not None:
            check_length(traj_index, n, "traj_index")
        return compact(group, n), None

    traj = raw_codes(traj_index, n, device, "traj_index")
    positions = torch.arange(n, device=device)
    if traj.first_rows and torch.equal(group.values.index_select(0, traj.values), group.values):
        # Each trajectory id occurs in one group only (verl-agent's uuid traj_uid): the
        # trajectory's first row is the pair's first row, no key to sort.
        return compact(group, n), traj.values == positions
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
    return group, first.index_select(0, pair) == positions

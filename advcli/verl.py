"""The fix inside a verl training step: :func:`compute_advantage` fills a ``DataProto``'s
``advantages`` and ``returns`` with advcli's numbers, any estimator, either level.

It finds the group, trajectory and turn ids among the batch's keys with the command line's
vocabulary (verl's ``uid``, verl-agent's ``traj_uid``, agent-lightning's ``rollout_id_list``…,
:data:`advcli.read.dialects.DIALECTS`), or takes them by name, and computes with
:func:`advcli.torch.compute_advantage_with_metrics`: the rule table the command line uses. It
needs the ``torch`` extra; verl itself is never imported (the batch is used through its
``batch`` and ``non_tensor_batch``).
"""

from __future__ import annotations

from typing import Any

from advcli.batch import batch_entries, batch_roles
from advcli.errors import AdvcliError
from advcli.torch import RewardError, compute_advantage_with_metrics


def compute_advantage(
    data: Any,
    estimator: str = "grpo",
    level: str = "trajectory",
    *,
    group_key: str | None = None,
    trajectory_key: str | None = None,
    turn_key: str | None = None,
    reward_key: str | None = None,
    mask_key: str | None = None,
    scale: str | None = None,
    singleton: str = "raw",
    traj_score: str | None = None,
    epsilon: float = 1e-6,
    unit_tokens: str = "sum",
    metrics_prefix: str = "advcli/",
) -> dict[str, int]:
    """Set ``data.batch["advantages"]`` and ``data.batch["returns"]`` (float32, ``(bs,
    response_length)``) in place and return the metrics a trainer logs.

    The keys are found as the command line finds columns: verl's ``uid`` (group), a trajectory
    key of a trainer advcli knows (``traj_uid``, ``rollout_id_list``, ``session_id``, …; none:
    each row is a trajectory, as in verl's agent loop), ``token_level_rewards`` (else
    ``token_level_scores``) and ``response_mask``; the ``*_key`` arguments name them instead.
    A trajectory whose rows carry different scores is refused (``ValueError``) unless
    ``traj_score`` picks a rule; the other settings are those of
    :func:`advcli.torch.compute_advantage`. A NaN or infinite reward or mask value, integer
    rewards beyond 2^53 and scores too large for float32 raise
    :class:`advcli.torch.RewardError` (an ``AdvcliError`` and a ``ValueError``) naming the
    batch's keys, the row and the token, and leave the batch as it was (verl's estimators
    return NaN for the group). An empty batch gets ``(0, response_length)`` advantages and
    metrics of 0.

    Returns ``{prefix}rows``, ``trajectories``, ``multi_row_trajectories``,
    ``max_rows_per_trajectory``, ``groups``, ``singleton_groups`` and ``zero_std_groups``.
    """
    if not (hasattr(data, "batch") and hasattr(data, "non_tensor_batch")):
        # Checked first: the advantages are written back into the batch once computed.
        raise TypeError(
            "compute_advantage takes a verl DataProto (with .batch and .non_tensor_batch), "
            f"not {type(data).__name__}"
        )
    entries = batch_entries(data)
    try:
        roles = batch_roles(
            entries,
            group=group_key,
            trajectory=trajectory_key,
            turn=turn_key,
            reward=reward_key,
            mask=mask_key,
            mask_needed_for="the per-token advantages need one",
        )
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    if roles.reward_kind != "token_rewards" or roles.mask_kind != "mask" or roles.group is None:
        raise ValueError(
            f"the batch's reward '{roles.reward}' and mask '{roles.mask}' must be (bs, "
            "response_length) tensors, with a group id key"
        )
    assert roles.mask is not None
    try:
        result = compute_advantage_with_metrics(
            entries[roles.reward],
            entries[roles.mask],
            entries[roles.group],
            entries[roles.trajectory] if roles.trajectory is not None else None,
            estimator=estimator,
            level=level,
            scale=scale,
            singleton=singleton,
            traj_score=traj_score,
            turn_index=entries[roles.turn] if roles.turn is not None else None,
            epsilon=epsilon,
            unit_tokens=unit_tokens,
        )
    except RewardError as error:
        # The tensors' names in the batch, which the message of advcli.torch cannot know.
        raise RewardError(
            f"batch '{roles.reward}' (reward), '{roles.mask}' (mask): {error}"
        ) from None
    data.batch["advantages"] = result.advantages
    data.batch["returns"] = result.advantages
    return result.metrics.as_dict(metrics_prefix)

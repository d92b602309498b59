"""Any of advcli's estimators on one batch, with the numbers of ``advcli compute``, and the
metrics a trainer logs about the batch."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import torch

from advcli.errors import UsageError
from advcli.rules import RULES
from advcli.settings import AdvantageConfig, Estimator, Level, Scale, Singleton, TrajScore
from advcli.torch.groups import GroupCounts, unit_advantages, whiten
from advcli.torch.ids import Ids, compact, raw_codes
from advcli.torch.tensors import broadcast, check_fits, row_scores
from advcli.torch.trajectories import (
    Trajectories,
    Units,
    check_consistent,
    trajectories_and_groups,
    trajectory_units,
    turn_numbers,
)

SettingT = TypeVar("SettingT", bound=Enum)


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
    """``advantages``, the settings they were computed with (``config``), each row's float64
    ``scores``, and the batch's ``metrics``, counted when first asked for (they cost a pass over
    the rows that the advantages alone do not need)."""

    def __init__(
        self,
        advantages: torch.Tensor,
        config: AdvantageConfig,
        scores: torch.Tensor,
        rows: int,
        trajectories: Trajectories | None,
        groups: GroupCounts,
    ) -> None:
        self.advantages, self.config, self.scores = advantages, config, scores
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
        scores = row_scores(token_level_rewards, response_mask)
        # Token counts only where the rule weighs by them (opo, REINFORCE++).
        tokens = (
            response_mask.detach().to(torch.float64).sum(dim=-1) if rule.counts_tokens else None
        )
        n = scores.shape[0]
        device = scores.device
        traj = raw_codes(traj_index, n, device, "traj_index") if traj_index is not None else None
        trajectories: Trajectories | None = None
        if config.level is Level.TRAJECTORY and traj is not None:
            assert traj_index is not None
            trajectories, unit_group = trajectories_and_groups(index, traj, n, device)
            turn = turn_numbers(turn_index, n, device) if turn_index is not None else None
            units = trajectory_units(
                scores, tokens, unit_group, trajectories, turn, config, unit_tokens
            )
            if config.traj_score is None:
                check_consistent(scores, units.score, trajectories, index, traj_index)
        else:
            group = compact(raw_codes(index, n, device, "index"), n)
            if traj is not None:
                trajectories = Trajectories.of(group, traj, n)
            units = Units(scores, tokens, group.values, group.bound, None)
        unit_advantage, stats = unit_advantages(units, config)
        if rule.whitens and unit_tokens == "first_row":
            # agent-lightning whitens its representative rows, one per trajectory.
            assert units.tokens is not None
            unit_advantage = whiten(unit_advantage, units.tokens)
        check_fits(scores, unit_advantage, units.first_row)
        advantage = unit_advantage
        if units.first_row is not None:  # trajectories: each row takes its trajectory's
            assert trajectories is not None
            advantage = trajectories.to_rows(unit_advantage)
        if rule.whitens and unit_tokens == "sum":
            assert tokens is not None
            advantage = whiten(advantage, tokens)
        out = broadcast(advantage, response_mask)
    return AdvantageResult(out, config, scores, n, trajectories, stats)


def _config(
    estimator: str,
    level: str,
    scale: str | None,
    singleton: str,
    traj_score: str | None,
    epsilon: float,
) -> AdvantageConfig:
    """The settings checked by the command line's own :class:`AdvantageConfig` (a bad value is a
    ``ValueError`` here, naming the argument and its valid values)."""
    if estimator == Estimator.GIGPO.value:
        # Its step term needs the anchors and step rewards, which this call does not take.
        raise ValueError("gigpo runs in advcli compute only (its step term is not on tensors)")
    try:
        return AdvantageConfig(
            level=_choice(Level, "level", level),
            estimator=_choice(Estimator, "estimator", estimator),
            epsilon=epsilon,
            traj_score=(
                _choice(TrajScore, "traj_score", traj_score) if traj_score is not None else None
            ),
            scale=_choice(Scale, "scale", scale) if scale is not None else None,
            singleton=_choice(Singleton, "singleton", singleton),
        )
    except UsageError as error:
        raise ValueError(str(error)) from None


def _choice(kind: type[SettingT], argument: str, value: object) -> SettingT:
    """``value`` as a member of the setting ``kind`` (its value or the member itself)."""
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(repr(member.value) for member in kind)
        raise ValueError(f"{argument}={value!r} is not one of {valid}") from None

"""Any of advcli's estimators on one batch, with the numbers of ``advcli compute``, and the
metrics a trainer logs about the batch."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from advcli.settings.config import OWN_SCORE_ESTIMATORS, AdvantageConfig, Level, TrajScore
from advcli.settings.resolve import GivenSettings, gigpo_only, resolve_config
from advcli.settings.rules import RULES
from advcli.torch.groups import (
    GroupCounts,
    apply_table,
    gigpo_divisor,
    group_table,
    own_score_divisor,
    unit_advantages,
    whiten,
)
from advcli.torch.ids import Codes, Ids, compact, raw_codes
from advcli.torch.per_turn import per_turn_rows
from advcli.torch.step_groups import (
    StepMetrics,
    step_advantages,
    step_values,
)
from advcli.torch.step_groups import step_groups as step_groups_of
from advcli.torch.step_groups import step_returns as step_returns_of
from advcli.torch.tensors import broadcast, check_fits, is_small, row_scores, sum_rows
from advcli.torch.trajectories import (
    Trajectories,
    Units,
    check_consistent,
    trajectory_units,
    turn_numbers,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack


def compute_advantage(  # noqa: PLR0913
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    *,
    turn_index: Ids | None = None,
    unit_tokens: str = "sum",
    anchor_index: Ids | None = None,
    step_rewards: Any = None,
    step_returns: Any = None,
    **settings: Unpack[GivenSettings],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any of advcli's estimators on one batch, with the numbers of ``advcli compute``.

    The command line's settings and rules, from its table (:data:`advcli.rules.RULES`).

    Parameters
    ----------
    token_level_rewards, response_mask
        ``(bs, response_length)``; a row's score is the sum of its rewards (in float64), its
        token count the sum of its mask.
    index, traj_index
        ``bs`` group ids (verl's ``uid``) and trajectory ids, unique within a group (``None``:
        each row is a trajectory).
    estimator
        An :class:`advcli.settings.Estimator` value: ``grpo`` (the default, but for a
        recipe's: gigpo's recipes imply ``gigpo``), ``rloo``, …, ``gigpo``. This and the
        settings below are keywords of :class:`advcli.settings.resolve.GivenSettings`,
        resolved as the command line resolves its options
        (:func:`advcli.settings.resolve.resolve_config`); a bad value, or settings that do not
        fit together, raise :class:`advcli.errors.SettingsError` (a ``ValueError``).
    level, scale, singleton, epsilon
        As ``--level`` (``trajectory``: each trajectory is one unit of its group; ``turn``:
        every row is one), ``--scale`` (grpo, grpo_passk, grpo_loo: ``group``, ``batch`` or
        ``none``), ``--singleton`` (``raw``, ``zero``) and ``--epsilon``, with their defaults.
    traj_score
        The trajectory's score when its rows disagree (``first``, ``last``, ``mean``, ``max``,
        ``sum``; verl's v1 path: ``"last"``); ``None`` refuses such a trajectory (ValueError).
    turn_index
        ``bs`` turn numbers that order ``first``, ``last`` and gigpo's step returns; ``None``:
        the batch order.
    unit_tokens
        A trajectory's token count for opo's weights and REINFORCE++'s whitening: ``"sum"`` of its
        rows', or ``"first_row"``, its first row's (agent-lightning's rollout-level path).
    anchor_index, step_rewards, step_returns
        gigpo: ``bs`` anchor-state ids (equal ids, one state), and ``(bs,)`` step rewards
        (discounted per trajectory in turn order) or returns already discounted.
    gamma, step_weight, gigpo_norm, anchor_scope, recipe
        gigpo, as ``--gamma``, ``--step-weight``, ``--gigpo-norm``, ``--anchor-scope`` and
        ``--recipe`` (a given argument wins over the recipe's; none: the level's default).
    reward_mode, step_groups
        As ``--reward-mode`` and ``--step-groups`` (``recipe="lightrft"`` implies per-turn).
        ``"per-turn"``: each row's score (its rewards' sum, or its ``step_rewards``) is its own
        turn's reward, and its reward-to-go (``gamma``, default 1; turn order as above) is
        normalized by grpo, drgrpo or rloo within its step group: ``turn``, ``turn-padded``
        (the default), ``pooled``, ``anchor`` (``anchor_index``, ``anchor_scope``) or
        ``turn-rewards`` (each position's rewards normalized, then summed to the end), at turn
        level (:mod:`advcli.torch.per_turn`).

    Returns
    -------
    advantages, returns
        The same float32 ``(bs, response_length)`` tensor twice, on the rewards' device.

    Raises
    ------
    RewardError
        As :func:`compute_grpo_outcome_advantage`, with the command line's rules.

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
        turn_index=turn_index,
        unit_tokens=unit_tokens,
        anchor_index=anchor_index,
        step_rewards=step_rewards,
        step_returns=step_returns,
        **settings,
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
    ``scores`` (gigpo's Trinity-RFT recipe: its step rewards), the batch's ``metrics``, counted
    when first asked for (they cost a pass over the rows that the advantages alone do not
    need), and gigpo's ``step_metrics`` (None for the other estimators)."""

    def __init__(
        self,
        advantages: torch.Tensor,
        config: AdvantageConfig,
        scores: torch.Tensor,
        rows: int,
        trajectories: Trajectories | None,
        groups: GroupCounts,
        step_metrics: StepMetrics | None = None,
    ) -> None:
        self.advantages, self.config, self.scores = advantages, config, scores
        self._rows, self._trajectories, self._groups = rows, trajectories, groups
        self.step_metrics = step_metrics

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


def compute_advantage_with_metrics(  # noqa: PLR0913
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    *,
    turn_index: Ids | None = None,
    unit_tokens: str = "sum",
    anchor_index: Ids | None = None,
    step_rewards: Any = None,
    step_returns: Any = None,
    **settings: Unpack[GivenSettings],
) -> AdvantageResult:
    """:func:`compute_advantage`'s tensor (once) and the batch's :class:`AdvantageMetrics`."""
    config = resolve_config(settings)
    if unit_tokens not in ("sum", "first_row"):
        raise ValueError(f"unit_tokens is 'sum' or 'first_row', got {unit_tokens!r}")
    with torch.no_grad():
        scores = row_scores(token_level_rewards, response_mask)
        n = scores.shape[0]
        if config.per_turn is not None:
            inputs = (index, traj_index, turn_index, anchor_index, step_rewards, step_returns)
            rewards, rows, advantage, counts = per_turn_rows(scores, config, *inputs)
            out = broadcast(advantage, response_mask)
            return AdvantageResult(out, config, rewards, n, rows.trajectories, counts)
        steps = _step_inputs(config, anchor_index, step_rewards, step_returns, n, scores.device)
        step = config.step
        if step is not None and step.episode_from_steps:
            if steps.rewards is None:
                raise ValueError(
                    "the episode score as the sum of step rewards (Trinity-RFT's) needs "
                    "step_rewards, not step_returns"
                )
            scores = steps.rewards
            if config.level is Level.TRAJECTORY:
                config = replace(config, traj_score=TrajScore.SUM)
        episode = _episode(
            scores, response_mask, index, traj_index, turn_index, config, unit_tokens
        )
        step_metrics = None
        if step is None:
            out = broadcast(episode.rows(torch.float32), response_mask)
        else:
            returns = steps.returns
            if returns is None:
                assert steps.rewards is not None
                returns = step_returns_of(
                    steps.rewards, episode.trajectories, episode.turn, step.gamma
                )
            assert anchor_index is not None
            groups = step_groups_of(episode.group, anchor_index, step.scope, n)
            step_term, step_metrics = step_advantages(
                returns, groups, step, config.epsilon, config.std_ddof
            )
            # In the step term's own buffer: a fresh large allocation costs page faults.
            if step.weight != 1:
                step_term.mul_(step.weight)
            advantage = step_term.add_(episode.rows())
            check_fits(scores, advantage, None)
            out = broadcast(advantage, response_mask)
    return AdvantageResult(
        out, config, scores, n, episode.trajectories, episode.counts, step_metrics
    )


@dataclass(frozen=True)
class _Episode:
    """The advantages at the config's level (GiGPO: its episode term): ``advantage`` each
    row's, or each trajectory's where ``per_trajectory`` (:meth:`rows` gives each row its
    trajectory's); the batch's trajectories (None where it has no trajectory ids), each row's
    group and turn, and the groups' counts."""

    advantage: torch.Tensor
    per_trajectory: bool
    trajectories: Trajectories | None
    group: Codes
    turn: torch.Tensor | None
    counts: GroupCounts

    def rows(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Each row's advantage as ``dtype``, converted before the gather to the rows: for the
        float32 result that gather moves half the bytes of a float64 one."""
        advantage = self.advantage.to(dtype)
        if not self.per_trajectory:
            return advantage
        assert self.trajectories is not None
        return self.trajectories.to_rows(advantage)


def _episode(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None,
    turn_index: Ids | None,
    config: AdvantageConfig,
    unit_tokens: str,
) -> _Episode:
    rule = RULES[config.estimator]
    # Token counts only where the rule weighs by them (opo, REINFORCE++).
    n = scores.shape[0]
    device = scores.device
    small = device.type == "cpu" and is_small(*response_mask.shape)
    tokens = sum_rows(response_mask.detach(), small) if rule.counts_tokens else None
    traj = raw_codes(traj_index, n, device, "traj_index") if traj_index is not None else None
    turn = turn_numbers(turn_index, n, device) if turn_index is not None else None
    trajectories: Trajectories | None = None
    group = compact(raw_codes(index, n, device, "index"), n)
    if config.level is Level.TRAJECTORY and traj is not None:
        assert traj_index is not None
        trajectories = Trajectories.of(group, traj, n)
        if config.traj_score is TrajScore.OWN:
            advantage, counts = _own_scores(scores, group, trajectories, config)
            return _Episode(advantage, False, trajectories, group, turn, counts)
        unit_group = Codes(group.values.index_select(0, trajectories.first_rows), group.bound)
        units = trajectory_units(
            scores, tokens, unit_group, trajectories, turn, config, unit_tokens
        )
        if config.traj_score is None:
            own_rule = config.estimator.value in OWN_SCORE_ESTIMATORS
            check_consistent(scores, units.score, trajectories, index, traj_index, own_rule)
    else:
        if traj is not None:
            trajectories = Trajectories.of(group, traj, n)
        units = Units(scores, tokens, group.values, group.bound, None)
    unit_advantage, counts = unit_advantages(units, config)
    if rule.whitens and unit_tokens == "first_row":
        # agent-lightning whitens its representative rows, one per trajectory.
        assert units.tokens is not None
        unit_advantage = whiten(unit_advantage, units.tokens)
    check_fits(scores, unit_advantage, units.first_row)
    episode = _Episode(
        unit_advantage, units.first_row is not None, trajectories, group, turn, counts
    )
    if rule.whitens and unit_tokens == "sum":
        assert tokens is not None
        episode = replace(episode, advantage=whiten(episode.rows(), tokens), per_trajectory=False)
    return episode


def _own_scores(
    scores: torch.Tensor, group: Codes, trajectories: Trajectories, config: AdvantageConfig
) -> tuple[torch.Tensor, GroupCounts]:
    """Each row's advantage under ``--traj-score own``: each trajectory's first row (in batch
    order) in its group's statistics, every row centred on its own score."""
    first = trajectories.first_rows
    table = group_table(
        scores.index_select(0, first),
        group.values.index_select(0, first),
        group.bound,
        RULES[config.estimator],
        config.effective_scale,
        config.singleton,
        config.epsilon,
        ddof=config.std_ddof,
    )
    if config.step is not None:
        table = gigpo_divisor(table, config)
    table = own_score_divisor(table, config)
    return apply_table(table, scores, group.values), table.counts()


@dataclass(frozen=True)
class _StepInputs:
    rewards: torch.Tensor | None
    returns: torch.Tensor | None


def _step_inputs(
    config: AdvantageConfig,
    anchor_index: Ids | None,
    step_rewards: Any,
    step_returns: Any,
    n: int,
    device: torch.device,
) -> _StepInputs:
    """The step rewards or returns as float64 tensors, checked; nothing for the outcome
    estimators, which take none of them."""
    given = [
        name
        for name, value in (
            ("anchor_index", anchor_index),
            ("step_rewards", step_rewards),
            ("step_returns", step_returns),
        )
        if value is not None
    ]
    if config.step is None:
        if given:
            raise ValueError(gigpo_only(given, config.estimator.value))
        return _StepInputs(None, None)
    if anchor_index is None:
        raise ValueError("gigpo's step groups need anchor_index (one anchor id a row)")
    if (step_rewards is None) == (step_returns is None):
        raise ValueError(
            "gigpo needs step_rewards (each step's reward, discounted here with gamma) or "
            "step_returns (already discounted): give one"
        )
    if step_rewards is not None:
        return _StepInputs(step_values(step_rewards, n, device, "step_rewards"), None)
    return _StepInputs(None, step_values(step_returns, n, device, "step_returns"))

"""The fix inside a verl training step: :func:`compute_advantage` takes verl's own call,
``batch = compute_advantage(batch, adv_estimator=..., norm_adv_by_std_in_grpo=..., config=...)``,
fills the ``DataProto``'s ``advantages`` and ``returns`` with advcli's numbers (either level) and
puts the step's metrics, the length bias among them, in ``batch.meta_info["metrics"]``.

It finds the group, trajectory and turn ids among the batch's keys with the command line's
vocabulary (verl's ``uid``, verl-agent's ``traj_uid``, agent-lightning's ``rollout_id_list``…,
:data:`advcli.read.dialects.DIALECTS`), or takes them by name, and computes with
:func:`advcli.torch.compute_advantage_with_metrics`: the rule table the command line uses. The
bias figures are ``advcli compare``'s own (:func:`advcli.advantages.levels.both_levels`,
:func:`advcli.report.bias.bias_report`) on the batch's key projection. It needs the ``torch``
extra; verl itself is never imported (the batch is used through its ``batch``,
``non_tensor_batch`` and ``meta_info``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl

from advcli import __version__
from advcli.advantages.groupings import every_grouping, groupings_of
from advcli.advantages.levels import both_levels
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import index_trajectories
from advcli.errors import AdvcliError
from advcli.keys import ANCHOR, SCORE, STEP_REWARD
from advcli.read.batch import (
    batch_entries,
    batch_projection,
    batch_roles,
)
from advcli.read.columns import ColumnRoles
from advcli.read.picker import Options
from advcli.report.bias import bias_report
from advcli.report.termination import termination_report
from advcli.settings.config import Estimator, TrajScore
from advcli.settings.resolve import SETTING_NAMES, resolve_config
from advcli.settings.rules import RULES
from advcli.torch import AdvantageResult, RewardError, compute_advantage_with_metrics
from advcli.verl.keywords import (
    check_gigpo_keywords,
    config_value,
    gigpo_arguments,
    per_turn_keywords,
    per_turn_mode,
    take_step_keys,
)

# verl's estimator names (the values of verl.trainer.ppo.core_algos.AdvantageEstimator, 0.9.1)
# and advcli's own, each to the advcli estimator that computes it with verl's meaning; None: a
# verl estimator advcli does not implement (it needs a critic's values, per-token returns,
# reward baselines, the actor's probabilities or per-dimension rewards).
ESTIMATORS: dict[str, Estimator | None] = {
    "grpo": Estimator.GRPO,
    "grpo_vectorized": Estimator.GRPO,
    "rloo": Estimator.RLOO,
    "rloo_vectorized": Estimator.RLOO,
    "opo": Estimator.OPO,
    "grpo_passk": Estimator.GRPO_PASSK,
    "reinforce_plus_plus_baseline": Estimator.REINFORCE_PP_BASELINE,
    "drgrpo": Estimator.DRGRPO,
    "reinforce_pp_baseline": Estimator.REINFORCE_PP_BASELINE,
    "grpo_loo": Estimator.GRPO_LOO,
    # verl-agent's AdvantageEstimator.GiGPO.
    "gigpo": Estimator.GIGPO,
    "gae": None,
    "reinforce_plus_plus": None,
    "remax": None,
    "gpg": None,
    "optimal_token_baseline": None,
    "tir_optimal_token_baseline": None,
    "gdpo": None,
}
# What a group of one unit gets where verl's function differs from advcli's default (it keeps
# its raw score): verl 0.9.1's rloo_vectorized gives it 0, its rloo the raw score.
SINGLETONS = {"rloo_vectorized": "zero"}

# The bias report's figures logged each step, by their place in the JSON report
# (docs/compare.md, "The JSON report, key by key"); the metric is named by the path.
BIAS_FIGURES = (
    ("groups", "baseline_shift_mean"),
    ("groups", "baseline_shift_max"),
    ("trajectories", "advantage_diff_mean"),
    ("trajectories", "advantage_diff_max"),
    ("trajectories", "sign_flips"),
    ("loss_weights", "token-mean", "longest_vs_shortest"),
)

# The termination report's figures logged each step under per-turn rewards, for every grouping
# it computes (docs/compare.md, "Per-turn rewards"): the hidden bonus the grouping gives
# continuing, and its advantages' sign flips against the zero-padded grouping's.
TERMINATION_FIGURES = ("implied_bonus", "sign_flips")

# How the errors name the keys' arguments.
OPTIONS = Options(
    {
        "group": "group_key",
        "trajectory": "trajectory_key",
        "turn": "turn_key",
        "reward": "reward_key",
        "mask": "mask_key",
        "anchor": "anchor_key",
        "step_reward": "step_reward_key",
        "step_return": "step_return_key",
    },
    keywords=True,
    by=None,
    holder="batch",
)


def compute_advantage(  # noqa: PLR0913
    data: Any,
    adv_estimator: Any = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    *,
    estimator: str | None = None,
    level: str | None = None,
    group_key: str | None = None,
    trajectory_key: str | None = None,
    turn_key: str | None = None,
    reward_key: str | None = None,
    mask_key: str | None = None,
    scale: str | None = None,
    singleton: str | None = None,
    traj_score: str | None = None,
    epsilon: float | None = None,
    std: str | None = None,
    unit_tokens: str = "sum",
    bias_metrics: bool = True,
    metrics_prefix: str = "advcli/",
    reward_mode: str | None = None,
    step_groups: str | None = None,
    **gigpo: Any,
) -> Any:
    """verl's ``compute_advantage(data, adv_estimator, gamma, lam, num_repeat,
    norm_adv_by_std_in_grpo, config)`` with advcli's numbers: set ``data.batch["advantages"]``
    and ``data.batch["returns"]`` (float32, ``(bs, response_length)``), merge the step's
    metrics into ``data.meta_info["metrics"]`` and return ``data`` (verl's line ``batch =
    compute_advantage(batch, ...)`` keeps working).

    ``adv_estimator`` is one of verl's ``AdvantageEstimator`` members or its value (``grpo``,
    ``grpo_vectorized``, ``rloo``, ``rloo_vectorized``, ``opo``, ``grpo_passk``,
    ``reinforce_plus_plus_baseline``), verl-agent's ``gigpo``, or advcli's ``drgrpo``,
    ``reinforce_pp_baseline``; ``estimator=`` is the same argument (neither: ``grpo``).
    ``norm_adv_by_std_in_grpo=False`` divides by no std (``scale="none"``) for grpo and
    grpo_passk: grpo is then Dr. GRPO. ``config`` is read for what verl's estimators read of
    it, ``norm_adv_by_std_in_grpo`` (grpo_passk's source; contradicting the argument: an
    error). ``lam``, ``num_repeat`` and (but for gigpo, whose step rewards it discounts)
    ``gamma`` are taken and not used, as verl's outcome estimators do. A lone unit keeps its
    raw score, as in verl, but under ``rloo_vectorized`` (:data:`SINGLETONS`); ``singleton``
    ("raw", "zero") sets it, ``std`` the std's denominator ("sample", verl's, "population").

    The keys are found as the command line finds columns: verl's ``uid`` (group), a trajectory
    key of a trainer advcli knows (``traj_uid``, ``rollout_id_list``, ``session_id``, …; none:
    each row is a trajectory, as in verl's agent loop), ``token_level_rewards`` (else
    ``token_level_scores``) and ``response_mask``; the ``*_key`` arguments name them instead.
    gigpo reads the anchor (``anchor_obs``) and step returns (``step_rewards``) or rewards
    (``rewards``) too, and takes :data:`advcli.verl_keywords.GIGPO_KEYWORDS`. The rest is
    :func:`advcli.torch.compute_advantage`'s (rows of a trajectory that disagree are refused
    unless ``traj_score`` picks a rule; verl-agent's batch takes its own, "own"); rewards no
    advantage can be computed from raise :class:`advcli.torch.RewardError` naming the batch's
    keys, the row and the token. Every error leaves the batch as it was.
    ``reward_mode="per-turn"``, ``step_groups``: per-turn rewards
    (:func:`advcli.verl_keywords.per_turn_keywords`; the bias figures its report's).

    The metrics: ``{prefix}rows``, ``trajectories``, ``multi_row_trajectories``,
    ``max_rows_per_trajectory``, ``groups``, ``singleton_groups``, ``zero_std_groups`` (at
    ``level``), gigpo's :class:`advcli.torch.StepMetrics`, and with ``bias_metrics`` ``advcli
    compare``'s figures on this batch (both levels; gigpo: its episode term's) by their JSON
    keys (:data:`BIAS_FIGURES`), NaN where the report has null. An empty batch: counts of 0.
    """
    _check_data(data)
    name = verl_estimator(adv_estimator, estimator)
    mode, turn = per_turn_mode(reward_mode, step_groups, gamma, config, gigpo)
    steps = check_gigpo_keywords(gigpo, name)
    _check_unused(lam=lam, num_repeat=num_repeat, **({} if steps or mode else {"gamma": gamma}))
    singleton = singleton or SINGLETONS.get(_spelled(adv_estimator or estimator))
    scale = _scale(name, norm_adv_by_std_in_grpo, config, scale)
    entries = batch_entries(data)
    keys = (group_key, trajectory_key, turn_key, reward_key, mask_key)
    roles = key_roles(entries, *keys, steps=steps, **take_step_keys(gigpo))
    assert roles.group is not None and roles.mask is not None
    step_arguments = gigpo_arguments(entries, roles, gamma, config, gigpo) if steps else {}
    if turn:
        step_arguments = per_turn_keywords(entries, roles, turn)
    settings: dict[str, Any] = {"estimator": name.value, "level": level, "scale": scale}
    settings |= {"singleton": singleton, "epsilon": epsilon, "std": std}
    settings["traj_score"] = traj_score or _trainer_rule(roles, {**settings, **step_arguments})
    try:
        result = compute_advantage_with_metrics(
            entries[roles.reward],
            entries[roles.mask],
            entries[roles.group],
            entries[roles.trajectory] if roles.trajectory is not None else None,
            turn_index=entries[roles.turn] if roles.turn is not None else None,
            unit_tokens=unit_tokens,
            **settings,
            **step_arguments,
        )
    except RewardError as error:
        # The tensors' names in the batch, which the message of advcli.torch cannot know.
        raise RewardError(
            f"batch '{roles.reward}' (reward), '{roles.mask}' (mask): {error}"
        ) from None
    _publish(data, entries, roles, result, bias_metrics, metrics_prefix, step_arguments)
    return data


def _trainer_rule(roles: ColumnRoles, given: Mapping[str, Any]) -> str | None:
    """The batch's trainer's own rule for a trajectory whose rows differ (verl-agent's invalid
    action penalty), ``traj_score="own"``, where the settings ``given`` (among the batch's
    other keywords) take it, as ``advcli compare`` reads its dumps; None otherwise."""
    if roles.own_scores_of is None:
        return None
    settings = {name: value for name, value in given.items() if name in SETTING_NAMES}
    return TrajScore.OWN.value if resolve_config(settings).takes_own_scores else None


def _check_data(data: Any) -> None:
    """Refuse what is not a DataProto before anything: the advantages are written back into
    the batch once computed."""
    if not all(hasattr(data, name) for name in ("batch", "non_tensor_batch", "meta_info")):
        raise TypeError(
            "compute_advantage takes a verl DataProto (with .batch, .non_tensor_batch and "
            f".meta_info), not {type(data).__name__}"
        )


def _publish(
    data: Any,
    entries: Mapping[str, Any],
    roles: ColumnRoles,
    result: AdvantageResult,
    bias_metrics: bool,
    prefix: str,
    arguments: Mapping[str, Any],
) -> None:
    """The advantages and the metrics into the batch (``arguments``: the step keywords the
    advantages were computed with, per-turn rewards' anchors among them)."""
    metrics: dict[str, float] = dict(result.metrics.as_dict(prefix))
    if result.step_metrics is not None:
        metrics.update(result.step_metrics.as_dict(prefix))
    if bias_metrics and result.config.per_turn is not None:
        metrics.update(_termination(entries, roles, result, prefix, arguments))
    elif bias_metrics:
        metrics.update(_bias(entries, roles, result, prefix))
    data.batch["advantages"] = result.advantages
    data.batch["returns"] = result.advantages
    # verl's convention for the metrics a DataProto carries (its workers' outputs); merged into
    # a new dict, so that a dict the caller holds is not changed under it.
    data.meta_info["metrics"] = {**(data.meta_info.get("metrics") or {}), **metrics}


def _check_unused(**arguments: Any) -> None:
    """verl's numbers that its outcome estimators take and do not use: numbers still (an old
    call's positional ``level`` would land in ``gamma``)."""
    for name, value in arguments.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"{name} is verl's number (unused by the outcome estimators), got {value!r}; "
                "advcli's settings (level=, …) are keywords"
            )


def key_roles(
    entries: Mapping[str, Any], *keys: str | None, steps: bool | None, **step_keys: str | None
) -> ColumnRoles:
    """The roles of the batch's keys (``keys``: the group, trajectory, turn, reward and mask
    keys given; ``steps``: gigpo's too, ``step_keys`` naming them), with token rewards, a 0/1
    mask and a group id."""
    group, trajectory, turn, reward, mask = keys
    try:
        roles = batch_roles(
            entries,
            group=group,
            trajectory=trajectory,
            turn=turn,
            reward=reward,
            mask=mask,
            mask_needed_for="the per-token advantages need one",
            options=OPTIONS,
            steps=steps,
            anchor=step_keys.get("anchor_key"),
            step_reward=step_keys.get("step_reward_key"),
            step_return=step_keys.get("step_return_key"),
        )
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    if roles.reward_kind != "token_rewards" or roles.mask_kind != "mask" or roles.group is None:
        raise ValueError(
            f"the batch's reward '{roles.reward}' and mask '{roles.mask}' must be (bs, "
            "response_length) tensors, with a group id key"
        )
    return roles


def verl_estimator(adv_estimator: Any, estimator: Any = None) -> Estimator:
    """The advcli estimator of verl's ``adv_estimator`` (an ``AdvantageEstimator`` member or
    its value) or of advcli's ``estimator``, by :data:`ESTIMATORS`; ``grpo`` when neither is
    given."""
    if adv_estimator is not None and estimator is not None:
        raise ValueError(
            f"adv_estimator={_spelled(adv_estimator)!r} and estimator={_spelled(estimator)!r} "
            "name the same setting: give one"
        )
    given = adv_estimator if adv_estimator is not None else estimator
    name = _spelled(given) if given is not None else Estimator.GRPO.value
    implemented = ", ".join(key for key, value in ESTIMATORS.items() if value is not None)
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; advcli.verl computes {implemented}")
    found = ESTIMATORS[name]
    if found is None:
        raise ValueError(
            f"verl's estimator {name!r} is not one advcli implements; advcli.verl computes "
            f"{implemented}"
        )
    return found


def _spelled(value: Any) -> Any:
    """An enum member's value (verl's ``AdvantageEstimator``, advcli's ``Estimator``), else the
    value itself."""
    return getattr(value, "value", value)


def _scale(
    estimator: Estimator, norm_adv_by_std_in_grpo: Any, config: Any, scale: str | None
) -> str | None:
    """advcli's ``scale`` for verl's ``norm_adv_by_std_in_grpo``: ``none`` where it is False
    and the estimator divides by a std (grpo, grpo_passk, grpo_loo), ``scale`` otherwise.
    ``config``'s own ``norm_adv_by_std_in_grpo`` (verl's grpo reads the argument, its grpo_passk
    the config) must agree with the argument."""
    if not RULES[estimator].divides or RULES[estimator].steps:
        # gigpo's divisor is its norm's (verl-agent's gigpo does not read the flag either).
        return scale
    norm = _flag("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    in_config = config_value(config, "norm_adv_by_std_in_grpo")
    if in_config is not None and _flag("config.norm_adv_by_std_in_grpo", in_config) != norm:
        raise ValueError(
            f"norm_adv_by_std_in_grpo={norm} but config.norm_adv_by_std_in_grpo={in_config}: "
            "verl's grpo reads the argument and its grpo_passk the config; give them one value"
        )
    if norm:
        return scale
    if scale not in (None, "none"):
        raise ValueError(
            f"norm_adv_by_std_in_grpo=False divides by no std, and scale={scale!r} by one: give "
            "one of them"
        )
    return "none"


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} is True or False, got {value!r}")
    return bool(value)


def _termination(
    entries: Mapping[str, Any],
    roles: ColumnRoles,
    result: AdvantageResult,
    prefix: str,
    arguments: Mapping[str, Any],
) -> dict[str, float]:
    """:data:`TERMINATION_FIGURES` of each grouping in ``advcli compare --reward-mode
    per-turn``'s report on the batch's key projection (its per-turn rewards as the scores, its
    anchors where the step groups are), named ``{prefix}groupings/{grouping}/{figure}``; NaN
    where the report has null, and for an empty batch, of which there is no report."""
    try:
        projection = batch_projection(entries, roles, result.scores.cpu().numpy())
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    if arguments.get("anchor_index") is not None:
        projection = projection.with_columns(pl.Series(ANCHOR, arguments["anchor_index"]))
    config = result.config
    assert config.per_turn is not None
    if projection.is_empty():
        names = groupings_of(projection, config.per_turn.groups)
        return {
            f"{prefix}groupings/{name}/{figure}": math.nan
            for name in names
            for figure in TERMINATION_FIGURES
        }
    naming = Naming(roles.group or "group", roles.trajectory or "row")
    rows = every_grouping(projection, config, naming, index_trajectories(projection))
    settings = {"columns": roles.describe(), "reading": roles.reading()}
    report = termination_report(rows, config=config, settings=settings, version=__version__)
    return {
        f"{prefix}groupings/{name}/{figure}": math.nan if entry[figure] is None else entry[figure]
        for name, entry in report.summary["groupings"].items()
        for figure in TERMINATION_FIGURES
    }


def _bias(
    entries: Mapping[str, Any], roles: ColumnRoles, result: AdvantageResult, prefix: str
) -> dict[str, float]:
    """:data:`BIAS_FIGURES` of ``advcli compare``'s report on the batch's key projection, with
    ``result``'s settings and scores; NaN where the report has null, and for an empty batch, of
    which there is no report."""
    try:
        projection = batch_projection(entries, roles, result.scores.cpu().numpy())
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    config, step = result.config, result.config.step
    if step is not None and step.episode_from_steps:
        # Trinity-RFT's episode term: the scores computed on are the step rewards.
        projection = projection.with_columns(pl.col(SCORE).alias(STEP_REWARD))
    elif step is not None and config.traj_score is None:
        # The episode term's bias: where a trajectory's rows disagree (verl-agent's
        # invalid-action penalty), its score at trajectory level is their mean.
        config = replace(config, traj_score=TrajScore.MEAN)
    if projection.is_empty():
        return {f"{prefix}{'/'.join(path)}": math.nan for path in BIAS_FIGURES}
    naming = Naming(roles.group or "group", roles.trajectory or "row")
    turn, trajectory = both_levels(projection, config, naming, index_trajectories(projection))
    settings = {"columns": roles.describe(), "reading": roles.reading()}
    report = bias_report(
        turn,
        trajectory.without_index(),
        config=config,
        settings=settings,
        version=__version__,
        top=0,
    )
    figures: dict[str, float] = {}
    for path in BIAS_FIGURES:
        value: Any = report.summary
        for key in path:
            value = value[key]
        figures[f"{prefix}{'/'.join(path)}"] = math.nan if value is None else value
    return figures

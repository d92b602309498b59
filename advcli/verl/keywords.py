"""verl's and verl-agent's keywords and config keys as :func:`advcli.torch.compute_advantage`'s
arguments, for :func:`advcli.verl.compute_advantage`: gigpo's (:func:`gigpo_arguments`) and
per-turn rewards' (:func:`per_turn_keywords`), the batch's step entries read by
:mod:`advcli.read.batch`, and ``config`` read as verl reads it (:func:`config_value`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from advcli.errors import AdvcliError
from advcli.read.batch import TurnRewardError, anchor_codes, per_turn_inputs
from advcli.read.columns import ColumnRoles
from advcli.settings.config import Estimator, RewardMode
from advcli.settings.recipes import PER_TURN_RECIPES
from advcli.settings.resolve import gigpo_only
from advcli.settings.rules import RULES
from advcli.torch import RewardError

# advcli.verl's gigpo keywords: advcli's names (``--recipe``, ``--gigpo-norm``, ``--step-weight``,
# ``--anchor-scope``) and verl-agent's compute_advantage's (``step_advantage_w``, ``gigpo_mode``).
GIGPO_KEYWORDS = (
    "recipe",
    "gigpo_norm",
    "step_weight",
    "anchor_scope",
    "step_advantage_w",
    "gigpo_mode",
)
# The keys of gigpo's roles, as the other ``*_key`` arguments.
STEP_KEYS = ("anchor_key", "step_reward_key", "step_return_key")


def take_step_keys(gigpo: dict[str, Any]) -> dict[str, Any]:
    """The keys of gigpo's roles named among its keywords (:data:`STEP_KEYS`), taken out of
    them (None for each not named)."""
    return {key: gigpo.pop(key, None) for key in STEP_KEYS}


# The keywords of those that per-turn rewards read too, and those of them that name batch keys.
PER_TURN_KEYS = ("anchor_key", "step_reward_key", "anchor_scope")
BATCH_KEYS = ("anchor_key", "step_reward_key")
# verl-agent's algorithm.gigpo.mode values as advcli's gigpo_norm.
GIGPO_MODES = {"mean_norm": "mean", "mean_std_norm": "mean_std"}
# The recipe without recipe=: verl-agent's own numbers (every row in the episode statistics).
VERL_RECIPE = "verl-agent"


def gigpo_arguments(
    entries: Mapping[str, Any],
    roles: ColumnRoles,
    gamma: float,
    config: Any,
    given: Mapping[str, Any],
) -> dict[str, Any]:
    """:func:`advcli.torch.compute_advantage`'s gigpo keywords for the batch: its anchors hashed
    as stage 1 hashes a dump's (:func:`advcli.batch.anchor_codes`), its step returns (verl-agent's
    ``step_rewards``) or step rewards (discounted with ``gamma``, verl's
    ``algorithm.gamma``), and the settings of ``given`` (:data:`GIGPO_KEYWORDS`) and of
    ``config`` (verl-agent's ``algorithm`` section: ``gigpo.step_advantage_w``, ``gigpo.mode``;
    a value there that contradicts a keyword is an error). ``recipe``: :data:`VERL_RECIPE`
    unless given."""
    section = config_value(config, "gigpo")
    weight = agreed(
        ("step_weight", given.get("step_weight")),
        ("step_advantage_w", given.get("step_advantage_w")),
        ("config.gigpo.step_advantage_w", config_value(section, "step_advantage_w")),
    )
    mode = agreed(
        ("gigpo_mode", given.get("gigpo_mode")),
        ("config.gigpo.mode", config_value(section, "mode")),
    )
    if mode is not None and mode not in GIGPO_MODES:
        raise ValueError(f"gigpo_mode is one of {', '.join(map(repr, GIGPO_MODES))}, got {mode!r}")
    norm = agreed(
        ("gigpo_norm", given.get("gigpo_norm")),
        ("gigpo_mode", GIGPO_MODES[mode] if mode is not None else None),
    )
    assert roles.anchor is not None
    try:
        anchors = anchor_codes(roles.anchor, entries[roles.anchor])
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    if roles.step_return is not None:
        steps = {"step_returns": entries[roles.step_return]}
    else:
        assert roles.step_reward is not None
        steps = {"step_rewards": entries[roles.step_reward]}
    return {
        "anchor_index": anchors,
        **steps,
        "gamma": gamma,
        "step_weight": weight,
        "gigpo_norm": norm,
        "anchor_scope": given.get("anchor_scope"),
        "recipe": given.get("recipe") or VERL_RECIPE,
    }


def per_turn_mode(
    reward_mode: str | None,
    step_groups: str | None,
    gamma: float,
    config: Any,
    keywords: dict[str, Any],
) -> tuple[str | None, dict[str, Any]]:
    """The reward mode given (the argument or ``config.reward_mode``; None for outcome
    rewards) and the settings :func:`per_turn_keywords` reads: ``reward_mode``, ``step_groups``
    (or ``config.step_groups``), ``gamma`` (verl's ``algorithm.gamma``) and
    :data:`PER_TURN_KEYS` and ``recipe`` taken out of ``keywords`` (a per-turn recipe,
    ``lightrft``, implies per-turn rewards); under outcome rewards ``step_groups``
    alone where given (for ``advcli.torch`` to refuse it), else nothing."""
    mode = agreed(
        ("reward_mode", reward_mode), ("config.reward_mode", config_value(config, "reward_mode"))
    )
    groups = agreed(
        ("step_groups", step_groups), ("config.step_groups", config_value(config, "step_groups"))
    )
    recipe = keywords.get("recipe")
    if mode is None and any(recipe in (known, known.value) for known in PER_TURN_RECIPES):
        mode = RewardMode.PER_TURN.value  # as a per-turn recipe implies
    if mode in (None, RewardMode.OUTCOME.value):
        return None, {} if groups is None else {"step_groups": groups}
    keys = {key: keywords.pop(key) for key in (*PER_TURN_KEYS, "recipe") if key in keywords}
    return mode, {"reward_mode": mode, "step_groups": groups, "gamma": gamma, **keys}


def per_turn_keywords(
    entries: Mapping[str, Any], roles: ColumnRoles, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`advcli.torch.compute_advantage`'s per-turn keywords for the batch: ``settings``
    (:func:`per_turn_mode`) with the per-turn rewards and anchors
    :func:`advcli.batch.per_turn_inputs` reads: verl-agent's per-step ``rewards`` (or the
    ``step_reward_key`` entry; none: each row's token rewards summed) and its ``anchor_obs``
    (or ``anchor_key``) for anchor step groups. A null, NaN or infinite per-turn reward is a
    :class:`advcli.torch.RewardError`."""
    keywords = {key: value for key, value in settings.items() if key not in BATCH_KEYS}
    if "reward_mode" not in settings:
        return keywords
    keys = {key: settings[key] for key in BATCH_KEYS if key in settings}
    try:
        inputs = per_turn_inputs(entries, roles, settings["step_groups"], **keys)
    except TurnRewardError as error:
        raise RewardError(str(error)) from None
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    return {**keywords, **inputs}


def check_gigpo_keywords(given: Mapping[str, Any], estimator: Estimator) -> bool:
    """Whether ``estimator`` has a step term (gigpo); a keyword compute_advantage does not take
    is refused, and gigpo's keywords given to another estimator, which would not read them."""
    unknown = sorted(set(given) - {*GIGPO_KEYWORDS, *STEP_KEYS})
    if unknown:
        raise TypeError(f"compute_advantage() got an unexpected keyword argument {unknown[0]!r}")
    steps = RULES[estimator].steps
    if not steps and given:
        raise ValueError(gigpo_only(sorted(given), estimator.value))
    return steps


def agreed(*values: tuple[str, Any]) -> Any:
    """The one value the given (not None) ``(name, value)`` pairs hold; None if none is given;
    an error naming two that differ."""
    given = [(name, value) for name, value in values if value is not None]
    for name, value in given[1:]:
        if value != given[0][1]:
            raise ValueError(
                f"{given[0][0]}={given[0][1]!r} but {name}={value!r}: give them one value"
            )
    return given[0][1] if given else None


def config_value(config: Any, key: str) -> Any:
    """``config[key]`` as verl reads it (``config.get``: an ``AlgoConfig``, an OmegaConf
    ``DictConfig`` or a dict), None without a config or the key."""
    if config is None:
        return None
    if isinstance(config, Mapping) or hasattr(config, "get"):
        return config.get(key)
    return getattr(config, key, None)

""":func:`advcli.torch.compute_advantage`'s keyword arguments as the command line's settings
(:func:`settings_of`): each checked by the command line's own :class:`AdvantageConfig`, a bad
value a ``ValueError`` naming the argument and its valid values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from advcli.errors import UsageError
from advcli.settings.config import (
    DEFAULT_GROUPS,
    AdvantageConfig,
    AnchorScope,
    Estimator,
    GigpoNorm,
    Level,
    PerTurn,
    RewardMode,
    Scale,
    Singleton,
    StepGroups,
    TrajScore,
)
from advcli.settings.recipes import PER_TURN_RECIPES, PerTurnRecipe, Recipe, gigpo_settings

SettingT = TypeVar("SettingT", bound=Enum)
# The command line's --epsilon default.
DEFAULT_EPSILON = AdvantageConfig().epsilon


@dataclass(frozen=True)
class GigpoArguments:
    """The step term's arguments as given (None: not given)."""

    gamma: float | None
    step_weight: float | None
    norm: str | None
    scope: str | None
    recipe: str | None

    def given(self) -> list[str]:
        names = ("gamma", "step_weight", "gigpo_norm", "anchor_scope", "recipe")
        values = (self.gamma, self.step_weight, self.norm, self.scope, self.recipe)
        return [name for name, value in zip(names, values, strict=True) if value is not None]


@dataclass(frozen=True)
class PerTurnArguments:
    """``reward_mode`` and ``step_groups`` as given (None: not given)."""

    reward_mode: str | None
    step_groups: str | None


def settings_of(
    estimator: str | None,
    level: str | None,
    scale: str | None,
    singleton: str | None,
    traj_score: str | None,
    epsilon: float | None,
    gigpo: GigpoArguments,
    per_turn: PerTurnArguments,
) -> AdvantageConfig:
    """The settings checked by the command line's own :class:`AdvantageConfig`; gigpo's from
    its recipe and the arguments given beside it, as ``--recipe`` and the options (each given
    one wins); per-turn rewards' from ``gamma``, ``anchor_scope`` and a per-turn recipe
    (:func:`per_turn_of`; its estimator, ε and singleton rule unless given). ``estimator``
    None: the per-turn recipe's, else grpo."""
    recipe = choice(Recipe, "recipe", gigpo.recipe) if gigpo.recipe is not None else None
    turn_recipe = PER_TURN_RECIPES.get(recipe) if recipe is not None else None
    chosen = choice(Estimator, "estimator", estimator) if estimator is not None else None
    level_of = choice(Level, "level", level) if level is not None else None
    singleton_of = choice(Singleton, "singleton", singleton) if singleton is not None else None
    if turn_recipe is not None:
        chosen = chosen or turn_recipe.estimator
        epsilon = turn_recipe.epsilon if epsilon is None else epsilon
        singleton_of = singleton_of or turn_recipe.singleton
    chosen = chosen or Estimator.GRPO
    step = None
    try:
        per_turn_settings = per_turn_of(per_turn, gigpo, turn_recipe)
        if per_turn_settings is not None:
            level_of = level_of or Level.TURN
        elif chosen is Estimator.GIGPO:
            level_of, step, epsilon, singleton_of = gigpo_settings(
                recipe,
                level=level_of,
                epsilon=epsilon,
                gamma=gigpo.gamma,
                weight=gigpo.step_weight,
                norm=choice(GigpoNorm, "gigpo_norm", gigpo.norm) if gigpo.norm else None,
                scope=choice(AnchorScope, "anchor_scope", gigpo.scope) if gigpo.scope else None,
                singleton=singleton_of,
            )
        elif gigpo.given():
            raise ValueError(f"{', '.join(gigpo.given())} apply to gigpo, not to {chosen.value}")
        return AdvantageConfig(
            level=level_of or Level.TRAJECTORY,
            estimator=chosen,
            epsilon=DEFAULT_EPSILON if epsilon is None else epsilon,
            traj_score=(
                choice(TrajScore, "traj_score", traj_score) if traj_score is not None else None
            ),
            scale=choice(Scale, "scale", scale) if scale is not None else None,
            singleton=singleton_of or Singleton.RAW,
            step=step,
            per_turn=per_turn_settings,
        )
    except UsageError as error:
        raise ValueError(str(error)) from None


def per_turn_of(
    per_turn: PerTurnArguments, gigpo: GigpoArguments, recipe: PerTurnRecipe | None
) -> PerTurn | None:
    """The per-turn settings under ``reward_mode="per-turn"``, which a per-turn ``recipe``
    implies (``gamma`` default 1, ``step_groups`` default the recipe's, else ``turn-padded``,
    ``anchor_scope`` default ``group``, the recipe's divisor), as the command line makes
    them; None under outcome rewards, where ``step_groups`` is refused."""
    default = RewardMode.PER_TURN if recipe is not None else RewardMode.OUTCOME
    mode = choice(RewardMode, "reward_mode", per_turn.reward_mode or default)
    if mode is RewardMode.OUTCOME:
        if recipe is not None:
            raise ValueError("a per-turn recipe implies reward_mode='per-turn', not 'outcome'")
        if per_turn.step_groups is not None:
            raise ValueError("step_groups applies to reward_mode='per-turn'")
        return None
    own = {"gamma", "anchor_scope", *(("recipe",) if recipe is not None else ())}
    gigpo_only = [name for name in gigpo.given() if name not in own]
    if gigpo_only:
        raise ValueError(f"{', '.join(gigpo_only)} apply to gigpo, not to reward_mode='per-turn'")
    groups = per_turn.step_groups or (recipe.groups if recipe is not None else DEFAULT_GROUPS)
    return PerTurn(
        gamma=1.0 if gigpo.gamma is None else gigpo.gamma,
        groups=choice(StepGroups, "step_groups", groups),
        scope=choice(AnchorScope, "anchor_scope", gigpo.scope or AnchorScope.GROUP),
        variance_epsilon=recipe.variance_epsilon if recipe is not None else None,
    )


def choice(kind: type[SettingT], argument: str, value: object) -> SettingT:
    """``value`` as a member of the setting ``kind`` (its value or the member itself)."""
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(repr(member.value) for member in kind)
        raise ValueError(f"{argument}={value!r} is not one of {valid}") from None

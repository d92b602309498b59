"""The one resolver from the settings as given to the :class:`AdvantageConfig` that decides the
numbers (:func:`resolve_config`).

What is given reaches it in one form, :class:`GivenSettings`, from every face: the command
line's options (typed, or saved in ``advcli.toml``), :func:`advcli.torch.compute_advantage`'s
keywords, and :func:`advcli.verl.compute_advantage`'s once verl's words are translated to them.

One precedence: a setting given wins; else the recipe's (``recipe`` sets a peer's rule, and a
gigpo recipe names its estimator); else the estimator's or the reward mode's default (gigpo's
step term, per-turn rewards' turn level); else :class:`AdvantageConfig`'s. One error type,
:class:`advcli.errors.SettingsError`: the command line exits 2 on it, and a library caller
catches it as a ``ValueError``. Its messages name each setting in the caller's words
(:class:`Spelling`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict, TypeVar

from advcli.errors import SettingsError
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    Estimator,
    GigpoNorm,
    Level,
    PerTurn,
    RewardMode,
    Scale,
    Singleton,
    StdDenominator,
    StepGroups,
    TrajScore,
)
from advcli.settings.recipes import (
    OUTCOME_RECIPES,
    PER_TURN_RECIPES,
    OutcomeRecipe,
    PerTurnRecipe,
    Recipe,
    gigpo_settings,
    recipe_sets,
)
from advcli.settings.rules import RULES

SettingT = TypeVar("SettingT", bound=Enum)

# The settings nobody gave: the defaults every face shares (the options' too).
DEFAULTS = AdvantageConfig()


class GivenSettings(TypedDict, total=False):
    """The settings as given, by their keyword names (the options' without dashes); a setting
    absent or None was not given. A choice is its member or its value (``"turn"``)."""

    estimator: Estimator | str | None
    level: Level | str | None
    scale: Scale | str | None
    singleton: Singleton | str | None
    traj_score: TrajScore | str | None
    epsilon: float | None
    recipe: Recipe | str | None
    reward_mode: RewardMode | str | None
    step_groups: StepGroups | str | None
    gamma: float | None
    step_weight: float | None
    gigpo_norm: GigpoNorm | str | None
    anchor_scope: AnchorScope | str | None
    std: StdDenominator | str | None


SETTING_NAMES: tuple[str, ...] = tuple(GivenSettings.__annotations__)
# The step term's settings, which only gigpo reads; per-turn rewards read gamma and
# anchor_scope too (and a per-turn recipe).
STEP_SETTINGS = ("recipe", "gamma", "step_weight", "gigpo_norm", "anchor_scope")
PER_TURN_SHARED = ("gamma", "anchor_scope")


@dataclass(frozen=True)
class Spelling:
    """How a message names a setting: as an option (``--reward-mode per-turn``) or as a keyword
    (``reward_mode='per-turn'``)."""

    options: bool

    def name(self, setting: str) -> str:
        return "--" + setting.replace("_", "-") if self.options else setting

    def given(self, setting: str, value: object) -> str:
        value = getattr(value, "value", value)
        return f"{self.name(setting)} {value}" if self.options else f"{setting}={value!r}"


OPTION_WORDS = Spelling(options=True)
KEYWORD_WORDS = Spelling(options=False)


def resolve_config(
    given: GivenSettings | Mapping[str, Any], words: Spelling = KEYWORD_WORDS
) -> AdvantageConfig:
    """The :class:`AdvantageConfig` of the settings ``given``, by the module's precedence.

    Parameters
    ----------
    given
        The settings as given (:class:`GivenSettings`); a key that is not a setting is a
        ``TypeError``.
    words
        How the error messages name the settings: :data:`OPTION_WORDS` (the command line) or
        :data:`KEYWORD_WORDS` (the library).

    Raises
    ------
    SettingsError
        A value that is not one of its setting's, or settings that do not fit together.

    Examples
    --------
    >>> resolve_config({"recipe": "roll"}).estimator.value
    'gigpo'
    >>> resolve_config({"recipe": "lightrft"}).level.value
    'turn'
    >>> resolve_config({"estimator": "rloo", "step_weight": 0.5}, OPTION_WORDS)
    Traceback (most recent call last):
    ...
    advcli.errors.SettingsError: --step-weight applies to gigpo, not to rloo
    """
    unknown = [name for name in given if name not in SETTING_NAMES]
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not a setting; the settings are {SETTING_NAMES}")
    reader = _Reader(given, words)
    recipe = reader.member(Recipe, "recipe")
    turn_recipe = PER_TURN_RECIPES.get(recipe) if recipe is not None else None
    std = reader.member(StdDenominator, "std")
    estimator = reader.member(Estimator, "estimator")
    level = reader.member(Level, "level")
    singleton = reader.member(Singleton, "singleton")
    epsilon = given.get("epsilon")
    if turn_recipe is not None:
        estimator = estimator or turn_recipe.estimator
        epsilon = turn_recipe.epsilon if epsilon is None else epsilon
        singleton = singleton or turn_recipe.singleton
    elif recipe in OUTCOME_RECIPES:
        outcome = OUTCOME_RECIPES[recipe]
        _check_outcome_recipe(reader, recipe, outcome, estimator)
        estimator = estimator or outcome.estimators[0]
        level = level or outcome.level
        singleton = singleton or outcome.singleton
        if RULES[estimator].divides and reader.member(Scale, "scale") is not Scale.NONE:
            std = std or outcome.std
            epsilon = outcome.epsilon if epsilon is None else epsilon
        recipe = None
    elif recipe is not None:
        estimator = estimator or Estimator.GIGPO
    estimator = estimator or DEFAULTS.estimator
    per_turn = _per_turn(reader, turn_recipe)
    step = None
    if per_turn is not None:
        gigpo_only = [name for name in STEP_SETTINGS if name not in PER_TURN_SHARED]
        if turn_recipe is not None:
            gigpo_only.remove("recipe")
        reader.refuse(gigpo_only, words.given("reward_mode", RewardMode.PER_TURN))
        level = level or Level.TURN
    elif estimator is Estimator.GIGPO:
        level, step, epsilon, singleton = gigpo_settings(
            recipe,
            level=level,
            epsilon=epsilon,
            gamma=given.get("gamma"),
            weight=given.get("step_weight"),
            norm=reader.member(GigpoNorm, "gigpo_norm"),
            scope=reader.member(AnchorScope, "anchor_scope"),
            singleton=singleton,
        )
    else:
        # An outcome recipe (``recipe`` None by now) is the estimator's own.
        refused = [name for name in STEP_SETTINGS if name != "recipe" or recipe is not None]
        reader.refuse(refused, estimator.value)
    return AdvantageConfig(
        level=level or DEFAULTS.level,
        estimator=estimator,
        epsilon=DEFAULTS.epsilon if epsilon is None else epsilon,
        traj_score=reader.member(TrajScore, "traj_score"),
        scale=reader.member(Scale, "scale"),
        singleton=singleton or DEFAULTS.singleton,
        step=step,
        per_turn=per_turn,
        std=std,
    )


def _check_outcome_recipe(
    reader: _Reader, recipe: Recipe, outcome: OutcomeRecipe, estimator: Estimator | None
) -> None:
    """Refuse beside an outcome ``recipe`` what the peer has no rule for: another estimator,
    per-turn rewards, the batch scale."""
    words = reader.words
    named = words.given("recipe", recipe)
    has = ", ".join(e.value for e in outcome.estimators)
    if estimator is not None and estimator not in outcome.estimators:
        raise SettingsError(
            f"{named} is an outcome-reward rule of {has}, not of "
            f"{words.given('estimator', estimator)}"
        )
    if reader.member(RewardMode, "reward_mode") is RewardMode.PER_TURN:
        raise SettingsError(
            f"{named} is an outcome-reward rule, not one of "
            f"{words.given('reward_mode', RewardMode.PER_TURN)}"
        )
    if reader.member(Scale, "scale") is Scale.BATCH and not outcome.batch_scale:
        raise SettingsError(
            f"{named} has no rule of {words.given('scale', Scale.BATCH)}: it divides each group "
            "by its own std or by none"
        )


def _per_turn(reader: _Reader, recipe: PerTurnRecipe | None) -> PerTurn | None:
    """The per-turn settings under per-turn rewards (which a per-turn ``recipe`` implies), None
    under outcome rewards, where ``step_groups`` is refused."""
    words = reader.words
    mode = reader.member(RewardMode, "reward_mode")
    groups = reader.member(StepGroups, "step_groups")
    per_turn = words.given("reward_mode", RewardMode.PER_TURN)
    if recipe is not None and mode is RewardMode.OUTCOME:
        raise SettingsError(
            f"{words.given('recipe', reader.given['recipe'])} implies {per_turn}, not "
            f"{words.given('reward_mode', RewardMode.OUTCOME)}"
        )
    if recipe is None and mode in (None, RewardMode.OUTCOME):
        if groups is not None:
            raise SettingsError(f"{words.name('step_groups')} applies to {per_turn}")
        return None
    gamma = reader.given.get("gamma")
    default = PerTurn()
    return PerTurn(
        gamma=default.gamma if gamma is None else gamma,
        groups=groups or (recipe.groups if recipe is not None else default.groups),
        scope=reader.member(AnchorScope, "anchor_scope") or default.scope,
        variance_epsilon=recipe.variance_epsilon if recipe is not None else None,
    )


@dataclass(frozen=True)
class _Reader:
    """The settings given, read as their types, and the messages that name them."""

    given: Mapping[str, Any]
    words: Spelling

    def member(self, kind: type[SettingT], setting: str) -> SettingT | None:
        """The setting's member of ``kind``, None where it was not given."""
        value = self.given.get(setting)
        if value is None:
            return None
        try:
            return kind(value)
        except ValueError:
            valid = ", ".join(repr(member.value) for member in kind)
            raise SettingsError(
                f"{self.words.given(setting, value)} is not one of {valid}"
            ) from None

    def refuse(self, settings: list[str], reader: str) -> None:
        """Refuse the ``settings`` given, which apply to gigpo and not to ``reader`` (an
        estimator, or per-turn rewards); gamma and anchor_scope, if given, are said to be
        per-turn rewards' too."""
        given = [name for name in settings if self.given.get(name) is not None]
        if not given:
            return
        message = gigpo_only([self._named(name) for name in given], reader)
        shared = [self._named(name) for name in given if name in PER_TURN_SHARED]
        if shared:
            per_turn = self.words.given("reward_mode", RewardMode.PER_TURN)
            message += f" ({_apply(shared)} to {per_turn} too)"
        raise SettingsError(message)

    def _named(self, setting: str) -> str:
        """A setting's name in the caller's words; a recipe's with its name (``--recipe roll``)."""
        if setting == "recipe":
            return self.words.given(setting, self.given[setting])
        return self.words.name(setting)


def gigpo_only(names: Sequence[str], reader: str) -> str:
    """The message for settings or inputs (``names``, in the caller's words) that apply to gigpo
    and were given to ``reader``: ``--gamma applies to gigpo, not to rloo``."""
    return f"{_apply(names)} to gigpo, not to {reader}"


def _apply(names: Sequence[str]) -> str:
    """``a applies``, ``a and b apply``, ``a, b and c apply``."""
    if len(names) == 1:
        return f"{names[0]} applies"
    return f"{', '.join(names[:-1])} and {names[-1]} apply"


@dataclass(frozen=True)
class ExpectedRule:
    """The rule a user believes the trainer ran (``audit --expect``): its config, and the
    settings the user stated (by keyword name), the only ones held against the rule found."""

    config: AdvantageConfig
    stated: tuple[str, ...]


# The settings --expect takes: a rule's (GiGPO's step term's among them), and a recipe that
# sets them.
EXPECTABLE = (
    "level",
    "estimator",
    "scale",
    "singleton",
    "epsilon",
    "std",
    "gamma",
    "step_weight",
    "gigpo_norm",
    "anchor_scope",
    "recipe",
)
# The --expect keys that take a number.
_NUMBERS = ("epsilon", "gamma", "step_weight")


def expected_rule(text: str) -> ExpectedRule:
    """``--expect``'s rule from ``key=value`` pairs separated by commas, the keys those of
    :data:`EXPECTABLE` (``estimator=grpo,level=turn``; ``recipe=rllm`` states what the recipe
    sets). A key given twice, another key or a value that is not its setting's is a
    :class:`SettingsError` naming it.

    Examples
    --------
    >>> rule = expected_rule("recipe=rllm,level=turn")
    >>> rule.config.level.value, rule.config.std_ddof, rule.stated
    ('turn', 0, ('level', 'estimator', 'std', 'epsilon', 'singleton'))
    """
    given: dict[str, Any] = {}
    for pair in text.split(","):
        key, equals, value = pair.strip().partition("=")
        key = key.strip().replace("-", "_")
        if not equals or key not in EXPECTABLE:
            raise SettingsError(
                f"--expect takes key=value pairs separated by commas, the keys "
                f"{', '.join(EXPECTABLE)}; not '{pair.strip()}'"
            )
        if key in given:
            raise SettingsError(f"--expect gives '{key}' twice")
        if key in _NUMBERS and not _is_number(value):
            raise SettingsError(f"--expect {key}={value.strip()}: not a number")
        given[key] = float(value) if key in _NUMBERS else value.strip()
    config = resolve_config(given, OPTION_WORDS)
    if config.per_turn is not None:
        raise SettingsError(
            f"--expect: audit's rules are the outcome estimators' and GiGPO's, not "
            f"{config.describe()}"
        )
    recipe = given.get("recipe")
    set_by_recipe = recipe_sets(Recipe(recipe)) if recipe is not None else ()
    stated = tuple(
        dict.fromkeys(name for name in (*given, *set_by_recipe) if name in EXPECTABLE[:-1])
    )
    return ExpectedRule(config, stated)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

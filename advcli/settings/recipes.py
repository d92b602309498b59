"""Peers' rules as one option (``--recipe``): each peer's GiGPO (:data:`RECIPES`) and its
per-turn rewards (:data:`PER_TURN_RECIPES`), and the settings a recipe and the options given
beside it make (:func:`gigpo_settings`).

Kept free of Polars, as :mod:`advcli.settings.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from advcli.errors import SettingsError
from advcli.settings.config import (
    AnchorScope,
    Estimator,
    GigpoNorm,
    Level,
    Singleton,
    StdDenominator,
    StepGroups,
    StepTerm,
)
from advcli.settings.rules import LIGHTRFT_VARIANCE_EPSILON, ROLL_MIN_STD


class Recipe(str, Enum):
    """A peer's rule as one option: its GiGPO (:data:`RECIPES` says what each sets) or its
    per-turn rewards (:data:`PER_TURN_RECIPES`)."""

    VERL_AGENT = "verl-agent"
    VERL_AGENT_TRAJECTORY = "verl-agent-trajectory"
    TRINITY = "trinity"
    ROLL = "roll"
    LIGHTRFT = "lightrft"
    RLLM = "rllm"
    PRIME_RL = "prime-rl"
    OPEN_INSTRUCT = "open-instruct"
    TRL = "trl"
    NEMO_RL = "nemo-rl"


@dataclass(frozen=True)
class RecipeSettings:
    """What a recipe sets; an option given beside it wins. ``mean_epsilon``: the ε under
    ``--gigpo-norm mean`` (verl-agent's mean_norm subtracts only), None for ``--epsilon``'s;
    ``singleton``: what a lone episode group gets, None for ``--singleton``'s."""

    level: Level
    step: StepTerm
    mean_epsilon: float | None = None
    singleton: Singleton | None = None

    def describe(self) -> str:
        """What the recipe sets, as the options that would: ``--level turn --gamma 1 ...``."""
        step = self.step
        words = [
            f"--level {self.level.value}",
            f"--gigpo-norm {step.norm.value}",
            f"--gamma {step.gamma:g}",
            f"--anchor-scope {step.scope.value}",
        ]
        if self.mean_epsilon is not None:
            words.append(f"--epsilon {self.mean_epsilon:g} under mean")
        if step.own_row_scores:
            words.append("each row centred on its own score")
        if step.episode_from_steps:
            words.append("episode score the sum of step rewards")
        if step.min_std is not None:
            words.append(f"groups of std <= {step.min_std:g} get 0 under mean_std")
        if self.singleton is not None:
            words.append(f"--singleton {self.singleton.value}")
        return " ".join(words[:4]) + "".join(f", {word}" for word in words[4:])


# Each peer's GiGPO as its released code computes it (the docs' estimators page names the
# source files).
RECIPES: dict[Recipe, RecipeSettings] = {
    # Every row in its group's episode statistics; the yaml's mean_norm and γ 1.
    Recipe.VERL_AGENT: RecipeSettings(Level.TURN, StepTerm(), mean_epsilon=0.0),
    # compute_mean_std_cross_steps=False: one row per trajectory in the statistics.
    Recipe.VERL_AGENT_TRAJECTORY: RecipeSettings(
        Level.TRAJECTORY, StepTerm(own_row_scores=True), mean_epsilon=0.0
    ),
    # Each run once, R(τ) = Σ step rewards, anchors batch-wide, fnorm none.
    Recipe.TRINITY: RecipeSettings(
        Level.TRAJECTORY, StepTerm(scope=AnchorScope.BATCH, episode_from_steps=True)
    ),
    # Every row's episode score, step_reward_gamma 0.95, batch-wide step groups; one
    # normalization (agentic_reward_norm) for both terms: under mean_std a group of one or of
    # σ ≤ 1e-6 gets 0, under mean x − μ with no ε (a group of one 0 too).
    Recipe.ROLL: RecipeSettings(
        Level.TURN,
        StepTerm(
            gamma=0.95,
            norm=GigpoNorm.MEAN_STD,
            scope=AnchorScope.BATCH,
            min_std=ROLL_MIN_STD,
        ),
        mean_epsilon=0.0,
        singleton=Singleton.ZERO,
    ),
}


@dataclass(frozen=True)
class PerTurnRecipe:
    """What a per-turn recipe sets (it implies ``--reward-mode per-turn``); an option given
    beside it wins."""

    estimator: Estimator
    groups: StepGroups
    epsilon: float
    singleton: Singleton
    variance_epsilon: float | None = None

    def describe(self) -> str:
        words = [
            "--reward-mode per-turn",
            f"--step-groups {self.groups.value}",
            f"--estimator {self.estimator.value}",
            f"--epsilon {self.epsilon:g}",
            f"--singleton {self.singleton.value}",
        ]
        if self.variance_epsilon is not None:
            words.append(f"std sqrt(population variance + {self.variance_epsilon:g})")
        return " ".join(words[:5]) + "".join(f", {word}" for word in words[5:])


# Each peer's per-turn rewards as its released code computes them (docs/per-turn-rewards.md
# names the source files).
PER_TURN_RECIPES: dict[Recipe, PerTurnRecipe] = {
    # per_step_reward_mode=group_norm: each index's rewards among the group's trajectories that
    # reach it, (r − mean) / sqrt(population variance + 1e-9), then summed to the end; a lone
    # member at an index is its own mean (0).
    Recipe.LIGHTRFT: PerTurnRecipe(
        Estimator.GRPO,
        StepGroups.TURN_REWARDS,
        epsilon=0.0,
        singleton=Singleton.ZERO,
        variance_epsilon=LIGHTRFT_VARIANCE_EPSILON,
    ),
}


@dataclass(frozen=True)
class OutcomeRecipe:
    """A peer's outcome-reward rule: its level, the estimators it has (advcli's names; the
    first is the recipe's), and where its estimator divides by a std, that std's denominator
    and ε (None: advcli's); what a group of one unit gets; whether it has ``--scale batch``."""

    level: Level
    estimators: tuple[Estimator, ...]
    std: StdDenominator | None = None
    epsilon: float | None = None
    singleton: Singleton = Singleton.RAW
    batch_scale: bool = False

    def describe(self) -> str:
        words = [f"--level {self.level.value}", f"--estimator {self.estimators[0].value}"]
        words.append(f"--singleton {self.singleton.value}")
        divided = [
            *([f"--std {self.std.value}"] if self.std is not None else []),
            *([f"--epsilon {self.epsilon:g}"] if self.epsilon is not None else []),
        ]
        if divided:
            words.append(f"{' '.join(divided)} where it divides by a std")
        others = ", ".join(e.value for e in self.estimators[1:])
        return " ".join(words) + (f" (also --estimator {others})" if others else "")


# Each peer's outcome-reward rule where advcli's defaults are not it, as its released code
# computes it (the docs' estimators page names the source files).
OUTCOME_RECIPES: dict[Recipe, OutcomeRecipe] = {
    # rllm/trainer/algorithms/rl_algo.py: np.std (ddof 0) + 1e-6 over each group's trajectory
    # rewards (a group: a task's trajectories of one name), a group of one mean 0 and std 1;
    # norm_adv_by_std_in_grpo false: the rewards less the mean; rloo n / (n - 1) (r - mean).
    Recipe.RLLM: OutcomeRecipe(
        Level.TRAJECTORY,
        (Estimator.GRPO, Estimator.DRGRPO, Estimator.RLOO),
        std=StdDenominator.POPULATION,
    ),
    # src/prime_rl/orchestrator/algo/grpo.py, GRPOAlgorithm.score_group: each trainable trace's
    # reward less its group's mean, no std (a group of one: 0); length_penalty unset.
    Recipe.PRIME_RL: OutcomeRecipe(Level.TRAJECTORY, (Estimator.DRGRPO,), singleton=Singleton.ZERO),
    # open_instruct/data_loader.py: advantage_normalization_type "centered" (the default),
    # scores less the group's mean; "standard", (scores - mean) / (np.std + 1e-8). A group of
    # one gets 0 in both.
    Recipe.OPEN_INSTRUCT: OutcomeRecipe(
        Level.TRAJECTORY,
        (Estimator.DRGRPO, Estimator.GRPO),
        std=StdDenominator.POPULATION,
        epsilon=1e-8,
        singleton=Singleton.ZERO,
    ),
    # trl/trainer/grpo_trainer.py (f2cd577, l.2676-2730): each block of num_generations rows,
    # (r - mean) / (std + 1e-4), its nanstd's Bessel std; scale_rewards "batch" and "none" are
    # --scale's. A completion no reward function scored is left out of its block's nanmean
    # and nanstd (a dump's left-out rows), and a block of one scored completion has no std
    # (NaN, which nan_to_num makes 0; under "none" r - r): a singleton gets 0.
    Recipe.TRL: OutcomeRecipe(
        Level.TRAJECTORY,
        (Estimator.GRPO,),
        epsilon=1e-4,
        batch_scale=True,
        singleton=Singleton.ZERO,
    ),
    # nemo_rl/algorithms/advantage_estimator.py, GRPOAdvantageEstimator, over
    # calculate_baseline_and_std_per_prompt (nemo_rl/algorithms/utils.py): the leave-one-out
    # mean and the other samples' Bessel std, + 1e-6 only where that std is above 0
    # (use_leave_one_out_baseline and normalize_rewards true, the defaults); a prompt of one
    # valid sample gets 0 (its baseline is its reward). normalize_rewards false: rloo.
    Recipe.NEMO_RL: OutcomeRecipe(
        Level.TRAJECTORY,
        (Estimator.GRPO_LOO, Estimator.RLOO),
        epsilon=1e-6,
        singleton=Singleton.ZERO,
    ),
}


def recipe_sets(recipe: Recipe) -> tuple[str, ...]:
    """The settings (by keyword name) ``recipe`` sets: where the recipe is typed, a saved one
    gives way to it, as a saved option gives way to the same option typed. Every recipe sets
    the std, its own (a gigpo or per-turn recipe: the sample std, or LightRFT's)."""
    if recipe in OUTCOME_RECIPES:
        return ("level", "estimator", "std", "epsilon", "singleton")
    turn = PER_TURN_RECIPES.get(recipe)
    if turn is not None:
        return ("reward_mode", "step_groups", "estimator", "epsilon", "singleton", "std")
    base = RECIPES[recipe]
    return (
        "estimator",
        "level",
        "gamma",
        "gigpo_norm",
        "anchor_scope",
        *(("epsilon",) if base.mean_epsilon is not None else ()),
        *(("singleton",) if base.singleton is not None else ()),
        "std",
    )


def gigpo_settings(
    recipe: Recipe | None,
    *,
    level: Level | None = None,
    epsilon: float | None = None,
    gamma: float | None = None,
    weight: float | None = None,
    norm: GigpoNorm | None = None,
    scope: AnchorScope | None = None,
    singleton: Singleton | None = None,
) -> tuple[Level | None, StepTerm, float | None, Singleton | None]:
    """(level, step term, ε, singleton) from a recipe and the options given beside it (None:
    not given), each given option winning over the recipe's; without a recipe, the step term's
    defaults."""
    if recipe is not None and recipe not in RECIPES:
        raise SettingsError(
            f"--recipe {recipe.value} is a per-turn rewards recipe, not a gigpo one: it implies "
            "--reward-mode per-turn"
        )
    base = RECIPES[recipe] if recipe is not None else None
    step = base.step if base is not None else StepTerm()
    step = replace(
        step,
        gamma=step.gamma if gamma is None else gamma,
        weight=step.weight if weight is None else weight,
        norm=norm or step.norm,
        scope=scope or step.scope,
    )
    if base is not None:
        level = level if level is not None else base.level
        if epsilon is None and step.norm is GigpoNorm.MEAN and base.mean_epsilon is not None:
            epsilon = base.mean_epsilon
        singleton = singleton or base.singleton
    return level, step, epsilon, singleton

"""The settings that decide the numbers: level, estimator, scale, singleton rule, epsilon.

Kept free of Polars so that the command line can parse and check them (and set Polars' thread
count) before Polars is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from advcli.errors import SettingsError
from advcli.settings.rules import (
    DEFAULT_STEP_GROUPS,
    GAMMA_RANGE,
    PER_TURN_ESTIMATORS,
    POPULATION_DDOF,
    RULES,
    STD_DDOF,
    STEP_GROUPINGS,
    StepGrouping,
)

# Which of GiGPO's roles a reading looks for: none (False); the anchor and a step reward or
# return, each required (True); the same only when the dump has an anchor ("if_anchored",
# compare's); the anchor alone, when the dump has one ("anchor", inspect's); the anchor and a
# step reward or return where the dump has both ("if_complete", audit's: its GiGPO rules need
# both, and its outcome rules neither).
StepRoles = bool | Literal["if_anchored", "anchor", "if_complete"]


class Level(str, Enum):
    """Which unit counts once in its group's statistics: a trajectory, or every row (turn)."""

    TRAJECTORY = "trajectory"
    TURN = "turn"


class Estimator(str, Enum):
    """The advantage estimators, by their verl names where verl has them (grpo_loo: NeMo-RL's
    GRPO; the docs' estimators page has each rule)."""

    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GRPO_LOO = "grpo_loo"
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"
    GIGPO = "gigpo"


class Scale(str, Enum):
    """What grpo, grpo_passk and grpo_loo divide by (TRL's ``scale_rewards`` vocabulary)."""

    GROUP = "group"
    BATCH = "batch"
    NONE = "none"


class StdDenominator(str, Enum):
    """The std's denominator: n − 1 (``sample``: ddof 1, as torch.std and verl) or n
    (``population``: ddof 0, as np.std and rLLM)."""

    SAMPLE = "sample"
    POPULATION = "population"

    @property
    def ddof(self) -> int:
        return STD_DDOF if self is StdDenominator.SAMPLE else POPULATION_DDOF


class Singleton(str, Enum):
    """What a group with a single unit gets."""

    RAW = "raw"
    ZERO = "zero"


# Estimators that divide by a std, and so take --scale (GiGPO's divisor is --gigpo-norm's).
SCALED = tuple(
    estimator for estimator in Estimator if RULES[estimator].divides and not RULES[estimator].steps
)
# Estimators that read a dump's outcome scores alone (no anchor or step reward).
OUTCOME = tuple(estimator for estimator in Estimator if not RULES[estimator].steps)


class GigpoNorm(str, Enum):
    """GiGPO's normalization of both terms: ``mean``, (x − μ) / (1 + ε); ``mean_std``,
    (x − μ) / (σ + ε)."""

    MEAN = "mean"
    MEAN_STD = "mean_std"


class AnchorScope(str, Enum):
    """Where equal anchors form one step group: within a task group, or across the batch."""

    GROUP = "group"
    BATCH = "batch"


@dataclass(frozen=True)
class StepTerm:
    """GiGPO's step term and how its episode term departs from the estimators' shared rules.

    ``own_row_scores``: the episode term is verl-agent's own rule for rows that disagree by
    its invalid-action penalty, ``--traj-score own`` (which the config takes from it).
    ``episode_from_steps``: a trajectory's episode score is the sum of its step rewards
    (Trinity-RFT). ``min_std``: under ``mean_std``, a group
    whose std is at most this gets 0, an episode group as a step group (ROLL's normalization
    serves both terms; its ``mean`` divides by nothing and floors nothing); None: only equal
    values do.
    """

    gamma: float = 1.0
    weight: float = 1.0
    norm: GigpoNorm = GigpoNorm.MEAN
    scope: AnchorScope = AnchorScope.GROUP
    own_row_scores: bool = False
    episode_from_steps: bool = False
    min_std: float | None = None

    def __post_init__(self) -> None:
        low, high = GAMMA_RANGE
        if not low <= self.gamma <= high:
            raise SettingsError(f"--gamma must be in [{low:g}, {high:g}], got {self.gamma}")
        if not 0 <= self.weight < math.inf:
            raise SettingsError(f"--step-weight must be a finite number >= 0, got {self.weight}")

    def check_traj_score(self, rule: TrajScore) -> None:
        """Refuse a ``--traj-score`` rule the episode term's own rule would leave unread."""
        if self.own_row_scores and rule is not TrajScore.OWN:
            raise SettingsError(
                f"--traj-score {rule.value} does not apply to the verl-agent-trajectory rule: "
                "every row is centred on its own score (--traj-score own)"
            )
        if self.episode_from_steps and rule is not TrajScore.SUM:
            raise SettingsError(
                f"--traj-score {rule.value} does not apply to Trinity-RFT's episode score, "
                "the sum of a trajectory's step rewards"
            )

    @property
    def std_floor(self) -> float | None:
        """The std at or below which a group (episode or step) gets 0, None for none."""
        return self.min_std if self.norm is GigpoNorm.MEAN_STD else None

    def describe(self) -> str:
        return (
            f"norm {self.norm.value}, gamma {self.gamma:g}, step weight {self.weight:g}, "
            f"anchor scope {self.scope.value}"
        )


class RewardMode(str, Enum):
    """What a row's reward is: the trajectory's outcome (every row carries it), or its own turn's
    (each row's score is then its reward-to-go)."""

    OUTCOME = "outcome"
    PER_TURN = "per-turn"


class StepGroups(str, Enum):
    """Per-turn rewards: which rows share a step group (``advcli.rules.STEP_GROUPINGS``)."""

    TURN = "turn"
    TURN_PADDED = "turn-padded"
    POOLED = "pooled"
    ANCHOR = "anchor"
    TURN_REWARDS = "turn-rewards"


DEFAULT_GROUPS = StepGroups(DEFAULT_STEP_GROUPS)


@dataclass(frozen=True)
class PerTurn:
    """Per-turn rewards: each row's score is its reward-to-go ``G_t = r_t + γ G_{t+1}``,
    normalized within its step group (``groups``; ``scope``: where equal anchors meet, for
    ``anchor``)."""

    gamma: float = 1.0
    groups: StepGroups = DEFAULT_GROUPS
    scope: AnchorScope = AnchorScope.GROUP
    # turn-rewards under grpo as LightRFT divides: by sqrt(population variance + this), nothing
    # added to the std; None: the estimator's own divisor.
    variance_epsilon: float | None = None

    def __post_init__(self) -> None:
        low, high = GAMMA_RANGE
        if not low <= self.gamma <= high:
            raise SettingsError(f"--gamma must be in [{low:g}, {high:g}], got {self.gamma}")
        if self.scope is not AnchorScope.GROUP and self.groups is not StepGroups.ANCHOR:
            raise SettingsError(
                f"--anchor-scope applies to --step-groups anchor, not to {self.groups.value}"
            )
        if self.variance_epsilon is not None and self.groups is not StepGroups.TURN_REWARDS:
            raise SettingsError(
                f"--recipe lightrft normalizes per-index rewards (--step-groups turn-rewards), "
                f"not {self.groups.value}"
            )

    @property
    def grouping(self) -> StepGrouping:
        return STEP_GROUPINGS[self.groups.value]

    def describe(self) -> str:
        scope = f", anchor scope {self.scope.value}" if self.grouping.anchors else ""
        divisor = (
            ""
            if self.variance_epsilon is None
            else f", std sqrt(population variance + {self.variance_epsilon:g})"
        )
        return (
            f"per-turn rewards, step groups {self.groups.value}, gamma {self.gamma:g}"
            f"{scope}{divisor}"
        )


class TrajScore(str, Enum):
    """How a trajectory's score is made from its rows' scores when they differ. ``own``:
    verl-agent's rule (its estimators with ``compute_mean_std_cross_steps=False``): each
    trajectory's first row (in row order) alone is in its group's statistics, and every row is
    centred on its own score; a group whose first rows tie is divided by SINGLETON_STD + ε,
    never by ε alone (a row that differs by a penalty would get −0.1 / ε). The estimators of a
    mean baseline only (:data:`OWN_SCORE_ESTIMATORS`)."""

    FIRST = "first"
    LAST = "last"
    MEAN = "mean"
    MAX = "max"
    SUM = "sum"
    OWN = "own"


# The estimators whose rule --traj-score own applies: a group mean centred on, a group std or
# nothing divided by, no post-step.
OWN_SCORE_ESTIMATORS = ("grpo", "drgrpo", "gigpo")


class LossMode(str, Enum):
    """How a trainer aggregates the policy loss over tokens and rows: verl's ``loss_agg_mode``
    values and agent-lightning's per-rollout mean (:mod:`advcli.advantages.loss` gives each
    weight)."""

    TOKEN_MEAN = "token-mean"
    TOKEN_SUM = "token-sum"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
    PER_ROLLOUT_MEAN = "per-rollout-mean"


class OutputFormat(str, Enum):
    """What ``compute`` writes: Parquet, an Arrow IPC file (``arrow``) or stream (``arrows``, what
    a pipe reader expects), or padded arrays (``npz``, ``pt``)."""

    PARQUET = "parquet"
    ARROW = "arrow"
    ARROWS = "arrows"
    NPZ = "npz"
    PT = "pt"


class OutputColumns(str, Enum):
    """Which columns ``compute`` writes: ``all`` (every input column, then the new ones), ``keys``
    (the group, trajectory and turn columns, then the new ones) or ``none`` (the new ones only:
    ``score``, ``advantage``, any ``loss_weight``, ``advantages``). Rows are in input order."""

    ALL = "all"
    KEYS = "keys"
    NONE = "none"


class Engine(str, Enum):
    """``local``: Polars on this machine; ``ray``: Ray Data."""

    LOCAL = "local"
    RAY = "ray"


class SampleTrainer(str, Enum):
    """Whose batch ``advcli sample`` writes: advcli's schema, or verl-agent's with GiGPO's
    columns (:mod:`advcli.write.sample`)."""

    ADVCLI = "advcli"
    VERL_AGENT = "verl-agent"


@dataclass(frozen=True)
class AdvantageConfig:
    """Everything that decides the numbers.

    Parameters
    ----------
    level
        ``trajectory``: each trajectory counts once in its group; ``turn``: every row counts.
    estimator
        One of :class:`Estimator`; the docs' estimators page gives each formula.
    epsilon
        Added to the std before dividing.
    traj_score
        Rule for a trajectory whose rows carry different scores; ``None`` makes that an error.
    scale
        For grpo, grpo_passk and grpo_loo: divide by the group std (default; grpo_loo: the
        other units'), the batch std, or nothing.
    singleton
        ``raw``: a single-unit group keeps its raw score (verl's rule); ``zero``: it gets 0.
    std
        The denominator of every std the estimator divides by (the group's, the batch's, a step
        group's): ``sample`` (n − 1, the default) or ``population`` (n); None for the default.
    """

    level: Level = Level.TRAJECTORY
    estimator: Estimator = Estimator.GRPO
    epsilon: float = 1e-6
    traj_score: TrajScore | None = None
    scale: Scale | None = None
    singleton: Singleton = Singleton.RAW
    # GiGPO's step term: set for gigpo (its defaults when not given), None for every other.
    step: StepTerm | None = None
    # Per-turn rewards: set under --reward-mode per-turn, None for outcome rewards.
    per_turn: PerTurn | None = None
    std: StdDenominator | None = None

    def __post_init__(self) -> None:
        if self.per_turn is not None:
            self._check_per_turn()
        if self.scale is not None and self.estimator not in SCALED:
            divisor = (
                " (its divisor is --gigpo-norm's)" if self.estimator is Estimator.GIGPO else ""
            )
            raise SettingsError(
                f"--scale applies to {', '.join(e.value for e in SCALED)}, not to "
                f"{self.estimator.value}{divisor}"
            )
        if not 0 <= self.epsilon < math.inf:
            raise SettingsError(f"epsilon must be a finite number >= 0, got {self.epsilon}")
        if RULES[self.estimator].steps and self.step is None:
            object.__setattr__(self, "step", StepTerm())
        if self.step is not None and not RULES[self.estimator].steps:
            raise SettingsError(
                "--gamma, --step-weight, --gigpo-norm, --anchor-scope and --recipe apply to "
                f"gigpo, not to {self.estimator.value}"
            )
        if self.step is not None and self.step.own_row_scores and self.traj_score is None:
            # The recipe's episode term is verl-agent's own rule, the one --traj-score own names.
            object.__setattr__(self, "traj_score", TrajScore.OWN)
        if self.step is not None and self.traj_score is not None:
            self.step.check_traj_score(self.traj_score)
        if self.traj_score is TrajScore.OWN:
            self._check_own_scores()
        if self.std is not None:
            object.__setattr__(self, "std", StdDenominator(self.std))
            self._check_std()

    @property
    def std_in_use(self) -> StdDenominator | None:
        """The denominator of the std the rule divides by; None where it divides by none (the
        reports' ``std``). LightRFT's recipe divides by its population std."""
        if self.per_turn is not None and self.per_turn.variance_epsilon is not None:
            return StdDenominator.POPULATION
        if self.step is not None and self.step.norm is GigpoNorm.MEAN:
            return None
        if not RULES[self.estimator].divides or self.effective_scale is Scale.NONE:
            return None
        return self.effective_std

    def _check_std(self) -> None:
        """``--std`` names the denominator of a std the rule divides by: refused where it
        divides by none."""
        if self.step is not None and self.step.norm is GigpoNorm.MEAN:
            raise SettingsError(
                "--std applies to gigpo under --gigpo-norm mean_std; under mean it divides by "
                "no std"
            )
        if not RULES[self.estimator].divides or self.effective_scale is Scale.NONE:
            scale = " at scale none" if RULES[self.estimator].divides else ""
            raise SettingsError(
                "--std applies where the rule divides by a std (grpo, grpo_passk, grpo_loo, "
                f"gigpo under --gigpo-norm mean_std); {self.estimator.value}{scale} divides by "
                "none"
            )
        if self.per_turn is not None and self.per_turn.variance_epsilon is not None:
            raise SettingsError(
                "--std does not apply to --recipe lightrft, whose std is its own: the square "
                "root of the population variance plus 1e-9"
            )

    @property
    def effective_std(self) -> StdDenominator:
        """The std's denominator in force: the one given, else ``sample``."""
        return self.std or StdDenominator.SAMPLE

    @property
    def std_ddof(self) -> int:
        """The std's delta degrees of freedom: 1 (sample, the default) or 0 (population)."""
        return self.effective_std.ddof

    def _check_own_scores(self) -> None:
        refusal = self._own_scores_refusal()
        if refusal is not None:
            raise SettingsError(refusal)

    def _own_scores_refusal(self) -> str | None:
        """Why ``--traj-score own`` does not apply, None where it does: it centres each row on
        its group's mean and divides by its group's std or by nothing, so it takes the
        estimators of OWN_SCORE_ESTIMATORS at their group scale."""
        if self.estimator.value not in OWN_SCORE_ESTIMATORS:
            return (
                f"--traj-score own takes --estimator {', '.join(OWN_SCORE_ESTIMATORS)} (a group "
                f"mean for a baseline), not {self.estimator.value}"
            )
        if self.effective_scale is Scale.BATCH:
            return "--traj-score own divides by each group's std: not --scale batch"
        return None

    @property
    def takes_trainer_score_rule(self) -> bool:
        """Whether a trainer's own ``--traj-score`` rule would apply to these settings as they
        are: no rule chosen, outcome rewards, and no step credit (whose episode term has rules
        of its own)."""
        return self.traj_score is None and self.per_turn is None and self.step is None

    @property
    def takes_own_scores(self) -> bool:
        """Whether ``--traj-score own`` would apply to these settings as they are: no rule
        chosen, outcome rewards, an estimator and scale it takes (and, for gigpo, not Trinity-RFT's
        episode score, the sum of the step rewards)."""
        return (
            self.traj_score is None
            and self.per_turn is None
            and not (self.step is not None and self.step.episode_from_steps)
            and self._own_scores_refusal() is None
        )

    def _check_per_turn(self) -> None:
        """Per-turn rewards take the estimators of PER_TURN_ESTIMATORS, at turn level (each row
        is a unit), each group's own std."""
        if self.estimator.value not in PER_TURN_ESTIMATORS:
            raise SettingsError(
                f"--reward-mode per-turn takes --estimator {', '.join(PER_TURN_ESTIMATORS)}, "
                f"not {self.estimator.value}"
            )
        if self.level is not Level.TURN:
            raise SettingsError(
                "--level does not apply under --reward-mode per-turn: each row is a unit "
                "(--level turn)"
            )
        if self.scale not in (None, Scale.GROUP):
            raise SettingsError("--reward-mode per-turn divides by each step group's std only")
        if self.traj_score is not None:
            raise SettingsError(
                "--traj-score does not apply under --reward-mode per-turn: each row keeps its "
                "own reward"
            )

    def describe(self) -> str:
        """E.g. ``grpo (scale group, singleton raw, epsilon 1e-06)``."""
        if self.per_turn is not None:
            return (
                f"{self.estimator.value} ({self.per_turn.describe()}, singleton "
                f"{self.singleton.value}, epsilon {self.epsilon:g}{self._std_words})"
            )
        if self.step is not None:
            return (
                f"{self.estimator.value} ({self.step.describe()}, singleton "
                f"{self.singleton.value}, epsilon {self.epsilon:g}{self._std_words})"
            )
        return (
            f"{self.estimator.value} (scale {self.effective_scale.value}, singleton "
            f"{self.singleton.value}, epsilon {self.epsilon:g}{self._std_words})"
        )

    @property
    def _std_words(self) -> str:
        """The std's denominator where it is not the default's, for :meth:`describe`."""
        return ", std population" if self.std is StdDenominator.POPULATION else ""

    @property
    def mask_needed_for(self) -> str | None:
        """Why the estimator needs each row's token count, if it does."""
        if RULES[self.estimator].counts_tokens:
            return f"{self.estimator.value} weighs rows by their tokens and needs one"
        return None

    def compare_step_roles(self) -> StepRoles:
        """What compare reads of GiGPO's roles: none for the other estimators; all of them
        where the episode term is made of the step rewards (Trinity-RFT's), else those of a dump
        with an anchor (without one the episode term is still reported); the anchors of a dump
        with them for per-turn rewards, whose report computes every grouping the dump has."""
        if self.per_turn is not None:
            return "anchor"
        if self.step is None:
            return False
        return True if self.step.episode_from_steps else "if_anchored"

    def compute_step_roles(self, report: bool = False) -> StepRoles:
        """What compute reads of GiGPO's roles: its anchors and step rewards for gigpo, the
        anchors for per-turn rewards' anchor step groups, and those of a dump with an anchor for
        the termination report (``report``), which computes every grouping the dump has."""
        if self.step is not None:
            return True
        if self.per_turn is not None and (report or self.per_turn.grouping.anchors):
            return "anchor"
        return False

    @property
    def effective_scale(self) -> Scale:
        """The scale in force: the one given, else ``group`` for the estimators that divide."""
        if self.estimator in SCALED:
            return self.scale or Scale.GROUP
        if self.step is not None:  # GiGPO divides by σ + ε or 1 + ε
            return Scale.GROUP
        return Scale.NONE


@dataclass(frozen=True)
class ColumnNames:
    """Column names chosen by the user; ``None`` means "use the default names"."""

    group: str | None = None
    trajectory: str | None = None
    turn: str | None = None
    reward: str | None = None
    mask: str | None = None
    # Groups as blocks of this many consecutive rows, for dumps with no group id (TRL, OpenRLHF).
    group_size: int | None = None
    # GiGPO's roles: the anchor state, and a step's reward or its already discounted return.
    anchor: str | None = None
    step_reward: str | None = None
    step_return: str | None = None
    # audit's: the column of the advantages the trainer computed (per token or per row).
    advantage: str | None = None
    # Where a role's name was given, when not by its option (a saved mapping's file and key).
    named_in: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 1:
            raise SettingsError(f"--group-size must be at least 1, got {self.group_size}")
        if self.step_reward is not None and self.step_return is not None:
            raise SettingsError(
                "--step-reward-col and --step-return-col exclude each other: give one"
            )

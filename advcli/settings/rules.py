"""The estimator rules: one table, read by every path that computes advantages.

Each estimator is four facts — what a unit's score is centred on (baseline), what it is divided by
(divisor), what a unit alone in its group gets (singleton), and what happens after the group rule
(post-step) — plus the rules every estimator shares. The Polars path
(:mod:`advcli.advantages.estimators`),
the tensor path (:mod:`advcli.torch`), the command line's option checks and the docs' estimator
table all state them from here. Pure data: no Polars, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Baseline(str, Enum):
    """What a unit's score is centred on, in a group of more than one unit."""

    MEAN = "the group's mean score"
    # RLOO: the mean of the other n − 1 units, which is n / (n − 1) · (s − mean) in closed form.
    LEAVE_ONE_OUT = "the mean of the group's other units"
    # OPO: Σ tokens·score / Σ tokens over the group's units (the mean when every score is equal).
    TOKEN_WEIGHTED_MEAN = "the group's token-weighted mean score"
    # pass@k: only the group's top unit (the first in input order on a tie) gets s_max − s_second;
    # every other unit gets 0.
    SECOND_BEST = "the group's second-highest score, for its top unit only"


@dataclass(frozen=True)
class EstimatorRule:
    """One estimator in four facts.

    ``divides``: the centred score is divided by a std plus ε: the group's (default), the batch's
    (``--scale batch``) or none (``--scale none``); only these estimators take ``--scale``.
    ``singleton_keeps_score``: under ``--singleton raw`` a unit alone in its group keeps its score
    (divided by 1 + ε when the estimator divides: mean 0 and std 1, verl's rule); otherwise 0.
    ``whitens``: the post-step, REINFORCE++'s whitening of every response token's value over the
    batch, (x − μ) / sqrt(σ² + 1e-8).
    """

    baseline: Baseline
    divides: bool
    singleton_keeps_score: bool
    whitens: bool
    # GiGPO: the rule above is the episode term's (its divisor the std under --gigpo-norm
    # mean_std, 1 under mean, never --scale), plus ω times the step term (STEP_* below).
    steps: bool = False
    # NeMo-RL's GRPO: at the group scale a unit is divided by the std of the group's *other*
    # units (OTHERS_STD below), not the group's.
    others_std: bool = False

    @property
    def counts_tokens(self) -> bool:
        """Whether the numbers depend on each row's response token count (its mask)."""
        return self.baseline is Baseline.TOKEN_WEIGHTED_MEAN or self.whitens


# Keyed by the estimator's name (``advcli.settings.Estimator`` members are those strings).
RULES: dict[str, EstimatorRule] = {
    "grpo": EstimatorRule(Baseline.MEAN, divides=True, singleton_keeps_score=True, whitens=False),
    "drgrpo": EstimatorRule(
        Baseline.MEAN, divides=False, singleton_keeps_score=True, whitens=False
    ),
    "rloo": EstimatorRule(
        Baseline.LEAVE_ONE_OUT, divides=False, singleton_keeps_score=True, whitens=False
    ),
    "opo": EstimatorRule(
        Baseline.TOKEN_WEIGHTED_MEAN, divides=False, singleton_keeps_score=True, whitens=False
    ),
    # No second score in a group of one: its unit gets 0.
    "grpo_passk": EstimatorRule(
        Baseline.SECOND_BEST, divides=True, singleton_keeps_score=False, whitens=False
    ),
    # NeMo-RL's default GRPO: the leave-one-out mean, and at the group scale the std of the
    # other units (OTHERS_STD).
    "grpo_loo": EstimatorRule(
        Baseline.LEAVE_ONE_OUT,
        divides=True,
        singleton_keeps_score=True,
        whitens=False,
        others_std=True,
    ),
    "reinforce_pp_baseline": EstimatorRule(
        Baseline.MEAN, divides=False, singleton_keeps_score=True, whitens=True
    ),
    "gigpo": EstimatorRule(
        Baseline.MEAN, divides=True, singleton_keeps_score=True, whitens=False, steps=True
    ),
}

# grpo_loo's divisor at the group scale: for a unit of a group of n units, the std (ddof as
# --std says: n − 2 the sample's denominator, n − 1 the population's) of the n − 1 *other*
# units' scores, which is 0 where they all carry one score (always so for n = 2). The centred
# score is divided by it plus ε only where it is above 0; where it is 0 the centred score is
# the advantage, undivided (NeMo-RL: "don't sharpen the ones with no variation").

# GiGPO's step term. Each row's step return R_t = r_t + γ R_{t+1} over its trajectory's rows in
# turn order (the turn column, else row order); rows with equal anchors (within a group, or
# batch-wide) form a step group, and A_step = (R − mean) / (F + ε), F the group's std
# (ddof=STD_DDOF) under mean_std, 1 under mean. A step group of one row gets STEP_SINGLETON (its
# mean is its own value: every peer's rule); a step group whose returns are all equal gets 0
# exactly; under ROLL's recipe with mean_std a group whose std is at most ROLL_MIN_STD gets 0
# too, in the episode term as in the step term (StepTerm.std_floor).
STEP_SINGLETON = 0.0
ROLL_MIN_STD = 1e-6
# γ is a discount: 0 ≤ γ ≤ 1 (γ = 0: R_t = r_t; γ = 1: the undiscounted sum to the end, added
# from the last step as the recurrence adds it). ω, the step term's weight, is ≥ 0.
GAMMA_RANGE = (0.0, 1.0)

# Per-turn rewards (--reward-mode per-turn): each row's reward is its own turn's, its score the
# reward-to-go G_t = r_t + γ G_{t+1} over its trajectory's rows in turn order (GiGPO's step
# return recurrence, γ in GAMMA_RANGE), and each row is a unit normalized within its step group
# by one of PER_TURN_ESTIMATORS' rules, singleton and zero-std rules included. The turn order is
# the turn column, whose indices in a trajectory must be consecutive (no gap, no repeat), else
# row order; a row's turn position counts from 0.
PER_TURN_ESTIMATORS = ("grpo", "drgrpo", "rloo")


@dataclass(frozen=True)
class StepGrouping:
    """Which rows of a group share a step group under per-turn rewards.

    ``by_position``: the rows at one turn position. ``padded``: every trajectory of the group is a
    member at every position, one with no row there counting G = 0 (a virtual member: the group
    size is the group's trajectory count, and only real rows get an advantage). ``anchors``: the
    rows of equal anchors (GiGPO's step groups, within the group or batch-wide).
    ``normalizes_rewards``: the estimator's rule is applied to the step group's *rewards*, and a
    row's advantage is the reward-to-go of those normalized rewards, Σ_{k≥t} γ^(k−t) z_k (the
    per-index construction verl RFC #7244 finds biased, LightRFT's group_norm).
    """

    by_position: bool
    padded: bool = False
    anchors: bool = False
    normalizes_rewards: bool = False


# Keyed by the --step-groups name (``advcli.settings.StepGroups`` members are those strings).
STEP_GROUPINGS: dict[str, StepGrouping] = {
    "turn": StepGrouping(by_position=True),
    "turn-padded": StepGrouping(by_position=True, padded=True),
    "pooled": StepGrouping(by_position=False),
    "anchor": StepGrouping(by_position=False, anchors=True),
    "turn-rewards": StepGrouping(by_position=True, normalizes_rewards=True),
}
# The default grouping: verl RFC #7244's fix, whose baseline at every position has the group's
# trajectory count of members, fixed before the turn whatever turn a trajectory stops at.
DEFAULT_STEP_GROUPS = "turn-padded"
# A padded member's reward-to-go.
PADDED_RETURN = 0.0
# LightRFT's per_step_reward_mode=group_norm (--recipe lightrft): each index's rewards divided by
# sqrt(population variance + LIGHTRFT_VARIANCE_EPSILON), nothing added to that std.
LIGHTRFT_VARIANCE_EPSILON = 1e-9

# Rules every estimator shares.
# The std is the unbiased sample std (Bessel's correction), as torch.std and verl; with --std
# population (np.std, rLLM) the population std, divided by n: every std the rule divides by, the
# group's, the batch's (--scale batch) and GiGPO's step groups'.
STD_DDOF = 1
POPULATION_DDOF = 0
# A group of one unit has mean 0 and std 1 (verl's rule), so its unit keeps its score.
SINGLETON_MEAN = 0.0
SINGLETON_STD = 1.0
# A group whose units all carry one score has that score exactly as its mean and std ZERO_STD,
# and its advantages are exactly 0 — a centred score of exactly 0 is never divided, also with
# ε = 0, where 0 / 0 would otherwise be NaN.
ZERO_STD = 0.0
# --scale batch divides every unit by the std (ddof=STD_DDOF) of every unit's score in the batch:
# a batch of one unit has std SINGLETON_STD (as a group of one), a batch whose units all carry one
# score ZERO_STD. A unit alone in its group is divided by the batch std too, or by SINGLETON_STD
# when the batch std is ZERO_STD (no other unit is divided then, each being exactly 0).
# Rows of one trajectory "carry the same score" when max − min ≤ 1e-6 · max(|max|, |min|).
SCORE_TOLERANCE = 1e-6
# Scores are float64, which holds every integer up to 2^53 and not all beyond: integer rewards
# past it are refused, never rounded.
EXACT_INTEGER_LIMIT = 2**53
# REINFORCE++ whitening: the constant added to the token variance (as verl's masked_whiten),
# over at least this many response tokens in the batch (the unbiased variance needs two).
WHITEN_EPSILON = 1e-8
WHITEN_MIN_TOKENS = 2
# The results are float32: a score or an advantage beyond the largest float32 is refused (naming
# its row), never written as inf.
FLOAT32_MAX = 3.4028234663852886e38

"""The settings that decide the numbers: level, estimator, scale, singleton rule, epsilon.

Kept free of Polars so that the command line can parse and check them (and set Polars' thread
count) before Polars is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from advcli.errors import UsageError
from advcli.rules import RULES


class Level(str, Enum):
    """Which unit counts once in its group's statistics: a trajectory, or every row (turn)."""

    TRAJECTORY = "trajectory"
    TURN = "turn"


class Estimator(str, Enum):
    """The advantage estimators, by their verl names (the docs' estimators page has each rule)."""

    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"


class Scale(str, Enum):
    """What grpo and grpo_passk divide by (TRL's ``scale_rewards`` vocabulary)."""

    GROUP = "group"
    BATCH = "batch"
    NONE = "none"


class Singleton(str, Enum):
    """What a group with a single unit gets."""

    RAW = "raw"
    ZERO = "zero"


# Estimators that divide by a std, and so take --scale.
SCALED = tuple(estimator for estimator in Estimator if RULES[estimator].divides)


class TrajScore(str, Enum):
    """How a trajectory's score is made from its rows' scores when they differ."""

    FIRST = "first"
    LAST = "last"
    MEAN = "mean"
    MAX = "max"
    SUM = "sum"


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


class Engine(str, Enum):
    """``local``: Polars on this machine; ``ray``: Ray Data."""

    LOCAL = "local"
    RAY = "ray"


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
        For grpo and grpo_passk: divide by the group std (default), the batch std, or nothing.
    singleton
        ``raw``: a single-unit group keeps its raw score (verl's rule); ``zero``: it gets 0.
    """

    level: Level = Level.TRAJECTORY
    estimator: Estimator = Estimator.GRPO
    epsilon: float = 1e-6
    traj_score: TrajScore | None = None
    scale: Scale | None = None
    singleton: Singleton = Singleton.RAW

    def __post_init__(self) -> None:
        if self.scale is not None and self.estimator not in SCALED:
            raise UsageError(
                f"--scale applies to grpo and grpo_passk, not to {self.estimator.value}"
            )
        if not 0 <= self.epsilon < math.inf:
            raise UsageError(f"epsilon must be a finite number >= 0, got {self.epsilon}")

    def describe(self) -> str:
        """E.g. ``grpo (scale group, singleton raw, epsilon 1e-06)``."""
        return (
            f"{self.estimator.value} (scale {self.effective_scale.value}, singleton "
            f"{self.singleton.value}, epsilon {self.epsilon:g})"
        )

    @property
    def effective_scale(self) -> Scale:
        """The scale in force: the one given, else ``group`` for the estimators that divide."""
        if self.estimator in SCALED:
            return self.scale or Scale.GROUP
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
    # Where a role's name was given, when not by its option (a saved mapping's file and key).
    named_in: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 1:
            raise UsageError(f"--group-size must be at least 1, got {self.group_size}")

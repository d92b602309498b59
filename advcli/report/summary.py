"""The bias report's summary, section by section, as types: the JSON document the docs' compare
page defines, which :mod:`advcli.report.figures` makes and every view (terminal, Markdown,
HTML, figure, gates, ``advcli.verl``'s metrics) reads. A field added to a section is one line
here, and the type checker then names each place that makes the section without it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired


class Counts(TypedDict):
    rows: int
    groups: int
    trajectories: int
    # None without a mask column: the token counts are unknown.
    tokens: int | None
    singleton_groups: int
    zero_std_groups_turn: int
    zero_std_groups_trajectory: int


class TurnsPerTrajectory(TypedDict):
    min: int
    median: float
    max: int
    # Trajectories by turn count, the count as text, in increasing order.
    histogram: dict[str, int]


class GroupFigures(TypedDict):
    baseline_shift_max: float | None
    baseline_shift_mean: float | None
    std_shift_max: float | None
    std_shift_mean: float | None
    baseline_drop_mean: float | None
    # The groups whose baseline falls (rises) by more than SAME_BASELINE when every turn
    # counts, and the largest fall (rise).
    baseline_fall_groups: int
    baseline_fall_max: float | None
    baseline_rise_groups: int
    baseline_rise_max: float | None


class TrajectoryFigures(TypedDict):
    sign_flips: int
    advantage_diff_max: float | None
    advantage_diff_mean: float | None
    corr_turns_diff: float | None


class ByTurns(TypedDict):
    turns: int
    trajectories: int
    mean_advantage_turn: float | None
    mean_advantage_trajectory: float | None
    token_mass_turn: float | None
    token_mass_trajectory: float | None


class TopGroup(TypedDict):
    group: Any
    rows: int
    trajectories: int
    baseline_turn: float | None
    baseline_trajectory: float | None
    std_turn: float | None
    std_trajectory: float | None
    baseline_shift: float | None


class TopTrajectory(TypedDict):
    group: Any
    trajectory: Any
    turns: int
    score: float | None
    advantage_turn: float | None
    advantage_trajectory: float | None
    diff: float | None


class ModeByTurns(TypedDict):
    turns: int
    trajectories: int
    relative_weight: float | None
    weight_share: float | None
    mass_turn: float | None
    mass_trajectory: float | None


class ModeWeights(TypedDict):
    source: str
    longest_vs_shortest: float | None
    by_turns: list[ModeByTurns]


class RemedyAdvice(TypedDict):
    trainer: str | None
    advice: list[dict[str, str]]


class Assessment(TypedDict):
    level: str
    advantage_diff_mean: float
    sign_flip_share: float
    thresholds: dict[str, dict[str, float]]
    lopsided_loss_modes: list[str]
    remedy: RemedyAdvice | None


class StepEntry(TypedDict):
    """A step of ``compare --by``'s series: its part compared alone (``level`` None for a step
    without rows)."""

    step: Any
    rows: int
    trajectories: int
    baseline_shift_mean: float | None
    advantage_diff_mean: float | None
    advantage_diff_max: float | None
    sign_flips: int
    token_mean_longest_vs_shortest: float | None
    level: str | None


class BySteps(TypedDict):
    by: str
    steps: list[StepEntry]


class SummaryFigures(TypedDict):
    """The figures the assessment and the verdict are judged on: the summary without them."""

    counts: Counts
    turns_per_trajectory: TurnsPerTrajectory
    groups: GroupFigures
    trajectories: TrajectoryFigures
    by_turns: list[ByTurns]
    top_groups: list[TopGroup]
    # What the caller says of the input (its reading, inputs, padding rows) and the settings.
    settings: dict[str, Any]
    top_trajectories: list[TopTrajectory]
    # By loss mode; None without a mask column.
    loss_weights: dict[str, ModeWeights] | None


class BiasSummary(SummaryFigures):
    assessment: Assessment
    verdict: str
    # compare --by's series of steps.
    by_step: NotRequired[BySteps]
    # The rows counted once with --drop-duplicates, or found and counted as the trainer did.
    duplicate_rows: NotRequired[dict[str, Any]]
    # gigpo's step term (advcli.report.step_credit).
    step_credit: NotRequired[dict[str, Any]]

"""GiGPO: the episode term from the rule table plus ω times the step term over anchor-state
groups (:func:`gigpo_advantages`).

Each row's step return comes from its trajectory's step rewards in turn order
(:func:`step_returns`); rows whose anchors are equal (within a task group, or batch-wide) form a
step group (:func:`step_groups`), and each return is normalized within it
(:func:`step_advantage`). The rules are
those of :mod:`advcli.settings.rules` (``STEP_*``, ``GAMMA_RANGE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from advcli.advantages.estimators import Advantages, compute_advantages
from advcli.advantages.statistics import batch_key
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import Trajectories, sorted_sum
from advcli.errors import AdvcliError
from advcli.keys import ANCHOR, COPY_OF, GROUP, ROW, SCORE, STEP_RETURN, STEP_REWARD, TURN
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    GigpoNorm,
    Level,
    StepTerm,
    TrajScore,
)
from advcli.settings.rules import FLOAT32_MAX, SINGLETON_STD, STD_DDOF, STEP_SINGLETON


@dataclass
class SharedParts:
    """What several GiGPO rules on one projection share, made once for all of them (the
    audit's candidates): each episode term, by the settings it depends on (not γ, ω or the
    anchors' scope), each γ's step returns, and each step grouping's figures, by γ, scope and
    std denominator."""

    episodes: dict[AdvantageConfig, tuple[Advantages, pl.Series]] = field(default_factory=dict)
    returns: dict[float, pl.Series] = field(default_factory=dict)
    groups: dict[tuple[float, AnchorScope, int], pl.DataFrame] = field(default_factory=dict)


def gigpo_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
    shared: SharedParts | None = None,
) -> Advantages:
    """GiGPO on the key projection (with ``anchor`` and ``step_reward`` or ``step_return``):
    ``A = A_episode + ω · A_step`` for every row.

    The episode term is the estimators' machinery at ``config.level`` with gigpo's rule (under
    ``--traj-score own``, each row centred on its own score); the result's units and groups
    are the episode term's, its ``row_advantage`` the sum, its ``steps`` each row's
    ``step_return``, ``step_group_rows``, ``step_advantage`` and ``episode_advantage`` (the
    episode term, for the report). ``shared``: the parts other rules on this projection made,
    taken where this one's are the same, and this one's kept there."""
    step = config.step
    if step is None:
        raise ValueError("gigpo needs its step settings")
    shared = shared or SharedParts()
    # The episode term depends on neither γ, ω nor the anchors' scope.
    own = replace(config, step=replace(step, gamma=1.0, weight=1.0, scope=AnchorScope.GROUP))
    if own not in shared.episodes:
        episode = episode_advantages(projection, config, naming, trajectories, batch)
        shared.episodes[own] = (episode, episode.rows(projection)["advantage"])
    episode, episode_term = shared.episodes[own]
    # Given returns are read as they are: no γ applies (keyed as γ = 1).
    given = STEP_RETURN in projection.columns
    gamma = 1.0 if given else step.gamma
    if gamma not in shared.returns:
        returns = (
            projection[STEP_RETURN].to_numpy()
            if given
            else _returns_with_copies(projection, trajectories, gamma)
        )
        shared.returns[gamma] = pl.Series(STEP_RETURN, returns)
    grouping = (gamma, step.scope, config.std_ddof)
    if grouping not in shared.groups:
        shared.groups[grouping] = step_groups(
            projection, shared.returns[gamma], step.scope, batch, config.std_ddof
        )
    steps = shared.groups[grouping].select(
        STEP_RETURN, "step_group_rows", step_advantage(step, config.epsilon)
    )
    total = episode_term + step.weight * steps["step_advantage"]
    _check_finite(projection, total, naming)
    steps = steps.with_columns(episode_term.alias("episode_advantage"))
    return replace(episode, row_advantage=total.alias("advantage"), steps=steps)


def episode_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
) -> Advantages:
    """GiGPO's episode term at ``config.level``: the estimators' machinery with gigpo's rule,
    each row's score its trajectory's sum of step rewards under ``episode_from_steps``
    (Trinity-RFT's R(τ), the same on every row of a trajectory), and, under ``--traj-score own``
    at trajectory level, each row centred on its own score. Both levels of the bias report come
    from here, so that they compare the episode term the step term is added to."""
    step = config.step
    assert step is not None
    if step.episode_from_steps:
        if STEP_REWARD not in projection.columns:
            raise AdvcliError(
                "the episode score as the sum of step rewards (Trinity-RFT's) needs the step "
                "rewards: name them with --step-reward-col, not a step return"
            )
        projection = projection.with_columns(pl.col(STEP_REWARD).alias(SCORE))
        if config.level is Level.TURN:
            totals = sorted_sum(projection, trajectories)
            projection = projection.with_columns(pl.Series(SCORE, totals[trajectories.of_row]))
        else:
            # The sum rule adds the same sorted step rewards into each trajectory's R(τ).
            config = replace(config, traj_score=TrajScore.SUM)
    index = None if config.level is Level.TURN else trajectories
    return compute_advantages(projection, config, naming, index, batch)


def turn_order(projection: pl.DataFrame, trajectories: Trajectories) -> np.ndarray:
    """The projection's rows sorted by trajectory, then turn (the ``turn`` key, else row
    order): the order step returns are added in."""
    n = projection.height
    position = projection[TURN].to_numpy() if TURN in projection.columns else np.arange(n)
    return np.lexsort((position, trajectories.of_row))


def step_returns(
    projection: pl.DataFrame,
    trajectories: Trajectories,
    gamma: float,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """Each row's ``R_t = r_t + γ R_{t+1}`` over its trajectory's rows in turn order
    (:func:`turn_order`, or ``order`` when the caller has it), in the projection's order.

    γ = 0 is the step reward itself and γ = 1 the sum to the end, added from the last step as
    the recurrence adds it, both exactly. Any other γ is a doubling scan over the sorted rows:
    after k passes each row holds its next 2^k terms and the factor γ^(2^k) (0 once its
    trajectory ends), so no power of γ is divided by and a long trajectory never underflows."""
    rewards = projection[STEP_REWARD].cast(pl.Float64).to_numpy()
    if gamma == 0:
        return rewards.copy()
    order = turn_order(projection, trajectories) if order is None else order
    n = len(order)
    trajectory = trajectories.of_row[order]
    value = rewards[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = trajectory[1:] != trajectory[:-1]
    if gamma == 1:
        value = _sums_to_the_end(value, last)
    else:
        factor = np.where(last, 0.0, gamma)
        shift = 1
        while shift < n and factor.any():
            ahead_value, ahead_factor = np.zeros(n), np.zeros(n)
            ahead_value[:-shift], ahead_factor[:-shift] = value[shift:], factor[shift:]
            value = value + factor * ahead_value
            factor = factor * ahead_factor
            shift *= 2
    returns = np.full(len(rewards), np.nan)  # rows not in ``order`` have none
    returns[order] = value
    return returns


def _returns_with_copies(
    projection: pl.DataFrame, trajectories: Trajectories, gamma: float
) -> np.ndarray:
    """:func:`step_returns`, where the rows hold a trainer's padding copies counted as it
    counted them (``copy_of``, ROLL's): it discounted the step rewards before it padded, so the
    returns are those of the rows less the copies, each copy taking its original's."""
    if COPY_OF not in projection.columns:
        return step_returns(projection, trajectories, gamma)
    original = projection[COPY_OF].is_null().to_numpy()
    order = turn_order(projection, trajectories)
    returns = step_returns(projection, trajectories, gamma, order[original[order]])
    of_row = pl.DataFrame([projection[ROW].alias(COPY_OF), pl.Series("return", returns)])
    copied = projection.select(COPY_OF).join(of_row, on=COPY_OF, how="left", maintain_order="left")
    return np.where(original, returns, copied["return"].to_numpy())


def _sums_to_the_end(value: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``S_i = v_i + S_{i+1}`` within each run of rows that ``last`` ends, added from the run's
    last row as the recurrence adds it: the rows one step from their run's end first, then two,
    and so on, each pass vectorized (as many passes as the longest run has rows)."""
    n = len(value)
    rows = np.arange(n)
    run_end = np.minimum.accumulate(np.where(last, rows, n)[::-1])[::-1]
    from_end = run_end - rows
    by_distance = np.argsort(from_end, kind="stable")
    counts = np.bincount(from_end)
    sums = value.copy()
    start = int(counts[0])
    for count in counts[1:]:
        at = by_distance[start : start + count]
        sums[at] = value[at] + sums[at + 1]
        start += int(count)
    return sums


def step_groups(
    projection: pl.DataFrame,
    returns: pl.Series,
    scope: AnchorScope,
    batch: str | None = None,
    ddof: int = STD_DDOF,
) -> pl.DataFrame:
    """Each row's ``step_return`` and its step group's figures (``step_group_rows``, the
    returns' mean, std and whether they are all equal), in the projection's order (the std's
    ``ddof``: ``--std``'s): :func:`step_advantage` makes the step term of them.

    A step group is the rows of one anchor within a group (``--anchor-scope group``) or within
    the batch (``batch``: each ``--by`` step, else the input). Its returns are summed sorted, so
    its figures do not depend on the row order."""
    rows = projection.select(
        anchor_scope(scope, batch).alias("__scope"), ANCHOR, returns.alias(STEP_RETURN)
    ).with_row_index("__position")
    names = ["__scope", ANCHOR]
    value = pl.col(STEP_RETURN)
    stats = (
        rows.sort(*names, STEP_RETURN)
        .group_by(names, maintain_order=True)
        .agg(
            pl.len().alias("step_group_rows"),
            value.mean().alias("__mean"),
            value.std(ddof=ddof).alias("__std"),
            (value.max() == value.min()).alias("__equal"),
        )
    )
    return rows.join(stats, on=names, how="left", maintain_order="left").sort("__position")


def step_advantage(step: StepTerm, epsilon: float) -> pl.Expr:
    """The step term over :func:`step_groups`' figures: ``(R − mean) / (F + ε)``, F the step
    group's std under ``mean_std`` and 1 under ``mean``; 0 for a step group of one row, of equal
    returns, or (ROLL's) of a std at most its floor."""
    centred = pl.col(STEP_RETURN) - pl.col("__mean")
    divisor = pl.col("__std") if step.norm is GigpoNorm.MEAN_STD else pl.lit(SINGLETON_STD)
    dead = (pl.col("step_group_rows") == 1) | pl.col("__equal")
    if step.std_floor is not None:
        dead = dead | (pl.col("__std") <= step.std_floor)
    advantage = pl.when(dead).then(STEP_SINGLETON).otherwise(centred / (divisor + epsilon))
    return advantage.alias("step_advantage")


def anchor_scope(scope: AnchorScope, batch: str | None) -> pl.Expr:
    """Where equal anchors form one step group: each row's task group (``--anchor-scope
    group``) or its batch (``batch``: each ``--by`` step, else the input)."""
    return pl.col(GROUP) if scope is AnchorScope.GROUP else batch_key(batch)


def _check_finite(projection: pl.DataFrame, total: pl.Series, naming: Naming) -> None:
    """A sum beyond the float32 range is an error naming its first row, never a written inf."""
    bad = ~total.is_finite() | (total.abs() > FLOAT32_MAX)
    if bad.any():
        row = int(projection[ROW].filter(bad).min())  # type: ignore[arg-type]
        raise AdvcliError(
            f"{naming.locate(row)}: the gigpo advantage (episode term + step weight x step term) "
            "does not fit a float32 (rescale the rewards or the step weight)"
        )

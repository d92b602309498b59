"""Both levels of one estimator, for the bias report: the turn level summed over each
trajectory (:func:`turn_level`, so that its rows can go before the report) and the trajectory
level, from one key projection and one index of its trajectories (:func:`both_levels`, the one
place ``compute --report``, ``compare`` and ``compare --by`` get them from).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from advcli.advantages.estimators import Advantages, compute_advantages
from advcli.advantages.loss import trajectory_terms
from advcli.advantages.step_groups import episode_advantages
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import Trajectories
from advcli.keys import TOKENS
from advcli.settings.config import AdvantageConfig, Level


@dataclass(frozen=True)
class TurnLevel:
    """What the report needs of the turn level's result, and nothing of its rows: its groups and
    counts, and each trajectory's figures summed over its rows (``per_trajectory``, in the
    trajectories' input order, with their ``turn_first_row``): ``advantage_turn``, the mean of
    its rows' advantages, and the sums of :func:`advcli.advantages.loss.trajectory_terms` (null
    without a
    mask column)."""

    groups: pl.DataFrame
    zero_std_groups: int
    rows: int
    tokens: int | None
    nonempty_rows: int | None
    per_trajectory: pl.DataFrame


def turn_level(turn: Advantages, trajectories: Trajectories) -> TurnLevel:
    """Sum the turn level's result over each trajectory's rows, through the one index of the
    rows' trajectories (no group-by of the rows), so that the rows can go before the report."""
    tokens = turn.units[TOKENS]
    tokens_known = tokens.null_count() == 0
    columns = [
        trajectories.table["first_row"].alias("turn_first_row"),
        pl.Series("advantage_turn", trajectories.mean(turn.units, pl.col("advantage"))),
    ]
    # Unknown (null) without a mask column.
    for name, term in trajectory_terms("advantage").items():
        if tokens_known:
            columns.append(pl.Series(name, trajectories.sum(turn.units, term)))
        else:
            columns.append(pl.Series(name, [None] * trajectories.count, dtype=pl.Float64))
    return TurnLevel(
        groups=turn.groups,
        zero_std_groups=turn.zero_std_groups,
        rows=turn.units.height,
        tokens=int(tokens.sum()) if tokens_known else None,
        nonempty_rows=int((tokens > 0).sum()) if tokens_known else None,
        per_trajectory=pl.DataFrame(columns),
    )


def both_levels(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories,
    batch: str | None = None,
    *,
    computed: Advantages | None = None,
) -> tuple[TurnLevel, Advantages]:
    """``config``'s estimator at both levels on ``projection`` (whose index is ``trajectories``):
    the turn level summed over each trajectory (its per-row result is let go first), and the
    trajectory level's result. ``computed``: the result at ``config.level`` if the caller has it
    already (``compute --report``), so that only the other level is computed. ``naming`` and
    ``batch`` are those of :func:`advcli.advantages.estimators.compute_advantages`."""

    def at_level(level: Level) -> Advantages:
        at = replace(config, level=level)
        index = None if level is Level.TURN else trajectories
        if config.step is None:
            return compute_advantages(projection, at, naming, index, batch)
        # GiGPO: the bias is the episode term's, under its own rules at both levels.
        return episode_advantages(projection, at, naming, trajectories, batch)

    if computed is not None and computed.level is Level.TURN:
        turn = turn_level(computed, trajectories)
    else:
        turn = turn_level(at_level(Level.TURN), trajectories)
    if computed is not None and computed.level is Level.TRAJECTORY:
        return turn, computed
    return turn, at_level(Level.TRAJECTORY)

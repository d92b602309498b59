"""Stage 2's units and their scores: a *unit* is what counts once in its group's statistics, a
row at turn level, a trajectory (``(group, trajectory)`` pair) at trajectory level.
:func:`build_units` turns the key projection into units, each trajectory scored by the
``--traj-score`` rule (or SkyRL's last-step flag), and refuses a trajectory whose rows disagree
when no rule is chosen. :class:`Naming` says how its errors name the user's columns and rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from advcli.advantages.units import Trajectories, sorted_sum
from advcli.errors import AdvcliError
from advcli.keys import GROUP, LAST_STEP, ROW, SCORE, TOKENS, TRAJECTORY, TURN
from advcli.settings.config import OWN_SCORE_ESTIMATORS, AdvantageConfig, Level, TrajScore
from advcli.settings.rules import SCORE_TOLERANCE


def _row_number(row: int) -> str:
    return f"row {row}"


def _one_file(row: int) -> int:
    return 0


@dataclass(frozen=True)
class Naming:
    """How error messages name things: the user's key column names and a row locator (which the
    I/O layer sets to name the file too), and which input file a row is in."""

    group: str = GROUP
    trajectory: str = TRAJECTORY
    locate: Callable[[int], str] = _row_number
    file_of: Callable[[int], int] = _one_file
    # Said after an error on a trajectory's scores when the turn column is in doubt.
    turn_hint: str = ""


def build_units(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories | None = None,
) -> pl.DataFrame:
    """One row per unit with ``group``, ``trajectory``, ``score``, ``tokens``, ``turns`` and
    ``first_row`` (the unit's first input row, which fixes the units' order).

    ``naming`` says how error messages name the key columns and rows. At trajectory level the
    units come from ``trajectories``, the projection's index
    (:func:`advcli.advantages.units.index_trajectories`).
    Without a ``traj_score`` rule, a projection with ``last_step`` (SkyRL's step-wise dumps) gives
    each trajectory the score of its last-step row, SkyRL's own rule.
    """
    if config.level is Level.TURN:
        return projection.select(
            pl.col(GROUP),
            pl.col(TRAJECTORY),
            pl.col(SCORE),
            pl.col(TOKENS),
            pl.lit(1, dtype=pl.UInt32).alias("turns"),
            pl.col(ROW).alias("first_row"),
        )

    if trajectories is None:
        raise ValueError("trajectory-level units need the projection's trajectory index")
    # "first" and "last" follow turn_index when the dump has one, else the input row order.
    order = projection[TURN].to_numpy() if TURN in projection.columns else None
    rule = config.traj_score
    table = trajectories.table
    flagged = LAST_STEP in projection.columns
    if rule is TrajScore.LAST and flagged:
        # The flagged row is the last step whatever the rows' order (SkyRL's own rule).
        score = projection[SCORE].gather(
            _last_step_positions(projection, trajectories, naming, in_row_order=False)
        )
    elif rule is TrajScore.LAST:
        score = projection[SCORE].gather(trajectories.last_position(order))
    elif rule is TrajScore.MAX:
        score = table["score_max"]
    elif rule in (TrajScore.MEAN, TrajScore.SUM):
        # Added over the sorted scores: the result does not depend on the row order.
        total = sorted_sum(projection, trajectories)
        score = pl.Series(total / table["turns"].to_numpy() if rule is TrajScore.MEAN else total)
        if rule is TrajScore.MEAN:
            # Rows that agree have their score as the mean exactly, not a rounding of it: a group
            # of them stays zero-std.
            agree = table["score_min"] == table["score_max"]
            score = pl.select(pl.when(agree).then(table["score_min"]).otherwise(score)).to_series()
    elif rule is None and flagged:
        score = projection[SCORE].gather(_last_step_positions(projection, trajectories, naming))
    else:  # the first turn's score: rule "first", or rows that agree (checked below)
        if rule is TrajScore.FIRST and flagged and order is None:
            # Without a turn column "first" is the first row: the rows must be in step order,
            # which the flag on each trajectory's last row shows.
            _last_step_positions(projection, trajectories, naming, rule="--traj-score first")
        score = projection[SCORE].gather(trajectories.first_position(order))
    units = table.with_columns(score.alias(SCORE))
    if rule is None and not flagged:
        own = config.estimator.value in OWN_SCORE_ESTIMATORS
        _check_consistent_scores(projection, units, naming, own_rule=own)
    return units.select(GROUP, TRAJECTORY, SCORE, TOKENS, "turns", "first_row")


def _last_step_positions(
    projection: pl.DataFrame,
    trajectories: Trajectories,
    naming: Naming,
    *,
    in_row_order: bool = True,
    rule: str = "",
) -> np.ndarray:
    """The projection position of each trajectory's last-step row, SkyRL's score rule: its
    step-wise advantage runs the estimator on the last-step rows only and broadcasts the result
    to the trajectory's other steps. Each trajectory must have exactly one such row and, with
    ``in_row_order``, it must be its last in row order (SkyRL's steps of a trajectory are
    contiguous, the flagged one last). ``rule``: the option that relies on that order, for the
    error message."""
    flagged = projection[LAST_STEP].to_numpy()
    last = trajectories.last_position()
    flags = np.bincount(trajectories.of_row, weights=flagged, minlength=trajectories.count)
    broken = flags != 1
    if in_row_order:
        broken |= ~flagged[last]
    broken = np.flatnonzero(broken)
    if not len(broken):
        if in_row_order:
            return last
        positions = np.flatnonzero(flagged)
        out = np.empty(trajectories.count, dtype=np.int64)
        out[trajectories.of_row[positions]] = positions
        return out
    trajectory = int(broken[0])  # the trajectories are in input order
    positions = np.flatnonzero(trajectories.of_row == trajectory)
    key = trajectories.table.row(trajectory, named=True)
    named = f"trajectory ({naming.group}={key[GROUP]!r}, {naming.trajectory}={key[TRAJECTORY]!r})"
    rows = projection[ROW]
    relies = f"; {rule} takes its first row, which needs its steps in row order" if rule else ""
    other_rules = " (or choose a rule with --traj-score first|last|mean|max|sum)"
    if not in_row_order:
        count = int(flags[trajectory])
        where = positions[flagged[positions]][1] if count > 1 else last[trajectory]
        raise AdvcliError(
            f"{naming.locate(rows[int(where)])}: {named} has {count} rows flagged "
            "'is_last_step'; SkyRL flags exactly one, a trajectory's last step, whose reward "
            "--traj-score last takes"
        )
    early = positions[flagged[positions] & (positions != last[trajectory])]
    if len(early):
        raise AdvcliError(
            f"{naming.locate(rows[int(early[0])])}: {named} has a row flagged 'is_last_step' "
            f"before its last row ({naming.locate(rows[int(last[trajectory])])}); SkyRL flags only "
            f"a trajectory's last step, whose reward is the trajectory's score{relies}"
        )
    raise AdvcliError(
        f"{naming.locate(rows[int(last[trajectory])])}: {named} ends at this row, which is not "
        "flagged 'is_last_step'; SkyRL flags a trajectory's last step, whose reward is the "
        f"trajectory's score{relies or other_rules}"
    )


# verl-agent's rows differ by its invalid-action penalty: its own rule, for the estimators of a
# mean baseline.
_OWN_SCORE_HINT = (
    ", or --traj-score own (each trajectory's first row in the statistics, every row centred on "
    "its own score, as verl-agent does when its penalty makes rows differ)"
)


def scores_disagree(low: pl.Expr, high: pl.Expr) -> pl.Expr:
    """True where ``high - low`` exceeds the relative tolerance: ``max − min > 1e-6 · max(|max|,
    |min|)``. Shared by ``compute`` (an error) and ``inspect`` (a count)."""
    return (high - low) > SCORE_TOLERANCE * pl.max_horizontal(high.abs(), low.abs())


def _check_consistent_scores(
    projection: pl.DataFrame, units: pl.DataFrame, naming: Naming, *, own_rule: bool
) -> None:
    offenders = units.filter(scores_disagree(pl.col("score_min"), pl.col("score_max")))
    if offenders.is_empty():
        return
    first = offenders.row(0, named=True)  # units are in input order
    rows = projection.filter(
        (pl.col(GROUP) == first[GROUP]) & (pl.col(TRAJECTORY) == first[TRAJECTORY])
    ).sort(ROW)
    # Name the first row holding one of the two extremes that disagree.
    extreme = (pl.col(SCORE) == first["score_min"]) | (pl.col(SCORE) == first["score_max"])
    disagreeing = rows.filter(extreme)[ROW][0]
    scores = rows[SCORE].unique(maintain_order=True).to_list()
    trajectory = (
        f"trajectory ({naming.group}={first[GROUP]!r}, {naming.trajectory}={first[TRAJECTORY]!r})"
    )
    first_row, last_row = rows[ROW][0], rows[ROW][-1]
    if naming.file_of(first_row) != naming.file_of(last_row):
        # A rule would merge what are two trajectories of two steps whose ids repeat.
        raise AdvcliError(
            f"{naming.locate(last_row)}: {trajectory} has rows in two files (first at "
            f"{naming.locate(first_row)}) with different scores {scores}: the ids repeat "
            "across files; if each file is a training step, pass --by file to read each as "
            "its own batch"
        )
    raise AdvcliError(
        f"{naming.locate(disagreeing)}: {trajectory} has rows with different scores {scores}; "
        f"choose a rule with --traj-score first|last|mean|max|sum{naming.turn_hint}"
        + (_OWN_SCORE_HINT if own_rule else "")
    )

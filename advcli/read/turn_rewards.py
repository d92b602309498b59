"""The checks of a dump read for per-turn rewards (``--reward-mode per-turn``), on its key
projection: a reward column that is an outcome score repeated on every turn
(:func:`check_turn_rewards`), and last-step flags that disagree with the turn order
(:func:`check_last_steps`)."""

from __future__ import annotations

import polars as pl

from advcli.errors import AdvcliError
from advcli.keys import GROUP, LAST_STEP, ROW, TRAJECTORY, TURN
from advcli.read.columns import ColumnRoles
from advcli.read.dataset import Dataset
from advcli.read.dialects import dialect_named


def check_turn_rewards(
    trajectories: pl.DataFrame, dataset: Dataset, columns: ColumnRoles, confirmed: bool
) -> None:
    """Refuse a reward that carries one value on every row of each trajectory, some trajectory
    having several rows: an outcome score repeated per turn (verl-agent's token rewards, ROLL's
    ``episode_scores``), whose reward-to-go would count it once per turn, multiplying it by the
    trajectory's turn count. ``trajectories``: one row per trajectory with its ``group``,
    ``trajectory``, ``turns``, ``first_row``, ``score_min`` and ``score_max`` (the projection's
    trajectory index). ``confirmed`` (an option named the reward column) reads it as each turn's
    own reward all the same: a per-turn reward can be constant, a cost per turn say."""
    if confirmed:
        return
    constant = trajectories.select((pl.col("score_min") == pl.col("score_max")).all()).item()
    several = trajectories.filter(pl.col("turns") > 1)
    if not constant or several.is_empty():
        return
    first = several.sort("first_row").row(0, named=True)
    row, turns, value = first["first_row"], first["turns"], first["score_min"]
    dialect = dialect_named(columns.dialect)
    own = dialect.turn_reward if dialect is not None else ()
    where = (
        f"{dialect.trainer}'s dumps keep it in {' or '.join(repr(n) for n in own)}, which this "
        "one does not have: name"
        if dialect is not None and own
        else "name"
    )
    raise AdvcliError(
        f"{dataset.locate(row)}: column '{columns.reward}' (reward) has one value on all "
        f"the rows of each trajectory (trajectory ({columns.group or 'group'}={first[GROUP]!r}, "
        f"{columns.trajectory or 'trajectory'}={first[TRAJECTORY]!r}) has {turns:,} "
        f"rows of {value:g}): it looks like an outcome score repeated on every turn, "
        "which --reward-mode per-turn would count once per turn (the reward-to-go multiplies "
        f"it by the turn count); {where} the per-turn reward column with --reward-col, or pass "
        f"--reward-col {columns.reward} to read this one as each turn's own reward"
    )


def check_last_steps(projection: pl.DataFrame, dataset: Dataset, columns: ColumnRoles) -> None:
    """Refuse last-step flags (SkyRL's ``is_last_step``) that disagree with the turn order the
    rewards-to-go follow: each trajectory's last row in that order (the turn column, else row
    order) must be flagged, and no other row; the error names the first row that breaks it."""
    if LAST_STEP not in projection.columns:
        return
    order = pl.col(TURN) if TURN in projection.columns else pl.col(ROW)
    last = order == order.max().over(GROUP, TRAJECTORY)
    wrong = projection.filter(pl.col(LAST_STEP) != last).head(1)
    if wrong.is_empty():
        return
    row = wrong.row(0, named=True)
    flag = columns.last_step
    named = (
        f"trajectory ({columns.group or 'group'}={row[GROUP]!r}, "
        f"{columns.trajectory or 'trajectory'}={row[TRAJECTORY]!r})"
    )
    in_order = f"the order of '{columns.turn}'" if columns.turn is not None else "row order"
    said = (
        f"is flagged '{flag}' but is not the last turn of {named} in {in_order}"
        if row[LAST_STEP]
        else f"is the last turn of {named} in {in_order} but is not flagged '{flag}'"
    )
    raise AdvcliError(
        f"{dataset.locate(row[ROW])}: this row {said}; SkyRL flags a trajectory's last step, and "
        "the rewards-to-go of --reward-mode per-turn run to it"
    )

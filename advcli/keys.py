"""The column names of the key projection, the frame stage 1 hands to stage 2, and the one
expression over them that both stage 1 (a check) and ``inspect`` (a count) use.

They are advcli's own (the projection is a fresh frame of these columns only), so a user column
called ``group`` or ``score`` never collides with them.
"""

import polars as pl

ROW = "row"
GROUP = "group"
TRAJECTORY = "trajectory"
TURN = "turn"
SCORE = "score"
TOKENS = "tokens"


def repeated_turn() -> pl.Expr:
    """True for a row whose ``(group, trajectory, turn)`` an earlier row already has."""
    return ~pl.struct(GROUP, TRAJECTORY, TURN).is_first_distinct()

"""The column names of the key projection, the frame stage 1 hands to stage 2, and the one
search over them for rows that share keys: repeated turns, which stage 1 refuses and ``inspect``
counts, and the candidates for duplicated rows (:mod:`advcli.read.duplicates`).

They are advcli's own (the projection is a fresh frame of these columns only), so a user column
called ``group`` or ``score`` never collides with them.
"""

from collections.abc import Sequence

import polars as pl

ROW = "row"
GROUP = "group"
TRAJECTORY = "trajectory"
TURN = "turn"
SCORE = "score"
TOKENS = "tokens"
# SkyRL's step-wise dumps only: the row's last-step flag, and whether the row is padding (stage 1
# removes those rows before stage 2).
LAST_STEP = "last_step"
PADDING = "padding"
# GiGPO only: the anchor state hashed to an integer (equal states, equal hashes), and a step's
# reward or its already discounted return.
ANCHOR = "anchor"
STEP_REWARD = "step_reward"
STEP_RETURN = "step_return"
# The row a duplicated row copies (:mod:`advcli.read.duplicates`), and in the projection, where
# a trainer's padding copies are counted as it counted them (ROLL's), each copy's original
# (null for the other rows): the trainer discounted the step rewards before it padded.
COPY_OF = "copy_of"
# audit only: the advantage the trainer computed for the row, on its first response token, and
# the least and the greatest over its response tokens (all three its value for a per-row
# column); null for a row without response tokens.
TRAINER_FIRST = "trainer_first"
TRAINER_LOW = "trainer_low"
TRAINER_HIGH = "trainer_high"


def repeated_turn() -> pl.Expr:
    """True for a row whose ``(group, trajectory, turn)`` an earlier row already has."""
    return ~pl.struct(GROUP, TRAJECTORY, TURN).is_first_distinct()


def repeated_turns(projection: pl.DataFrame) -> pl.DataFrame:
    """The rows whose ``(group, trajectory, turn)`` an earlier row already has, in input order."""
    return rows_sharing(projection, (GROUP, TRAJECTORY, TURN)).filter(repeated_turn())


def rows_sharing(projection: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """The rows whose ``keys`` at least one other row has too (every such row, the first of each
    set included), in input order.

    Found from sorted 64-bit hashes of the keys (8 bytes a row, where a set of the keys holds
    several times that): equal keys hash alike, so no repeat is missed, and only the rows whose
    hash occurs more than once are then compared exactly, so a collision of different keys
    counts nothing.
    """
    hashes = projection.select(pl.struct(*keys).hash()).to_series()
    in_order = hashes.sort()
    # Compared to the previous value, not diff(): it is null above 2**63.
    seen_twice = in_order.filter(in_order == in_order.shift(1))
    if seen_twice.is_empty():
        return projection.clear()
    candidates = projection.filter(hashes.is_in(seen_twice.unique().implode()))
    return candidates.filter(pl.struct(*keys).is_duplicated())

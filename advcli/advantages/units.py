"""Each row's trajectory, found once, and every per-trajectory figure summed over that index.

:func:`index_trajectories` ranks the key projection's ``(group, trajectory)`` keys once (a sort of
the two key columns) and numbers the trajectories in input order. Each per-trajectory figure is
then a numpy reduction over that number: 8 bytes a trajectory per figure. A Polars group-by on the
same keys holds more than the rows themselves while it runs (docs/performance.md, "What brought
them down"); the trajectory level's units, the report's turn-level sums and ``inspect``'s counts
all come from this one index.

Sums over a trajectory's rows are taken in input order, one row at a time, so they do not depend
on the thread count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from advcli.keys import GROUP, ROW, SCORE, TOKENS, TRAJECTORY

# Rows whose values a per-trajectory sum, minimum or maximum makes at once.
ROWS_PER_PIECE = 1 << 20

# The id types numpy sorts as they are.
NUMPY_INTEGERS = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64)


@dataclass(frozen=True)
class Trajectories:
    """``of_row``: each projection row's trajectory, as its position in ``table``.

    ``table``: one row per trajectory, in the input order of their first rows, with ``group``,
    ``trajectory``, ``turns`` (its rows), ``tokens`` (null without a mask column), ``first_row``
    (the input row number of its first row), ``score_min`` and ``score_max``.
    """

    of_row: np.ndarray
    table: pl.DataFrame

    @property
    def count(self) -> int:
        return self.table.height

    def sum(self, rows: pl.DataFrame, value: pl.Expr) -> np.ndarray:
        """Each trajectory's sum of ``value`` over ``rows`` (one per projection row, in its
        order), as float64, added one by one in input order."""
        return _sum(self.of_row, self.count, rows, value)

    def mean(self, rows: pl.DataFrame, value: pl.Expr) -> np.ndarray:
        """Each trajectory's mean of ``value`` over its rows."""
        means: np.ndarray = self.sum(rows, value) / self.table["turns"].to_numpy()
        return means

    def first_position(self, order: np.ndarray | None = None) -> np.ndarray:
        """The projection position of each trajectory's first row, or, given ``order`` (one
        integer per row), of its first row with the smallest ``order``."""
        return self._extreme_position(order, np.minimum)

    def last_position(self, order: np.ndarray | None = None) -> np.ndarray:
        """The projection position of each trajectory's last row, or, given ``order``, of its
        last row with the largest ``order``."""
        return self._extreme_position(order, np.maximum)

    def _extreme_position(self, order: np.ndarray | None, pick: np.ufunc) -> np.ndarray:
        # A piece of the rows at a time: no row-sized array of positions.
        ties = None if order is None else (order, _reduce(pick, order, self.of_row, self.count))
        start_value = np.iinfo(np.int64).max if pick is np.minimum else np.iinfo(np.int64).min
        out = np.full(self.count, start_value, dtype=np.int64)
        for start in range(0, len(self.of_row), ROWS_PER_PIECE):
            trajectories = self.of_row[start : start + ROWS_PER_PIECE]
            positions = np.arange(start, start + len(trajectories), dtype=np.int64)
            if ties is not None:
                # Only the rows at their trajectory's extreme ``order`` compete for the position.
                ordered, extreme = ties
                tied = ordered[start : start + len(trajectories)] == extreme[trajectories]
                trajectories, positions = trajectories[tied], positions[tied]
            pick.at(out, trajectories, positions)
        return out


def index_trajectories(projection: pl.DataFrame) -> Trajectories:
    """Number the projection's trajectories in input order and sum their rows, turns and tokens.

    ``projection`` is a key projection (``row``, ``group``, ``trajectory``, ``score``, ``tokens``)
    in input order."""
    rank, first = _rank_keys(projection)
    count = len(first)
    # Renumbered by their first row, so that the trajectories come in input order.
    by_first_row = np.argsort(first, kind="stable")
    renumber = np.empty(count, dtype=np.uint32)
    renumber[by_first_row] = np.arange(count, dtype=np.uint32)
    of_row = renumber[rank]
    del rank

    known_tokens = projection[TOKENS].null_count() == 0
    score_min, score_max = np.full(count, np.inf), np.full(count, -np.inf)
    for start, scores in _pieces(projection, pl.col(SCORE)):
        into = of_row[start : start + len(scores)]
        np.minimum.at(score_min, into, scores)
        np.maximum.at(score_max, into, scores)
    table = projection.select(pl.col(GROUP, TRAJECTORY, ROW).gather(first[by_first_row]))
    table = table.select(
        GROUP,
        TRAJECTORY,
        pl.Series("turns", np.bincount(of_row, minlength=count), dtype=pl.UInt32),
        # Summed as float64, exactly: a trajectory's token count is far below 2**53. Unknown
        # (null) without a mask column.
        pl.Series(TOKENS, _sum(of_row, count, projection, pl.col(TOKENS))).cast(pl.Int64)
        if known_tokens
        else pl.lit(None, dtype=pl.Int64).alias(TOKENS),
        pl.col(ROW).alias("first_row"),
        pl.Series("score_min", score_min),
        pl.Series("score_max", score_max),
    )
    return Trajectories(of_row=of_row, table=table)


def _rank_keys(projection: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``(group, trajectory)`` key numbered 0..T-1 in key order, exactly (no hashing),
    and the position of each key's first row."""
    if not all(projection[name].dtype in NUMPY_INTEGERS for name in (GROUP, TRAJECTORY)):
        # String ids, and 128-bit integers (JSON lines read ids from 2**63 up as Int128), which
        # numpy has not: Polars ranks the pair at once, faster than a numpy sort of each string
        # column's rank (docs/performance.md).
        dense = projection.select(pl.struct(GROUP, TRAJECTORY).rank("dense")).to_series()
        of_row = dense.to_numpy() - np.uint32(1)
        count = int(of_row.max()) + 1 if len(of_row) else 0
        return of_row, _reduce(np.minimum, np.arange(len(of_row), dtype=np.int64), of_row, count)
    # Integer ids: a stable sort of the positions by the two keys (numpy.lexsort) puts each key's
    # rows together in input order, and a key starts where either column differs from the row
    # before. It holds less while it runs than Polars' dense rank of the two columns as a struct
    # (python bench/bench_compute.py --rows 2000000 --commands-only).
    keys = [projection[name].to_numpy() for name in (TRAJECTORY, GROUP)]
    order = np.lexsort(keys)  # the last key sorts first
    starts = np.zeros(len(order), dtype=bool)
    starts[:1] = True
    for start in range(1, len(order), ROWS_PER_PIECE):
        # Neighbours in sorted order, a piece at a time: no sorted copy of a whole key column.
        pair = order[start - 1 : start + ROWS_PER_PIECE]
        for key in keys:
            sorted_key = key[pair]
            starts[start : start + len(pair) - 1] |= sorted_key[1:] != sorted_key[:-1]
    del keys
    first = order[starts]
    rank = np.empty(len(order), dtype=np.uint32)
    rank[order] = np.cumsum(starts, dtype=np.uint32) - np.uint32(1)
    return rank, first


def _sum(of_row: np.ndarray, count: int, rows: pl.DataFrame, value: pl.Expr) -> np.ndarray:
    """Each of ``count`` trajectories' sum of ``value`` over ``rows``, ``of_row`` naming each
    row's (the same sequential sums as ``numpy.bincount``, made a piece at a time)."""
    total = np.zeros(count)
    for start, values in _pieces(rows, value):
        # Unbuffered: each row's value is added to its trajectory's total in row order.
        np.add.at(total, of_row[start : start + len(values)], values)
    return total


def _pieces(rows: pl.DataFrame, value: pl.Expr) -> Iterator[tuple[int, np.ndarray]]:
    """``value`` over ``rows`` as float64, a million rows at a time: (first row, values). The
    values never exist for every row at once."""
    for start in range(0, rows.height, ROWS_PER_PIECE):
        piece = rows.slice(start, ROWS_PER_PIECE).select(value.cast(pl.Float64)).to_series()
        yield start, piece.to_numpy()


def sorted_sum(projection: pl.DataFrame, trajectories: Trajectories) -> np.ndarray:
    """Each trajectory's sum of its rows' scores, added one by one from the smallest: one fixed
    order, so the ``mean`` and ``sum`` rules do not depend on the input's row order.
    (``numpy.bincount`` adds sequentially; ``numpy.add.reduceat`` would not.)"""
    score = projection[SCORE].to_numpy()
    order = np.lexsort((score, trajectories.of_row))
    return np.bincount(
        trajectories.of_row[order], weights=score[order], minlength=trajectories.count
    )


def count_trajectories(projection: pl.DataFrame) -> int:
    """How many distinct ``(group, trajectory)`` keys the projection holds, where no index is
    needed: a streaming count is faster than making the index."""
    keys = projection.lazy().group_by(GROUP, TRAJECTORY).len()
    return int(keys.select(pl.len()).collect(engine="streaming").item())


def _reduce(pick: np.ufunc, values: np.ndarray, into: np.ndarray, count: int) -> np.ndarray:
    """``pick`` (np.minimum or np.maximum) of ``values`` per index in ``into``."""
    if np.issubdtype(values.dtype, np.floating):
        start = np.inf if pick is np.minimum else -np.inf
    else:
        limits = np.iinfo(values.dtype)
        start = limits.max if pick is np.minimum else limits.min
    out = np.full(count, start, dtype=values.dtype)
    pick.at(out, into, values)
    return out

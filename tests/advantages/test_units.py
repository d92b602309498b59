"""The trajectory index (advcli.advantages.units) and the repeated-turn search, on hand-made
projections with
hand-computed answers."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import polars as pl

from advcli.advantages.statistics import group_statistics
from advcli.advantages.units import index_trajectories, sorted_sum
from advcli.keys import repeated_turns


def projection(rows: list[tuple], tokens: bool = True) -> pl.DataFrame:
    """(group, trajectory, turn, score, tokens) rows as a key projection in input order."""
    frame = pl.DataFrame(
        rows,
        schema={
            "group": pl.String,
            "trajectory": pl.Int64,
            "turn": pl.Int64,
            "score": pl.Float64,
            "tokens": pl.Int64,
        },
        orient="row",
    ).with_row_index("row")
    return frame if tokens else frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("tokens"))


# Three trajectories whose rows interleave: (b, 1) at rows 0 and 2, (a, 2) at rows 1 and 4,
# (a, 1) at row 3. In input order of their first rows: (b, 1), (a, 2), (a, 1).
INTERLEAVED = [
    ("b", 1, 0, 1.0, 10),
    ("a", 2, 0, 0.5, 3),
    ("b", 1, 1, 1.0, 20),
    ("a", 1, 0, -2.0, 0),
    ("a", 2, 1, 0.25, 7),
]


def test_trajectories_are_numbered_in_the_input_order_of_their_first_rows():
    index = index_trajectories(projection(INTERLEAVED))
    assert index.of_row.tolist() == [0, 1, 0, 2, 1]
    assert index.table.rows() == [
        # group, trajectory, turns, tokens, first_row, score_min, score_max
        ("b", 1, 2, 30, 0, 1.0, 1.0),
        ("a", 2, 2, 10, 1, 0.25, 0.5),
        ("a", 1, 1, 0, 3, -2.0, -2.0),
    ]
    assert index.count == 3


def test_every_key_type_is_numbered_exactly():
    # Integer ids are sorted by numpy, others ranked by Polars: ids at the ends of their types'
    # ranges, and ids equal in one column but not the other, are told apart.
    cases = [
        (pl.UInt64, [2**64 - 1, 0, 2**64 - 1, 2**63, 0], [0, 1, 0, 2, 3]),
        (pl.Int64, [-(2**63), 2**63 - 1, -(2**63), -1, 2**63 - 1], [0, 1, 0, 2, 3]),
        (pl.Int128, [2**100, -(2**64), 2**100, 2**63, -(2**64)], [0, 1, 0, 2, 3]),
        (pl.Int8, [-128, 127, -128, 0, 127], [0, 1, 0, 2, 3]),
        (pl.Float64, [0.5, -1.5, 0.5, float("inf"), -1.5], [0, 1, 0, 2, 3]),
        (pl.Boolean, [True, False, True, False, False], [0, 1, 0, 1, 2]),
    ]
    for dtype, groups, of_row in cases:
        frame = pl.DataFrame(
            {
                "row": pl.Series(range(5), dtype=pl.UInt32),
                "group": pl.Series(groups, dtype=dtype),
                # Trajectory 7 in every group but the last row's: only the pair is the key.
                "trajectory": [7, 7, 7, 7, 8],
                "score": [0.0] * 5,
                "tokens": [1] * 5,
            }
        )
        index = index_trajectories(frame)
        assert index.of_row.tolist() == of_row, dtype
        assert index.table["turns"].to_list() == np.bincount(of_row).tolist(), dtype


def test_sums_and_means_are_per_trajectory():
    index = index_trajectories(projection(INTERLEAVED))
    rows = pl.DataFrame({"value": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert index.sum(rows, pl.col("value")).tolist() == [4.0, 7.0, 4.0]
    assert index.mean(rows, pl.col("value")).tolist() == [2.0, 3.5, 4.0]


def test_tokens_are_unknown_without_a_mask_column():
    index = index_trajectories(projection(INTERLEAVED, tokens=False))
    assert index.table["tokens"].to_list() == [None, None, None]


def test_first_and_last_follow_the_turn_then_the_input_order():
    # One trajectory, turns 2, 0, 0, 5, 5 at positions 0..4: its first row is the first of the
    # two turn-0 rows (position 1), its last the second of the two turn-5 rows (position 4).
    rows = [("g", 1, turn, float(turn), 1) for turn in (2, 0, 0, 5, 5)]
    index = index_trajectories(projection(rows))
    turns = np.array([2, 0, 0, 5, 5])
    assert index.first_position(turns).tolist() == [1]
    assert index.last_position(turns).tolist() == [4]
    # Without a turn order, the input order alone.
    assert index.first_position().tolist() == [0]
    assert index.last_position().tolist() == [4]


def test_sorted_sum_is_the_same_float_whatever_the_row_order():
    # Added in input order these rows give two different float64 sums; the sum over the sorted
    # scores is one value for every order of the rows, within an ulp of 0.6.
    assert (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1
    sums = set()
    for scores in ([0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.2, 0.3, 0.1], [0.3, 0.1, 0.2]):
        rows = [("g", 1, turn, score, 1) for turn, score in enumerate(scores)]
        frame = projection(rows)
        sums.update(sorted_sum(frame, index_trajectories(frame)).tolist())
    assert len(sums) == 1
    assert abs(sums.pop() - 0.6) <= 2**-52


def test_an_empty_projection_has_no_trajectories():
    frame = projection([])
    index = index_trajectories(frame)
    assert index.count == 0
    assert sorted_sum(frame, index).tolist() == []


def test_repeated_turns_are_the_later_rows_of_a_repeated_key_in_input_order():
    rows = [
        ("a", 1, 0, 1.0, 1),
        ("a", 1, 1, 1.0, 1),
        ("b", 1, 0, 0.0, 1),
        ("a", 1, 0, 1.0, 1),  # repeats row 0
        ("b", 1, 0, 0.0, 1),  # repeats row 2
        ("a", 2, 0, 1.0, 1),  # same turn, other trajectory: not a repeat
        ("a", 1, 0, 1.0, 1),  # repeats row 0 again
    ]
    assert repeated_turns(projection(rows))["row"].to_list() == [3, 4, 6]
    assert repeated_turns(projection(rows[:3])).is_empty()


def test_group_statistics_in_parts_are_the_figures_of_each_group():
    # Many small groups split into parts of 3 units: each group's figures equal a plain-Python
    # computation from the formulas, and are bit for bit those of the statistics in one part.
    rng = np.random.default_rng(7)
    groups = [f"g{rng.integers(0, 40)}" for _ in range(400)]
    scores = rng.choice([0.0, 0.1, 0.25, 1.0, 0.3333], size=400).tolist()
    tokens = rng.integers(0, 9, size=400).tolist()
    units = pl.DataFrame(
        {
            "group": groups,
            "trajectory": list(range(400)),
            "score": scores,
            "tokens": tokens,
            "turns": [1] * 400,
            "first_row": list(range(400)),
        },
        schema_overrides={"first_row": pl.UInt32, "turns": pl.UInt32},
    )
    whole = group_statistics(units, second_best=True)
    parts = group_statistics(units, units_per_part=3, second_best=True)
    assert parts.equals(whole)
    # Without grpo_passk's figures: the same figures but those two, top_row the first unit.
    lean = group_statistics(units, units_per_part=3)
    assert "score_second" not in lean.columns
    assert lean["top_row"].equals(lean["first_row"].alias("top_row"))
    assert lean.drop("top_row").equals(parts.drop("top_row", "score_second"))
    for row in parts.iter_rows(named=True):
        mine = [i for i, g in enumerate(groups) if g == row["group"]]
        values = [scores[i] for i in mine]
        assert row["units"] == len(mine)
        assert row["first_row"] == mine[0]
        assert row["tokens_sum"] == sum(tokens[i] for i in mine)
        assert math.isclose(row["mean"], statistics.fmean(values), rel_tol=1e-12)
        if len(values) > 1 and max(values) > min(values):
            assert math.isclose(row["std"], statistics.stdev(values), rel_tol=1e-9)
        top = max(values)
        assert row["top_row"] == next(i for i in mine if scores[i] == top)


def test_pieces_of_any_size_give_the_plain_answers(monkeypatch):
    # The index, its sums and its first/last positions are made a piece of rows at a time;
    # whatever the piece size they are the plain answers, computed here row by row.
    rng = np.random.default_rng(7)
    rows = [
        (
            "abc"[int(rng.integers(3))],
            int(rng.integers(4)),
            int(rng.integers(5)),
            float(rng.integers(-3, 4)) / 4,
            int(rng.integers(0, 9)),
        )
        for _ in range(60)
    ]
    numbers: dict[tuple, int] = {}
    for group, trajectory, *_ in rows:
        numbers.setdefault((group, trajectory), len(numbers))
    of_row = [numbers[(group, trajectory)] for group, trajectory, *_ in rows]
    turns = np.array([row[2] for row in rows])
    first, last, tokens = {}, {}, [0] * len(numbers)
    for position, (number, row) in enumerate(zip(of_row, rows, strict=True)):
        # (turn, position) smallest first; (turn, position) largest last.
        if number not in first or row[2] < rows[first[number]][2]:
            first[number] = position
        if number not in last or row[2] >= rows[last[number]][2]:
            last[number] = position
        tokens[number] += row[4]
    # String ids are ranked by Polars, integer ids sorted by numpy: both ways.
    as_strings = projection(rows)
    as_integers = as_strings.with_columns(
        pl.col("group").replace_strict({"a": 0, "b": 1, "c": 2}, return_dtype=pl.Int64)
    )
    for piece, frame in itertools.product((1, 2, 3, 7, 1 << 20), (as_strings, as_integers)):
        monkeypatch.setattr("advcli.advantages.units.ROWS_PER_PIECE", piece)
        index = index_trajectories(frame)
        assert index.of_row.tolist() == of_row, piece
        assert index.table["tokens"].to_list() == tokens, piece
        assert index.first_position(turns).tolist() == [first[n] for n in range(len(numbers))]
        assert index.last_position(turns).tolist() == [last[n] for n in range(len(numbers))]
        assert index.first_position().tolist() == [of_row.index(n) for n in range(len(numbers))]

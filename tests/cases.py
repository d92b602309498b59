"""Hand-computed cases shared by the CLI tests and the torch tests, so the two cannot drift.

Each case is a tiny dump (one tuple per row: group, trajectory, turn, score, response tokens)
and the advantage each row must get, per (level, estimator). Expected values are written as the
arithmetic done by hand from the formulas in the README, not produced by advcli.

EPS is the default epsilon (1e-6), added to the std; std is the sample std (ddof=1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EPS = 1e-6


@dataclass(frozen=True)
class Case:
    name: str
    rows: list[tuple[object, object, int, float, int]]
    # (level, estimator) -> one expected advantage per row, in row order
    expected: dict[tuple[str, str], list[float]] = field(default_factory=dict)


# One group: a 1-turn success (score 1) and a 4-turn failure (score 0): the README's example.
# Turn level: scores [1, 0, 0, 0, 0], mean 1/5, squared deviations 0.64 + 4 * 0.04 = 0.8,
# variance 0.8 / 4 = 0.2. Trajectory level: scores [1, 0], mean 0.5, variance 0.5 / 1.
_TURN_STD = math.sqrt(0.2)
_TRAJ_STD = math.sqrt(0.5)
BIAS_EXAMPLE = Case(
    name="one_turn_success_four_turn_failure",
    rows=[
        (0, "success", 0, 1.0, 10),
        (0, "failure", 0, 0.0, 10),
        (0, "failure", 1, 0.0, 10),
        (0, "failure", 2, 0.0, 10),
        (0, "failure", 3, 0.0, 10),
    ],
    expected={
        ("turn", "grpo"): [0.8 / (_TURN_STD + EPS)] + [-0.2 / (_TURN_STD + EPS)] * 4,
        ("trajectory", "grpo"): [0.5 / (_TRAJ_STD + EPS)] + [-0.5 / (_TRAJ_STD + EPS)] * 4,
        ("turn", "drgrpo"): [0.8] + [-0.2] * 4,
        ("trajectory", "drgrpo"): [0.5] + [-0.5] * 4,
    },
)

# One trajectory of three turns is the whole group: a singleton at trajectory level (mean 0,
# std 1, so s / (1 + eps)), but three equal rows at turn level (std 0, advantage 0).
MULTI_TURN_SINGLETON = Case(
    name="multi_turn_singleton",
    rows=[(7, 0, 0, 2.0, 5), (7, 0, 1, 2.0, 5), (7, 0, 2, 2.0, 5)],
    expected={
        ("turn", "grpo"): [0.0, 0.0, 0.0],
        ("trajectory", "grpo"): [2.0 / (1 + EPS)] * 3,
        ("turn", "drgrpo"): [0.0, 0.0, 0.0],
        ("trajectory", "drgrpo"): [2.0] * 3,
    },
)

# A group of one row is a singleton at both levels.
SINGLE_ROW = Case(
    name="single_row_group",
    rows=[("only", "r", 0, -1.5, 3)],
    expected={
        ("turn", "grpo"): [-1.5 / (1 + EPS)],
        ("trajectory", "grpo"): [-1.5 / (1 + EPS)],
        ("turn", "drgrpo"): [-1.5],
        ("trajectory", "drgrpo"): [-1.5],
    },
)

# Every trajectory scores the same: std 0, advantage exactly 0 at both levels.
IDENTICAL_SCORES = Case(
    name="identical_scores",
    rows=[(1, 0, 0, 0.1, 4), (1, 1, 0, 0.1, 4), (1, 1, 1, 0.1, 4), (1, 2, 0, 0.1, 4)],
    expected={
        (level, estimator): [0.0] * 4
        for level in ("turn", "trajectory")
        for estimator in ("grpo", "drgrpo")
    },
)

# Mixed turn counts, rows out of order: trajectories a (score 1, 2 turns), b (0, 1 turn),
# c (0.5, 3 turns).
# Trajectory level: scores [1, 0, 0.5], mean 0.5, variance (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5.
# Turn level: scores [1, 1, 0, 0.5, 0.5, 0.5], mean 3.5 / 6 = 7/12; deviations 5/12 (x2), -7/12,
# -1/12 (x3); squared sum (2*25 + 49 + 3*1) / 144 = 102/144; variance 102/144 / 5 = 102/720.
_M = 7 / 12
_S = math.sqrt(102 / 720)
MIXED_TURNS = Case(
    name="mixed_turn_counts_unordered",
    rows=[
        ("g", "c", 1, 0.5, 6),
        ("g", "a", 0, 1.0, 2),
        ("g", "b", 0, 0.0, 8),
        ("g", "c", 0, 0.5, 6),
        ("g", "a", 1, 1.0, 2),
        ("g", "c", 2, 0.5, 6),
    ],
    expected={
        ("trajectory", "grpo"): [
            0.0,
            0.5 / (0.5 + EPS),
            -0.5 / (0.5 + EPS),
            0.0,
            0.5 / (0.5 + EPS),
            0.0,
        ],
        ("trajectory", "drgrpo"): [0.0, 0.5, -0.5, 0.0, 0.5, 0.0],
        ("turn", "grpo"): [
            (0.5 - _M) / (_S + EPS),
            (1 - _M) / (_S + EPS),
            (0 - _M) / (_S + EPS),
            (0.5 - _M) / (_S + EPS),
            (1 - _M) / (_S + EPS),
            (0.5 - _M) / (_S + EPS),
        ],
        ("turn", "drgrpo"): [0.5 - _M, 1 - _M, -_M, 0.5 - _M, 1 - _M, 0.5 - _M],
    },
)

# Two groups interleaved: each group's statistics use only its own units.
# Group 10: trajectories scoring 3 and 1 (mean 2, std sqrt(2)); group 20: 0 and 4 (mean 2,
# std sqrt(8)), the 4 spread over two turns.
TWO_GROUPS = Case(
    name="two_groups_interleaved",
    rows=[
        (10, 1, 0, 3.0, 1),
        (20, 1, 0, 0.0, 1),
        (10, 2, 0, 1.0, 1),
        (20, 2, 0, 4.0, 1),
        (20, 2, 1, 4.0, 1),
    ],
    expected={
        ("trajectory", "grpo"): [
            1 / (math.sqrt(2) + EPS),
            -2 / (math.sqrt(8) + EPS),
            -1 / (math.sqrt(2) + EPS),
            2 / (math.sqrt(8) + EPS),
            2 / (math.sqrt(8) + EPS),
        ],
        ("trajectory", "drgrpo"): [1.0, -2.0, -1.0, 2.0, 2.0],
        # Turn level, group 20: scores [0, 4, 4], mean 8/3, deviations -8/3, 4/3, 4/3,
        # squared sum (64 + 16 + 16) / 9 = 96/9, variance 48/9.
        ("turn", "grpo"): [
            1 / (math.sqrt(2) + EPS),
            (-8 / 3) / (math.sqrt(48 / 9) + EPS),
            -1 / (math.sqrt(2) + EPS),
            (4 / 3) / (math.sqrt(48 / 9) + EPS),
            (4 / 3) / (math.sqrt(48 / 9) + EPS),
        ],
        ("turn", "drgrpo"): [1.0, -8 / 3, -1.0, 4 / 3, 4 / 3],
    },
)

CASES = [BIAS_EXAMPLE, MULTI_TURN_SINGLETON, SINGLE_ROW, IDENTICAL_SCORES, MIXED_TURNS, TWO_GROUPS]


# verl-agent's invalid-action penalty (--traj-score own), as (group, trajectory, score) rows in
# collection order: t0's second step and t4's second lowered by 0.1. By hand: g0's first rows
# score 1.0 and 0.0 (mean 0.5, std sqrt(0.5)), each row centred on its own score; g1's first
# rows tie at 1.0 (std 0), so each row is divided by 1 + ε.
PENALIZED_ROWS = [
    ("g0", "t0", 1.0),
    ("g0", "t0", 0.9),
    ("g0", "t1", 0.0),
    ("g0", "t1", 0.0),
    ("g1", "t3", 1.0),
    ("g1", "t4", 1.0),
    ("g1", "t4", 0.9),
]
_G0_STD = math.sqrt(0.5) + EPS
PENALIZED_OWN_RULE = [
    0.5 / _G0_STD,
    0.4 / _G0_STD,
    -0.5 / _G0_STD,
    -0.5 / _G0_STD,
    0.0,
    0.0,
    -0.1 / (1 + EPS),
]


# grpo_loo by hand, epsilon 0: G [2, 4, 6, 8]: 2's others [4, 6, 8] (mean 6, sample std 2),
# so (2 - 6) / 2 = -2; 4's others [2, 6, 8] (mean 16/3, squared deviations 100/9, 4/9, 64/9,
# sample variance 84/9), so (4 - 16/3) / (sqrt(84) / 3) = -4 / sqrt(84); 6 and 8 mirror them.
# N [0.1, 0.1, 0.1, 0.7]: each 0.1's others [0.1, 0.1, 0.7] (mean 0.3, sample variance 0.12),
# so -0.2 / sqrt(0.12); 0.7's others tie (std 0): 0.7 - 0.1 undivided, never divided by the
# float residue a difference of squares leaves. P [1, 3]: undivided, -2 and 2. S alone: 0
# under --recipe nemo-rl (--singleton zero).
LOO_ROWS = [
    *(("G", f"g{i}", 0, score, 1) for i, score in enumerate([2.0, 4.0, 6.0, 8.0])),
    *(("N", f"n{i}", 0, score, 1) for i, score in enumerate([0.1, 0.1, 0.1, 0.7])),
    ("P", "p0", 0, 1.0, 1),
    ("P", "p1", 0, 3.0, 1),
    ("S", "s", 0, 5.0, 1),
]
LOO_BY_HAND = [
    -2.0,
    -4 / math.sqrt(84),
    4 / math.sqrt(84),
    2.0,
    *[-0.2 / math.sqrt(0.12)] * 3,
    0.6,
    -2.0,
    2.0,
    0.0,
]
# Others nearly tied: 0.5's others [0, 6.5e-48] and 0's [1, 1, 1 + 1e-9] have a std far below
# their group's (a difference from the group's sum of squares would lose it to rounding):
# 0.5 / (std + 1e-6) is about 5e5, and 0 - (1 + 1e-9 / 3) about -1e6.
LOO_NEAR_TIES = [
    ("A", "a0", 0, 0.5, 1),
    ("A", "a1", 0, 0.0, 1),
    ("A", "a2", 0, 6.498127503994593e-48, 1),
    ("B", "b0", 0, 1.0, 1),
    ("B", "b1", 0, 1.0, 1),
    ("B", "b2", 0, 1.0 + 1e-9, 1),
    ("B", "b3", 0, 0.0, 1),
]

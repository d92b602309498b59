"""Plain-Python reference for the advantages advcli computes, written from the specification.

No polars, numpy or advcli here on purpose: this file is the independent statement of the
math that the property tests hold advcli to. It favours obviousness over speed.

Input
-----
``rows`` is a list of tuples ``(group, trajectory, turn, score, tokens)`` in input order:
``group`` and ``trajectory`` are ints or strings, ``turn`` an int, ``score`` the row's score
(a float) and ``tokens`` the number of response tokens of the row (an int >= 0).

Output
------
One float per row, in row order.

Units
-----
At ``level="turn"`` every row is a unit, with its own score and tokens.
At ``level="trajectory"`` a unit is a trajectory: the pair ``(group, trajectory)``, so the same
trajectory id in two groups names two different trajectories. Its tokens are the sum of its
rows' tokens; its score is

* ``traj_score=None``: the score of its first row by turn order (all rows of a trajectory
  are then expected to carry the same score);
* ``"first"`` / ``"last"``: the score of the row with the smallest / largest ``turn``; ties on
  ``turn`` are broken by row order (a stable sort by turn: ``first`` takes the earliest row of
  the smallest turn, ``last`` the latest row of the largest turn);
* ``"mean"``, ``"max"``, ``"sum"``: of the scores of its rows.

The units of a group are the units sharing its group value; ``n`` is their number. Units are
ordered by their first row's position in the input ("row order"). Every row of a trajectory
gets its trajectory's advantage.

Group statistics
----------------
``mean_g`` is the mean of the unit scores of the group, ``std_g`` their unbiased sample std
(divide by ``n - 1``; ``std="population"``: divide by ``n``, np.std's and rLLM's). If every
unit of a group has exactly the same score, ``mean_g`` is that score and ``std_g`` is 0, so the
(grpo, drgrpo, rloo, grpo_passk) advantage is exactly 0.

Estimators (``s`` is the unit's score)
--------------------------------------
* ``grpo``: ``(s - mean_g) / (std_g + epsilon)``. ``scale="batch"`` divides by the sample std
  (ddof=1) of *all* units of the whole input plus ``epsilon`` instead; ``scale="none"`` gives
  ``s - mean_g``.
* ``drgrpo``: ``s - mean_g``.
* ``rloo``: ``s - mean(other units of the group)`` = ``n / (n - 1) * (s - mean_g)``.
* ``opo``: ``s - sum(len * s) / sum(len)`` over the group's units, ``len`` the unit's tokens;
  when every unit has the same score the baseline is that score (the zero-std rule: 0 for all);
  otherwise, if ``sum(len)`` over the group is 0 the baseline is 0.
* ``grpo_loo`` (NeMo-RL's default GRPO): ``c = s - mean(other units of the group)``, and
  ``sigma`` the std (``ddof``: divide by ``n - 2``; population: by ``n - 1``) of the group's
  *other* ``n - 1`` units, 0 when they all carry one score (always for ``n == 2``); the
  advantage is ``c / (sigma + epsilon)`` where ``sigma > 0``, else ``c`` undivided.
  ``scale="batch"`` divides ``c`` by the batch std plus ``epsilon`` as grpo does;
  ``scale="none"`` gives ``c``.
* ``grpo_passk``: only the unit with the highest score in its group (ties: the first in row
  order) gets ``s_max - s_second`` (``s_second`` is the second-highest unit score, equal to
  ``s_max`` when tied), divided by ``std_g + epsilon`` unless ``scale="none"``; every other
  unit gets 0. A group with one unit gives 0. ``scale="batch"`` divides by the std of all units
  of the whole input plus ``epsilon``, as for grpo.
* ``reinforce_pp_baseline``: ``s - mean_g`` broadcast to the rows, then whitened over all
  response tokens of the whole input: row ``r`` contributes ``tokens_r`` copies of its value
  ``x_r``; ``T = sum(tokens_r)``, ``mu = sum(tokens_r * x_r) / T``,
  ``var = sum(tokens_r * (x_r - mu) ** 2) / (T - 1)`` and the row's value is
  ``(x_r - mu) / sqrt(var + 1e-8)``, or 0 for a row with no response tokens (the value is
  multiplied by the mask). Undefined (``ValueError`` here) when ``T < 2``.

Singleton groups (``n == 1``)
-----------------------------
``singleton="raw"`` (default): grpo, grpo_loo, drgrpo and reinforce_pp_baseline use mean 0
and std 1, so grpo and grpo_loo give ``s / (1 + epsilon)`` (``s`` with ``scale="none"``; with
``scale="batch"`` the batch std replaces the 1 unless the batch std is 0), drgrpo ``s`` and
reinforce_pp_baseline ``s`` before whitening; rloo gives ``s``; opo gives ``s`` (baseline 0);
grpo_passk gives 0. ``singleton="zero"``: every estimator gives 0 to a singleton group's unit
(before whitening for reinforce_pp_baseline).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

Row = tuple[Hashable, Hashable, int, float, int]

LEVELS = ("turn", "trajectory")
ESTIMATORS = ("grpo", "drgrpo", "rloo", "opo", "grpo_passk", "grpo_loo", "reinforce_pp_baseline")
TRAJ_SCORES = ("first", "last", "mean", "max", "sum", "own")
SCALES = ("group", "batch", "none")
SINGLETONS = ("raw", "zero")

WHITEN_EPS = 1e-8


class _Unit:
    """One unit: the rows it covers (positions in the input), its score and its tokens."""

    def __init__(self, group: Hashable, positions: list[int], score: float, tokens: int) -> None:
        self.group = group
        self.positions = positions
        self.score = score
        self.tokens = tokens

    @property
    def first_position(self) -> int:
        return self.positions[0]


def _traj_score(rows: Sequence[Row], positions: list[int], rule: str | None) -> float:
    """The score of the trajectory made of ``rows[p]`` for ``p`` in ``positions`` (row order)."""
    scores = [rows[p][3] for p in positions]
    by_turn = sorted(positions, key=lambda p: rows[p][2])  # stable: ties stay in row order
    if rule is None or rule == "first":
        return rows[by_turn[0]][3]
    if rule == "last":
        return rows[by_turn[-1]][3]
    if rule == "mean":
        return math.fsum(scores) / len(scores)
    if rule == "max":
        return max(scores)
    if rule == "sum":
        return math.fsum(scores)
    raise ValueError(f"unknown traj_score rule {rule!r}")


def _units(rows: Sequence[Row], level: str, traj_score: str | None) -> list[_Unit]:
    """The units of the input, in row order of their first row."""
    if level == "turn":
        return [_Unit(row[0], [i], row[3], row[4]) for i, row in enumerate(rows)]
    if level != "trajectory":
        raise ValueError(f"unknown level {level!r}")
    positions: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i, row in enumerate(rows):
        positions.setdefault((row[0], row[1]), []).append(i)
    return [
        _Unit(
            key[0],
            pos,
            _traj_score(rows, pos, traj_score),
            sum(rows[p][4] for p in pos),
        )
        for key, pos in positions.items()  # dicts keep insertion order = row order
    ]


def _mean(values: Sequence[float]) -> float:
    if all(v == values[0] for v in values):
        return values[0]
    return math.fsum(values) / len(values)


def _std(values: Sequence[float], ddof: int = 1) -> float:
    """Unbiased sample std (ddof=1), or the population std (ddof=0); exactly 0 when all values
    are equal."""
    n = len(values)
    if n < 2:
        raise ValueError("the std of a group needs at least two values")
    if all(v == values[0] for v in values):
        return 0.0
    mean = _mean(values)
    deviations = [v - mean for v in values]
    # Scale by the largest deviation so that tiny (e.g. 1e-200) deviations do not underflow
    # when squared: the float64 std of such values is tiny but not 0.
    largest = max(abs(d) for d in deviations)
    if largest == 0.0:
        return 0.0
    return largest * math.sqrt(math.fsum((d / largest) ** 2 for d in deviations) / (n - ddof))


def _group_advantages(
    units: list[_Unit],
    *,
    estimator: str,
    epsilon: float,
    scale: str,
    singleton: str,
    batch_std: float | None,
    ddof: int,
) -> list[float]:
    """The advantage of each unit of one group (``units`` in row order)."""
    n = len(units)
    scores = [u.score for u in units]

    if n == 1:
        s = scores[0]
        if singleton == "zero" or estimator == "grpo_passk":
            return [0.0]
        if estimator in ("grpo", "grpo_loo") and scale == "batch" and batch_std:
            # The batch divisor every other unit shares (1 when it is 0: no other unit is then
            # divided, each being exactly 0).
            return [s / (batch_std + epsilon)]
        if estimator in ("grpo", "grpo_loo") and scale != "none":
            return [s / (1.0 + epsilon)]
        # drgrpo, grpo with scale "none", rloo, opo (baseline 0), reinforce_pp_baseline
        return [s]

    all_equal = all(v == scores[0] for v in scores)
    mean_g = _mean(scores)
    std_g = _std(scores, ddof)

    if estimator == "grpo":
        if all_equal:
            return [0.0] * n
        if scale == "none":
            return [s - mean_g for s in scores]
        divisor = (batch_std if scale == "batch" else std_g) + epsilon
        assert divisor > 0
        return [(s - mean_g) / divisor for s in scores]

    if estimator in ("drgrpo", "reinforce_pp_baseline"):
        if all_equal:
            return [0.0] * n
        return [s - mean_g for s in scores]

    if estimator == "rloo":
        if all_equal:
            return [0.0] * n
        total = math.fsum(scores)
        return [s - (total - s) / (n - 1) for s in scores]

    if estimator == "grpo_loo":
        out = []
        for i, s in enumerate(scores):
            others = scores[:i] + scores[i + 1 :]
            centred = s - _mean(others)
            if scale == "none" or centred == 0:
                out.append(centred)
            elif scale == "batch":
                out.append(centred / (batch_std + epsilon))
            else:
                sigma = 0.0 if len(others) < 2 else _std(others, ddof)
                out.append(centred / (sigma + epsilon) if sigma > 0 else centred)
        return out

    if estimator == "opo":
        total_len = sum(u.tokens for u in units)
        if len(set(scores)) == 1:
            baseline = scores[0]  # all units equal: the zero-std rule, whatever their tokens
        elif total_len == 0:
            baseline = 0.0
        else:
            baseline = math.fsum(u.tokens * u.score for u in units) / total_len
        return [s - baseline for s in scores]

    if estimator == "grpo_passk":
        best = 0
        for i, s in enumerate(scores):
            if s > scores[best]:  # strict: ties keep the first unit in row order
                best = i
        s_max = scores[best]
        s_second = max(s for i, s in enumerate(scores) if i != best)
        gap = s_max - s_second
        if scale != "none" and gap != 0:
            gap = gap / ((batch_std if scale == "batch" else std_g) + epsilon)
        out = [0.0] * n
        out[best] = gap
        return out

    raise ValueError(f"unknown estimator {estimator!r}")


def _whiten(values: list[float], tokens: list[int]) -> list[float]:
    """Token-weighted whitening: each row counts ``tokens`` times, variance with ddof=1."""
    total = sum(tokens)
    if total < 2:
        raise ValueError("whitening needs at least two response tokens in the input")
    mu = math.fsum(t * x for t, x in zip(tokens, values, strict=True)) / total
    var = math.fsum(t * (x - mu) ** 2 for t, x in zip(tokens, values, strict=True)) / (total - 1)
    denom = math.sqrt(var + WHITEN_EPS)
    # The whitened value times the row's mask: a row without response tokens gets 0.
    return [(x - mu) / denom if t > 0 else 0.0 for t, x in zip(tokens, values, strict=True)]


def reference_scores(
    rows: Sequence[Row], *, level: str, traj_score: str | None = None
) -> list[float]:
    """The score each row is judged by: its own at turn level and under the ``own`` rule, its
    trajectory's otherwise."""
    if traj_score == "own":
        return [row[3] for row in rows]
    out = [math.nan] * len(rows)
    for unit in _units(rows, level, traj_score):
        for p in unit.positions:
            out[p] = unit.score
    return out


def reference_advantages(
    rows: Sequence[Row],
    *,
    level: str,
    estimator: str,
    epsilon: float = 1e-6,
    traj_score: str | None = None,
    scale: str = "group",
    singleton: str = "raw",
    std: str = "sample",
) -> list[float]:
    """One advantage per row, in row order (see the module docstring for the semantics)."""
    ddof = {"sample": 1, "population": 0}[std]
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}")
    if singleton not in SINGLETONS:
        raise ValueError(f"unknown singleton {singleton!r}")
    if traj_score is not None and traj_score not in TRAJ_SCORES:
        raise ValueError(f"unknown traj_score {traj_score!r}")

    if traj_score == "own" and level == "trajectory":
        if singleton != "raw" or scale == "batch":
            raise ValueError("the own rule's reference takes singleton raw, scale group or none")
        return reference_own_score(
            [row[3] for row in rows],
            [row[0] for row in rows],
            [row[1] for row in rows],
            estimator="drgrpo" if scale == "none" else estimator,
            epsilon=epsilon,
            dedup=True,
            tie_std=1.0,
        )
    units = _units(rows, level, traj_score)
    by_group: dict[Hashable, list[_Unit]] = {}
    for unit in units:
        by_group.setdefault(unit.group, []).append(unit)

    batch_std = None
    if estimator in ("grpo", "grpo_passk", "grpo_loo") and scale == "batch" and len(units) > 1:
        batch_std = _std([u.score for u in units], ddof)

    out = [math.nan] * len(rows)
    for group_units in by_group.values():
        advantages = _group_advantages(
            group_units,
            estimator=estimator,
            epsilon=epsilon,
            scale=scale,
            singleton=singleton,
            batch_std=batch_std,
            ddof=ddof,
        )
        for unit, advantage in zip(group_units, advantages, strict=True):
            for p in unit.positions:
                out[p] = advantage

    if estimator == "reinforce_pp_baseline":
        out = _whiten(out, [row[4] for row in rows])
    return out


def reference_own_score(
    scores: Sequence[float],
    groups: Sequence[Hashable],
    trajectories: Sequence[Hashable] | None,
    *,
    estimator: str,
    epsilon: float = 1e-6,
    dedup: bool = False,
    tie_std: float = 0.0,
) -> list[float]:
    """``advcli.torch``'s semantics (verl's drop-in), grpo, drgrpo and rloo: a group's units are
    its rows or, with ``dedup``, the first row (in row order) of each ``(group, trajectory)``
    pair; every row is then normalized with its **own** score against its group's units. When
    the rows of each trajectory carry one score this is :func:`reference_advantages`.

    ``tie_std``: what grpo divides by (plus ε) in a group whose units tie (std 0): 0 is verl's
    (a row that differs from the tie gets its difference / ε), 1 advcli's ``--traj-score own``."""
    counted: dict[Hashable, list[float]] = {}
    seen: set[tuple[Hashable, Hashable]] = set()
    for i, (score, group) in enumerate(zip(scores, groups, strict=True)):
        if dedup:
            assert trajectories is not None
            if (group, trajectories[i]) in seen:
                continue
            seen.add((group, trajectories[i]))
        counted.setdefault(group, []).append(score)

    out = []
    for score, group in zip(scores, groups, strict=True):
        values = counted[group]
        n = len(values)
        # A lone unit: mean 0 and std 1 (verl's rule).
        mean, std = (0.0, 1.0) if n == 1 else (_mean(values), _std(values))
        if std == 0:
            std = tie_std
        centred = score - mean
        if estimator == "rloo":
            out.append(centred if n == 1 else n / (n - 1) * centred)
        elif estimator == "drgrpo":
            out.append(centred)
        elif estimator == "grpo":
            out.append(0.0 if centred == 0 else centred / (std + epsilon))
        else:
            raise ValueError(f"no own-score reference for {estimator!r}")
    return out

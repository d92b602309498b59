"""Plain-Python reference for per-turn rewards: reward-to-go and its step groupings.

No polars, numpy or advcli here on purpose: this is the independent statement of the formulas of
docs/per-turn-rewards.md that the per-turn engine is to be held to. Lists and loops, float64.

Input
-----
``rows`` is a list of tuples ``(group, trajectory, turn, reward)`` in input order. A trajectory
is the pair ``(group, trajectory)``; ``turn`` (int) orders its rows and must run through
consecutive integers (no gap, no repeat: ``ValueError`` otherwise); ``reward`` is the row's own
turn's reward ``r_t``.

Output: one float per row, in input order.

Reward-to-go
------------
Per trajectory, rows sorted by turn: ``G_t = r_t + gamma * G_{t+1}``, 0 past the last turn, so
``G_t = sum_{k >= t} gamma ** (k - t) * r_k``.

Groupings (the units normalized together; every unit's score is a ``G_t``)
-------------------------------------------------------------------------
* ``turn``: the rows of a group with one turn value.
* ``turn-padded``: the same over *all* trajectories of the group: a trajectory with no row at that
  turn value is a virtual member with score 0. Virtual members count in ``n``, the mean and the
  std; only real rows get an advantage.
* ``pooled``: every row of the group.
* ``trajectory``: one unit per trajectory, its score ``G`` at its first turn (the whole discounted
  return), the advantage broadcast to every row of the trajectory.

Estimators over the ``n`` units of one normalization group (``s`` a unit's score)
----------------------------------------------------------------------------------
advcli's rules (docs/estimators.md): ``grpo`` ``(s - mean) / (std + epsilon)`` with the sample std
(ddof 1, advcli's ``STD_DDOF``), ``drgrpo`` ``s - mean``, ``rloo`` ``s - mean of the other units``.
All units exactly equal: 0 (the zero-std rule). ``n == 1``: ``singleton="raw"`` keeps the score
(grpo ``s / (1 + epsilon)``, drgrpo and rloo ``s``), ``singleton="zero"`` gives 0.

Per-index normalized rewards, summed (``per_index_sum_advantages``)
-------------------------------------------------------------------
The construction of verl RFC #7244 and LightRFT's ``per_step_reward_mode=group_norm``: each turn
value's *rewards* ``r_t`` are normalized among the group's rows at that turn (the ``turn``
grouping applied to ``r`` instead of ``G``, with the estimator rules above), then summed into a
reward-to-go per trajectory: ``A_t = sum_{k >= t} gamma ** (k - t) * norm(r_k)``.
``lightrft_group_norm`` is the same with LightRFT's own normalization: over the ``m`` rows at a
turn value, ``(r - mean) / sqrt(population variance + 1e-9)`` (a lone row: 0).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

Row = tuple[Hashable, Hashable, int, float]

GROUPINGS = ("turn", "turn-padded", "pooled", "trajectory")
ESTIMATORS = ("grpo", "drgrpo", "rloo")
SINGLETONS = ("raw", "zero")
STD_DDOF = 1  # advcli's convention (advcli/settings/rules.py), as torch.std in verl


def _trajectories(rows: Sequence[Row]) -> dict[tuple[Hashable, Hashable], list[int]]:
    """Each trajectory's row positions sorted by turn, trajectories in order of first row."""
    found: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i, row in enumerate(rows):
        found.setdefault((row[0], row[1]), []).append(i)
    for key, positions in found.items():
        positions.sort(key=lambda p: rows[p][2])
        turns = [rows[p][2] for p in positions]
        if turns != list(range(turns[0], turns[0] + len(turns))):
            raise ValueError(f"trajectory {key!r}: turns {turns} have a gap or a repeat")
    return found


def reward_to_go(rows: Sequence[Row], gamma: float = 1.0) -> list[float]:
    """``G_t`` of every row, in input order."""
    out = [math.nan] * len(rows)
    for positions in _trajectories(rows).values():
        following = 0.0
        for p in reversed(positions):
            following = rows[p][3] + gamma * following
            out[p] = following
    return out


def normalize(
    scores: Sequence[float], estimator: str, singleton: str, epsilon: float
) -> list[float]:
    """The advantage of each unit of one normalization group, in the given order."""
    n = len(scores)
    if n == 1:
        if singleton == "zero":
            return [0.0]
        return [scores[0] / (1.0 + epsilon)] if estimator == "grpo" else [scores[0]]
    if all(s == scores[0] for s in scores):
        return [0.0] * n
    total = math.fsum(scores)
    mean = total / n
    if estimator == "drgrpo":
        return [s - mean for s in scores]
    if estimator == "rloo":
        return [s - (total - s) / (n - 1) for s in scores]
    if estimator == "grpo":
        std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / (n - STD_DDOF))
        return [(s - mean) / (std + epsilon) for s in scores]
    raise ValueError(f"unknown estimator {estimator!r}")


def _check(estimator: str, singleton: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}")
    if singleton not in SINGLETONS:
        raise ValueError(f"unknown singleton {singleton!r}")


def _by_turn(
    rows: Sequence[Row], values: Sequence[float], padded: bool
) -> list[tuple[list[int], list[float]]]:
    """Per group and turn value: the real rows' positions and the units' scores (the real rows'
    values first, then one 0 per virtual member when ``padded``)."""
    trajectories = _trajectories(rows)
    members: dict[Hashable, int] = {}
    for group, _ in trajectories:
        members[group] = members.get(group, 0) + 1
    cells: dict[tuple[Hashable, int], list[int]] = {}
    for i, row in enumerate(rows):
        cells.setdefault((row[0], row[2]), []).append(i)
    out = []
    for (group, _), positions in cells.items():
        scores = [values[p] for p in positions]
        if padded:
            scores += [0.0] * (members[group] - len(positions))
        out.append((positions, scores))
    return out


def advantages(
    rows: Sequence[Row],
    grouping: str,
    estimator: str,
    gamma: float = 1.0,
    singleton: str = "raw",
    epsilon: float = 1e-6,
) -> list[float]:
    """One advantage per row, in input order (see the module docstring)."""
    _check(estimator, singleton)
    returns = reward_to_go(rows, gamma)
    out = [math.nan] * len(rows)
    if grouping in ("turn", "turn-padded"):
        for positions, scores in _by_turn(rows, returns, grouping == "turn-padded"):
            real = normalize(scores, estimator, singleton, epsilon)[: len(positions)]
            for p, a in zip(positions, real, strict=True):  # virtual members get nothing
                out[p] = a
    elif grouping == "pooled":
        groups: dict[Hashable, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row[0], []).append(i)
        for positions in groups.values():
            scores = [returns[p] for p in positions]
            found = normalize(scores, estimator, singleton, epsilon)
            for p, a in zip(positions, found, strict=True):
                out[p] = a
    elif grouping == "trajectory":
        per_group: dict[Hashable, list[list[int]]] = {}
        for (group, _), positions in _trajectories(rows).items():
            per_group.setdefault(group, []).append(positions)
        for trajectories in per_group.values():
            scores = [returns[positions[0]] for positions in trajectories]
            found = normalize(scores, estimator, singleton, epsilon)
            for positions, a in zip(trajectories, found, strict=True):
                for p in positions:
                    out[p] = a
    else:
        raise ValueError(f"unknown grouping {grouping!r}")
    return out


def per_index_sum_advantages(
    rows: Sequence[Row],
    estimator: str,
    gamma: float = 1.0,
    singleton: str = "raw",
    epsilon: float = 1e-6,
) -> list[float]:
    """Each turn value's rewards normalized among the group's rows at it, then summed into a
    reward-to-go; one value per row, in input order."""
    _check(estimator, singleton)
    normalized = [math.nan] * len(rows)
    for positions, scores in _by_turn(rows, [row[3] for row in rows], padded=False):
        found = normalize(scores, estimator, singleton, epsilon)
        for p, a in zip(positions, found, strict=True):
            normalized[p] = a
    relabelled = [(g, t, k, a) for (g, t, k, _), a in zip(rows, normalized, strict=True)]
    return reward_to_go(relabelled, gamma)


LIGHTRFT_VARIANCE_EPSILON = 1e-9  # LightRFT's _apply_step_reward_group_norm: sqrt(var + 1e-9)


def lightrft_group_norm(rows: Sequence[Row], gamma: float = 1.0) -> list[float]:
    """LightRFT's per_step_reward_mode=group_norm: per group and turn value, the rewards of the
    rows there centred on their mean and divided by sqrt(population variance + 1e-9), then
    summed into a reward-to-go; one value per row, in input order."""
    normalized = [math.nan] * len(rows)
    for positions, scores in _by_turn(rows, [row[3] for row in rows], padded=False):
        m = len(scores)
        mean = math.fsum(scores) / m
        variance = math.fsum((s - mean) ** 2 for s in scores) / m
        for p, s in zip(positions, scores, strict=True):
            normalized[p] = (s - mean) / math.sqrt(variance + LIGHTRFT_VARIANCE_EPSILON)
    relabelled = [(g, t, k, a) for (g, t, k, _), a in zip(rows, normalized, strict=True)]
    return reward_to_go(relabelled, gamma)

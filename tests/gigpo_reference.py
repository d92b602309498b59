"""Plain-Python reference for GiGPO's advantage, ``A = w_E * A_episode + omega * A_step``.

Written from the formulas of Group-in-Group Policy Optimization (Feng et al. 2025) and from what
each peer's released code does, with no polars, numpy, torch or advcli: this file is the
independent statement that advcli's gigpo estimator is held to. It favours obviousness over speed
and computes in float64 (the peers compute in float32; see "Exact ties" below).

Input
-----
``rows`` is a list of :class:`GigpoRow` ``(group, trajectory, turn, score, anchor, step_reward)``
in input order, one per step of a trajectory:

* ``group`` (the prompt / task group) and ``trajectory`` are ints or strings; a trajectory is the
  pair ``(group, trajectory)``, so the same trajectory id in two groups names two trajectories;
* ``turn`` (int) orders the steps of a trajectory (a stable sort: equal turns keep row order);
* ``score`` is the row's episode score, its ``sum(token_level_rewards)``; verl-agent's
  invalid-action penalty is already subtracted, so the rows of one trajectory may differ;
* ``anchor`` is the hashable anchor state (str, int or tuple), compared by Python equality;
* ``step_reward`` is the step's immediate environment reward ``r_t`` (penalty subtracted too).

Output: one float per row, in row order.

Step returns
------------
Per trajectory, its rows sorted by turn: ``R_t = r_t + gamma * R_{t+1}``, ``R`` past the last
step being 0 (the discount counts positions, not turn values). ``step_returns_given=``
replaces them with given per-row returns (a dump's already discounted column).

Normalization ``norm`` of a value ``x`` against a group's counted values (``n >= 2``)
---------------------------------------------------------------------------------------------
``mu`` is their mean, ``sigma`` their unbiased sample std (divide by ``n - 1``), ``epsilon``
1e-6 unless given:

* ``"mean"``: ``x - mu`` (verl-agent ``mean_norm``; ROLL ``mean``);
* ``"mean_std"``: ``(x - mu) / (sigma + epsilon)`` (verl-agent ``mean_std_norm``; Trinity
  ``fnorm="std"``; ROLL ``mean_std``);
* ``"mean_one"``: ``(x - mu) / (1 + epsilon)`` (Trinity ``fnorm="none"``, its default).

``min_std`` (ROLL): with ``"mean_std"``, a group whose ``sigma <= min_std`` gives 0 to all its
rows.

Exact ties: when every counted value of a group is the same, ``mu`` is that value and
``sigma`` is 0 exactly, so a row whose own value equals it gets exactly 0. The peers compute
``mu`` in float32, where the mean of equal values can miss them by an ulp; in ``mean_std``
that ulp is then divided by ``epsilon`` (Trinity 0.6.0 gives 0.056 to each row of a group
of three 0.9s). The reference does not reproduce that rounding.

Episode term
------------
The episode groups are the ``group`` values. ``level="turn"``: every row is counted, with its
own ``score``, and is normalized with it. ``level="trajectory"``: ``traj_score`` says which
values are counted and which value each row is normalized with:

* ``"mean"``: one value per trajectory, the mean of its rows' scores (a verl-agent episode's
  reward less its share of penalties); each row gets its trajectory's advantage;
* ``"step_sum"``: one value per trajectory, ``R(tau) = sum of its step rewards`` (Trinity; the
  ``score`` column is not read); each row gets its trajectory's advantage;
* ``"own"``: verl-agent's ``compute_mean_std_cross_steps=False``: the counted values are the
  scores of the first row *in row order* of each trajectory, and each row is normalized with its
  own score against them. With the penalty, a group whose first rows tie (``sigma = 0``) gives a
  penalized later row ``-0.1 / epsilon = -1e5`` in ``mean_std``: reproduced here on purpose.

A lone episode group (one counted value), ``singleton``: ``"raw"`` uses mean 0 and scale 1,
so the row gets ``x`` with ``"mean"`` and ``x / (1 + epsilon)`` otherwise (verl-agent and
Trinity); ``"zero"`` gives 0 (ROLL; advcli's ``--singleton zero``).

Step term
---------
Step groups are the rows with equal ``anchor``: within each ``group`` (``anchor_scope="group"``,
verl-agent: no turn or trajectory constraint, so a state revisited inside one trajectory shares
its group) or across the whole input (``"batch"``: Trinity by ``env_state_hash``, ROLL by
``state_hash``). Every row of a step group is counted, with its step return, and normalized with
it (``norm`` and ``min_std`` as for the episode term). A step group of one row gives 0.

Recipes (:data:`RECIPES`, run by :func:`gigpo_recipe`)
----------------------------------------------------
Each fixes the structure; ``norm``, ``gamma``, ``omega`` and ``episode_weight`` stay parameters.

* ``"verl-agent upstream"``: ``level="turn"``, ``anchor_scope="group"``, ``singleton="raw"``,
  ``norm`` in ``mean`` | ``mean_std``, ``min_std=None`` (no episode weight: 1). What
  langfengQ/verl-agent's ``compute_gigpo_outcome_advantage`` computes (its episode statistics
  take every row: ``compute_mean_std_cross_steps`` keeps its default True); yaml defaults
  ``mean_norm``, ``gamma=1.0``, ``step_advantage_w=1.0``; the AlfWorld example uses
  ``mean_std_norm`` and ``gamma=0.95``. verl-agent discounts along each ``traj_uid`` (unique
  across groups) in row order: the same returns when its rows come in turn order.
* ``"verl-agent with trajectory counting"``: as upstream but ``level="trajectory"``,
  ``traj_score="mean"``: each trajectory counted once, its rows sharing one advantage.
* ``"verl-agent keyword"`` (a variant, not a recipe for advcli): as upstream but
  ``level="trajectory"``, ``traj_score="own"``: verl-agent with the keyword flipped, -1e5 included.
* ``"Trinity-RFT"``: ``level="trajectory"``, ``traj_score="step_sum"``, ``anchor_scope="batch"``,
  ``singleton="raw"``, ``norm`` in ``mean_one`` (``fnorm="none"``, default) | ``mean_std``
  (``fnorm="std"``), ``min_std=None`` (no episode weight: 1); Trinity-RFT 0.6.0's
  ``GiGPOAdvantageFn`` (defaults ``omega=1.0``, ``gamma=1.0``, ``epsilon=1e-6``), for rows whose
  anchors are all of one type (Trinity buckets anchors by ``str(anchor)``: 1 and "1" meet).
  Trinity's experience fields: ``eid.task`` the group, ``eid.run`` the trajectory, ``eid.step``
  the turn, ``info["step_reward"]`` and ``info["env_state_hash"]``. Not modelled: a run with no
  ``step_reward`` (Trinity then gives the last step ``exp.reward`` and the others 0) and a step
  with no ``env_state_hash`` (``A_step = 0``).
* ``"ROLL"``: ``level="turn"``, ``anchor_scope="batch"``, ``singleton="zero"``, ``norm`` in
  ``mean`` | ``mean_std``, ``min_std=1e-6``; ``episode_weight`` and ``omega`` are ROLL's
  ``episode_reward_weight`` and ``step_reward_weight``, ``gamma`` its ``step_reward_gamma``
  (its GiGPO guide: 1.0, 1.0, 0.95, ``reward_normalization`` ``grouping: traj_group_id``,
  ``method: mean``). One normalization serves both terms (``roll/pipeline/agentic/utils.py``,
  ``agentic_reward_norm``, alibaba/ROLL 8eb27cc): its ``mean_std`` gives 0 to a group of one or
  with ``sigma <= 1e-6``, its ``mean`` (``x - mu``, no epsilon) gives a group of one 0 anyway;
  the step term's groups are ``state_group_id``, the bare ``state_hash``. The episode groups are
  ``traj_group_id`` (``grouping: batch`` would make the episode term batch-wide: not modelled).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from reference import _mean, _std

LEVELS = ("turn", "trajectory")
TRAJ_SCORES = ("mean", "step_sum", "own")
NORMS = ("mean", "mean_std", "mean_one")
ANCHOR_SCOPES = ("group", "batch")
SINGLETONS = ("raw", "zero")


class GigpoRow(NamedTuple):
    """One step of a trajectory (see the module docstring)."""

    group: Hashable
    trajectory: Hashable
    turn: int
    score: float
    anchor: Hashable
    step_reward: float


@dataclass(frozen=True)
class Recipe:
    """A peer's structure: everything but ``norm`` (one of ``norms``), gamma and the weights."""

    level: str
    traj_score: str | None
    anchor_scope: str
    singleton: str
    min_std: float | None
    norms: tuple[str, ...]


RECIPES = {
    "verl-agent upstream": Recipe("turn", None, "group", "raw", None, ("mean", "mean_std")),
    "verl-agent with trajectory counting": Recipe(
        "trajectory", "mean", "group", "raw", None, ("mean", "mean_std")
    ),
    "verl-agent keyword": Recipe("trajectory", "own", "group", "raw", None, ("mean", "mean_std")),
    "Trinity-RFT": Recipe("trajectory", "step_sum", "batch", "raw", None, ("mean_one", "mean_std")),
    "ROLL": Recipe("turn", None, "batch", "zero", 1e-6, ("mean", "mean_std")),
}


def trajectories(rows: Sequence[GigpoRow]) -> dict[tuple[Hashable, Hashable], list[int]]:
    """Each trajectory's row positions sorted by turn (stable), trajectories in row order."""
    positions: dict[tuple[Hashable, Hashable], list[int]] = {}
    for i, row in enumerate(rows):
        positions.setdefault((row.group, row.trajectory), []).append(i)
    return {key: sorted(pos, key=lambda p: rows[p].turn) for key, pos in positions.items()}


def step_returns(rows: Sequence[GigpoRow], gamma: float) -> list[float]:
    """``R_t = r_t + gamma * R_{t+1}`` along each trajectory in turn order, one per row."""
    out = [0.0] * len(rows)
    for positions in trajectories(rows).values():
        running = 0.0
        for p in reversed(positions):
            running = rows[p].step_reward + gamma * running
            out[p] = running
    return out


def normalized(
    x: float,
    counted: Sequence[float],
    *,
    norm: str,
    epsilon: float,
    min_std: float | None,
) -> float:
    """``x`` normalized against a group's ``counted`` values (at least two of them)."""
    mu = _mean(counted)
    sigma = _std(counted)
    if norm == "mean_std" and min_std is not None and sigma <= min_std:
        return 0.0
    centred = x - mu
    if centred == 0.0:  # also with epsilon 0 in a tied group
        return 0.0
    if norm == "mean":
        return centred
    if norm == "mean_one":
        return centred / (1.0 + epsilon)
    if norm == "mean_std":
        return centred / (sigma + epsilon)
    raise ValueError(f"unknown norm {norm!r}")


def episode_terms(
    rows: Sequence[GigpoRow],
    *,
    level: str,
    traj_score: str | None,
    norm: str,
    singleton: str,
    epsilon: float = 1e-6,
    min_std: float | None = None,
) -> list[float]:
    """``A_episode`` of each row (see "Episode term")."""
    # Each row's own value, and the values its group counts.
    own: list[float] = []
    counted: dict[Hashable, list[float]] = {}
    if level == "turn":
        own = [row.score for row in rows]
        for row in rows:
            counted.setdefault(row.group, []).append(row.score)
    elif level == "trajectory" and traj_score == "own":
        own = [row.score for row in rows]
        seen: set[tuple[Hashable, Hashable]] = set()
        for row in rows:  # row order: verl-agent counts the first row it meets
            if (row.group, row.trajectory) not in seen:
                seen.add((row.group, row.trajectory))
                counted.setdefault(row.group, []).append(row.score)
    elif level == "trajectory" and traj_score in ("mean", "step_sum"):
        own = [0.0] * len(rows)
        for (group, _), positions in trajectories(rows).items():
            if traj_score == "mean":
                value = _mean([rows[p].score for p in positions])
            else:
                value = sum(rows[p].step_reward for p in positions)
            counted.setdefault(group, []).append(value)
            for p in positions:
                own[p] = value
    else:
        raise ValueError(f"unknown level / traj_score {level!r} / {traj_score!r}")

    out = []
    for row, x in zip(rows, own, strict=True):
        values = counted[row.group]
        if len(values) > 1:
            out.append(normalized(x, values, norm=norm, epsilon=epsilon, min_std=min_std))
        elif singleton == "zero":
            out.append(0.0)
        else:  # "raw": mean 0, scale 1
            out.append(x if norm == "mean" else x / (1.0 + epsilon))
    return out


def step_terms(
    rows: Sequence[GigpoRow],
    returns: Sequence[float],
    *,
    anchor_scope: str,
    norm: str,
    epsilon: float = 1e-6,
    min_std: float | None = None,
) -> list[float]:
    """``A_step`` of each row from its step return (see "Step term")."""
    if anchor_scope == "group":
        keys: list[Hashable] = [(row.group, row.anchor) for row in rows]
    elif anchor_scope == "batch":
        keys = [row.anchor for row in rows]
    else:
        raise ValueError(f"unknown anchor_scope {anchor_scope!r}")
    members: dict[Hashable, list[float]] = {}
    for key, value in zip(keys, returns, strict=True):
        members.setdefault(key, []).append(value)
    return [
        normalized(value, members[key], norm=norm, epsilon=epsilon, min_std=min_std)
        if len(members[key]) > 1
        else 0.0
        for key, value in zip(keys, returns, strict=True)
    ]


def gigpo_advantages(  # noqa: PLR0913
    rows: Sequence[GigpoRow],
    *,
    level: str,
    norm: str,
    gamma: float,
    anchor_scope: str,
    traj_score: str | None = None,
    singleton: str = "raw",
    omega: float = 1.0,
    episode_weight: float = 1.0,
    epsilon: float = 1e-6,
    min_std: float | None = None,
    step_returns_given: Sequence[float] | None = None,
) -> list[float]:
    """``episode_weight * A_episode + omega * A_step`` per row, in row order."""
    if level not in LEVELS or norm not in NORMS or singleton not in SINGLETONS:
        raise ValueError(f"unknown level / norm / singleton {level!r} / {norm!r} / {singleton!r}")
    if level == "trajectory" and traj_score not in TRAJ_SCORES:
        raise ValueError(f"unknown traj_score {traj_score!r}")
    if anchor_scope not in ANCHOR_SCOPES:
        raise ValueError(f"unknown anchor_scope {anchor_scope!r}")
    episode = episode_terms(
        rows,
        level=level,
        traj_score=traj_score,
        norm=norm,
        singleton=singleton,
        epsilon=epsilon,
        min_std=min_std,
    )
    returns = step_returns(rows, gamma) if step_returns_given is None else step_returns_given
    step = step_terms(
        rows, returns, anchor_scope=anchor_scope, norm=norm, epsilon=epsilon, min_std=min_std
    )
    return [episode_weight * e + omega * s for e, s in zip(episode, step, strict=True)]


def gigpo_recipe(
    rows: Sequence[GigpoRow],
    recipe: str,
    *,
    norm: str,
    gamma: float,
    omega: float = 1.0,
    episode_weight: float = 1.0,
    epsilon: float = 1e-6,
    step_returns_given: Sequence[float] | None = None,
) -> list[float]:
    """:func:`gigpo_advantages` with a named peer's structure (:data:`RECIPES`)."""
    spec = RECIPES[recipe]
    if norm not in spec.norms:
        raise ValueError(f"{recipe} has no norm {norm!r}; it has {spec.norms}")
    return gigpo_advantages(
        rows,
        level=spec.level,
        traj_score=spec.traj_score,
        norm=norm,
        gamma=gamma,
        anchor_scope=spec.anchor_scope,
        singleton=spec.singleton,
        omega=omega,
        episode_weight=episode_weight,
        epsilon=epsilon,
        min_std=spec.min_std,
        step_returns_given=step_returns_given,
    )

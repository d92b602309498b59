"""`advcli inspect`: what a user should know about a dump before computing advantages.

:func:`inspect_dump` reads only the key projection (keys, score, mask lengths) and returns a JSON-
ready dict; the soft problems that ``compute`` would refuse at trajectory level (rows of one
trajectory with different scores, repeated turns) are counted and listed here, not raised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import polars as pl

from advcli.advantages.statistics import group_statistics
from advcli.advantages.unit_scores import Naming, build_units, scores_disagree
from advcli.advantages.units import Trajectories, index_trajectories
from advcli.keys import (
    ANCHOR,
    GROUP,
    LAST_STEP,
    ROW,
    SCORE,
    TOKENS,
    TRAJECTORY,
    TURN,
    repeated_turns,
)
from advcli.report.figures import histogram, number
from advcli.report.step_credit import step_group_figures
from advcli.settings.config import AdvantageConfig, AnchorScope, Level, TrajScore

# How many offending trajectories or turns are listed by key.
EXAMPLES = 5
# Up to this many distinct scores, the report lists each with its count.
DISTINCT_SCORES_LISTED = 10


class Roles(Protocol):
    """What the inspection reads of stage 1's column roles
    (:class:`advcli.read.columns.ColumnRoles`): each role's column, the trainer's layout and
    why each column was chosen. A protocol, so that the report room does not import stage 1."""

    @property
    def group(self) -> str | None: ...
    @property
    def trajectory(self) -> str | None: ...
    @property
    def turn(self) -> str | None: ...
    @property
    def reward(self) -> str: ...
    @property
    def mask(self) -> str | None: ...
    @property
    def anchor(self) -> str | None: ...
    @property
    def trainer(self) -> str | None: ...
    @property
    def own_scores_of(self) -> str | None: ...
    @property
    def trainer_advantage(self) -> str | None: ...
    @property
    def left_out(self) -> str | None: ...
    @property
    def reward_removed(self) -> str | None: ...
    @property
    def padding_label(self) -> str: ...
    @property
    def traj_score_rule(self) -> tuple[Any, str] | None: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def reasons(self) -> Mapping[str, str]: ...
    def read_as(self) -> str: ...


# The roles the inspection lists only where the dump has them.
_ROLES_IF_READ = ("anchor", "trainer_advantage")


def _inconsistent_trajectories(
    projection: pl.DataFrame, trajectories: Trajectories, columns: Roles
) -> dict[str, Any]:
    """How many trajectories' rows disagree on the score, the rule compute scores them by, and
    the first few, each with its rows' distinct scores in input order."""
    disagree = scores_disagree(pl.col("score_min"), pl.col("score_max"))
    inconsistent = trajectories.table.with_row_index("position").filter(disagree)
    examples = inconsistent.head(EXAMPLES)
    scores = (
        projection.select(pl.Series("position", trajectories.of_row), SCORE)
        .filter(pl.col("position").is_in(examples["position"].implode()))
        .group_by("position", maintain_order=True)
        .agg(pl.col(SCORE).unique(maintain_order=True).alias("scores"))
    )
    examples = examples.join(scores, on="position", how="left", maintain_order="left")
    return {
        "count": inconsistent.height,
        "rule": _disagreeing_scores_rule(columns, LAST_STEP in projection.columns),
        "examples": [
            {"group": r[GROUP], "trajectory": r[TRAJECTORY], "scores": r["scores"]}
            for r in examples.iter_rows(named=True)
        ],
    }


def _disagreeing_scores_rule(columns: Roles, last_step: bool) -> str:
    """What compute does with a trajectory whose rows' scores disagree in this dump."""
    if last_step:
        return f"scored by its last step's reward, {columns.trainer}'s rule"
    if columns.own_scores_of is not None:
        return f"scored by {columns.own_scores_of}'s own rule (--traj-score own)"
    if columns.traj_score_rule is not None:
        rule, why = columns.traj_score_rule
        return f"{why} (--traj-score {rule.value})"
    return "compute asks for a --traj-score rule"


def inspect_dump(
    projection: pl.DataFrame,
    columns: Roles,
    *,
    inputs: list[str],
    input_format: str,
    locate: Callable[[int], str],
    padding_rows: int = 0,
    anchor_scope: AnchorScope = AnchorScope.GROUP,
    trainer_advantages: pl.Series | None = None,
) -> dict[str, Any]:
    """The inspection report of a checked key projection (docs/inspect.md has every key), with
    the padding rows stage 1 left out and its step groups under ``anchor_scope``;
    ``trainer_advantages``: the trainer's own advantage of each of its rows, where the dump
    holds them. Of a dump without rewards (``columns.reward_removed``) the figures of scores
    are None."""
    scored = columns.reward_removed is None
    if not scored:
        # The units are counted alike whatever their scores: a stand-in no figure reports.
        projection = projection.with_columns(pl.lit(0.0).alias(SCORE))
    # The figures over rows first, while the projection is all that is held: the trajectory
    # index and its units are not yet made when their hash tables and sorted copies are.
    duplicates = _duplicate_turns(projection, locate)
    score_summary = _score_summary(projection[SCORE]) if scored else None
    tokens_known = columns.mask is not None
    counts = {
        "rows": projection.height,
        # Unknown (null) without a mask column, rather than 0.
        "tokens": int(projection[TOKENS].sum()) if tokens_known else None,
        "empty_responses": int((projection[TOKENS] == 0).sum()) if tokens_known else None,
    }
    # The trajectories and groups as stage 2 sees them at trajectory level (score of the first
    # turn, or SkyRL's last step, or the trainer's own rule its dump says; turns, tokens; each
    # group's units, singleton and zero-std rules) ...
    traj_score = None if LAST_STEP in projection.columns else TrajScore.FIRST
    if traj_score is not None and columns.traj_score_rule is not None:
        traj_score = columns.traj_score_rule[0]
    config = AdvantageConfig(level=Level.TRAJECTORY, traj_score=traj_score)
    trajectories = index_trajectories(projection)
    naming = Naming(columns.group or GROUP, columns.trajectory or TRAJECTORY, locate)
    per_trajectory = build_units(projection, config, naming, trajectories)
    per_group = group_statistics(per_trajectory)
    singleton = per_group.filter(pl.col("units") == 1)
    zero_std = per_group.filter(pl.col("zero_std"))
    # ... and the trajectories whose rows' scores disagree.
    inconsistent = _inconsistent_trajectories(projection, trajectories, columns)
    del trajectories

    # Each trajectory counted once (its score as compute reads it when its rows agree, or, in
    # SkyRL's dumps, always): a success rate over rows overweights long trajectories.
    trajectory_scores = _score_summary(per_trajectory[SCORE]) if scored else None

    turns = per_trajectory["turns"]
    summary = {
        "inputs": {
            "files": inputs,
            "format": input_format,
            "trainer": columns.trainer,
            "read_as": columns.read_as(),
            "notes": list(columns.notes),
        },
        "columns": {
            role: {"column": getattr(columns, role), "why": columns.reasons.get(role, "")}
            for role in ("group", "trajectory", "turn", "reward", "mask", *_ROLES_IF_READ)
            if role not in _ROLES_IF_READ or getattr(columns, role) is not None
        },
        "counts": {
            "rows": counts["rows"],
            "groups": per_group.height,
            "trajectories": per_trajectory.height,
            "tokens": counts["tokens"],
            "empty_responses": counts["empty_responses"],
        },
        "turns_per_trajectory": {
            "min": int(turns.min()),  # type: ignore[arg-type]
            "median": float(turns.median()),  # type: ignore[arg-type]
            "max": int(turns.max()),  # type: ignore[arg-type]
            "histogram": histogram(turns),
        },
        "scores": score_summary,
        "trajectory_scores": trajectory_scores,
        "singleton_groups": _groups_found(singleton),
        "zero_std_groups": _groups_found(zero_std) if scored else None,
        "inconsistent_trajectories": inconsistent if scored else None,
        "duplicate_turns": duplicates,
        "padding_rows": padding_rows,
        **({"padding_label": columns.padding_label} if columns.left_out is not None else {}),
        **(
            {"trainer_advantages": _advantage_summary(trainer_advantages)}
            if trainer_advantages is not None
            else {}
        ),
        **({"reward_removed": columns.reward_removed} if not scored else {}),
    }
    return summary | _step_groups(projection, anchor_scope)


def _groups_found(groups: pl.DataFrame) -> dict[str, Any]:
    """How many groups a check found, and the first few."""
    return {"count": groups.height, "examples": groups[GROUP].head(EXAMPLES).to_list()}


def _step_groups(projection: pl.DataFrame, scope: AnchorScope) -> dict[str, Any]:
    """GiGPO's step groups when the dump has an anchor, under ``scope``."""
    if ANCHOR not in projection.columns:
        return {}
    return {"step_groups": step_group_figures(projection, scope)}


def _duplicate_turns(projection: pl.DataFrame, locate: Callable[[int], str]) -> dict[str, Any]:
    """How many rows repeat an earlier row's ``(group, trajectory, turn)``, and the first few."""
    if TURN not in projection.columns:
        return {"count": 0, "examples": []}
    repeated = repeated_turns(projection)
    return {
        "count": repeated.height,
        "examples": [
            {
                "group": r[GROUP],
                "trajectory": r[TRAJECTORY],
                "turn": r[TURN],
                "where": locate(r[ROW]),
            }
            for r in repeated.head(EXAMPLES).iter_rows(named=True)
        ],
    }


def _advantage_summary(advantages: pl.Series) -> dict[str, Any]:
    """The trainer's advantages as scores are summed up, over the rows that have one, and how
    many rows have none (a trace prime-rl did not train on, a sample slime's train file lacks)."""
    known = advantages.drop_nulls()
    summary = _score_summary(known) if known.len() else {}
    return {**summary, "rows": known.len(), "rows_without": advantages.null_count()}


def _score_summary(scores: pl.Series) -> dict[str, Any]:
    """min, max, mean, std and the distinct count of ``scores``, with each value's count when
    they are few, else quantiles."""
    distinct = scores.n_unique()
    summary: dict[str, Any] = {
        "min": number(scores.min()),
        "max": number(scores.max()),
        "mean": number(scores.mean()),
        "std": number(scores.std()),
        "distinct": distinct,
    }
    if distinct <= DISTINCT_SCORES_LISTED:
        counts = scores.value_counts(sort=True)
        summary["values"] = {
            f"{value:g}": count for value, count in counts.sort(scores.name).iter_rows()
        }
    else:
        summary["quantiles"] = {
            f"p{q}": number(scores.quantile(q / 100)) for q in (10, 25, 50, 75, 90)
        }
    return summary

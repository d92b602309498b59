"""GiGPO's step-credit report: how much signal the step groups carry on a dump.

:func:`step_group_figures` needs only the anchors (``inspect`` shows it too): the step groups'
sizes, the rows in step groups of one (their ``A_step`` is 0), the hit ratio and the anchors
shared across task groups. :func:`step_credit` adds what needs the gigpo result: step groups
whose returns tie, the episode and step terms' sizes (overall and by turn index), the settings
the step term used, and the judgement (:data:`STEP_THRESHOLDS`, :func:`step_assessment`).
:func:`penalty_hazard` finds the groups where verl-agent's trajectory counting would divide a
penalized row by ε. docs/compare.md ("Step credit") defines every key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from advcli.advantages.statistics import batch_key
from advcli.advantages.units import Trajectories
from advcli.keys import ANCHOR, GROUP, SCORE, TRAJECTORY, TURN
from advcli.settings.config import AdvantageConfig, AnchorScope, Level, TrajScore
from advcli.settings.rules import STD_DDOF

if TYPE_CHECKING:
    from advcli.report.summary import BiasSummary

# When the step term is judged dead or weak: "dead" when at least this share of rows gets
# A_step = 0 (step groups of one, or whose returns tie), "weak" when the mean |ω · A_step| is
# below this share of the mean |A_episode|; else it carries signal. docs/compare.md, "Step
# credit".
STEP_THRESHOLDS = {"dead_zero_share": 0.9, "weak_step_to_episode": 0.1}
# How many groups the penalty hazard names.
HAZARD_EXAMPLES = 5


def step_group_figures(
    projection: pl.DataFrame,
    scope: AnchorScope,
    batch: str | None = None,
    returns: pl.Series | None = None,
    min_std: float | None = None,
    ddof: int = STD_DDOF,
) -> dict[str, Any]:
    """The step groups of ``projection`` (with ``anchor``) under ``scope``: how many, their
    size histogram, the rows in step groups of one, the hit ratio, and the anchors shared
    across task groups; with ``returns`` (each row's step return) also the step groups of more
    than one row whose returns all tie (or, given ``min_std``, ROLL's floor, whose std is at
    most that): the step groups whose rows get ``A_step = 0``."""
    aggregations = [
        pl.len().alias("size"),
        pl.struct(GROUP, TRAJECTORY).n_unique().alias("trajectories"),
    ]
    frame = projection.select(GROUP, TRAJECTORY, ANCHOR, _scope(scope, batch))
    if returns is not None:
        frame = frame.with_columns(returns.alias("__return"))
        tie = pl.col("__return").max() == pl.col("__return").min()
        if min_std is not None:
            tie = tie | (pl.col("__return").std(ddof=ddof) <= min_std)
        aggregations.append(tie.alias("tie"))
    groups = frame.group_by("__scope", ANCHOR).agg(aggregations)
    rows = projection.height
    sizes = (
        groups.group_by("size")
        .agg(pl.len().alias("step_groups"), pl.col("size").sum().alias("rows"))
        .sort("size")
    )
    singles = int((groups["size"] == 1).sum())
    hits = int(groups.filter(pl.col("trajectories") > 1)["size"].sum())
    figures: dict[str, Any] = {
        "anchor_scope": scope.value,
        "step_groups": groups.height,
        "rows": rows,
        "histogram": {
            str(size): {"step_groups": count, "rows": total}
            for size, count, total in sizes.iter_rows()
        },
        "singleton_rows": singles,
        "singleton_share": _share(singles, rows),
        "hit_rows": hits,
        "hit_ratio": _share(hits, rows),
    }
    if returns is not None:
        tied = groups.filter(pl.col("tie") & (pl.col("size") > 1))
        figures["tied_groups"] = tied.height
        figures["tied_rows"] = int(tied["size"].sum())
    figures["shared_anchors"] = _shared_anchors(projection, batch)
    return figures


def _scope(scope: AnchorScope, batch: str | None) -> pl.Expr:
    """The key a step group is taken within: the task group, or the batch (each ``--by``
    step)."""
    key = pl.col(GROUP) if scope is AnchorScope.GROUP else batch_key(batch)
    return key.alias("__scope")


def _shared_anchors(projection: pl.DataFrame, batch: str | None) -> dict[str, int]:
    """The anchors seen in more than one task group of a batch: how many, their rows, and the
    group-scope step groups that ``--anchor-scope batch`` merges into them."""
    shared = (
        projection.select(batch_key(batch).alias("__batch"), GROUP, ANCHOR)
        .group_by("__batch", ANCHOR)
        .agg(pl.len().alias("rows"), pl.col(GROUP).n_unique().alias("groups"))
        .filter(pl.col("groups") > 1)
    )
    return {
        "anchors": shared.height,
        "rows": int(shared["rows"].sum()),
        "group_step_groups": int(shared["groups"].sum()),
    }


def step_credit(
    projection: pl.DataFrame,
    trajectories: Trajectories,
    steps: pl.DataFrame,
    config: AdvantageConfig,
    sources: dict[str, Any],
    batch: str | None = None,
) -> dict[str, Any]:
    """The JSON's ``step_credit`` for a gigpo result: ``steps`` is its per-row frame
    (``step_return``, ``step_advantage``, ``episode_advantage``, in ``projection``'s order),
    ``trajectories`` the projection's index, ``sources`` where the turn order and the returns
    came from (``turn_order``, ``returns``)."""
    step = config.step
    assert step is not None
    groups = step_group_figures(
        projection, step.scope, batch, steps["step_return"], step.std_floor, config.std_ddof
    )
    episode = steps["episode_advantage"].abs()
    weighted = (step.weight * steps["step_advantage"]).abs()
    zero_rows = groups["singleton_rows"] + groups["tied_rows"]
    mean_episode, mean_step = _mean(episode), _mean(weighted)
    credit: dict[str, Any] = {
        "measured": True,
        "reason": None,
        "settings": step_settings(config, sources),
        "step_groups": groups,
        "zero_rows": zero_rows,
        "zero_share": _share(zero_rows, projection.height),
        "mean_abs_episode": mean_episode,
        "mean_abs_step": mean_step,
        "step_to_episode": mean_step / mean_episode if mean_episode else None,
        "by_turn": _by_turn(projection, trajectories.of_row, episode, weighted),
        "penalty_hazard": penalty_hazard(projection, trajectories),
    }
    credit["assessment"] = step_assessment(credit)
    credit["verdict"] = step_verdict(credit)
    return credit


def not_measured(
    projection: pl.DataFrame, trajectories: Trajectories, config: AdvantageConfig, reason: str
) -> dict[str, Any]:
    """The JSON's ``step_credit`` when the dump has no anchor: said, never left out (the
    penalty hazard needs no anchor)."""
    credit = {
        "measured": False,
        "reason": reason,
        "settings": step_settings(config, {}),
        "step_groups": None,
        "zero_rows": None,
        "zero_share": None,
        "mean_abs_episode": None,
        "mean_abs_step": None,
        "step_to_episode": None,
        "by_turn": [],
        "penalty_hazard": penalty_hazard(projection, trajectories),
        "assessment": {
            "level": "not_measured",
            "zero_share": None,
            "step_to_episode": None,
            "thresholds": STEP_THRESHOLDS,
        },
    }
    credit["verdict"] = step_verdict(credit)
    return credit


def step_settings(config: AdvantageConfig, sources: dict[str, Any]) -> dict[str, Any]:
    """The settings the two terms used: the episode term's level and rule, and the step
    term's; ``gamma`` is null where the returns were given already discounted."""
    step = config.step
    assert step is not None
    return {
        "level": config.level.value,
        "episode_rule": _episode_rule(config),
        "gamma": None if sources.get("returns_given") else step.gamma,
        "step_weight": step.weight,
        "norm": step.norm.value,
        "std_floor": step.std_floor,
        "anchor_scope": step.scope.value,
        "turn_order": sources.get("turn_order"),
        "returns": sources.get("returns"),
    }


def _episode_rule(config: AdvantageConfig) -> str:
    step = config.step
    assert step is not None
    score = "R(τ), the sum of its step rewards" if step.episode_from_steps else "its score"
    if config.level is Level.TURN:
        return f"every row in its group's statistics, with {score}"
    if config.traj_score is TrajScore.OWN:
        return "each trajectory's first row in the statistics, every row centred on its own score"
    return f"each trajectory once in its group's statistics, with {score}"


def _by_turn(
    projection: pl.DataFrame, of_row: np.ndarray, episode: pl.Series, weighted: pl.Series
) -> list[dict[str, Any]]:
    """For each turn index (a row's place in its trajectory, from 0, in turn order): its rows
    and their mean |A_episode| and mean |ω · A_step|. Summed one by one in input order
    (``numpy.bincount``), so the figures do not depend on the thread count."""
    frame = pl.DataFrame([pl.Series("__trajectory", of_row)])
    if TURN in projection.columns:
        frame = frame.with_columns(projection[TURN])
        place = pl.col(TURN).rank("ordinal").cast(pl.Int64) - 1
    else:
        place = pl.int_range(pl.len(), dtype=pl.Int64)
    index = frame.select(place.over("__trajectory")).to_series().to_numpy()
    rows = np.bincount(index)
    sums = [np.bincount(index, weights=values.to_numpy()) for values in (episode, weighted)]
    return [
        {
            "turn": int(turn),
            "rows": int(rows[turn]),
            "mean_abs_episode": float(sums[0][turn] / rows[turn]),
            "mean_abs_step": float(sums[1][turn] / rows[turn]),
        }
        for turn in np.flatnonzero(rows)
    ]


def step_assessment(credit: dict[str, Any]) -> dict[str, Any]:
    """Whether the step term carries signal (``carries``), little (``weak``) or almost none
    (``dead``), by :data:`STEP_THRESHOLDS`, with the figures it was judged on."""
    zero_share, ratio = credit["zero_share"], credit["step_to_episode"]
    if zero_share >= STEP_THRESHOLDS["dead_zero_share"] or not credit["mean_abs_step"]:
        level = "dead"
    elif ratio is not None and ratio < STEP_THRESHOLDS["weak_step_to_episode"]:
        level = "weak"
    else:
        level = "carries"
    return {
        "level": level,
        "zero_share": zero_share,
        "step_to_episode": ratio,
        "thresholds": STEP_THRESHOLDS,
    }


def penalty_hazard(projection: pl.DataFrame, trajectories: Trajectories) -> dict[str, Any]:
    """verl-agent's −1e5 hazard: the groups of two or more trajectories whose first rows (in
    row order) tie on the score, so their std is 0, while some rows' scores differ from their
    trajectory's first row (the invalid-action penalty). Under verl-agent's trajectory
    counting (its ``compute_mean_std_cross_steps`` keyword false) with ``mean_std_norm`` each
    such row gets (x − μ) / ε, about ±1e5 for a 0.1 penalty."""
    first, of_row = trajectories.first_position(), trajectories.of_row
    first_score = projection[SCORE].gather(first)
    tied = (
        pl.DataFrame([projection[GROUP].gather(first), first_score.alias("__first")])
        .group_by(GROUP)
        .agg(
            ((pl.len() > 1) & (pl.col("__first").max() == pl.col("__first").min())).alias("__tied")
        )
        .filter("__tied")
        .select(GROUP)
    )
    rows = (
        projection.select(GROUP, SCORE, first_score.gather(of_row).alias("__first"))
        .with_row_index("__position")
        .filter(pl.col(SCORE) != pl.col("__first"))
        .join(tied, on=GROUP, how="semi")
    )
    groups = rows.group_by(GROUP).agg(pl.col("__position").min()).sort("__position")
    return {
        "groups": groups.height,
        "rows": rows.height,
        "examples": groups[GROUP].head(HAZARD_EXAMPLES).to_list(),
    }


def attach_step_credit(summary: BiasSummary, credit: dict[str, Any]) -> None:
    """Put ``credit`` in a bias report's ``summary`` (key ``step_credit``) and its verdict after
    the episode term's."""
    summary["step_credit"] = credit
    summary["verdict"] = f"{summary['verdict']} {credit['verdict']}"


def step_verdict(credit: dict[str, Any]) -> str:
    """The step term's verdict in plain language (with the penalty hazard when there is one)."""
    hazard = credit["penalty_hazard"]
    sentences = [_signal_sentence(credit)]
    if hazard["groups"]:
        sentences.append(
            "Under verl-agent's trajectory counting (its compute_mean_std_cross_steps keyword "
            f"false, mean_std_norm) {_counted(hazard['rows'], 'penalized row')} in "
            f"{_counted(hazard['groups'], 'group')} whose first rows tie would get "
            "advantages near ±1e5 (advcli's "
            "verl-agent-trajectory recipe divides them by 1 + ε)."
        )
    return " ".join(sentences)


def _signal_sentence(credit: dict[str, Any]) -> str:
    if not credit["measured"]:
        return f"The step term was not measured: {credit['reason']}."
    level = credit["assessment"]["level"]
    groups = credit["step_groups"]
    if credit["settings"]["step_weight"] == 0:
        return "The step weight ω is 0: the step term adds nothing to the advantages."
    zero = (
        f"{100 * credit['zero_share']:.0f}% of rows get A_step = 0 "
        f"({groups['singleton_rows']:,} in step groups of one, {groups['tied_rows']:,} in step "
        "groups whose returns tie)"
    )
    if level == "dead":
        return f"The step term is dead on this dump: {zero}."
    moves = (
        f"The step term moves advantages by {100 * credit['step_to_episode']:.0f}% of the "
        "episode term"
        if credit["step_to_episode"] is not None
        else "The step term moves advantages where the episode term is 0"
    )
    words = "it carries signal" if level == "carries" else "it carries little signal"
    sentence = (
        f"{moves} (mean |ω·A_step| {credit['mean_abs_step']:.3f}, mean |A_episode| "
        f"{credit['mean_abs_episode']:.3f}); {zero}: {words}."
    )
    shared = groups["shared_anchors"]
    if groups["anchor_scope"] == "batch" and shared["rows"]:
        sentence += (
            f" But {100 * _share(shared['rows'], groups['rows']):.0f}% of rows have an anchor "
            f"shared by task groups ({_counted(shared['anchors'], 'anchor')}), which batch scope "
            "makes one "
            "step group: there the step term compares different tasks' states (ROLL's "
            "step_{idx} hashes make every prompt's k-th step one)."
        )
    return sentence


def _counted(count: int, thing: str) -> str:
    return f"{count:,} {thing}{'' if count == 1 else 's'}"


def _mean(values: pl.Series) -> float:
    return float(values.mean()) if len(values) else 0.0  # type: ignore[arg-type]


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0

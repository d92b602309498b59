"""How the bias report judges what it measured: the bias's level by its thresholds, the remedy for
each trainer (one table, read by the JSON's ``assessment`` and by the verdict's sentence), and the
verdict in plain language.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

# Where the bias stops being negligible and becomes severe, in the advantage's own units (the
# group std for grpo): the mean |trajectory − turn level advantage| over trajectories, and the
# share of trajectories whose advantage changes sign. README: "Reading the verdict".
THRESHOLDS = {
    "material": {"advantage_diff_mean": 0.01, "sign_flip_share": 0.0},
    "severe": {"advantage_diff_mean": 0.1, "sign_flip_share": 0.01},
}
# A loss mode is called lopsided when a trajectory of the most turns gets this many times the
# weight of one of the fewest.
LOPSIDED_LOSS = 2.0


def assess(summary: dict[str, Any]) -> dict[str, Any]:
    """The bias's level (negligible, material, severe) by :data:`THRESHOLDS`, the figures it was
    judged on, and the remedy for each trainer."""
    trajectories = summary["trajectories"]
    diff = trajectories["advantage_diff_mean"] or 0.0
    flips = trajectories["sign_flips"] / max(summary["counts"]["trajectories"], 1)

    level = bias_level(diff, flips)
    lopsided = [
        mode
        for mode, entry in (summary.get("loss_weights") or {}).items()
        if (entry["longest_vs_shortest"] or 0.0) >= LOPSIDED_LOSS
    ]
    return {
        "level": level,
        "advantage_diff_mean": diff,
        "sign_flip_share": flips,
        "thresholds": THRESHOLDS,
        "lopsided_loss_modes": lopsided,
        "remedy": remedies() if level != "negligible" else None,
    }


def bias_level(diff: float, flips: float) -> str:
    """negligible, material or severe by :data:`THRESHOLDS`, for a mean |advantage diff| and a
    share of trajectories whose advantage changes sign."""

    def beyond(level: str) -> bool:
        limits = THRESHOLDS[level]
        return diff >= limits["advantage_diff_mean"] or flips > limits["sign_flip_share"]

    return "severe" if beyond("severe") else "material" if beyond("material") else "negligible"


@dataclass(frozen=True)
class Remedy:
    """What a trainer's user sets to count each trajectory once: ``setting`` as the JSON's
    ``assessment.remedy`` states it, ``brief`` as the verdict's sentence names it (None: the
    verdict does not name it)."""

    setting: str
    brief: str | None


REMEDIES = {
    "advcli": Remedy(
        "advcli compute --level trajectory (the default) writes trajectory-level "
        "advantages; advcli.verl.compute_advantage(batch) applies them in the training step",
        brief="advcli compute --level trajectory, or advcli.verl in the training step",
    ),
    "verl-agent": Remedy(
        "algorithm.compute_mean_std_cross_steps=False (each (uid, traj_uid) counts once)",
        brief="verl-agent: algorithm.compute_mean_std_cross_steps=False",
    ),
    "agent-lightning": Remedy(
        "algorithm.enable_rollout_level_advantage=true (its default), and "
        "actor.policy_loss.loss_mode=per_rollout_mean for equal loss weight per rollout",
        brief="agent-lightning: enable_rollout_level_advantage",
    ),
    "verl v1": Remedy(
        "the v1 trainer's compute_advantage_for_multi_trajectories does it for GRPO "
        "(final turn's score); other estimators run per row there",
        brief=None,
    ),
}


def remedies() -> dict[str, str]:
    """The JSON's ``assessment.remedy``: each trainer's setting."""
    return {trainer: remedy.setting for trainer, remedy in REMEDIES.items()}


def verdict(summary: dict[str, Any], per_trajectory: pl.DataFrame) -> str:
    """A few plain-language sentences on the size and direction of the bias."""
    counts, spread, groups = summary["counts"], summary["turns_per_trajectory"], summary["groups"]
    drop = groups["baseline_drop_mean"] or 0.0
    if (groups["baseline_shift_max"] or 0.0) < 5e-4:
        sentences = ["Group baselines are the same at both levels."]
    else:
        sentences = [
            f"When every turn counts, group baselines {'fall' if drop > 0 else 'rise'} by "
            f"{abs(drop):.3f} on average (up to {groups['baseline_shift_max']:.3f})."
        ]
    if spread["min"] == spread["max"]:
        sentences.append(
            f"Every trajectory has {spread['min']} turn(s), so all weigh alike at both levels."
        )
    else:
        # "Long" = at least the median turn count, and strictly more than the shortest.
        threshold = max(math.ceil(spread["median"]), spread["min"] + 1)
        long, short = per_trajectory.select(
            pl.col("diff").filter(pl.col("turns") >= threshold).mean(),
            pl.col("diff").filter(pl.col("turns") < threshold).mean().alias("short"),
        ).row(0)
        sentences.append(
            f"Compared with counting each trajectory once, trajectories with ≥ {threshold} turns "
            f"get {_less_or_more(long)}, and shorter ones {_less_or_more(short)}."
        )
    flips = summary["trajectories"]["sign_flips"]
    sentences.append(
        f"{100 * flips / counts['trajectories']:.1f}% of trajectories ({flips:,}) change sign."
    )
    weights = summary.get("loss_weights")
    if weights is not None and spread["min"] != spread["max"]:
        token_mean = weights["token-mean"]["longest_vs_shortest"]
        if token_mean is not None:
            sentences.append(
                f"In the loss, verl's default token-mean gives a {spread['max']}-turn trajectory "
                f"{token_mean:.1f}× the weight of a {spread['min']}-turn one "
                "(agent-lightning's per-rollout mean: 1×)."
            )
    assessment = summary["assessment"]
    level = assessment["level"]
    if level == "negligible":
        sentences.append("The bias is negligible here: either level gives about the same numbers.")
    else:
        briefs = "; ".join(remedy.brief for remedy in REMEDIES.values() if remedy.brief)
        sentences.append(f"The bias is {level}: use trajectory-level advantages ({briefs}).")
    return " ".join(sentences)


def _less_or_more(mean_diff: Any) -> str:
    value = float(mean_diff or 0.0)
    if abs(value) < 5e-4:
        return "about the same advantage"
    return f"{abs(value):.3f} {'less' if value > 0 else 'more'} advantage on average"

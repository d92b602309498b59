"""How the bias report judges what it measured: the bias's level by its thresholds, the remedy for
each trainer (one table, read by the JSON's ``assessment.remedy``, the verdict's sentence and every
view's "What to change"), and the verdict in plain language.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advcli.report.summary import Assessment, GroupFigures, RemedyAdvice, SummaryFigures

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


def assess(summary: SummaryFigures, estimator: str | None = None) -> Assessment:
    """The bias's level (negligible, material, severe) by :data:`THRESHOLDS`, the figures it was
    judged on, and the remedy for each trainer (``estimator``'s: gigpo has its own)."""
    trajectories = summary["trajectories"]
    diff = trajectories["advantage_diff_mean"] or 0.0
    flips = trajectories["sign_flips"] / max(summary["counts"]["trajectories"], 1)

    level = bias_level(diff, flips)
    lopsided = [
        mode
        for mode, entry in (summary["loss_weights"] or {}).items()
        if (entry["longest_vs_shortest"] or 0.0) >= LOPSIDED_LOSS
    ]
    return {
        "level": level,
        "advantage_diff_mean": diff,
        "sign_flip_share": flips,
        "thresholds": THRESHOLDS,
        "lopsided_loss_modes": lopsided,
        "remedy": remedy(summary["settings"]["reading"]["trainer"], estimator)
        if level != "negligible"
        else None,
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
    """What one trainer's user changes to count each trajectory once, as that trainer's released
    code has it (``docs/reference/trainer-sources.md``, "Remedies", cites each line).

    ``change`` is the JSON's and every report's sentence, ``brief`` the verdict's words for it
    (after the trainer's name),
    ``source`` where the code says so (repository at a commit, or a release; file; function or
    key), ``config_keys`` every config key ``change`` names, each read in ``source``.
    """

    trainer: str
    change: str
    brief: str
    source: str
    config_keys: tuple[str, ...] = ()
    # advcli's own remedy named after a trainer's (whose change says how its training step
    # changes): the command alone, without the verl call of ``brief``.
    command: str | None = None

    def entry(self) -> dict[str, str]:
        """The remedy as the JSON's ``assessment.remedy.advice`` lists it."""
        return {"trainer": self.trainer, "change": self.change, "source": self.source}


ADVCLI = Remedy(
    "advcli",
    "advcli compute --level trajectory (the default) writes trajectory-level advantages; in a "
    "verl-based training step, advcli.verl.compute_advantage(batch) in place of verl's "
    "compute_advantage call applies them",
    brief="advcli compute --level trajectory, or advcli.verl.compute_advantage(batch) in the "
    "training step",
    source="advcli: advcli/verl/advantage.py, compute_advantage",
    command="advcli compute --level trajectory",
)
VERL = Remedy(
    "verl",
    "verl's agent loop keeps a conversation in one row, so its own batch has no turn bias. "
    "Where rows are turns, with a trajectory column of your own: in the legacy "
    "RayPPOTrainer.fit, replace compute_advantage with advcli.verl.compute_advantage(batch, "
    "adv_estimator=..., ...), which reads that column; in the v1 trainer (trainer.use_v1=true, "
    "0.9.1's default), GRPO already counts each session once (compute_advantage_for_multi_"
    "trajectories scores its final output), and for the other estimators replace that call in "
    "TrainerBase._compute_advantage with advcli.verl.compute_advantage(data, ...), giving data "
    "each row's session from its key first (see verl (v1 multi-trajectory))",
    brief="advcli.verl.compute_advantage(batch, ...) in place of compute_advantage in the "
    "legacy RayPPOTrainer.fit; in the v1 trainer GRPO already counts each session once",
    source="verl 0.9.1 (PyPI): verl/trainer/config/ppo_trainer.yaml, trainer.use_v1; "
    "verl/trainer/ppo/v1/trainer_base.py, TrainerBase._compute_advantage; "
    "verl/trainer/ppo/ray_trainer.py, compute_advantage and RayPPOTrainer.fit",
    config_keys=("trainer.use_v1",),
)
VERL_V1 = Remedy(
    "verl (v1 multi-trajectory)",
    "for GRPO the v1 trainer already counts each session once: "
    "compute_advantage_for_multi_trajectories (verl/trainer/ppo/v1/utils.py, called by "
    "TrainerBase._compute_advantage) scores each session's final output and broadcasts it; "
    "other estimators run per row there. For them, in TrainerBase._compute_advantage give data "
    'each row\'s session from its key, data.non_tensor_batch["session_id"] = '
    'np.array([key.rsplit("_", 2)[1] for key in batch.keys], dtype=object), and replace that '
    "call with data = advcli.verl.compute_advantage(data, adv_estimator=..., ...) (data: the "
    "DataProto it builds; batch there is a KVBatchMeta, whose fields carry no session)",
    brief="GRPO already does; other estimators: the session from each key, then "
    "advcli.verl.compute_advantage(data, ...) in TrainerBase._compute_advantage",
    source="verl 0.9.1 (PyPI): verl/trainer/ppo/v1/utils.py, "
    "compute_advantage_for_multi_trajectories; verl/trainer/ppo/v1/trainer_base.py, "
    "TrainerBase._compute_advantage",
)
VERL_AGENT = Remedy(
    "verl-agent",
    "no config key does it: compute_mean_std_cross_steps is only a keyword default of "
    "compute_grpo_outcome_advantage (verl/trainer/ppo/core_algos.py) and episode_norm_reward "
    "(gigpo/core_gigpo.py), which compute_advantage (verl/trainer/ppo/ray_trainer.py) never "
    "passes, and flipping it alone is unsafe: each row stays centred on its own score, so with "
    "the invalid-action penalty (actor_rollout_ref.actor.use_invalid_action_penalty, on by "
    "default) a group whose trajectories' first rows tie (std 0) divides a later penalized row's "
    "-0.1 by epsilon: an advantage of -1e5. "
    "Replace the compute_advantage call in RayPPOTrainer.fit for GRPO with "
    "advcli.verl.compute_advantage(batch, ...): it reads uid and traj_uid and computes "
    "verl-agent's own rule for counting each trajectory once (its first row in the group "
    "statistics, every row centred on its own score, so a penalized step keeps its penalty), "
    "dividing a group whose first rows tie by 1 + epsilon, not by epsilon",
    brief="advcli.verl.compute_advantage(batch, ...) in place of compute_advantage in "
    "RayPPOTrainer.fit (no config key does it)",
    source="langfengQ/verl-agent@2716b30: verl/trainer/ppo/ray_trainer.py, compute_advantage, "
    "apply_invalid_action_penalty and RayPPOTrainer.fit; verl/trainer/ppo/core_algos.py, "
    "compute_grpo_outcome_advantage; gigpo/core_gigpo.py, episode_norm_reward; "
    "verl/trainer/config/ppo_trainer.yaml, actor_rollout_ref.actor.use_invalid_action_penalty",
    config_keys=("actor_rollout_ref.actor.use_invalid_action_penalty",),
)
AGENT_LIGHTNING = Remedy(
    "agent-lightning",
    "nothing to change with agent-lightning's own config, whose agentlightning/verl/config.yaml "
    "sets algorithm.enable_rollout_level_advantage=true, which computes the advantage on one "
    "row per rollout (compute_rollout_level_advantage) and broadcasts it to the rollout's rows, "
    "and actor_rollout_ref.actor.policy_loss.loss_mode=per_rollout_mean, which gives each rollout "
    "equal weight in the loss. A config of your own that leaves the first key out gets the "
    "trainer's default, false, which counts every turn row: set both there",
    brief="its config.yaml already does (a config of your own: "
    "algorithm.enable_rollout_level_advantage=true)",
    source="microsoft/agent-lightning@c632d8d: agentlightning/verl/config.yaml, "
    "algorithm.enable_rollout_level_advantage and actor_rollout_ref.actor.policy_loss.loss_mode; "
    "agentlightning/verl/trainer.py; agentlightning/verl/rollout_level_advantage.py, "
    "compute_rollout_level_advantage",
    config_keys=(
        "algorithm.enable_rollout_level_advantage",
        "actor_rollout_ref.actor.policy_loss.loss_mode",
    ),
)
SKYRL = Remedy(
    "SkyRL",
    "nothing to change: with generator.step_wise_trajectories=true, "
    "RayPPOTrainer.compute_advantages_and_returns (skyrl/train/trainer.py) runs the estimator on "
    "the is_last_step rows only and broadcasts each trajectory's advantage to its steps; the "
    "turn level here is what counting every step would give",
    brief="its step-wise training already does",
    source="NovaSky-AI/SkyRL@a956457: skyrl/train/trainer.py, "
    "RayPPOTrainer.compute_advantages_and_returns; skyrl/train/config/config.py, "
    "generator.step_wise_trajectories",
    config_keys=("generator.step_wise_trajectories",),
)
RLLM = Remedy(
    "rLLM",
    "rLLM's unified trainer already counts each trajectory once "
    "(collect_reward_and_advantage_from_trajectory_groups in "
    "rllm/trainer/algorithms/advantage.py: one advantage per trajectory from its reward, given "
    "to each step); in AgentWorkflowPPOTrainer (rllm/trainer/verl/agent_workflow_trainer.py) "
    "replace the compute_advantage call in fit_agent with advcli.verl.compute_advantage(batch, "
    'group_key="trajectory_ids", trajectory_key="episode_ids")',
    brief='advcli.verl.compute_advantage(batch, group_key="trajectory_ids", '
    'trajectory_key="episode_ids") in AgentWorkflowPPOTrainer.fit_agent',
    source="rllm-org/rllm@9beb6e0: rllm/trainer/algorithms/advantage.py, "
    "collect_reward_and_advantage_from_trajectory_groups; "
    "rllm/trainer/verl/agent_workflow_trainer.py, AgentWorkflowPPOTrainer.fit_agent",
)
RLLM_AGENT_PPO = Remedy(
    "rLLM (AgentPPOTrainer)",
    "in step-wise training (rllm.stepwise_advantage.enable=true), "
    "rllm.stepwise_advantage.mode=broadcast (its default) has AgentPPOTrainer.fit_agent compute "
    "the advantage on the is_last_step rows only and broadcast it to each step of the same idxs; "
    "per_step counts every step row",
    brief="rllm.stepwise_advantage.mode=broadcast",
    source="rllm-org/rllm@0b1853c: rllm/trainer/verl/agent_ppo_trainer.py, "
    "AgentPPOTrainer.fit_agent and _stepwise_advantage_broadcast; "
    "rllm/trainer/config/agent_ppo_trainer.yaml, rllm.stepwise_advantage.enable and "
    "rllm.stepwise_advantage.mode",
    config_keys=("rllm.stepwise_advantage.enable", "rllm.stepwise_advantage.mode"),
)
ROLL = Remedy(
    "ROLL",
    "with TrajEnvManager (custom_envs.<tag>.env_manager_cls's default) a trajectory is one row "
    "and counts once; with StepEnvManager (one row per environment step, what GiGPO needs) no "
    "config key does it: reward_normalization.grouping names the one key agentic_reward_norm "
    "groups rows by, and every step row enters its group's mean and std with its "
    "episode_scores. There, in compute_response_level_rewards, replace agentic_reward_norm on "
    "episode_scores with advcli.torch.compute_advantage on one reward per row (episode_scores "
    "as a (bs, 1) tensor, a mask of ones), index=traj_group_id, traj_index=traj_id, "
    'singleton="zero" and estimator "grpo" for method mean_std, "drgrpo" for mean: column 0 of '
    "its advantages is each row's episode term",
    brief="advcli.torch.compute_advantage(..., index=traj_group_id, traj_index=traj_id) in "
    "place of agentic_reward_norm on episode_scores in compute_response_level_rewards (no "
    "config key does it under StepEnvManager)",
    source="alibaba/ROLL@8eb27cc: roll/pipeline/agentic/utils.py, agentic_reward_norm and "
    "compute_response_level_rewards; roll/pipeline/agentic/agentic_config.py, "
    "RewardNormalizationConfig (reward_normalization.grouping, method) and make_env_configs "
    "(custom_envs.<tag>.env_manager_cls); roll/pipeline/agentic/env_manager/step_env_manager.py "
    "and traj_env_manager.py, formulate_rollouts",
    config_keys=("reward_normalization.grouping", "custom_envs.<tag>.env_manager_cls"),
)
ONE_ROW_PER_EPISODE = Remedy(
    "OpenRLHF, TRL",
    "nothing to change: each row is a whole episode, so both levels are the same",
    brief="one row per episode, nothing to change",
    source="openrlhf 0.11.2 and trl 1.16.0 (PyPI): one row per sample",
)

# Each dialect's remedy, keyed and ordered as advcli.read.dialects.DIALECTS names them.
# advcli's own schema is written by advcli.dump.write_batch from any trainer's batch, so a dump
# in it gets the whole table, as a dump no dialect matched does.
REMEDIES: dict[str, Remedy] = {
    "advcli": ADVCLI,
    "agent-lightning": AGENT_LIGHTNING,
    "verl-agent": VERL_AGENT,
    "verl (v1 multi-trajectory)": VERL_V1,
    "verl": VERL,
    "SkyRL": SKYRL,
    "SkyRL 0.4.0": SKYRL,
    "rLLM": RLLM,
    "rLLM (AgentPPOTrainer)": RLLM_AGENT_PPO,
    "ROLL": ROLL,
    "OpenRLHF": ONE_ROW_PER_EPISODE,
    "TRL": ONE_ROW_PER_EPISODE,
}


# GiGPO's: the change that counts each trajectory once in the episode term and keeps the step
# term, for the trainers that implement GiGPO (Trinity-RFT's already counts each run once).
ADVCLI_GIGPO = Remedy(
    "advcli",
    "advcli compute --estimator gigpo --recipe verl-agent-trajectory (or your recipe's options "
    "with --level trajectory) writes GiGPO with each trajectory once in the episode term and the "
    "step term kept; in a verl-agent step, advcli.verl.compute_advantage(batch, "
    'adv_estimator="gigpo", recipe="verl-agent-trajectory") in place of compute_advantage '
    "applies it",
    brief="advcli compute --estimator gigpo --recipe verl-agent-trajectory, or "
    'advcli.verl.compute_advantage(batch, adv_estimator="gigpo", recipe="verl-agent-trajectory") '
    "in the training step",
    command="advcli compute --estimator gigpo --recipe verl-agent-trajectory",
    source=(
        "advcli: advcli/settings/recipes.py, RECIPES; advcli/verl/advantage.py, compute_advantage"
    ),
)
VERL_AGENT_GIGPO = Remedy(
    "verl-agent",
    "no config key does it (compute_gigpo_outcome_advantage in gigpo/core_gigpo.py calls "
    "episode_norm_reward without compute_mean_std_cross_steps, whose False would divide a "
    "penalized row by epsilon where a group's first rows tie). Replace the compute_advantage "
    'call in RayPPOTrainer.fit with advcli.verl.compute_advantage(batch, adv_estimator="gigpo", '
    'recipe="verl-agent-trajectory"): each trajectory\'s first row in the episode statistics, '
    "every row centred on its own score, the step term as verl-agent computes it",
    brief='advcli.verl.compute_advantage(batch, adv_estimator="gigpo", '
    'recipe="verl-agent-trajectory") in place of compute_advantage in RayPPOTrainer.fit (no '
    "config key does it)",
    source="langfengQ/verl-agent@2716b30: gigpo/core_gigpo.py, compute_gigpo_outcome_advantage "
    "and episode_norm_reward; verl/trainer/ppo/ray_trainer.py, compute_advantage and "
    "RayPPOTrainer.fit",
)
ROLL_GIGPO = Remedy(
    "ROLL",
    "no config key does it: agentic_reward_norm normalizes episode_scores over every step row "
    "of a traj_group_id. In compute_response_level_rewards, compute the GiGPO advantage with "
    "advcli.torch.compute_advantage on a (bs, 1) reward of episode_scores and a mask of ones, "
    'index=traj_group_id, traj_index=traj_id, turn_index=step, estimator="gigpo", '
    'recipe="roll", level="trajectory", anchor_index=state_hash, step_rewards=step_scores, in '
    "place of the episode and step normalizations",
    brief='advcli.torch.compute_advantage(..., estimator="gigpo", recipe="roll", '
    'level="trajectory") in compute_response_level_rewards (no config key does it)',
    source="alibaba/ROLL@8eb27cc: roll/pipeline/agentic/utils.py, agentic_reward_norm and "
    "compute_response_level_rewards",
)
GIGPO_REMEDIES: dict[str, Remedy] = {"verl-agent": VERL_AGENT_GIGPO, "ROLL": ROLL_GIGPO}


def remedies_for(trainer: str | None, estimator: str | None = None) -> list[Remedy]:
    """The remedies that apply to a dump read in ``trainer``'s dialect: that trainer's, then
    advcli's; every trainer's (advcli's first) where the dialect does not tell the trainer.
    For gigpo, the changes that keep its step term (:data:`GIGPO_REMEDIES`)."""
    table, advcli = (GIGPO_REMEDIES, ADVCLI_GIGPO) if estimator == "gigpo" else (REMEDIES, ADVCLI)
    own = table.get(trainer or "")
    if own is None or own is advcli:
        return list(dict.fromkeys([advcli, *table.values()]))
    return [own, advcli]


def remedy(trainer: str | None, estimator: str | None = None) -> RemedyAdvice:
    """The JSON's ``assessment.remedy``: the dialect the advice was chosen for (None: no
    dialect matched) and the advice, the trainer's own first."""
    advice = remedies_for(trainer, estimator)
    return {"trainer": trainer, "advice": [entry.entry() for entry in advice]}


# A group's baseline that moves less than this between the levels is the same at both.
SAME_BASELINE = 5e-4


def _baseline_sentence(groups: GroupFigures) -> str:
    """How the group baselines move when every turn counts: the mean move, and the largest; the
    groups that fall and those that rise apart when there are both."""
    drop = groups["baseline_drop_mean"] or 0.0
    falls, rises = groups["baseline_fall_groups"], groups["baseline_rise_groups"]
    if not falls and not rises:
        return "Group baselines are the same at both levels."
    if falls and rises:
        return (
            f"When every turn counts, the baselines of {falls:,} group{'s' * (falls > 1)} fall "
            f"(by up to {groups['baseline_fall_max']:.3f}) and of {rises:,} "
            f"rise (by up to {groups['baseline_rise_max']:.3f}): "
            f"{abs(drop):.3f} {'lower' if drop > 0 else 'higher'} on average."
        )
    most = groups["baseline_fall_max"] if falls else groups["baseline_rise_max"]
    return (
        f"When every turn counts, group baselines {'fall' if falls else 'rise'} by "
        f"{abs(drop):.3f} on average (up to {most:.3f})."
    )


# The mean diff of the trajectories of at least a turn count and of those of fewer turns.
DiffMeans = Callable[[int], tuple[float | None, float | None]]


def verdict(
    summary: SummaryFigures,
    assessment: Assessment,
    means: DiffMeans,
    estimator: str | None = None,
) -> str:
    """A few plain-language sentences on the size and direction of the bias (judged as
    ``assessment`` says; the remedy ``estimator``'s); ``means``: the trajectories' mean diff on
    either side of a turn count."""
    counts, spread, groups = summary["counts"], summary["turns_per_trajectory"], summary["groups"]
    sentences = [_baseline_sentence(groups)]
    if spread["min"] == spread["max"]:
        sentences.append(
            f"Every trajectory has {spread['min']} turn(s), so all weigh alike at both levels."
        )
    else:
        # "Long" = at least the median turn count, and strictly more than the shortest.
        threshold = max(math.ceil(spread["median"]), spread["min"] + 1)
        long, short = means(threshold)
        # diff = trajectory − turn level, so counting every turn gives a trajectory −diff more.
        sentences.append(
            f"Counting every turn gives trajectories with ≥ {threshold} turns "
            f"{_more_or_less(long, 'than counting each trajectory once')}, and shorter ones "
            f"{_more_or_less(short)}."
        )
    flips = summary["trajectories"]["sign_flips"]
    sentences.append(
        f"{100 * flips / counts['trajectories']:.1f}% of trajectories ({flips:,}) change sign."
    )
    weights = summary["loss_weights"]
    if weights is not None and spread["min"] != spread["max"]:
        token_mean = weights["token-mean"]["longest_vs_shortest"]
        if token_mean is not None:
            sentences.append(
                f"In the loss, verl's default token-mean gives {_a(spread['max'])}-turn "
                f"trajectory {token_mean:.1f}× the weight of {_a(spread['min'])}-turn one "
                "(agent-lightning's per-rollout mean: 1×)."
            )
    level = assessment["level"]
    if level == "negligible":
        sentences.append("The bias is negligible here: either level gives about the same numbers.")
    else:
        advice = remedies_for(summary["settings"]["reading"]["trainer"], estimator)
        # After a trainer's own change (how its training step changes), advcli's is its command.
        own = advice[0].trainer != "advcli"
        named = [
            f"{entry.trainer}: {entry.brief}"
            if entry.trainer != "advcli"
            else (entry.command or entry.brief)
            if own
            else entry.brief
            for entry in advice
        ]
        if len(named) > 2:
            briefs = f"{named[0]}; What to change lists each trainer's"
        else:
            briefs = "; or ".join(named)
        sentences.append(f"The bias is {level}: count each trajectory once ({briefs}).")
    return " ".join(sentences)


def _more_or_less(mean_diff: Any, than: str = "") -> str:
    """What counting every turn gives, from a mean trajectory − turn level ``diff``: ``than``
    names the other level where the sentence first compares the two."""
    value = float(mean_diff or 0.0)
    if abs(value) < 5e-4:
        return f"about the same advantage{' as' + than.removeprefix('than') if than else ''}"
    words = f"{abs(value):.3f} {'less' if value > 0 else 'more'}"
    return f"{words} advantage on average {than}" if than else words


# Per-turn rewards (compare --reward-mode per-turn, docs/compare.md "Per-turn rewards"). The
# reference every grouping is measured against: zero-padded, whose baseline has the group's
# trajectory count of members at every turn, so it cannot depend on the row's own stopping turn.
REFERENCE_GROUPING = "turn-padded"
# The groupings the derivation (docs/per-turn-rewards.md) shows give "take another turn" no
# hidden bonus, and why; every other one is judged by the bonus measured on the dump.
UNBIASED_BY_DERIVATION = {
    "turn-padded": "unbiased: its baseline is the others' zero-padded returns, a fixed number of "
    "members whatever turn the trajectory stops at (the reference)",
    "trajectory": "unbiased up to the factor gamma^t: one return per trajectory, the others' "
    "baseline",
    "turn": "unbiased, differently centred: the others that reach the turn are settled before "
    "it; its advantages at a turn sum to 0 where the padded ones do not",
}
# Where the measured hidden bonus on "continue" stops being negligible and becomes severe, as a
# share of a typical centred return (implied_bonus_relative: |bonus| / mean |G_t − the
# reference's leave-one-out baseline|): 5% of it tilts the stopping decision, a quarter is as
# large as the signal. It counts only beyond BONUS_SIGNIFICANCE standard errors (a bonus that
# sampling noise explains is not one).
TERMINATION_THRESHOLDS = {"material": 0.05, "severe": 0.25}
BONUS_SIGNIFICANCE = 3.0


def judge_grouping(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """One grouping's verdict: ``safe`` and why (``basis``: the derivation, or the bonus
    measured here by :data:`TERMINATION_THRESHOLDS` and :data:`BONUS_SIGNIFICANCE`), and its
    ``level`` (negligible, material, severe; negligible for a grouping safe by derivation)."""
    if name in UNBIASED_BY_DERIVATION:
        return {
            "safe": True,
            "level": "negligible",
            "basis": "derivation",
            "reason": UNBIASED_BY_DERIVATION[name],
        }
    bonus, se = figures["implied_bonus"], figures["implied_bonus_se"]
    relative = figures["implied_bonus_relative"]
    if bonus is None or relative is None:
        reason = "no turn where some rows continue and some stop: nothing to measure"
        return {"safe": True, "level": "negligible", "basis": "measured", "reason": reason}
    significant = se is None or abs(bonus) >= BONUS_SIGNIFICANCE * se
    level = "negligible"
    for name_of_level in ("material", "severe"):
        if significant and relative >= TERMINATION_THRESHOLDS[name_of_level]:
            level = name_of_level
    error = f" ± {se:.3g}" if se is not None else ""
    reason = (
        f"its baseline can depend on the row's own stopping turn; measured hidden bonus on "
        f"continuing {bonus:+.4g}{error} per decision ({100 * relative:.0f}% of a typical "
        f"centred return)"
    )
    return {"safe": level == "negligible", "level": level, "basis": "measured", "reason": reason}


def termination_verdict(summary: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The termination report's ``assessment`` (which groupings this dump can use safely, the
    thresholds, advcli's grouping and its level, which ``--fail-on`` reads) and its verdict in
    plain language."""
    settings, groupings = summary["settings"], summary["groupings"]
    safe = [name for name, entry in groupings.items() if entry["verdict"]["safe"]]
    biased = [name for name in groupings if name not in safe]
    in_use = settings["in_use"]
    assessment = {
        "reference": REFERENCE_GROUPING,
        "safe": safe,
        "biased": biased,
        "in_use": in_use,
        "level": groupings[in_use]["verdict"]["level"],
        "thresholds": TERMINATION_THRESHOLDS,
        "significance": BONUS_SIGNIFICANCE,
    }
    sentences = [
        f"Per-turn rewards ({settings['estimator']}, gamma {settings['gamma']:g}): "
        f"{', '.join(safe)} can be used safely on this dump."
    ]
    for name in biased:
        entry = groupings[name]
        error = entry["implied_bonus_se"]
        shown = f" (± {error:.2g})" if error is not None else ""
        sentences.append(
            f"{name} is biased ({entry['verdict']['level']}): it gives taking another turn a "
            f"hidden bonus of {entry['implied_bonus']:+.3f}{shown} per decision against "
            f"{REFERENCE_GROUPING}."
        )
    state = "safe" if in_use in safe else "biased"
    # advcli's setting, not a trainer's: most trainers' per-turn rewards use no grouping.
    sentences.append(f"advcli's --step-groups {in_use}, what it computes with, is {state}.")
    return assessment, " ".join(sentences)


def _a(count: int) -> str:
    """The count with its article, as it is read aloud: "a 6", "an 8", "an 11", "an 18,000"."""
    digits = str(count)
    # The number's first word: its leading group of up to three digits, as said.
    lead = digits[: len(digits) % 3 or 3]
    vowel = lead.startswith("8") or lead in ("11", "18")
    return f"{'an' if vowel else 'a'} {count}"

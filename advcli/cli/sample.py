"""``advcli sample``: a synthetic multi-turn rollout dump to try the other commands on."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from advcli.cli.consoles import stderr
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.errors import UsageError
from advcli.settings.config import SampleTrainer


@reports_errors
def sample_command(  # noqa: PLR0913
    output: Annotated[
        Path,
        typer.Argument(
            help="Parquet file to write ('-': Parquet bytes on stdout, not a terminal).",
            show_default=False,
        ),
    ],
    groups: Annotated[int, option("--groups", min=1, max=10**9, help="Prompts (groups).")] = 64,
    rollouts: Annotated[
        int, option("--rollouts", min=1, max=100_000, help="Trajectories per prompt.")
    ] = 8,
    max_turns: Annotated[
        int, option("--max-turns", min=1, max=10_000, help="Most turns per trajectory.")
    ] = 6,
    tokens: Annotated[
        int, option("--tokens", min=2, max=1_000_000, help="Mean response tokens per turn row.")
    ] = 48,
    seed: Annotated[int, option("--seed", min=0, max=2**63 - 1, help="Random seed.")] = 0,
    trainer: Annotated[
        SampleTrainer,
        option(
            "--trainer",
            help="Whose batch to write: advcli's schema, or verl-agent's per-step rows with "
            "GiGPO's columns (uid, traj_uid, anchor_obs, rewards, is_action_valid).",
        ),
    ] = SampleTrainer.ADVCLI,
    anchor_share: Annotated[
        float | None,
        option(
            "--anchor-share",
            min=0.0,
            max=1.0,
            help="verl-agent: the chance that a later step's state is one the prompt's other "
            "rollouts can reach too (the start state always is).  [default: 0.5]",
            show_default=False,
        ),
    ] = None,
    invalid_rate: Annotated[
        float | None,
        option(
            "--invalid-rate",
            min=0.0,
            max=1.0,
            help="verl-agent: the chance that a step's action is invalid (its score less the "
            "0.1 penalty, its state unchanged).  [default: 0.1]",
            show_default=False,
        ),
    ] = None,
    turn_reward: Annotated[
        float | None,
        option(
            "--turn-reward",
            help="advcli's schema: each turn before the last carries this reward of its own, the "
            "last turn the outcome (a dump for --reward-mode per-turn).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, option("--force", help="Replace an existing file.")] = False,
    quiet: Annotated[bool, option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> None:
    """Write a synthetic multi-turn rollout dump.

    Example: advcli sample rollouts.parquet --groups 64 --rollouts 8 --seed 0
    """
    from advcli.report.views import visible
    from advcli.write.outputs import goes_to_stdout
    from advcli.write.sample import StepOptions, write_sample

    given = {"anchor_share": anchor_share, "invalid_rate": invalid_rate}
    knobs = {name: value for name, value in given.items() if value is not None}
    if knobs and trainer is not SampleTrainer.VERL_AGENT:
        raise UsageError("--anchor-share and --invalid-rate apply to --trainer verl-agent")
    if turn_reward is not None and trainer is not SampleTrainer.ADVCLI:
        raise UsageError("--turn-reward applies to --trainer advcli")
    if turn_reward is not None and not math.isfinite(turn_reward):
        raise typer.BadParameter("must be a finite number", param_hint="'--turn-reward'")
    rows = write_sample(
        output,
        groups=groups,
        rollouts=rollouts,
        max_turns=max_turns,
        tokens=tokens,
        seed=seed,
        force=force,
        trainer=trainer,
        steps=StepOptions(**knobs),
        turn_reward=turn_reward,
    )
    if not quiet:
        where = "standard output" if goes_to_stdout(output) else visible(output)
        stderr.print(
            Text(f"wrote {rows:,} turn rows of {groups * rollouts:,} trajectories to {where}")
        )

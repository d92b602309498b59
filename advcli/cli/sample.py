"""``advcli sample``: a synthetic multi-turn rollout dump to try the other commands on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from advcli.cli.consoles import stderr
from advcli.cli.exits import reports_errors


@reports_errors
def sample_command(
    output: Annotated[
        Path,
        typer.Argument(
            help="Parquet file to write ('-': Parquet bytes on stdout, not a terminal).",
            show_default=False,
        ),
    ],
    groups: Annotated[int, typer.Option(min=1, max=10**9, help="Prompts (groups).")] = 64,
    rollouts: Annotated[int, typer.Option(min=1, max=100_000, help="Trajectories per prompt.")] = 8,
    max_turns: Annotated[
        int, typer.Option(min=1, max=10_000, help="Most turns per trajectory.")
    ] = 6,
    tokens: Annotated[
        int, typer.Option(min=2, max=1_000_000, help="Mean response tokens per turn row.")
    ] = 48,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Random seed.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> None:
    """Write a synthetic multi-turn rollout dump.

    Example: advcli sample rollouts.parquet --groups 64 --rollouts 8 --seed 0
    """
    from advcli.report.views import visible
    from advcli.sample import write_sample
    from advcli.write.outputs import goes_to_stdout

    rows = write_sample(
        output,
        groups=groups,
        rollouts=rollouts,
        max_turns=max_turns,
        tokens=tokens,
        seed=seed,
        force=force,
    )
    if not quiet:
        where = "standard output" if goes_to_stdout(output) else visible(output)
        stderr.print(
            Text(f"wrote {rows:,} turn rows of {groups * rollouts:,} trajectories to {where}")
        )

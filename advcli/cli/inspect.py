"""``advcli inspect``: a dump's column roles, counts, turns, scores and problems, from its key
columns only."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from advcli._runtime.process import (
    load_numpy_bridge,
    require_stdout,
    use_threads,
    write_stdout_text,
)
from advcli._runtime.signals import held
from advcli.cli.consoles import stdout
from advcli.cli.exits import reports_errors
from advcli.cli.option_table import option
from advcli.cli.options import (
    COLUMN_OPTIONS,
    AnchorScopeOpt,
    ConfigOpt,
    Inputs,
    ThreadsOpt,
    dump_settings,
    with_options,
)
from advcli.cli.progress_bar import progress_bar
from advcli.names import printable

JsonOpt = Annotated[bool, option("--json", help="Print the report as JSON on stdout.")]
InspectByOpt = Annotated[
    str | None,
    option(
        "--by",
        help="Each input file ('file') or each value of a column (e.g. step) is its own "
        "batch: groups are keyed by it, so ids that repeat across training steps stay apart.",
    ),
]


@with_options(*COLUMN_OPTIONS)
@reports_errors
def inspect_command(
    ctx: typer.Context,
    inputs: Inputs = None,
    # Not anchor_scope: dump_settings reads that as an advantage setting, which inspect has none of.
    step_group_scope: AnchorScopeOpt = None,
    by: InspectByOpt = None,
    json_output: JsonOpt = False,
    threads: ThreadsOpt = None,
    config_path: ConfigOpt = None,
) -> None:
    """Look at a dump before computing: column roles, counts, turns, scores, and problems.

    Reads only the key columns. Example: advcli inspect rollouts/ --json | jq .counts
    """
    require_stdout("the inspection")
    use_threads(threads)
    with held():  # Polars panics when a Ctrl-C lands inside its import
        from advcli.run.commands import inspect

        load_numpy_bridge()

    with progress_bar(True, "opening") as on_stage:
        summary = inspect(
            inputs or [],
            dump_settings(ctx).names,
            anchor_scope=step_group_scope,
            by=by,
            on_stage=on_stage,
        )
    if config_path is not None:
        summary["config"] = printable(str(config_path))
    if json_output:
        write_stdout_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", "the JSON")
    else:
        from advcli.cli.terminal import render_inspection
        from advcli.report.views import visible

        console = stdout()
        render_inspection(summary, console)
        if config_path is not None:
            console.print(Text(f"config: {visible(config_path)}"))

"""The help panels: every option of every command in one group of its ``--help``, by one table,
so that a command of 40 options reads as the seven things it asks about."""

from __future__ import annotations

from typing import Any

import typer.core

# Each panel's options by their long names, the panels in the order --help shows them. An
# option is in one panel whichever command has it (tests/test_cli_options.py holds every
# option of every command to the table).
PANELS: dict[str, tuple[str, ...]] = {
    "Columns": (
        "--group-col",
        "--group-size",
        "--traj-col",
        "--turn-col",
        "--reward-col",
        "--mask-col",
        "--anchor-col",
        "--step-reward-col",
        "--step-return-col",
        "--drop-duplicates",
    ),
    "Estimator": (
        "--level",
        "--estimator",
        "--epsilon",
        "--traj-score",
        "--scale",
        "--singleton",
        "--recipe",
    ),
    "GiGPO": ("--gamma", "--step-weight", "--gigpo-norm", "--anchor-scope"),
    "Per-turn rewards": ("--reward-mode", "--step-groups"),
    "Outputs": (
        "--output",
        "--format",
        "--columns",
        "--no-tokens",
        "--loss-weight",
        "--loss-scale-factor",
        "--report",
        "--top",
        "--json",
        "--markdown",
        "--plot",
        "--html",
        "--jsonl",
        "--force",
        "--quiet",
    ),
    "Run": (
        "--by",
        "--jobs",
        "--engine",
        "--address",
        "--fail-above",
        "--fail-on",
        "--follow",
        "--settle",
        "--config",
    ),
    "Machine": ("--threads",),
    "Synthetic dump": (
        "--groups",
        "--rollouts",
        "--max-turns",
        "--tokens",
        "--seed",
        "--trainer",
        "--anchor-share",
        "--invalid-rate",
        "--turn-reward",
    ),
}
PANEL_OF = {option: panel for panel, options in PANELS.items() for option in options}


# click's types are Any here: Typer brings its own copy of click in some releases, click itself in
# others.


def long_name(param: Any) -> str:
    """An option's long name (``--traj-col``), by which the table knows it."""
    return str(next(name for name in param.opts if name.startswith("--")))


class PanelledCommand(typer.core.TyperCommand):
    """A command whose ``--help`` lists its arguments, then its options panel by panel, then
    what is in no panel (``--help``)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": []}
        sections |= {panel: [] for panel in PANELS}
        sections["Other options"] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append(record)
            else:
                sections[PANEL_OF.get(long_name(param), "Other options")].append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

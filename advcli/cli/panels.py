"""The help panels: every option of every command in one group of its ``--help``, by the option
table (:mod:`advcli.cli.option_table`), so that a command of 40 options reads as the seven
things it asks about."""

from __future__ import annotations

from typing import Any

import typer.core

from advcli.cli.option_table import OPTIONS, PANELS

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
        params = sorted(self.get_params(ctx), key=_table_order)
        for param in params:
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append(record)
            else:
                # Each option's panel is its row's (option_table.option declared it so).
                panel = getattr(param, "rich_help_panel", None)
                sections[panel or "Other options"].append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


# An option's place in the table; arguments and options in none keep their order (a stable sort).
ORDER = {option: place for place, option in enumerate(OPTIONS)}


def _table_order(param: Any) -> int:
    if param.param_type_name == "argument":
        return -1
    return ORDER.get(long_name(param), len(ORDER))

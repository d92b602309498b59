"""The one table of the command line's options, by long name: the help panel that shows each
(``--help`` lists a command's options panel by panel, in the table's order) and whether a
config file may save it (the file's keys, and the ``--config`` help that lists them). Every
command's option is declared through it (:func:`option`): Typer gets each one's panel from its
row, and an option without a row fails at import. tests/cli/test_cli_options.py holds every
option of every command to the table."""

from __future__ import annotations

from typing import Any, NamedTuple

import typer


class OptionRow(NamedTuple):
    """Where an option shows in ``--help``, and whether ``advcli.toml`` may hold it."""

    panel: str
    saved: bool = True


COLUMNS = "Columns"
ESTIMATOR = "Estimator"
GIGPO = "GiGPO"
PER_TURN = "Per-turn rewards"
OUTPUTS = "Outputs"
RUN = "Run"
MACHINE = "Machine"
SYNTHETIC = "Synthetic dump"

# Never saved: where a run writes (a saved path would be replaced by every later run, and --force
# would make that silent), --quiet (it would hide the line saying that a config file is in
# force), watch's own (they make a run that never ends), --config itself, and sample's (sample
# reads no config file).
UNSAVED_OUTPUT = OptionRow(OUTPUTS, saved=False)
OPTIONS: dict[str, OptionRow] = {
    "--group-col": OptionRow(COLUMNS),
    "--group-size": OptionRow(COLUMNS),
    "--traj-col": OptionRow(COLUMNS),
    "--turn-col": OptionRow(COLUMNS),
    "--reward-col": OptionRow(COLUMNS),
    "--mask-col": OptionRow(COLUMNS),
    "--anchor-col": OptionRow(COLUMNS),
    "--step-reward-col": OptionRow(COLUMNS),
    "--step-return-col": OptionRow(COLUMNS),
    "--advantage-col": OptionRow(COLUMNS),
    "--drop-duplicates": OptionRow(COLUMNS),
    "--level": OptionRow(ESTIMATOR),
    "--estimator": OptionRow(ESTIMATOR),
    "--epsilon": OptionRow(ESTIMATOR),
    "--traj-score": OptionRow(ESTIMATOR),
    "--scale": OptionRow(ESTIMATOR),
    "--singleton": OptionRow(ESTIMATOR),
    "--std": OptionRow(ESTIMATOR),
    "--recipe": OptionRow(ESTIMATOR),
    "--gamma": OptionRow(GIGPO),
    "--step-weight": OptionRow(GIGPO),
    "--gigpo-norm": OptionRow(GIGPO),
    "--anchor-scope": OptionRow(GIGPO),
    "--reward-mode": OptionRow(PER_TURN),
    "--step-groups": OptionRow(PER_TURN),
    "--output": UNSAVED_OUTPUT,
    "--format": UNSAVED_OUTPUT,
    "--columns": OptionRow(OUTPUTS),
    "--no-tokens": OptionRow(OUTPUTS),
    "--loss-weight": OptionRow(OUTPUTS),
    "--loss-scale-factor": OptionRow(OUTPUTS),
    "--report": UNSAVED_OUTPUT,
    "--top": OptionRow(OUTPUTS),
    "--json": UNSAVED_OUTPUT,
    "--markdown": UNSAVED_OUTPUT,
    "--plot": UNSAVED_OUTPUT,
    "--html": UNSAVED_OUTPUT,
    "--jsonl": UNSAVED_OUTPUT,
    "--force": UNSAVED_OUTPUT,
    "--quiet": UNSAVED_OUTPUT,
    "--by": OptionRow(RUN),
    "--jobs": OptionRow(RUN),
    "--engine": OptionRow(RUN),
    "--address": OptionRow(RUN),
    "--fail-above": OptionRow(RUN),
    "--fail-on": OptionRow(RUN),
    "--expect": OptionRow(RUN),
    "--follow": OptionRow(RUN, saved=False),
    "--audit": OptionRow(RUN, saved=False),
    "--settle": OptionRow(RUN, saved=False),
    "--config": OptionRow(RUN, saved=False),
    "--threads": OptionRow(MACHINE),
    **{
        option: OptionRow(SYNTHETIC, saved=False)
        for option in (
            "--groups",
            "--rollouts",
            "--max-turns",
            "--tokens",
            "--seed",
            "--trainer",
            "--anchor-share",
            "--invalid-rate",
            "--turn-reward",
        )
    },
}
# The panels in the order --help shows them.
PANELS: tuple[str, ...] = tuple(dict.fromkeys(row.panel for row in OPTIONS.values()))
# The config file's keys: the long names without their dashes.
SAVED_KEYS: tuple[str, ...] = tuple(
    option.removeprefix("--") for option, row in OPTIONS.items() if row.saved
)
# The reading commands' options a config file never holds (sample reads none: its options are
# no key of the file at all).
UNSAVED_KEYS = frozenset(
    option.removeprefix("--")
    for option, row in OPTIONS.items()
    if not row.saved and row.panel != SYNTHETIC
)


def option(long_name: str, *other_names: str, **declaration: Any) -> Any:
    """Typer's declaration of the option ``long_name`` (``typer.Option``'s arguments in
    ``declaration``), in the help panel of its row of the table."""
    return typer.Option(
        long_name, *other_names, rich_help_panel=OPTIONS[long_name].panel, **declaration
    )

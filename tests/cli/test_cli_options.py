"""The reading commands' options become the library's settings in one place
(``advcli.cli.options.dump_settings``): each command's own options reach it, an option a command
does not have leaves the settings' default, and a saved option is named by its file and key."""

from __future__ import annotations

import pytest
import typer
import typer.main
from click.core import ParameterSource

from advcli.cli.app import app
from advcli.cli.option_table import OPTIONS, PANELS
from advcli.cli.options import dump_settings
from advcli.cli.panels import long_name
from advcli.settings.config import (
    AdvantageConfig,
    ColumnNames,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)

ADVCLI = typer.main.get_command(app)


def parsed(command: str, *args: str) -> typer.Context:
    """The command's context after Typer parsed ``args``, as the command receives it."""
    root = typer.Context(ADVCLI, info_name="advcli")
    return ADVCLI.commands[command].make_context(command, ["rollouts.parquet", *args], parent=root)


def test_compute_options_become_the_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ctx = parsed(
        "compute",
        *("-o", "out.parquet", "--level", "turn", "--estimator", "grpo_passk", "--epsilon", "0.5"),
        *("--traj-score", "last", "--scale", "batch", "--singleton", "zero"),
        *("--group-col", "g", "--traj-col", "t", "--turn-col", "k"),
        *("--reward-col", "r", "--mask-col", "m"),
    )
    settings = dump_settings(ctx)
    assert settings.config == AdvantageConfig(
        level=Level.TURN,
        estimator=Estimator.GRPO_PASSK,
        epsilon=0.5,
        traj_score=TrajScore.LAST,
        scale=Scale.BATCH,
        singleton=Singleton.ZERO,
    )
    assert settings.names == ColumnNames("g", "t", "k", "r", "m")


@pytest.mark.parametrize(
    ("command", "args", "config"),
    [
        # compare has no --level: its comparison runs both levels.
        ("compare", ["--estimator", "rloo"], AdvantageConfig(estimator=Estimator.RLOO)),
        # inspect computes nothing: none of the estimator options.
        ("inspect", [], AdvantageConfig()),
    ],
)
def test_an_option_a_command_lacks_keeps_the_settings_default(
    command, args, config, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    settings = dump_settings(parsed(command, *args, "--group-size", "4"))
    assert settings.config == config
    assert settings.names == ColumnNames(group_size=4)


def test_a_choice_kept_as_its_text_is_made_its_settings_type(tmp_path, monkeypatch):
    """Typer releases before choices were parsed to enums keep the option's text."""
    monkeypatch.chdir(tmp_path)
    ctx = parsed("compute", "-o", "out.parquet")
    ctx.params.update(level="turn", estimator="grpo", traj_score="max", scale="none")
    for name in ("level", "estimator", "traj_score", "scale"):
        ctx.set_parameter_source(name, ParameterSource.COMMANDLINE)
    config = dump_settings(ctx).config
    assert config.level is Level.TURN
    assert config.traj_score is TrajScore.MAX
    assert config.scale is Scale.NONE
    assert (
        config.describe()
        == AdvantageConfig(level=Level.TURN, traj_score=TrajScore.MAX, scale=Scale.NONE).describe()
    )


def test_a_saved_column_is_named_by_its_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advcli.toml").write_text('group-col = "prompt"\n')
    names = dump_settings(parsed("inspect", "--traj-col", "rollout")).names
    assert names == ColumnNames(group="prompt", trajectory="rollout")
    assert names.named_in == {"group": "'group-col' in advcli.toml"}


@pytest.mark.parametrize("command", ["compute", "compare"])
def test_a_typed_group_size_wins_over_a_saved_group_column(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advcli.toml").write_text('group-col = "prompt"\n')
    output = ["-o", "out.parquet"] if command == "compute" else []
    names = dump_settings(parsed(command, *output, "--group-size", "8")).names
    assert names == ColumnNames(group_size=8)
    assert names.named_in == {}


def test_every_option_of_every_command_is_in_one_help_panel(run):
    """The option table names every option a command has (only --help is in none), and each
    command's --help shows its options under their panels, each panel's in the table's order."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, command in commands.items():
        options = [
            long_name(param) for param in command.params if param.param_type_name == "option"
        ]
        assert [option for option in options if option not in OPTIONS] == [], name
        shown = [panel for panel in PANELS if any(OPTIONS[o].panel == panel for o in options)]
        lines = run(name, "--help").stdout.splitlines()
        titles = [line[:-1] for line in lines if line[:1].isupper()]
        arguments = (
            ["Arguments"] if any(p.param_type_name == "argument" for p in command.params) else []
        )
        assert titles[1:] == [*arguments, *shown, "Other options"], name
        listed = [
            word.rstrip(",")
            for line in lines
            for word in line.split()[:2]
            if word.rstrip(",") in options and line.startswith("  -")
        ]
        assert listed == [option for option in OPTIONS if option in options], name

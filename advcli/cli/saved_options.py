"""Saved options as the options' defaults: the config file in force (read by
:mod:`advcli.cli.config_file`) goes into ``ctx.default_map``, each value checked by its own
option exactly as the same value typed on the command line. Which options a file may hold is
the option table's (:mod:`advcli.cli.option_table`)."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import typer
import typer.core

from advcli.cli.exits import reports_errors
from advcli.cli.option_table import OPTIONS, UNSAVED_KEYS


def savable(command: Any) -> dict[str, Any]:
    """A command's options that a config file may hold (the option table's saved ones), by long
    name without the dashes."""
    options = {}
    for param in command.params:
        if isinstance(param, typer.core.TyperOption):
            option = next(opt for opt in param.opts if opt.startswith("--"))
            row = OPTIONS.get(option)
            if row is not None and row.saved:
                options[option.removeprefix("--")] = param
    return options


def _value_types(command: Any, options: dict[str, Any]) -> dict[str, type]:
    """The TOML type a saved value of each option must have, from the command's annotations:
    choices (enums) and paths are strings, as on the command line."""
    hints = typing.get_type_hints(command.callback)
    types = {}
    for key, option in options.items():
        hint = hints[option.name]
        declared = next(arg for arg in typing.get_args(hint) or (hint,) if arg is not type(None))
        types[key] = next((kind for kind in (bool, int, float) if declared is kind), str)
    return types


@reports_errors
def read_config(ctx: typer.Context, value: Path | None) -> Path | None:
    """Load the config file in force into ``ctx.default_map``, so that its values become the
    options' defaults: the command line still wins, and each value goes through its option's
    own type, choices and range. Eager, so it runs before the other options are read."""
    from advcli.cli.config_file import command_settings, find_config

    config = find_config(value)
    if config is None:
        return None
    reading = {
        name: command
        for name, command in ctx.find_root().command.commands.items()  # type: ignore[attr-defined]
        if any(param.name == "config_path" for param in command.params)
    }
    commands = {name: savable(command) for name, command in reading.items()}
    settings = command_settings(
        config,
        {name: _value_types(reading[name], options) for name, options in commands.items()},
        UNSAVED_KEYS,
    )
    # Every command's values are checked, so a bad value fails whichever command runs.
    for name, values in settings.items():
        for key, setting in values.items():
            try:
                commands[name][key].process_value(ctx, setting.value)
            except typer.BadParameter as error:
                raise config.error(setting.key, error.message) from None
    command = ctx.command.name or ""
    ctx.default_map = {
        commands[command][key].name: setting.value for key, setting in settings[command].items()
    }
    return config.path

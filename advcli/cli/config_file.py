"""Saved options: ``advcli.toml``, or the ``[tool.advcli]`` table of ``pyproject.toml``.

A flat table applies to every reading command that has the option; a sub-table named after a
command (``[compare]``, or ``[tool.advcli.compare]`` in pyproject.toml) overrides it for that
command. Keys are the long option names without their dashes (``group-col = "prompt_id"``).

This module reads and checks the file's shape and TOML types only: which keys a command has and
how their values are converted and range-checked is the command line's
(``advcli.cli.saved_options``), so that a saved value is checked exactly as the same value typed
as an option.
"""

from __future__ import annotations

import difflib
import math
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from advcli.errors import AdvcliError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

CONFIG_NAME = "advcli.toml"
PYPROJECT_NAME = "pyproject.toml"

# What a saved value must be, by the kind of its option: a TOML integer is not a float's
# stand-in the other way round (2.5 for an integer would be cut to 2), and a boolean is never a
# number (TOML's true is not 1).
KINDS: dict[type, str] = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


class Setting(NamedTuple):
    """A saved value and the key that holds it, as the error messages name it."""

    value: Any
    key: str


@dataclass(frozen=True)
class ConfigFile:
    """An options table read from ``path``: the whole file, or pyproject's ``[tool.advcli]``."""

    path: Path
    table: Mapping[str, Any]

    def error(self, key: str, message: str) -> AdvcliError:
        """The one error for a bad key or value: ``<file>: key '<key>': <message>``."""
        return AdvcliError(f"{self.path}: key '{key}': {message}")


def find_config(explicit: Path | None) -> ConfigFile | None:
    """The config file in force: ``explicit`` (which must exist), else ``./advcli.toml``, else
    ``./pyproject.toml`` when it has a ``[tool.advcli]`` table, else None.

    A ``pyproject.toml`` given explicitly must have the table; one found in the working
    directory without it is someone else's file and is ignored.
    """
    if explicit is not None:
        config = _options_table(explicit)
        if config is None:
            raise AdvcliError(f"{explicit}: no [tool.advcli] table")
        return config
    # lexists: a link whose target is gone is a config file that cannot be read, not none.
    local = Path(CONFIG_NAME)
    if os.path.lexists(local):
        return _options_table(local)
    pyproject = Path(PYPROJECT_NAME)
    if pyproject.exists():
        return _options_table(pyproject)
    return None


def command_settings(
    config: ConfigFile,
    options: Mapping[str, Mapping[str, type]],
    unsaved: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Setting]]:
    """Each reading command's saved values, checked against ``options``.

    Parameters
    ----------
    config
        The file read by :func:`find_config`.
    options
        For each reading command, its savable keys and the Python type of each one's value
        (``bool``, ``int``, ``float`` or ``str``).
    unsaved
        Option names the commands have that are never saved (outputs), for a clearer error.

    Returns
    -------
    dict
        ``{command: {key: Setting}}``: the flat keys the command has, overridden by its own
        sub-table. The whole file is checked, not only the table of the command that runs.
    """
    every_key = sorted({key for keys in options.values() for key in keys})
    flat: dict[str, Setting] = {}
    sections: dict[str, dict[str, Setting]] = {command: {} for command in options}
    for key, value in config.table.items():
        if key in options:
            if not isinstance(value, dict):
                raise config.error(key, f"must be a table of {key}'s options, not {_kind(value)}")
            for sub_key, sub_value in value.items():
                where = f"{key}.{sub_key}"
                if sub_key not in options[key]:
                    owners = [command for command, keys in options.items() if sub_key in keys]
                    raise config.error(
                        where,
                        f"{key} has no option --{sub_key}"
                        + (f" ({_listed(owners)} has)" if owners else "")
                        + _suggestion(sub_key, sorted(options[key]), where=f"{key}."),
                    )
                sections[key][sub_key] = _checked(config, where, sub_value, options[key][sub_key])
        elif key in every_key:
            kind = next(keys[key] for keys in options.values() if key in keys)
            flat[key] = _checked(config, key, value, kind)
        elif key in unsaved:
            raise config.error(key, f"--{key} is given on the command line only")
        else:
            raise config.error(
                key,
                f"not an option of {_listed(list(options))}"
                + _suggestion(key, every_key + sorted(options)),
            )
    return {
        command: {key: flat[key] for key in keys if key in flat} | sections[command]
        for command, keys in options.items()
    }


def _options_table(path: Path) -> ConfigFile | None:
    """The options table of ``path``: pyproject's ``[tool.advcli]`` (None without one), else
    the whole file."""
    document = _read_toml(path)
    if path.name != PYPROJECT_NAME:
        return ConfigFile(path, document)
    tool = document.get("tool")
    if not isinstance(tool, dict) or "advcli" not in tool:
        return None
    table = tool["advcli"]
    if not isinstance(table, dict):
        raise AdvcliError(f"{path}: key 'tool.advcli': must be a table, not {_kind(table)}")
    return ConfigFile(path, table)


def _read_toml(path: Path) -> dict[str, Any]:
    # Read and decoded here, and parsed from text, which every tomli version accepts.
    try:
        text = _config_bytes(path).decode("utf-8-sig")  # a byte-order mark is no key
    except FileNotFoundError:
        dangling = " (a link whose target is gone)" if path.is_symlink() else ""
        raise AdvcliError(f"{path}: no such config file{dangling}") from None
    except OSError as error:
        raise AdvcliError(f"{path}: cannot read the config file: {error.strerror}") from None
    except UnicodeDecodeError:
        raise AdvcliError(f"{path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # The message ends "(at line L, column C)".
        raise AdvcliError(f"{path}: invalid TOML: {error}") from None


# A config file holds a few dozen options: one larger than this is not one.
MAX_CONFIG_BYTES = 1 << 20


def _config_bytes(path: Path) -> bytes:
    """The file's bytes, if it is a regular file of at most :data:`MAX_CONFIG_BYTES`: opened
    without waiting (a named pipe would wait for a writer for ever), a device is refused before
    it is read (``/dev/zero`` never ends)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise AdvcliError(f"{path}: not a regular file; a config file is a TOML file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise AdvcliError(
                f"{path}: {info.st_size:,} bytes, too large for a config file (at most "
                f"{MAX_CONFIG_BYTES:,})"
            )
        return file.read(MAX_CONFIG_BYTES + 1)


def _checked(config: ConfigFile, key: str, value: Any, kind: type) -> Setting:
    """``value`` if it is of the option's kind; floats must be finite, as every float option's
    own check requires."""
    allowed = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, allowed):
        raise config.error(key, f"must be {KINDS[kind]}, not {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise config.error(key, f"must be a finite number, not {value}")
    return Setting(value, key)


def _kind(value: Any) -> str:
    """The TOML kind of a parsed value, with the value itself for a scalar, for error messages."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    for kind in KINDS:
        if type(value) is kind:
            return f"{'a float' if kind is float else KINDS[kind]} ({value!r})"
    return f"a date or time ({value})"


def _listed(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def _suggestion(key: str, candidates: list[str], where: str = "") -> str:
    close = difflib.get_close_matches(key, candidates, n=1)
    return f"; did you mean '{where}{close[0]}'?" if close else ""

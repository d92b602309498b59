"""What the columns of a file advcli wrote are (:func:`advcli.dump.write_batch`'s step files),
kept in the Parquet file's key-value metadata under ``advcli``: the column of each role and the
training step's. A reader takes those columns as if they were named by option, so that a column
whose name says another role (a training step called ``step``, which names a turn in ROLL's
batches) is never read as one.

The value is JSON::

    {"format": 1, "written_by": "advcli.dump.write_batch", "trainer": "verl-agent",
     "columns": {"data_id": "group", "rollout_id": "trajectory", ..., "step": "training_step"}}

``trainer`` (absent for a batch of no trainer advcli knows) is the dialect the batch was read
in: its rules that are not columns (verl-agent's own score rule) stand for the file as for the
batch.

A file whose ``advcli`` metadata advcli cannot read (another format, a role it does not know, a
column the file lacks) is an error, never a file read by its names alone: the metadata was
written to say how the file is read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from advcli.errors import AdvcliError
from advcli.read.dialects import ROLES, STEP_ROLES, dialect_named
from advcli.settings.config import ColumnNames

KEY = "advcli"
FORMAT = 1
TRAINING_STEP = "training_step"
WRITTEN_BY = "advcli.dump.write_batch"
_KNOWN = frozenset((*ROLES, *STEP_ROLES, TRAINING_STEP))


@dataclass(frozen=True)
class FileRoles:
    """The role of each column a file's advcli metadata names (``training_step`` for the
    training step's), and what wrote the file."""

    columns: tuple[tuple[str, str], ...]
    written_by: str = WRITTEN_BY
    # The dialect the written batch was read in, None for none.
    trainer: str | None = None
    # Where the roles were read from, as the reasons say it.
    source: str = "the file's advcli metadata"
    # What a role's column holds, where the source says more than its name (a trainer's own
    # dump read in advcli's layout: :mod:`advcli.read.trainer_dumps`), by role.
    why: tuple[tuple[str, str], ...] = ()

    def column(self, role: str) -> str | None:
        """The column of ``role`` (or of ``training_step``), None where the file has none."""
        return next((name for name, its in self.columns if its == role), None)

    @property
    def training_step(self) -> str | None:
        return self.column(TRAINING_STEP)

    def named_in(self, role: str) -> str:
        """Where ``role``'s column was named, as its reason says it."""
        why = dict(self.why).get(role)
        return self.source if why is None else f"{self.source}: {why}"

    def metadata(self) -> dict[str, str]:
        """The Parquet key-value metadata that says these roles."""
        value: dict[str, Any] = {"format": FORMAT, "written_by": self.written_by}
        if self.trainer is not None:
            value["trainer"] = self.trainer
        return {KEY: json.dumps({**value, "columns": dict(self.columns)})}


def read_file_roles(
    metadata: Mapping[bytes, bytes] | None, schema: pl.Schema, label: str
) -> FileRoles | None:
    """The roles a Parquet file's key-value ``metadata`` names, None where it has no ``advcli``
    key; an error naming the file where advcli cannot read them or the file lacks a column."""
    raw = (metadata or {}).get(KEY.encode())
    if raw is None:
        return None
    bad = f"{label}: its '{KEY}' Parquet metadata is not advcli's"
    try:
        value: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise AdvcliError(f"{bad} (not JSON)") from None
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        found = value.get("format") if isinstance(value, dict) else None
        raise AdvcliError(
            f"{bad} (format {found!r}; this advcli reads format {FORMAT}): read it with an "
            "advcli as new as the one that wrote it"
        )
    columns, written_by = value.get("columns"), value.get("written_by", WRITTEN_BY)
    if not isinstance(columns, dict) or not isinstance(written_by, str):
        raise AdvcliError(f"{bad} (no 'columns' mapping of column to role)")
    trainer = value.get("trainer")
    if trainer is not None and dialect_named(trainer) is None:
        raise AdvcliError(f"{bad}: it names the trainer {trainer!r}, unknown to advcli")
    for name, role in columns.items():
        if role not in _KNOWN:
            raise AdvcliError(f"{bad}: column '{name}' has the role {role!r}, unknown to advcli")
        if name not in schema:
            raise AdvcliError(
                f"{label}: its advcli metadata names column '{name}' ({role}), which the file "
                "does not have"
            )
    roles = list(columns.values())
    repeated = next((role for role in roles if roles.count(role) > 1), None)
    if repeated is not None:
        raise AdvcliError(f"{bad}: two columns have the role {repeated!r}")
    return FileRoles(tuple(columns.items()), written_by, trainer)


def named_by_file(
    names: ColumnNames, roles: FileRoles | None, *, turn_rewards: bool = False
) -> ColumnNames:
    """``names`` with the columns the file's metadata names for the roles no option named.
    Under per-turn rewards (``turn_rewards``) a step's own reward the file holds is each turn's
    reward, in place of the trajectory's outcome the file names as the reward."""
    if roles is None:
        return names
    named: dict[str, Any] = {
        role: column
        for role in (*ROLES, *STEP_ROLES)
        if (column := roles.column(role)) is not None and getattr(names, role) is None
    }
    step_reward = turn_rewards and "reward" in named and "step_reward" in named
    if step_reward:
        named["reward"] = named.pop("step_reward")
    if names.step_reward is not None or names.step_return is not None:
        # The two exclude each other: one named by option stands for both.
        named.pop("step_reward", None)
        named.pop("step_return", None)
    if names.group_size is not None:
        named.pop("group", None)
    if not named:
        return names
    where = {role: roles.named_in(role) for role in named}
    if step_reward:
        where["reward"] = f"{roles.source} as the step's own reward"
    return replace(names, **named, named_in={**names.named_in, **where})

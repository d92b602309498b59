"""Finding each role's column in one schema (:class:`RolePicker`): the column an option names,
else the one name of the dump's dialect the file has, else a column named like the role; why, for
every output, and what it could not find, for one error naming every missing role."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import polars as pl

from advcli.errors import AdvcliError
from advcli.read.dialects import (
    ADVCLI,
    DERIVED_FROM,
    OPTIONS,
    STEP_ROLES,
    Dialect,
    Role,
    all_names,
    dialect_of,
    named_like,
    signed,
    step_names,
    trainer_of,
)
from advcli.read.dtypes import can_hold


@dataclass(frozen=True)
class Options:
    """How the reading's errors name the options that give a role its column: the command
    line's flags (``--traj-col NAME``, the default) or a library call's keywords
    (``trajectory_key='NAME'``). ``by``: the option that reads each training step as its own
    batch, None where the caller has none (a trainer's batch is one step). ``holder``: what
    holds the columns, for the list of them. ``rows_without_trajectory``: a holder with no
    trajectory column has a trajectory a row, whatever its dialect (``write_batch``'s batches,
    as verl's agent loop keeps a conversation in one row), unless its values contradict it."""

    names: Mapping[Role, str] = field(default_factory=lambda: OPTIONS)
    keywords: bool = False
    by: str | None = "--by"
    holder: str = "file"
    rows_without_trajectory: bool = False

    def giving(self, role: Role, column: str) -> list[str]:
        """The option naming ``column`` for ``role``, as command-line words."""
        if self.keywords:
            return [f"{self.names[role]}={column!r}"]
        return [self.names[role], column]

    def given(self, role: Role, column: str) -> str:
        """:meth:`giving` as text: ``--traj-col traj_uid``, ``trajectory_key='traj_uid'``."""
        return " ".join(self.giving(role, column))

    def named(self, role: Role) -> str:
        """The option alone: ``--traj-col``, ``trajectory_key=``."""
        return f"{self.names[role]}=" if self.keywords else self.names[role]


COMMAND_LINE = Options()


class RolePicker:
    """Finds each role's column in one schema, in the dump's dialect, recording why for every
    output, and what it could not find in ``missing`` (role → what to do)."""

    def __init__(
        self,
        schema: pl.Schema,
        where: str,
        reasons: dict[str, str],
        named_in: dict[str, str],
        options: Options = COMMAND_LINE,
    ) -> None:
        self.schema, self.where, self.reasons, self.named_in = schema, where, reasons, named_in
        self.options = options
        self.dialect, self.tie = dialect_of(schema)
        self.missing: dict[str, str] = {}
        self.by_name: list[Role] = []
        self._wanted: list[str] = []

    def __call__(
        self,
        role: Role,
        chosen: str | None,
        required: Literal[True] | str | None = True,
        *,
        taken: Sequence[str | None] = (),
        by_name: bool = True,
    ) -> str | None:
        """The column for ``role``, or None where the dialect has no such column (each row a
        trajectory, groups as blocks of rows, no turn index) or none was found (then recorded
        in ``missing`` when the role is ``required``: True, or a phrase saying what needs it).
        ``taken``: columns other roles have; ``by_name``: whether a column named like the role
        (:func:`named_like`) may stand in where no trainer's name is found."""
        option = self.options.named(role)
        if chosen is not None:
            if chosen not in self.schema:
                named = self.named_in.get(role, option)
                raise AdvcliError(
                    f"{self.where}: column '{chosen}' ({named}) not found{self._hint([chosen])}"
                )
            self.reasons[role] = f"named by {self.named_in.get(role, option)}"
            return chosen
        if self.tie and role in ("group", "trajectory"):
            first, second = self.tie
            agreed = set(first.names(role)) & set(second.names(role)) & set(self.schema.names())
            if len(agreed) == 1:
                name = agreed.pop()
                self.reasons[role] = (
                    f"'{name}' is the {role} column of {first.trainer}'s and {second.trainer}'s "
                    "dumps"
                )
                return name
            raise AdvcliError(
                f"{self.where}: the columns fit two trainers' dumps, {signed(first)} and "
                f"{signed(second)}; name the {role} column with {option}"
            )
        dialect = self.dialect
        names, present = self._known_names(role)
        present = [name for name in present if name not in taken]
        if len(present) > 1:
            raise AdvcliError(
                f"{self.where}: two columns could be the {role.replace('_', ' ')}: "
                f"'{present[0]}' and '{present[1]}'; pick one with "
                f"{self.options.given(role, 'NAME')}"
            )
        if present:
            name = present[0]
            whose = (
                dialect.trainer
                if dialect is not None and name in dialect.names(role)
                else trainer_of(name)
            )
            self.reasons[role] = (
                f"'{name}' is the {role.replace('_', ' ')} column of {whose}'s dumps"
            )
            return name
        rows_stand_in = dialect is not None and not names and role in ("group", "trajectory")
        if by_name and (role != "trajectory" or not rows_stand_in):
            found = self._named_like(role, taken, dialect)
            if found is not None:
                return found
        if rows_stand_in:
            return None  # the dialect's rows are trajectories, or its groups blocks of rows
        if required is None:
            return None
        needed = f" ({required})" if isinstance(required, str) else ""
        expected = ", ".join(f"'{name}'" for name in names)
        own = dialect is not None and (role not in STEP_ROLES or dialect.names(role))
        source = f"{dialect.trainer}'s dumps name it" if own and dialect else "expected"
        self.missing[role] = (
            f"no {role.replace('_', ' ')} column{needed}: {source} {expected}, or name one "
            f"with {option}"
        )
        self._wanted += names
        return None

    def _known_names(self, role: Role) -> tuple[tuple[str, ...], list[str]]:
        """The trainers' names for ``role`` that were looked for, and those the schema has."""
        dialect = self.dialect
        if role in STEP_ROLES:
            names, others = step_names(role, dialect)
            present = _present(self.schema, role, names)
            if not present:
                # No name of the dump's own trainer: another trainer's (Trinity-RFT's, ROLL's).
                names += others
                present = _present(self.schema, role, names)
            return names, present
        names = dialect.names(role) if dialect is not None else all_names(role)
        present = _present(self.schema, role, names)
        if not present and dialect is not None and role in ("turn", "reward", "mask"):
            # A dialect's own names first, then advcli's (a scalar 'score', a
            # 'response_length'), less any the trainer uses for something else.
            names += tuple(
                name
                for name in ADVCLI.names(role)
                if name not in names and name not in dialect.not_read
            )
            present = _present(self.schema, role, names)
        return names, present

    def _named_like(
        self, role: Role, taken: Sequence[str | None], dialect: Dialect | None
    ) -> str | None:
        """The one column whose name says ``role`` (``prompt_id``, ``traj_id``, ``turn``…), not
        taken by another role; two are an error naming both."""
        found = [
            name
            for name in self.schema.names()
            if named_like(role, name)
            and name not in taken
            and (dialect is None or name not in dialect.not_read)
            and can_hold(role, self.schema[name])
        ]
        if len(found) > 1:
            raise AdvcliError(
                f"{self.where}: two columns are named like the {role}: '{found[0]}' and "
                f"'{found[1]}'; pick one with {self.options.given(role, 'NAME')}"
            )
        if not found:
            return None
        name = found[0]
        self.by_name.append(role)
        trainer = f"{dialect.trainer}'s dumps have no {role} column, and " if dialect else ""
        self.reasons[role] = f"{trainer}'{name}' is named like the {role} {ROLE_NOUNS[role]}"
        return name

    def hint_names(self) -> str:
        """The file's columns, with the nearest names to those looked for."""
        return self._hint(self._wanted)

    def _hint(self, wanted: Sequence[str]) -> str:
        """The file's columns, with the nearest names to ``wanted`` as a suggestion."""
        names = self.schema.names()
        nearest: list[str] = []
        for name in wanted:
            nearest += difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        nearest = list(dict.fromkeys(nearest))[:3]
        shown = ", ".join(f"'{name}'" for name in names[:COLUMNS_SHOWN])
        more = f" and {len(names) - COLUMNS_SHOWN} more" if len(names) > COLUMNS_SHOWN else ""
        suggestion = (
            f"; did you mean {' or '.join(repr(name) for name in nearest)}?" if nearest else ""
        )
        return f". The {self.options.holder} has {shown}{more}{suggestion}"


# What a role's column holds, for the reasons: "named like the group id".
ROLE_NOUNS: dict[Role, str] = {
    "group": "id",
    "trajectory": "id",
    "turn": "index",
    "reward": "",
    "mask": "",
    "anchor": "",
    "step_reward": "",
    "step_return": "",
}

# How many of a file's columns an error lists.
COLUMNS_SHOWN = 20


def _present(schema: pl.Schema, role: Role, names: Sequence[str]) -> list[str]:
    """The names of ``names`` that ``schema`` has, less those a derived column present
    supersedes and, in an advcli output read again, advcli's own ``score``."""
    present = [name for name in names if name in schema]
    for derived, source in DERIVED_FROM.items():
        if derived in present and source in present:
            present.remove(source)
    if role == "reward" and "advantage" in schema and "score" in present and len(present) > 1:
        # An advcli output read again: its 'score' is advcli's own column, the per-row sum of
        # the reward it was computed from, so that reward column is the one to read.
        present.remove("score")
    return present

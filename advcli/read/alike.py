"""One reading for a run of many parts: ``compare --by``, ``--follow`` and ``compute --by file``
read each part (a file, or a column's values) on its own, and take the first part's roles for
the run; a later part read otherwise is read again with the run's columns where its values say
nothing against them, else refused by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn, TypeVar

from advcli.errors import AdvcliError
from advcli.read.columns import ColumnRoles
from advcli.read.dialects import ROLES, STEP_ROLES
from advcli.settings.config import ColumnNames

T = TypeVar("T")


@dataclass
class ReadAlike:
    """The roles a run of many parts (files, or a column's values) is read with: its first
    part's. Roles read from the values can differ where the files' schemas agree (a column
    named like a trajectory id repeats within groups in one file, and is unique per row in the
    next): a later part read with none for a role the run reads from a column is read again
    with that column named, and a part read otherwise still is refused, since its figures or
    rows would be given under another reading than the one the run reports. ``every``: the
    parts, for the message ("every file")."""

    every: str = "every file"
    columns: ColumnRoles | None = None
    first: str = ""

    def as_run(
        self,
        part: str,
        read: T,
        columns: Callable[[T], ColumnRoles],
        names: ColumnNames,
        read_again: Callable[[ColumnNames], T],
    ) -> T:
        """``part`` (its name in messages) as the run reads it: ``read`` (read with ``names``;
        ``columns`` gives its roles) if it is read as the run is (taken for the run if it is
        the first part), else ``read_again`` with the run's columns for the roles it read with
        none (:meth:`names`) if that reads it as the run is; else an error naming the part and
        what it reads otherwise."""
        if self.take(columns(read), part):
            return read
        run_names = self.names(columns(read), names)
        if run_names is not None:
            again = read_again(run_names)
            if self.take(columns(again), part):
                return again
        self.refuse(columns(read), part)

    def take(self, columns: ColumnRoles, part: str) -> bool:
        """Whether ``part`` (its name in messages) is read as the run is: its ``columns`` taken
        for the run if it is the first part."""
        if self.columns is None:
            self.columns, self.first = columns, part
            return True
        return not _differing(columns, self.columns)

    def names(self, columns: ColumnRoles, names: ColumnNames) -> ColumnNames | None:
        """``names`` with the run's columns named for the roles ``columns`` read with none:
        where this part's values say nothing of a column (trajectory ids unique per row, or
        one per group), nothing contradicts the run's reading of it. None if there is no such
        role."""
        assert self.columns is not None
        named = {
            role: getattr(self.columns, role)
            for role in (*ROLES, *STEP_ROLES)
            if getattr(columns, role) is None
            and getattr(self.columns, role) is not None
            and getattr(names, role) is None
        }
        if not named:
            return None
        where: dict[str, str] = {role: f"the run's first part, {self.first}" for role in named}
        return replace(names, **named, named_in={**names.named_in, **where})

    def refuse(self, columns: ColumnRoles, part: str) -> NoReturn:
        """Refuse ``part``, read with ``columns``, naming what it reads otherwise than the run."""
        assert self.columns is not None
        differing = _differing(columns, self.columns)
        shown = "; ".join(f"{name}: {here} here, {there} there" for name, here, there in differing)
        named = any(name in (*ROLES, *STEP_ROLES) for name, _, _ in differing)
        advice = (
            "; name the columns (--group-col, --traj-col, --turn-col, --reward-col, --mask-col) "
            f"so that {self.every} is read alike"
            if named
            else f": {self.every} must be of one layout"
        )
        raise AdvcliError(f"{part}: read otherwise than {self.first} ({shown}){advice}")


# What decides how a part's rows are read, by ColumnRoles field, as messages name it: each
# role's column, the dialect, the reward's and mask's kinds, groups of rows, SkyRL's last-step
# runs. Not the fixed widths of arrays (each step a trainer writes is padded to its own longest
# row), nor the reasons and notes.
_READ_BY: dict[str, str] = {
    **{role: role for role in (*ROLES, *STEP_ROLES)},
    "dialect": "layout",
    "reward_kind": "reward kind",
    "mask_kind": "mask kind",
    "group_size": "groups of rows",
    "last_step": "last-step flag",
    "trajectory_from_last_step": "trajectories as runs of rows",
    "padding_ids": "padding ids",
}

_KINDS = {
    "token_rewards": "token rewards",
    "scalar": "a scalar",
    "mask": "a list of 0/1",
    "length": "a response length",
}


def _differing(columns: ColumnRoles, first: ColumnRoles) -> list[tuple[str, str, str]]:
    """What ``columns`` read otherwise than ``first``, as (what, here, there)."""
    return [
        (name, _shown(field, getattr(columns, field)), _shown(field, getattr(first, field)))
        for field, name in _READ_BY.items()
        if getattr(columns, field) != getattr(first, field)
    ]


def _shown(field: str, value: object) -> str:
    if value is None:
        return "none"
    if field == "dialect":
        return f"{value}'s"
    if field in ("reward_kind", "mask_kind"):
        return _KINDS[str(value)]
    return repr(value)

"""Stage 1's reading of a dump: which column plays which role, from the schema
(:func:`advcli.columns.resolve_columns`) and, where that reading assumes something, from the
values of the few columns that could contradict it.

An assumption is taken only when nothing in the file contradicts it:

- **each row a trajectory** (verl's layout): a column named like a trajectory id (or a trainer's
  trajectory column) whose values repeat within a group says the rows are turns. The one such
  column is read as the trajectory, and the reason says so; two are an error naming both. A
  column named like a turn index whose values differ says the same, and without a trajectory
  column that is an error. A column constant over the whole dump says nothing.
- **groups as blocks of rows** (``--group-size``, TRL, OpenRLHF): a column named like a group id
  whose values change within a block contradicts the blocks: an error naming it.

When roles find no column, one error names every missing role with its likeliest columns, ranked
by what their values look like, and the options that read the dump (:attr:`MissingRoles.flags`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from advcli.columns import (
    DIALECTS,
    OPTIONS,
    ColumnRoles,
    Role,
    can_hold,
    is_id_type,
    named_like,
    resolve_columns,
    sequence_of,
)
from advcli.errors import AdvcliError, MissingRoles
from advcli.settings import ColumnNames

# Reads the named columns, every row in input order (a file's or a batch's).
Values = Callable[[Sequence[str]], pl.DataFrame]

# The rows whose values rank the candidates of a missing role (enough to tell a group from a
# turn index, few enough for every pair of columns to be compared at once).
RANKED_ROWS = 100_000
# How many candidate columns an error names for one role.
CANDIDATES_SHOWN = 3


def read_roles(
    schema: pl.Schema,
    where: str,
    names: ColumnNames,
    values: Values,
    *,
    mask_needed_for: str | None = None,
    not_turns: Sequence[str] = (),
) -> ColumnRoles:
    """The column of each role, checked against the values where the schema's reading assumes
    something (see the module's text). ``values`` reads columns of the dump; it is called only
    when a check or an error needs it. ``not_turns``: columns that are known not to be the turn
    (the ``--by`` step column)."""
    options = {
        "group": names.group,
        "trajectory": names.trajectory,
        "turn": names.turn,
        "reward": names.reward,
        "mask": names.mask,
        "group_size": names.group_size,
        "mask_needed_for": mask_needed_for,
        "not_turns": not_turns,
        "named_in": names.named_in,
    }
    try:
        roles = resolve_columns(schema, where, **options)  # type: ignore[arg-type]
    except MissingRoles as missing:
        raise _ranked(missing, schema, values, names) from None
    if roles.trajectory is None:
        trajectory = _trajectory_in_values(schema, where, roles, values, not_turns)
        if trajectory is not None:
            column, why = trajectory
            roles = resolve_columns(schema, where, **{**options, "trajectory": column})  # type: ignore[arg-type]
            roles.reasons["trajectory"] = why
    if roles.group is None and roles.group_size is not None:
        _check_blocks(schema, where, roles, values)
    return roles


def _trajectory_in_values(
    schema: pl.Schema,
    where: str,
    roles: ColumnRoles,
    values: Values,
    not_turns: Sequence[str],
) -> tuple[str, str] | None:
    """For a dump read one row a trajectory: the column that the values show is the trajectory
    (and why), None when nothing contradicts the reading; an error when the rows are turns of
    trajectories no column names."""
    taken = {roles.group, roles.reward, roles.mask, *not_turns}
    trajectory_like = [
        name
        for name in schema.names()
        if name not in taken and is_id_type(schema[name]) and _says("trajectory", name)
    ]
    turn_like = [
        name
        for name in schema.names()
        if name not in taken
        and schema[name].is_integer()
        and _says("turn", name)
        and not _is_step(name)
    ]
    if not trajectory_like and not turn_like:
        return None
    frame = values(list(dict.fromkeys([*_group_key_columns(roles), *trajectory_like, *turn_like])))
    group = _group_key(roles, frame.height)
    rows = frame.height
    repeating = []
    for name in trajectory_like:
        counts = frame.select(
            pl.col(name).n_unique().alias("values"),
            pl.struct(group.alias("__group"), pl.col(name)).n_unique().alias("pairs"),
        ).row(0, named=True)
        if counts["values"] > 1 and counts["pairs"] < rows:
            repeating.append((name, counts["pairs"]))
    trainer = f"{roles.dialect}'s dumps keep" if roles.dialect else "a dump without one keeps"
    if len(repeating) > 1:
        listed = " and ".join(f"'{name}'" for name, _ in repeating)
        raise AdvcliError(
            f"{where}: the rows are not whole trajectories: {listed} both repeat within groups; "
            f"name the trajectory column with --traj-col {repeating[0][0]}"
        )
    if repeating:
        name, pairs = repeating[0]
        return name, (
            f"'{name}' is named like a trajectory id and its values repeat within groups "
            f"({rows:,} rows, {pairs:,} trajectories), so the rows are turns: read as the "
            f"trajectory ({trainer} a trajectory in one row)"
        )
    for name in turn_like:
        distinct = frame[name].n_unique()
        if distinct > 1:
            raise AdvcliError(
                f"{where}: {trainer} a trajectory in one row, but column '{name}' numbers turns "
                f"({distinct:,} distinct values) and no column says which trajectory a row "
                "belongs to; name the trajectory column with --traj-col"
            )
    return None


def _says(role: Role, name: str) -> bool:
    """Named like ``role``, or one of the trainers' names for it."""
    return named_like(role, name) or any(name in dialect.names(role) for dialect in DIALECTS)


def _is_step(name: str) -> bool:
    """``step``, ``step_idx``…: a training step as often as an environment step."""
    return name.lower().lstrip("_").startswith("step")


def _group_key_columns(roles: ColumnRoles) -> list[str]:
    return [roles.group] if roles.group is not None else []


def _group_key(roles: ColumnRoles, rows: int) -> pl.Expr:
    """Each row's group: its group column, or its block of ``group_size`` rows."""
    if roles.group is not None:
        return pl.col(roles.group)
    size = roles.group_size or 1
    return pl.int_range(0, rows, dtype=pl.Int64) // size


def _check_blocks(schema: pl.Schema, where: str, roles: ColumnRoles, values: Values) -> None:
    """Groups read as blocks of ``group_size`` rows: a column named like a group id whose values
    change within a block contradicts them."""
    group_like = [
        name
        for name in schema.names()
        if name not in (roles.trajectory, roles.turn)
        and is_id_type(schema[name])
        and _says("group", name)
    ]
    if not group_like:
        return
    frame = values(group_like)
    block = _group_key(roles, frame.height)
    for name in group_like:
        changes = frame.select((pl.col(name).n_unique().over(block) > 1).any()).item()
        if changes:
            raise AdvcliError(
                f"{where}: column '{name}' is named like a group id and its values change within "
                f"blocks of --group-size {roles.group_size} rows; read the groups from it with "
                f"--group-col {name} instead"
            )


def _ranked(
    missing: MissingRoles, schema: pl.Schema, values: Values, names: ColumnNames
) -> MissingRoles:
    """The missing roles' error, each role with its likeliest columns ranked by their values, and
    the options that would read the dump (when every missing role has a candidate)."""
    given = {names.group, names.trajectory, names.turn, names.reward, names.mask}
    ids = [name for name in schema.names() if is_id_type(schema[name]) and name not in given]
    frame = (
        values(ids).head(RANKED_ROWS)
        if ids and {"group", "trajectory"} & set(missing.missing)
        else None
    )
    choices: dict[Role, list[tuple[str, str]]] = {}
    group = missing.found.get("group")
    if "group" in missing.missing and frame is not None and names.group_size is None:
        choices["group"] = _group_candidates(frame)
        group = choices["group"][0][0] if choices["group"] else None
    if "trajectory" in missing.missing and frame is not None:
        choices["trajectory"] = _trajectory_candidates(frame, group, names.group_size)
    for role in ("reward", "mask"):
        if role in missing.missing:
            # Those named like the role first; a reward is more likely a float than an integer.
            typed = [n for n in schema.names() if n not in given and can_hold(role, schema[n])]
            typed.sort(key=lambda name: (not _says(role, name), not _floats(schema[name])))
            choices[role] = [
                (name, str(schema[name]))
                for name in typed
                if _says(role, name) or (role == "reward" and _floats(schema[name]))
            ]
    reasons: dict[Role, str] = {}
    flags: list[str] = []
    for role, why in missing.missing.items():
        found = choices.get(role, [])[:CANDIDATES_SHOWN]
        reasons[role] = why
        if found:
            listed = ", then ".join(f"'{name}' ({detail})" for name, detail in found)
            reasons[role] = f"{why} (likeliest: {listed})"
            flags += [OPTIONS[role], found[0][0]]
    complete = all(choices.get(role) for role in missing.missing)
    return MissingRoles(
        missing.where, reasons, missing.hint, missing.found, flags if complete else ()
    )


def _group_candidates(frame: pl.DataFrame) -> list[tuple[str, str]]:
    """Columns that could be the group: more than one value and fewer than rows. Those named
    like a group id come first, then those that hold another column's values nested (each
    trajectory id in one group: a turn index holds none), then by fewest values."""
    rows = frame.height
    distinct = frame.select(pl.all().n_unique()).row(0, named=True)
    fitting = [name for name, count in distinct.items() if 1 < count < rows]

    def holds_nested(name: str) -> bool:
        return any(
            distinct[other] > distinct[name]
            and frame.select(pl.struct(name, other).n_unique()).item() == distinct[other]
            for other in fitting
            if other != name
        )

    nested = {name: holds_nested(name) for name in fitting}
    fitting.sort(key=lambda name: (not _says("group", name), not nested[name], distinct[name]))
    return [(name, f"{distinct[name]:,} distinct values") for name in fitting]


def _trajectory_candidates(
    frame: pl.DataFrame, group: str | None, group_size: int | None
) -> list[tuple[str, str]]:
    """Columns that could be the trajectory: more trajectories than groups, at most one a row;
    those named like a trajectory id first, then by most trajectories."""
    rows = frame.height
    if group is not None:
        key = pl.col(group)
    elif group_size is not None:
        key = pl.int_range(0, rows, dtype=pl.Int64) // group_size
    else:
        key = pl.lit(0)
    groups = frame.select(key.n_unique()).item()
    counted = []
    for name in frame.columns:
        if name == group:
            continue
        pairs = frame.select(pl.struct(key.alias("__group"), pl.col(name)).n_unique()).item()
        if groups < pairs <= rows:
            counted.append((name, pairs))
    counted.sort(key=lambda item: (not _says("trajectory", item[0]), -item[1]))
    return [(name, f"{pairs:,} trajectories") for name, pairs in counted]


def _floats(dtype: pl.DataType) -> bool:
    """Floats, or a list or array of them."""
    inner = sequence_of(dtype)[0]
    return dtype.is_float() or (inner is not None and inner.is_float())

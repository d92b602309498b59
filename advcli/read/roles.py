"""Stage 1's reading of a dump: which column plays which role, from the schema
(:func:`advcli.read.columns.resolve_columns`) and, where that reading assumes something, from the
values of the few columns that could contradict it.

An assumption is taken only when nothing in the file contradicts it:

- **each row a trajectory** (verl's layout): a column named like a trajectory id (or a trainer's
  trajectory column) whose values vary within a group and repeat there says the rows are turns.
  The one such column is read as the trajectory, and the reason says so; two are an error naming
  both. A turn-named column that varies within a group says the same, and without a trajectory
  column that is an error. A column constant within every group, or unique per row, says nothing.
- **a ``step`` read as the turn for its name**: the same within every group but with several
  values, it is the training step, an error naming ``--by``.
- **groups as blocks of rows** (``--group-size``, TRL, OpenRLHF): a column named like a group id
  whose values change within a block contradicts the blocks: an error naming it.

When roles find no column, one error names every missing role with its likeliest columns, ranked
by what their values look like, and the options that read the dump (:attr:`MissingRoles.flags`)
when the values leave one choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import polars as pl

from advcli.errors import AdvcliError, MissingRoles
from advcli.read.columns import ColumnRoles, resolve_columns
from advcli.read.dialects import DIALECTS, Role, named_like
from advcli.read.dtypes import can_hold, is_id_type, is_number, sequence_of
from advcli.read.picker import COMMAND_LINE, Options
from advcli.settings.config import ColumnNames, StepRoles

# Reads the named columns in input order: every row, or the first ``limit``.
Values = Callable[[Sequence[str], int | None], pl.DataFrame]

# The rows whose values rank the candidates of a missing role (enough to tell a group from a
# turn index, few enough for every pair of columns to be compared at once).
RANKED_ROWS = 100_000
# How many id columns are ranked, and how many candidates an error names for one role.
RANKED_COLUMNS = 12
CANDIDATES_SHOWN = 3
# Strings longer than this on average are text (a prompt, a response), not ids.
ID_LENGTH = 64


def read_roles(  # noqa: PLR0913
    schema: pl.Schema,
    where: str,
    names: ColumnNames,
    values: Values,
    *,
    mask_needed_for: str | None = None,
    not_turns: Sequence[str] = (),
    options: Options = COMMAND_LINE,
    steps: StepRoles = False,
    turn_rewards: bool = False,
) -> ColumnRoles:
    """The column of each role, checked against the values where the schema's reading assumes
    something (see the module's text). ``values`` reads columns of the dump; it is called only
    when a check or an error needs it. ``not_turns``: columns that are known not to be the turn
    (the ``--by`` step column). ``options``: how the errors name the options (the command
    line's flags by default); ``steps``: GiGPO's roles too; ``turn_rewards``: the reward is
    each turn's own (``--reward-mode per-turn``)."""
    try:
        roles = resolve_columns(
            schema,
            where,
            names,
            mask_needed_for=mask_needed_for,
            not_turns=not_turns,
            options=options,
            steps=steps,
            turn_rewards=turn_rewards,
        )
    except MissingRoles as missing:
        raise _ranked(missing, schema, values, names, options) from None
    if roles.trajectory is None and not roles.trajectory_from_last_step:
        found = _trajectory_in_values(schema, where, roles, values, not_turns, options)
        if found is not None:
            column, why = found
            roles = resolve_columns(
                schema,
                where,
                replace(names, trajectory=column),
                mask_needed_for=mask_needed_for,
                not_turns=not_turns,
                options=options,
                steps=steps,
                turn_rewards=turn_rewards,
            )
            roles = replace(roles, reasons={**roles.reasons, "trajectory": why})
    if roles.turn is not None and "turn" in roles.by_name and _is_step(roles.turn):
        _check_not_a_training_step(where, roles, values, options)
    if roles.group is None and roles.group_size is not None:
        _check_blocks(schema, where, roles, values)
    return roles


def _trajectory_in_values(
    schema: pl.Schema,
    where: str,
    roles: ColumnRoles,
    values: Values,
    not_turns: Sequence[str],
    options: Options,
) -> tuple[str, str] | None:
    """For a dump read one row a trajectory: the column that the values show is the trajectory
    (and why), None when nothing contradicts the reading; an error when the rows are turns of
    trajectories no column names.

    A column contradicts the reading when it varies within a group and repeats there: a
    trajectory-named one is then the trajectory; a turn-named one (a ``step`` too) numbers the
    turns of trajectories no column names. Constant within every group (a training step, an
    episode counter of the run) or unique per row, it says nothing."""
    taken = {roles.group, roles.reward, roles.mask, *not_turns}
    trajectory_like = [
        name for name in schema.names() if name not in taken and _says("trajectory", name)
    ]
    turn_like = [
        name
        for name in schema.names()
        if name not in taken
        and is_number(schema[name])
        and (_says("turn", name) or name == roles.turn)
    ]
    if not trajectory_like and not turn_like:
        return None
    group_columns = [roles.group] if roles.group is not None else []
    frame = values(list(dict.fromkeys([*group_columns, *trajectory_like, *turn_like])), None)
    group = _group_key(roles, frame.height)
    rows = frame.height
    groups = frame.select(group.n_unique()).item()

    repeating = [
        (name, count)
        for name in trajectory_like
        if groups < (count := _trajectory_count(frame, group, name)) < rows
    ]
    trainer = f"{roles.dialect}'s dumps keep" if roles.dialect else "a dump without one keeps"
    if len(repeating) > 1:
        listed = " and ".join(f"'{name}'" for name, _ in repeating)
        raise AdvcliError(
            f"{where}: the rows are not whole trajectories: {listed} both repeat within groups; "
            f"name the trajectory column with {options.given('trajectory', repeating[0][0])}"
        )
    if repeating:
        name, count = repeating[0]
        if not is_id_type(schema[name]):
            raise AdvcliError(
                f"{where}: column '{name}' is named like a trajectory id and its values repeat "
                f"within groups, so the rows are turns, but it has type {schema[name]}; ids must "
                "be integers or strings: cast it, or name the trajectory column with "
                f"{options.named('trajectory')}"
            )
        return name, (
            f"'{name}' is named like a trajectory id and its values repeat within groups "
            f"({rows:,} rows, {count:,} trajectories), so the rows are turns: read as the "
            f"trajectory ({trainer} a trajectory in one row)"
        )
    for name in turn_like:
        if _trajectory_count(frame, group, name) > groups:
            raise AdvcliError(
                f"{where}: {trainer} a trajectory in one row, but column '{name}' numbers turns "
                f"within groups ({frame[name].n_unique():,} distinct values) and no column says "
                "which trajectory a row belongs to; name the trajectory column with "
                f"{options.named('trajectory')}"
            )
    return None


def _check_not_a_training_step(
    where: str, roles: ColumnRoles, values: Values, options: Options
) -> None:
    """A ``step`` read as the turn for its name that is constant within every group but takes
    several values is the training step: reading it as the turn would join two steps' rows."""
    assert roles.turn is not None
    group_columns = [roles.group] if roles.group is not None else []
    frame = values([*group_columns, roles.turn], None)
    group = _group_key(roles, frame.height)
    steps = frame[roles.turn].n_unique()
    varies = frame.select((pl.col(roles.turn).n_unique().over(group) > 1).any()).item()
    if steps > 1 and not varies:
        by = (
            f"pass {options.by} {roles.turn} to read each step as its own batch, or "
            if options.by is not None
            else "compute each step on its own, or pass "
        )
        raise AdvcliError(
            f"{where}: column '{roles.turn}' was read as the turn index for its name, but it is "
            f"the same within every group and takes {steps:,} values: it looks like the "
            f"training step; {by}{options.given('turn', roles.turn)} to read it as the turn"
        )


def _says(role: Role, name: str) -> bool:
    """Named like ``role``, or one of the trainers' names for it."""
    return named_like(role, name) or any(name in dialect.names(role) for dialect in DIALECTS)


def _is_step(name: str) -> bool:
    """``step``, ``step_idx``…: a training step as often as an environment step."""
    return name.lower().lstrip("_").startswith("step")


def _group_key(roles: ColumnRoles, rows: int) -> pl.Expr:
    """Each row's group: its group column, or its block of ``group_size`` rows."""
    return _block_or_column(roles.group, roles.group_size, rows)


def _block_or_column(group: str | None, group_size: int | None, rows: int) -> pl.Expr:
    if group is not None:
        return pl.col(group)
    if group_size is not None:
        return pl.int_range(0, rows, dtype=pl.Int64) // group_size
    return pl.lit(0)


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
    frame = values(group_like, None)
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
    missing: MissingRoles, schema: pl.Schema, values: Values, names: ColumnNames, options: Options
) -> MissingRoles:
    """The missing roles' error, each role with its likeliest columns ranked by their values, and
    the options that read the dump when the values leave one choice for every missing role
    (then with the turn column too, where one looks like a turn index)."""
    given = {names.group, names.trajectory, names.turn, names.reward, names.mask}
    found = {role: column for role, column in missing.found.items() if column is not None}
    ids = [
        name
        for name in schema.names()
        if is_id_type(schema[name]) and name not in given and name not in found.values()
    ][:RANKED_COLUMNS]
    choices: dict[str, list[tuple[str, str]]] = {}
    picked: dict[str, str] = {}
    turn = None
    if {"group", "trajectory"} & set(missing.missing) and ids:
        known = [found[role] for role in ("group", "trajectory") if role in found]
        frame = values([*ids, *known], RANKED_ROWS)
        ids = [name for name in ids if _could_be_an_id(frame[name])]
        turns = [name for name in ids if _looks_like_a_turn(frame[name])]
        ids = [name for name in ids if name not in turns]
        turn = turns[0] if len(turns) == 1 and "turn" not in found else None
        keys = _key_choices(frame, ids, found, names.group_size, set(missing.missing))
        choices.update(keys.ranked)
        picked.update(keys.picked)
    for role in ("reward", "mask"):
        if role in missing.missing:
            # Those named like the role first; a reward is more likely a float than an integer.
            typed = [n for n in schema.names() if n not in given and can_hold(role, schema[n])]
            typed.sort(key=lambda name: (not _says(role, name), not _floats(schema[name])))
            fitting = [
                name
                for name in typed
                if _says(role, name) or (role == "reward" and _floats(schema[name]))
            ]
            choices[role] = [(name, str(schema[name])) for name in fitting]
            named = [name for name in fitting if _says(role, name)]
            if len(named) == 1 or len(fitting) == 1:
                picked[role] = (named or fitting)[0]
    reasons: dict[str, str] = {}
    flags: list[str] = []
    for role, why in missing.missing.items():
        shown = choices.get(role, [])[:CANDIDATES_SHOWN]
        reasons[role] = why
        if shown:
            listed = ", then ".join(f"'{name}' ({detail})" for name, detail in shown)
            reasons[role] = f"{why} (likeliest: {listed})"
        if role in picked:
            flags += options.giving(role, picked[role])  # type: ignore[arg-type]
    complete = all(role in picked for role in missing.missing)
    if complete and turn is not None:
        flags += options.giving("turn", turn)
    return MissingRoles(
        missing.where, reasons, missing.hint, missing.found, flags if complete else ()
    )


def _could_be_an_id(column: pl.Series) -> bool:
    """More than one value, not unique per row (then it names rows, not trajectories), and not
    text."""
    if not 1 < column.n_unique() < column.len():
        return False
    if column.dtype == pl.String:
        length = column.str.len_chars().mean()
        return isinstance(length, float) and length <= ID_LENGTH
    return True


def _looks_like_a_turn(column: pl.Series) -> bool:
    """An integer column counted 0 (or 1), 1, 2… whose counts fall as the numbers rise, not all
    alike: every trajectory has a first turn, fewer a second."""
    if not column.dtype.is_integer():
        return False
    counts = column.value_counts().sort(column.name)
    numbers, how_many = counts[column.name], counts["count"]
    consecutive = numbers.to_list() == list(range(int(numbers[0]), int(numbers[0]) + len(numbers)))
    falling = bool((how_many.diff().drop_nulls() <= 0).all())
    return numbers[0] in (0, 1) and consecutive and falling and how_many.n_unique() > 1


class _Keys:
    """Candidates for the missing group and trajectory (``ranked``: role → (column, what its
    values show)), and the columns the values leave as the one choice (``picked``)."""

    def __init__(self) -> None:
        self.ranked: dict[str, list[tuple[str, str]]] = {}
        self.picked: dict[str, str] = {}


def _key_choices(
    frame: pl.DataFrame,
    ids: list[str],
    found: dict[str, str],
    group_size: int | None,
    missing: set[str],
) -> _Keys:
    """The missing group and trajectory among ``ids``: a group has more than one value; a
    trajectory varies within groups and repeats there (the rows are turns). Names like the
    roles' decide between candidates; otherwise a choice is made only when one fits."""
    distinct = {name: frame[name].n_unique() for name in [*ids, *found.values()]}
    if "group" in missing and "trajectory" in missing:
        return _pair_choices(frame, ids, distinct)
    keys = _Keys()
    if "trajectory" in missing:
        group = _block_or_column(found.get("group"), group_size, frame.height)
        groups = frame.select(group.n_unique()).item()
        counted = [
            (column, count)
            for column in ids
            if groups < (count := _trajectory_count(frame, group, column)) < frame.height
        ]
        counted.sort(key=lambda item: (not _says("trajectory", item[0]), -item[1]))
        keys.ranked["trajectory"] = [(t, f"{n:,} trajectories") for t, n in counted]
        _pick(keys, "trajectory", [column for column, _ in counted])
    elif "group" in missing and group_size is None:
        trajectory = found.get("trajectory")
        # A group holds several trajectories: the trajectory varies within it.
        groups = [
            column
            for column in ids
            if trajectory is None
            or distinct[column] < _trajectory_count(frame, pl.col(column), trajectory)
        ]
        groups.sort(key=lambda name: (not _says("group", name), -distinct[name]))
        keys.ranked["group"] = [(g, f"{distinct[g]:,} distinct values") for g in groups]
        _pick(keys, "group", groups)
    return keys


def _pair_choices(frame: pl.DataFrame, ids: list[str], distinct: dict[str, int]) -> _Keys:
    """Both missing: the pairs of columns that read as (group, trajectory). Of the two ways to
    read a pair the one with more groups is taken (a prompt has a few rollouts, a rollout index
    many prompts)."""
    best: dict[frozenset[str], tuple[str, str, int]] = {}
    for group in ids:
        for column in ids:
            if group == column or distinct[group] < 2:
                continue
            count = _trajectory_count(frame, pl.col(group), column)
            held = best.get(frozenset((group, column)))
            fits = distinct[group] < count < frame.height
            if fits and (held is None or distinct[group] > distinct[held[0]]):
                best[frozenset((group, column))] = (group, column, count)

    def named(pair: tuple[str, str, int]) -> bool:
        return _says("group", pair[0]) and _says("trajectory", pair[1])

    pairs = sorted(best.values(), key=lambda pair: (not named(pair), -distinct[pair[0]]))
    keys = _Keys()
    keys.ranked["group"] = [(g, f"{distinct[g]:,} distinct values") for g, _, _ in pairs]
    keys.ranked["trajectory"] = [(t, f"{n:,} trajectories") for _, t, n in pairs]
    chosen = [pair for pair in pairs if named(pair)]
    if len(pairs) == 1 or len(chosen) == 1:
        group, trajectory, _ = (chosen or pairs)[0]
        keys.picked.update(group=group, trajectory=trajectory)
    return keys


def _pick(keys: _Keys, role: Role, fitting: list[str]) -> None:
    """The one fitting column, or the one named like ``role``, as the choice."""
    named = [name for name in fitting if _says(role, name)]
    if len(fitting) == 1 or len(named) == 1:
        keys.picked[role] = (named or fitting)[0]


def _trajectory_count(frame: pl.DataFrame, group: pl.Expr, column: str) -> int:
    """How many (group, ``column``) pairs the rows hold: the trajectories, were ``column`` the
    trajectory id."""
    pairs = frame.select(pl.struct(group.alias("__group"), pl.col(column)).n_unique())
    return int(pairs.item())


def _floats(dtype: pl.DataType) -> bool:
    """Floats, or a list or array of them."""
    inner = sequence_of(dtype)[0]
    return dtype.is_float() or (inner is not None and inner.is_float())

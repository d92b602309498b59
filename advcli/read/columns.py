"""The column vocabulary: which input column plays which role (group, trajectory, turn, reward,
mask), by the names trainers use (:mod:`advcli.read.dialects`), each role's column checked for
its type, and the columns ``compute`` adds to its output."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import polars as pl
from polars.datatypes import DataTypeClass

from advcli.errors import AdvcliError, MissingRoles, UsageError
from advcli.read.dialects import (
    ADVCLI,
    DERIVED_FROM,
    ROLES,
    Dialect,
    Role,
    all_names,
    dialect_of,
    named_like,
    signed,
    trainer_of,
)

# ColumnRoles that compute adds to its output.
OUTPUT_COLUMNS = ("score", "advantage", "advantages")

RewardKind = Literal["token_rewards", "scalar"]
MaskKind = Literal["mask", "length"]

OPTIONS: dict[Role, str] = {
    "group": "--group-col",
    "trajectory": "--traj-col",
    "turn": "--turn-col",
    "reward": "--reward-col",
    "mask": "--mask-col",
}


@dataclass(frozen=True)
class ColumnRoles:
    """Which input column plays which role.

    ``group`` is None when the groups are blocks of ``group_size`` consecutive rows, and
    ``trajectory`` None when each row is a whole trajectory; the row number stands in for it.
    ``mask`` is None for a dump without a mask column, read where no per-token output is made;
    the token counts are then unknown. ``reward_width`` / ``mask_width`` are the widths of
    fixed-size array columns (a padded ``(batch, length)`` tensor), None for lists and scalars.
    """

    group: str | None
    trajectory: str | None
    turn: str | None
    reward: str
    reward_kind: RewardKind
    mask: str | None
    mask_kind: MaskKind | None
    reward_width: int | None = None
    mask_width: int | None = None
    group_size: int | None = None
    # The trainer whose dialect the dump was read in, None for a dump that speaks none.
    dialect: str | None = None
    # The roles whose column was taken for its name alone (named_like), not a trainer's name.
    by_name: tuple[str, ...] = ()
    # What else the reading says of the dump (groups that span files, say).
    notes: tuple[str, ...] = ()
    # SkyRL's step-wise dumps (see Dialect): the last-step flag column, whether the trajectories
    # are the runs of rows ending at it, and the ids of the padding rows.
    last_step: str | None = None
    trajectory_from_last_step: bool = False
    padding_ids: str | None = None
    # Why each role went to its column (or what stands in for it), for every output.
    reasons: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> dict[str, str | None]:
        """The roles as a plain dict, for summaries and reports."""
        return {
            "group": self.group,
            "trajectory": self.trajectory,
            "turn": self.turn,
            "reward": self.reward,
            "mask": self.mask,
        }

    def read_as(self) -> str:
        """The layout the dump was read in, in words."""
        if self.dialect is None:
            return "no trainer's layout: columns by their names and the options"
        return f"{self.dialect}'s layout"

    def reading(self) -> dict[str, Any]:
        """How the dump was read, for every output: the trainer's dialect and, for each role,
        its column (None where an assumption stands in for it) and why."""
        return {
            "trainer": self.dialect,
            "read_as": self.read_as(),
            "roles": {
                role: {"column": getattr(self, role), "why": self.reasons.get(role, "")}
                for role in ROLES
            },
            "notes": list(self.notes),
        }

    def reward_list(self) -> pl.Expr:
        """The token rewards as a list expression (a fixed-size array read as a list)."""
        return _as_list(self.reward, self.reward_width)

    def mask_list(self) -> pl.Expr:
        """The 0/1 mask as a list expression (a fixed-size array read as a list)."""
        if self.mask is None or self.mask_kind != "mask":
            raise ValueError("the dump has no 0/1 mask column")
        return _as_list(self.mask, self.mask_width)


def _as_list(name: str, width: int | None) -> pl.Expr:
    return pl.col(name).arr.to_list() if width is not None else pl.col(name)


def resolve_columns(
    schema: pl.Schema,
    where: str,
    *,
    group: str | None = None,
    trajectory: str | None = None,
    turn: str | None = None,
    reward: str | None = None,
    mask: str | None = None,
    group_size: int | None = None,
    mask_needed_for: str | None = "the per-token output needs one",
    not_turns: Collection[str] = (),
    named_in: dict[str, str] | None = None,
) -> ColumnRoles:
    """Pick the column for each role from the schema alone and check its type.

    A role goes to the column its option names, else to the one name of the dump's dialect (or,
    in a dump that speaks none, of any dialect, then of the names people write by hand:
    :func:`named_like`) that the file has; two such names are an error naming both (never a
    silent pick). Every role that finds no column is named in one :class:`MissingRoles` error.
    The mask may be missing when ``mask_needed_for`` is None (nothing asks for token counts);
    otherwise that phrase says, in the error, what needs it ("… needs one"). ``not_turns``:
    columns known not to be the turn (the ``--by`` step column); ``named_in``: where a role's
    name was given when not by its option (a saved mapping), for the reasons.

    The readings that assume something (each row a trajectory, groups as blocks of rows) are
    taken here from the schema; :func:`advcli.read.roles.read_roles` then checks them against the
    values.
    """
    reasons: dict[str, str] = {}
    pick = _Picker(schema, where, reasons, named_in or {})
    trainer = pick.dialect.trainer if pick.dialect is not None else "the"
    if group_size is not None:
        if group is not None:
            raise UsageError("--group-size and --group-col exclude each other: give one")
        group_col = None
        reasons["group"] = f"--group-size {group_size}: each block of {group_size} rows is a group"
    else:
        group_col = pick("group", group)
        if group_col is None and "group" not in pick.missing:
            pick.missing["group"] = (
                f"{trainer}'s dumps hold no group id: a prompt's rollouts are consecutive rows; "
                "pass --group-size N (the rollouts per prompt)"
            )
    trajectory_col = pick("trajectory", trajectory, taken=(group_col,))
    if trajectory_col is None and "trajectory" not in pick.missing:
        reasons["trajectory"] = (
            f"{trainer}'s dumps keep a whole trajectory in one row: each row is a trajectory"
        )
    rows_are_trajectories = trajectory_col is None and trajectory is None
    turn_col = pick(
        "turn",
        turn,
        required=None,
        taken=(group_col, trajectory_col, *not_turns),
        by_name=not rows_are_trajectories,
    )
    reward_col = pick("reward", reward)
    mask_col = pick("mask", mask, required=mask_needed_for)
    if pick.missing:
        found = {"group": group_col, "trajectory": trajectory_col, "turn": turn_col}
        raise MissingRoles(where, pick.missing, pick.hint_names(), found)
    assert reward_col is not None
    if turn_col is None:
        reasons["turn"] = "no turn index column: turns are ordered by input order"
        if rows_are_trajectories:
            reasons["turn"] = "each row is a whole trajectory: no turn order is needed"
            unread = [name for name in schema.names() if named_like("turn", name)]
            if unread:
                listed = ", ".join(f"'{name}'" for name in unread)
                reasons["turn"] += f" ({listed} not read as one)"

    for role, name in (("group", group_col), ("trajectory", trajectory_col)):
        if name is None:
            continue
        dtype = schema[name]
        if not is_id_type(dtype):
            raise AdvcliError(
                f"{where}: column '{name}' ({role} id) has type {dtype}; ids must be integers "
                "or strings"
            )
    if turn_col is not None and not schema[turn_col].is_integer():
        picked = " (read as the turn for its name)" if "turn" in pick.by_name else ""
        raise AdvcliError(
            f"{where}: column '{turn_col}' (turn index){picked} has type {schema[turn_col]}; "
            "expected integers: cast it, or name the turn column with --turn-col"
        )

    reward_dtype = schema[reward_col]
    reward_kind: RewardKind
    reward_inner, reward_width = sequence_of(reward_dtype)
    if _is_numeric(reward_dtype):
        reward_kind = "scalar"
    elif reward_inner is not None and _is_numeric(reward_inner):
        reward_kind = "token_rewards"
    else:
        raise AdvcliError(
            f"{where}: column '{reward_col}' (reward) has type {reward_dtype}; expected a number "
            "or a list (or one-dimensional array) of numbers"
        )

    mask_kind: MaskKind | None = None
    mask_width = None
    if mask_col is not None:
        mask_dtype = schema[mask_col]
        mask_inner, mask_width = sequence_of(mask_dtype)
        if mask_dtype.is_integer():
            mask_kind = "length"
        elif mask_inner is not None and (_is_numeric(mask_inner) or mask_inner == pl.Boolean):
            mask_kind = "mask"
        else:
            raise AdvcliError(
                f"{where}: column '{mask_col}' (response mask) has type {mask_dtype}; expected a "
                "list (or one-dimensional array) of 0/1 values or an integer response length"
            )

    taken = {reward_col} & {"advantage", "advantages"}
    if taken:
        raise AdvcliError(
            f"{where}: the reward column '{reward_col}' has the name of an output column; "
            "rename it or choose another with --reward-col"
        )
    reasons["reward"] += (
        ", a list of token rewards summed per row"
        if reward_kind == "token_rewards"
        else ", one number per row"
    )
    if mask_kind is None:
        reasons["mask"] = "no mask column: token counts are unknown"
    else:
        reasons["mask"] += ", a list of 0/1" if mask_kind == "mask" else ", a response length"
    roles = ColumnRoles(
        dialect=pick.dialect.trainer if pick.dialect is not None else None,
        by_name=tuple(pick.by_name),
        group=group_col,
        trajectory=trajectory_col,
        group_size=group_size,
        turn=turn_col,
        reward=reward_col,
        reward_kind=reward_kind,
        mask=mask_col,
        mask_kind=mask_kind,
        reward_width=reward_width,
        mask_width=mask_width,
        reasons=reasons,
    )
    return with_steps(roles, schema, where, pick.dialect)


def with_steps(
    roles: ColumnRoles, schema: pl.Schema, where: str, dialect: Dialect | None
) -> ColumnRoles:
    """``roles`` with the step-wise columns of ``dialect`` (SkyRL's): the last-step flag, the
    trajectories it delimits where no trajectory column is given, and the padding ids."""
    if dialect is None:
        return roles
    flag = next((name for name in dialect.last_step if name in schema), None)
    if flag is None:
        return replace(roles, padding_ids=dialect.padding_ids)
    if schema[flag] != pl.Boolean:
        raise AdvcliError(
            f"{where}: column '{flag}' (last-step flag) has type {schema[flag]}; expected booleans"
        )
    reasons = dict(roles.reasons)
    reasons["reward"] += (
        f"; without --traj-score a trajectory's score is the reward of its row flagged '{flag}', "
        f"as {dialect.trainer}'s step-wise advantage reads it"
    )
    runs = dialect.trajectory_from_last_step and roles.trajectory is None
    if runs:
        reasons["trajectory"] = (
            f"{dialect.trainer}'s dumps have no trajectory column: a trajectory is a run of rows "
            f"ending at a row flagged '{flag}', in row order"
        )
        if roles.turn is None:
            reasons["turn"] = "no turn index column: a run's turns are in row order"
    return replace(
        roles,
        last_step=flag,
        trajectory_from_last_step=runs,
        padding_ids=dialect.padding_ids,
        reasons=reasons,
    )


def sequence_of(dtype: pl.DataType | DataTypeClass) -> tuple[Any, int | None]:
    """(element type, fixed width) of a list (width None) or a one-dimensional array; (None,
    None) for anything else."""
    if isinstance(dtype, pl.List):
        return dtype.inner, None
    if isinstance(dtype, pl.Array) and len(dtype.shape) == 1:
        return dtype.inner, dtype.size
    return None, None


class _Picker:
    """Finds each role's column in one schema, in the dump's dialect, recording why for every
    output, and what it could not find in ``missing`` (role → what to do)."""

    def __init__(
        self, schema: pl.Schema, where: str, reasons: dict[str, str], named_in: dict[str, str]
    ) -> None:
        self.schema, self.where, self.reasons, self.named_in = schema, where, reasons, named_in
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
        option = OPTIONS[role]
        if chosen is not None:
            if chosen not in self.schema:
                named = self.named_in.get(role, option)
                raise AdvcliError(
                    f"{self.where}: column '{chosen}' ({named}) not found{self._hint([chosen])}"
                )
            self.reasons[role] = f"named by {self.named_in.get(role, option)}"
            return chosen
        if (
            role == "group"
            and _is_rollout_data_dir(self.schema)
            and (self.dialect is None or not self.dialect.trajectory)
        ):
            # verl v1 writes a 'uid' there, but it is the row's own key, one per row: read as
            # a group id (with each row a trajectory) it would make every row a group of its own.
            # A dump that also names its trajectories is some trainer's own, read as such.
            raise AdvcliError(f"{self.where}: {ROLLOUT_DATA_DIR}")
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
        if len(present) > 1:
            raise AdvcliError(
                f"{self.where}: two columns could be the {role}: '{present[0]}' and "
                f"'{present[1]}'; pick one with {option} NAME"
            )
        if present:
            name = present[0]
            whose = (
                dialect.trainer
                if dialect is not None and name in dialect.names(role)
                else trainer_of(name)
            )
            self.reasons[role] = f"'{name}' is the {role} column of {whose}'s dumps"
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
        source = f"{dialect.trainer}'s dumps name it" if dialect is not None else "expected"
        self.missing[role] = (
            f"no {role} column{needed}: {source} {expected}, or name one with {option}"
        )
        self._wanted += names
        return None

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
                f"'{found[1]}'; pick one with {OPTIONS[role]} NAME"
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
        return f". The file has {shown}{more}{suggestion}"


# What a role's column holds, for the reasons: "named like the group id".
ROLE_NOUNS: dict[Role, str] = {
    "group": "id",
    "trajectory": "id",
    "turn": "index",
    "reward": "",
    "mask": "",
}


def is_id_type(dtype: pl.DataType | DataTypeClass) -> bool:
    """Integers and strings (Categorical and Enum read as strings) can be ids."""
    return dtype.is_integer() or dtype in (pl.String, pl.Categorical) or is_enum(dtype)


def can_hold(role: Role, dtype: pl.DataType | DataTypeClass) -> bool:
    """Whether a column of ``dtype`` can be meant for ``role`` (a name alone never picks one
    that cannot)."""
    if role in ("group", "trajectory"):
        return is_id_type(dtype)
    if role == "turn":
        # Any number: a float turn column named like one is then refused for its type, not
        # passed over.
        return _is_numeric(dtype)
    inner = sequence_of(dtype)[0]
    if role == "reward":
        return _is_numeric(dtype) or (inner is not None and _is_numeric(inner))
    return dtype.is_integer() or (inner is not None and (_is_numeric(inner) or inner == pl.Boolean))


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


ROLLOUT_DATA_DIR = (
    "this looks like verl's trainer.rollout_data_dir dump (input, output, score), which holds no "
    "group or trajectory ids (its 'uid', where present, is each row's own key); write the batch "
    "with advcli.dump.write_batch instead (docs: 'Inside a trainer'), or name "
    "the group column with --group-col"
)


def _is_rollout_data_dir(schema: pl.Schema) -> bool:
    return {"input", "output", "score"} <= set(schema.names())


def _is_numeric(dtype: pl.DataType | DataTypeClass) -> bool:
    return dtype.is_numeric() and dtype != pl.Boolean


def is_enum(dtype: pl.DataType | DataTypeClass) -> bool:
    return isinstance(dtype, pl.Enum)


def unused_name(schema: pl.Schema, base: str = "__advcli_row") -> str:
    """A column name that ``schema`` does not have, for a row number added beside the user's
    columns: any name of the user's, ``row`` included, passes through untouched."""
    name = base
    while name in schema:
        name += "_"
    return name

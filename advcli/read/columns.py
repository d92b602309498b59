"""The column vocabulary: which input column plays which role (group, trajectory, turn, reward,
mask), by the names trainers use (:mod:`advcli.read.dialects`), each role's column checked for
its type, and the columns ``compute`` adds to its output."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import polars as pl

from advcli.errors import AdvcliError, MissingRoles, UsageError
from advcli.read.dialects import ROLES, STEP_ROLES, Dialect, named_like
from advcli.read.dtypes import is_anchor_type, is_id_type, is_number, sequence_of
from advcli.read.picker import COMMAND_LINE, Options, RolePicker
from advcli.settings.config import ColumnNames, StepRoles, TrajScore

# ColumnRoles that compute adds to its output.
OUTPUT_COLUMNS = ("score", "advantage", "advantages")

# What the rows set apart from the groups are called, where a trainer's dump does not say.
PADDING_LABEL = "padding rows"

RewardKind = Literal["token_rewards", "scalar"]
MaskKind = Literal["mask", "length"]


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
    # The trainer whose batch advcli.dump.write_batch wrote the file from, as the file's
    # metadata says (its columns are in advcli's layout): the trainer the dump's remedy is for.
    written_from: str | None = None
    # The roles whose column was taken for its name alone (named_like), not a trainer's name.
    by_name: tuple[str, ...] = ()
    # What else the reading says of the dump (groups that span files, say).
    notes: tuple[str, ...] = ()
    # SkyRL's step-wise dumps (see Dialect): the last-step flag column, whether the trajectories
    # are the runs of rows ending at it, and the ids of the padding rows.
    last_step: str | None = None
    trajectory_from_last_step: bool = False
    padding_ids: str | None = None
    # A column a trainer's own dump makes that flags the rows the trainer leaves out of its
    # groups (prime-rl's errored traces): set apart as padding rows are, and so named.
    left_out: str | None = None
    padding_label: str = PADDING_LABEL
    # The trainer whose own rule scores a trajectory whose rows differ (verl-agent's, see
    # Dialect): --traj-score own stands where no rule is chosen. None: no such rule.
    own_scores_of: str | None = None
    # The trainer whose padding copies repeat a turn (ROLL's, see Dialect), None for none.
    turn_copies_of: str | None = None
    # A trainer's own rule for a trajectory whose rows' scores differ, where its dump says it
    # (verl's v1 GRPO scores a session by its final output: --traj-score last), and that rule
    # in words. None: no such rule.
    traj_score_rule: tuple[TrajScore, str] | None = None
    # The column of the advantage the trainer computed for each row, where its own dump holds
    # it (never read as a reward): what advcli's numbers are checked against.
    trainer_advantage: str | None = None
    # The trainer's own dump the roles were read from (:mod:`advcli.read.trainer_dumps`), in
    # words; None for a batch or a table.
    read_from: str | None = None
    # Why the dump holds no rewards and how to keep them, where its trainer removed them before
    # it wrote the dump (SkyRL's): its reward column is then all null, and only what needs no
    # score is read (inspect's groups, rows and the trainer's advantages).
    reward_removed: str | None = None
    # GiGPO's roles (read for --estimator gigpo only): the anchor state, and a step's reward or
    # its already discounted return (one of the two).
    anchor: str | None = None
    step_reward: str | None = None
    step_return: str | None = None
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

    @property
    def trainer(self) -> str | None:
        """The trainer the dump comes from, as far as advcli can tell: the one whose batch
        advcli wrote the file from, else the dialect's."""
        return self.written_from or self.dialect

    def read_as(self) -> str:
        """The layout the dump was read in, in words."""
        if self.read_from is not None:
            return self.read_from
        if self.dialect is None:
            return "no trainer's layout: columns by their names and the options"
        if self.written_from is not None:
            return (
                f"{self.dialect}'s layout, written by advcli.dump.write_batch from "
                f"{self.written_from}'s batch"
            )
        return f"{self.dialect}'s layout"

    def reading(self) -> dict[str, Any]:
        """How the dump was read, for every output: the trainer's dialect and, for each role,
        its column (None where an assumption stands in for it) and why."""
        read: tuple[str, ...] = (
            *ROLES,
            *(role for role in STEP_ROLES if getattr(self, role) is not None),
            *(["trainer_advantage"] if self.trainer_advantage is not None else []),
        )
        return {
            "trainer": self.trainer,
            "read_as": self.read_as(),
            "roles": {
                role: {"column": getattr(self, role), "why": self.reasons.get(role, "")}
                for role in read
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
    names: ColumnNames,
    *,
    mask_needed_for: str | None = "the per-token output needs one",
    not_turns: Collection[str] = (),
    options: Options = COMMAND_LINE,
    steps: StepRoles = False,
    turn_rewards: bool = False,
) -> ColumnRoles:
    """Pick the column for each role from the schema alone and check its type.

    A role goes to the column ``names`` gives it (its option, or a saved mapping:
    ``names.named_in`` says where, for the reasons), else to the one name of the dump's dialect
    (or, in a dump that speaks none, of any dialect, then of the names people write by hand:
    :func:`~advcli.read.dialects.named_like`) that the file has; two such names are an error
    naming both (never a silent pick). Every role that finds no column is named in one
    :class:`MissingRoles` error. The mask may be missing when ``mask_needed_for`` is None
    (nothing asks for token counts); otherwise that phrase says, in the error, what needs it
    ("… needs one"). ``not_turns``: columns known not to be the turn (the ``--by`` step column).
    ``options``: how the errors name the options (the command line's flags by default).
    ``steps``: GiGPO's roles are read too (the anchor, and the step reward or step return);
    ``"if_anchored"``: only when the dump has an anchor; ``"anchor"``: the anchor alone, if any;
    ``"if_complete"``: only when the dump has an anchor and a step reward or return.
    ``turn_rewards``: each row's reward is its own turn's (:func:`_reward_column`).

    The readings that assume something (each row a trajectory, groups as blocks of rows) are
    taken here; :func:`advcli.read.roles.read_roles` checks them against the values.
    """
    reasons: dict[str, str] = {}
    pick = RolePicker(schema, where, reasons, names.named_in, options)
    trainer = pick.dialect.trainer if pick.dialect is not None else "the"
    group_col = _group_column(pick, names, trainer)
    trajectory_col = _trajectory_column(pick, names, options, group_col, trainer)
    rows_are_trajectories = trajectory_col is None and names.trajectory is None
    turn_col = pick(
        "turn",
        names.turn,
        required=None,
        taken=(group_col, trajectory_col, *not_turns),
        by_name=not rows_are_trajectories,
    )
    keys = (group_col, trajectory_col, turn_col)
    reward_col = _reward_column(pick, names.reward, turn_rewards, keys)
    mask_col = pick("mask", names.mask, required=mask_needed_for, taken=keys)
    anchor_col, step_reward_col, step_return_col = (
        _step_columns(pick, names, steps) if steps else (None, None, None)
    )
    if pick.missing:
        found = {"group": group_col, "trajectory": trajectory_col, "turn": turn_col}
        raise MissingRoles(where, pick.missing, pick.hint_names(), found)
    assert reward_col is not None
    if turn_col is None:
        reasons["turn"] = _why_no_turn(schema, rows_are_trajectories)
    _check_id_types(schema, where, group_col, trajectory_col)
    _check_turn_type(schema, where, turn_col, "turn" in pick.by_name, options)
    reward_kind, reward_width = _reward_kind(schema, where, reward_col)
    mask_kind, mask_width = _mask_kind(schema, where, mask_col)
    _check_not_an_output_name(where, reward_col, options)
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
        group_size=names.group_size,
        turn=turn_col,
        reward=reward_col,
        reward_kind=reward_kind,
        mask=mask_col,
        mask_kind=mask_kind,
        reward_width=reward_width,
        mask_width=mask_width,
        reasons=reasons,
        anchor=anchor_col,
        step_reward=step_reward_col,
        step_return=step_return_col,
    )
    if anchor_col is not None:
        _check_step_types(schema, where, roles)
    if step_reward_col is not None:
        order = (
            f"the order of '{turn_col}'" if turn_col is not None else "row order (no turn column)"
        )
        reasons["step_reward"] += (
            f"; the step returns R_t = r_t + γ R_t+1 run over each trajectory's rows in {order}"
        )
    return with_steps(roles, schema, where, pick.dialect, turn_rewards=turn_rewards)


def _reward_column(
    pick: RolePicker, chosen: str | None, turn_rewards: bool, keys: tuple[str | None, ...]
) -> str | None:
    """The reward column. Under ``turn_rewards`` (``--reward-mode per-turn``, each row's reward
    its own turn's) and without an option naming it, the dialect's per-turn reward column (ROLL's
    ``step_scores``) where the dump has it, saying which outcome column is left unread; else the
    reward as under outcome rewards (whose values
    :func:`advcli.read.turn_rewards.check_turn_rewards` then looks at), never one of the ``keys``
    columns."""
    dialect = pick.dialect
    name = None
    if turn_rewards and chosen is None and dialect is not None:
        name = next((name for name in dialect.turn_reward if name in pick.schema), None)
    if dialect is None or name is None:
        return pick("reward", chosen, taken=keys)
    outcome = [other for other in dialect.reward if other in pick.schema and other != name]
    unread = f"; its outcome column '{outcome[0]}' is not read" if outcome else ""
    pick.reasons["reward"] = (
        f"'{name}' is the per-turn reward column of {dialect.trainer}'s dumps, read under "
        f"--reward-mode per-turn{unread}"
    )
    return name


def _step_columns(
    pick: RolePicker, names: ColumnNames, steps: StepRoles
) -> tuple[str | None, str | None, str | None]:
    """GiGPO's columns: the anchor, and the step return if one is named or found, else the step
    reward (one of the two is needed), as ``steps`` asks for them."""
    optional = steps in ("if_anchored", "anchor", "if_complete")
    needed = None if optional else "gigpo's step groups need one"
    anchor = pick("anchor", names.anchor, required=needed, by_name=False)
    if steps == "anchor" or (optional and anchor is None):
        return anchor, None, None
    step_return = None
    if names.step_reward is None:
        step_return = pick("step_return", names.step_return, required=None, by_name=False)
    step_reward = None
    # An anchor found by its trainer's name, with no step reward beside it, is left unread
    # where only a complete set is looked for; one named by its option is not.
    incomplete_ok = steps == "if_complete" and names.anchor is None
    if step_return is None:
        step_reward = pick(
            "step_reward",
            names.step_reward,
            required=None
            if incomplete_ok
            else "gigpo's step returns need one, or an already discounted return named "
            f"with {pick.options.named('step_return')}",
            by_name=False,
        )
    if step_reward is None and step_return is None:
        return None, None, None
    return anchor, step_reward, step_return


def _check_step_types(schema: pl.Schema, where: str, roles: ColumnRoles) -> None:
    """Refuse an anchor that cannot be compared for equality (a float), and a step reward or
    return that is not one number a row."""
    assert roles.anchor is not None
    dtype = schema[roles.anchor]
    if not is_anchor_type(dtype):
        raise AdvcliError(
            f"{where}: column '{roles.anchor}' (anchor) has type {dtype}; an anchor must be a "
            "string, an integer, or a list or struct of them (equal values are one state)"
        )
    for role, name in (("step reward", roles.step_reward), ("step return", roles.step_return)):
        if name is not None and not is_number(schema[name]):
            raise AdvcliError(
                f"{where}: column '{name}' ({role}) has type {schema[name]}; expected one "
                "number a row"
            )


def _trajectory_column(
    pick: RolePicker, names: ColumnNames, options: Options, group_col: str | None, trainer: str
) -> str | None:
    """The trajectory's column; None where each row is a trajectory (the dialect keeps one in a
    row, or the caller's holder has none: ``options.rows_without_trajectory``), saying so."""
    trajectory_col = pick(
        "trajectory",
        names.trajectory,
        required=None if options.rows_without_trajectory else True,
        taken=(group_col,),
    )
    if trajectory_col is None and "trajectory" not in pick.missing:
        pick.reasons["trajectory"] = (
            f"{trainer}'s dumps keep a whole trajectory in one row: each row is a trajectory"
            if pick.dialect is not None and not pick.dialect.trajectory
            else f"the {options.holder} has no trajectory column: each row is a trajectory"
        )
    return trajectory_col


def _group_column(pick: RolePicker, names: ColumnNames, trainer: str) -> str | None:
    """The group column; None for groups as blocks of ``--group-size`` rows, or where the
    dialect has no group id (then recorded as missing: the blocks need their size)."""
    if names.group_size is not None:
        if names.group is not None:
            raise UsageError("--group-size and --group-col exclude each other: give one")
        pick.reasons["group"] = names.named_in.get(
            "group",
            f"--group-size {names.group_size}: each block of {names.group_size} rows is a group",
        )
        return None
    group_col = pick("group", names.group)
    if group_col is None and "group" not in pick.missing:
        # A library call has no --group-size: it gives each row's group as values.
        how = (
            f"give {pick.options.named('group')} each row's prompt (one value per row)"
            if pick.options.keywords
            else "pass --group-size N (the rollouts per prompt)"
        )
        pick.missing["group"] = (
            f"{trainer}'s dumps hold no group id: a prompt's rollouts are consecutive rows; {how}"
        )
    return group_col


def _why_no_turn(schema: pl.Schema, rows_are_trajectories: bool) -> str:
    """Why no column is the turn, naming the turn-like columns left unread when each row is a
    whole trajectory."""
    if not rows_are_trajectories:
        return "no turn index column: turns are ordered by input order"
    why = "each row is a whole trajectory: no turn order is needed"
    unread = [name for name in schema.names() if named_like("turn", name)]
    if unread:
        listed = ", ".join(f"'{name}'" for name in unread)
        why += f" ({listed} not read as one)"
    return why


def _check_id_types(
    schema: pl.Schema, where: str, group_col: str | None, trajectory_col: str | None
) -> None:
    """Refuse a group or trajectory column that is neither integers nor strings."""
    for role, name in (("group", group_col), ("trajectory", trajectory_col)):
        if name is None:
            continue
        dtype = schema[name]
        if not is_id_type(dtype):
            raise AdvcliError(
                f"{where}: column '{name}' ({role} id) has type {dtype}; ids must be integers "
                "or strings"
            )


def _check_turn_type(
    schema: pl.Schema, where: str, turn_col: str | None, by_name: bool, options: Options
) -> None:
    """Refuse a turn column that is not integers (``by_name``: it was taken for its name)."""
    if turn_col is not None and not schema[turn_col].is_integer():
        picked = " (read as the turn for its name)" if by_name else ""
        raise AdvcliError(
            f"{where}: column '{turn_col}' (turn index){picked} has type {schema[turn_col]}; "
            f"expected integers: cast it, or name the turn column with {options.named('turn')}"
        )


def _reward_kind(schema: pl.Schema, where: str, reward_col: str) -> tuple[RewardKind, int | None]:
    """Whether the reward column holds one number a row or a list of token rewards, and the
    width of a fixed-size array; an error for anything else."""
    reward_dtype = schema[reward_col]
    reward_inner, reward_width = sequence_of(reward_dtype)
    if is_number(reward_dtype):
        return "scalar", reward_width
    if reward_inner is not None and is_number(reward_inner):
        return "token_rewards", reward_width
    raise AdvcliError(
        f"{where}: column '{reward_col}' (reward) has type {reward_dtype}; expected a number "
        "or a list (or one-dimensional array) of numbers"
    )


def _mask_kind(
    schema: pl.Schema, where: str, mask_col: str | None
) -> tuple[MaskKind | None, int | None]:
    """Whether the mask column holds a 0/1 list or a response length (None without a mask
    column), and the width of a fixed-size array; an error for anything else."""
    if mask_col is None:
        return None, None
    mask_dtype = schema[mask_col]
    mask_inner, mask_width = sequence_of(mask_dtype)
    if mask_dtype.is_integer():
        return "length", mask_width
    if mask_inner is not None and (is_number(mask_inner) or mask_inner == pl.Boolean):
        return "mask", mask_width
    raise AdvcliError(
        f"{where}: column '{mask_col}' (response mask) has type {mask_dtype}; expected a "
        "list (or one-dimensional array) of 0/1 values or an integer response length"
    )


def _check_not_an_output_name(where: str, reward_col: str, options: Options) -> None:
    """Refuse a reward column named like a column compute writes: the output would replace it."""
    if reward_col in ("advantage", "advantages"):
        raise AdvcliError(
            f"{where}: the reward column '{reward_col}' has the name of an output column; "
            f"rename it or choose another with {options.named('reward')}"
        )


def with_trainer_rules(roles: ColumnRoles, dialect: Dialect) -> ColumnRoles:
    """``roles`` with the rules of ``dialect``'s trainer that are no column, each where the role
    it rests on has one and none is set yet: verl-agent's own score rule for a trajectory whose
    rows differ, ROLL's padding copies that repeat a turn. A dump read in the dialect takes
    them, and so does a file ``write_batch`` wrote from that trainer's batch."""
    if dialect.own_row_scores and roles.trajectory is not None and roles.own_scores_of is None:
        roles = replace(roles, own_scores_of=dialect.trainer)
    if dialect.copies_repeat_turns and roles.turn is not None and roles.turn_copies_of is None:
        roles = replace(roles, turn_copies_of=dialect.trainer)
    return roles


def with_steps(
    roles: ColumnRoles,
    schema: pl.Schema,
    where: str,
    dialect: Dialect | None,
    *,
    turn_rewards: bool = False,
) -> ColumnRoles:
    """``roles`` with what ``dialect`` says of its step-wise rows: SkyRL's last-step flag, the
    trajectories it delimits where no trajectory column is given, and the padding ids; and
    whether a trajectory's rows are scored by verl-agent's own rule and whether its padding
    copies repeat a turn (ROLL's). ``turn_rewards``: each row's reward is its own turn's, so
    the flag confirms where each trajectory ends rather than which row holds its score."""
    if dialect is None:
        return roles
    roles = with_trainer_rules(roles, dialect)
    flag = next((name for name in dialect.last_step if name in schema), None)
    if flag is None:
        return replace(roles, padding_ids=dialect.padding_ids)
    if schema[flag] != pl.Boolean:
        raise AdvcliError(
            f"{where}: column '{flag}' (last-step flag) has type {schema[flag]}; expected booleans"
        )
    reasons = dict(roles.reasons)
    reasons["reward"] += (
        f"; each trajectory's last row in turn order must be its one row flagged '{flag}'"
        if turn_rewards
        else f"; without --traj-score a trajectory's score is the reward of its row flagged "
        f"'{flag}', as {dialect.trainer}'s step-wise advantage reads it"
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


def unused_name(schema: pl.Schema, base: str = "__advcli_row") -> str:
    """A column name that ``schema`` does not have, for a row number added beside the user's
    columns: any name of the user's, ``row`` included, passes through untouched."""
    name = base
    while name in schema:
        name += "_"
    return name

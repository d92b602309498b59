"""The column vocabulary: which input column plays which role (group, trajectory, turn, reward,
mask), by the names trainers use, and the columns ``compute`` adds to its output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import polars as pl
from polars.datatypes import DataTypeClass

from advcli.errors import AdvcliError

# ColumnRoles that compute adds to its output.
OUTPUT_COLUMNS = ("score", "advantage", "advantages")

# Default column names, in order of preference (verl / verl-agent names as fallbacks).
GROUP_CANDIDATES = ("data_id", "uid")
TRAJECTORY_CANDIDATES = ("rollout_id", "traj_uid")
TURN_CANDIDATES = ("turn_index",)
REWARD_CANDIDATES = ("token_level_rewards", "score", "reward")
MASK_CANDIDATES = ("response_mask", "response_length")

RewardKind = Literal["token_rewards", "scalar"]
MaskKind = Literal["mask", "length"]


@dataclass(frozen=True)
class ColumnRoles:
    """Which input column plays which role."""

    group: str
    trajectory: str
    turn: str | None
    reward: str
    reward_kind: RewardKind
    mask: str
    mask_kind: MaskKind
    # Why each role went to its column, for `advcli inspect`.
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


def resolve_columns(
    schema: pl.Schema,
    where: str,
    *,
    group: str | None = None,
    trajectory: str | None = None,
    turn: str | None = None,
    reward: str | None = None,
    mask: str | None = None,
) -> ColumnRoles:
    """Pick the column for each role (the option's name, else the first default that exists)
    and check its type."""
    reasons: dict[str, str] = {}
    group_col = _pick(schema, where, "group", group, GROUP_CANDIDATES, "--group-col", reasons)
    trajectory_col = _pick(
        schema, where, "trajectory", trajectory, TRAJECTORY_CANDIDATES, "--traj-col", reasons
    )
    if turn is not None and turn not in schema:
        raise AdvcliError(f"{where}: column '{turn}' (--turn-col) not found")
    turn_col = turn if turn is not None else next((c for c in TURN_CANDIDATES if c in schema), None)
    reasons["turn"] = (
        "named by --turn-col"
        if turn is not None
        else "the default name"
        if turn_col is not None
        else "no 'turn_index' column: turns are ordered by input order"
    )
    # In an advcli output (a re-run) 'score' is advcli's own column, so it is tried last.
    reward_candidates = (
        ("token_level_rewards", "reward", "score") if "advantage" in schema else REWARD_CANDIDATES
    )
    reward_col = _pick(schema, where, "reward", reward, reward_candidates, "--reward-col", reasons)
    mask_col = _pick(schema, where, "mask", mask, MASK_CANDIDATES, "--mask-col", reasons)

    for role, name in (("group", group_col), ("trajectory", trajectory_col)):
        dtype = schema[name]
        if not (dtype.is_integer() or dtype in (pl.String, pl.Categorical) or is_enum(dtype)):
            raise AdvcliError(
                f"{where}: column '{name}' ({role} id) has type {dtype}; ids must be integers "
                "or strings"
            )
    if turn_col is not None and not schema[turn_col].is_integer():
        raise AdvcliError(
            f"{where}: column '{turn_col}' (turn index) has type {schema[turn_col]}; "
            "expected integers"
        )

    reward_dtype = schema[reward_col]
    reward_kind: RewardKind
    if _is_numeric(reward_dtype):
        reward_kind = "scalar"
    elif isinstance(reward_dtype, pl.List) and _is_numeric(reward_dtype.inner):
        reward_kind = "token_rewards"
    else:
        raise AdvcliError(
            f"{where}: column '{reward_col}' (reward) has type {reward_dtype}; expected a number "
            "or a list of numbers"
        )

    mask_dtype = schema[mask_col]
    mask_kind: MaskKind
    if mask_dtype.is_integer():
        mask_kind = "length"
    elif isinstance(mask_dtype, pl.List) and (
        _is_numeric(mask_dtype.inner) or mask_dtype.inner == pl.Boolean
    ):
        mask_kind = "mask"
    else:
        raise AdvcliError(
            f"{where}: column '{mask_col}' (response mask) has type {mask_dtype}; expected a list "
            "of 0/1 values or an integer response length"
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
    reasons["mask"] += ", a list of 0/1" if mask_kind == "mask" else ", a response length"
    return ColumnRoles(
        group=group_col,
        trajectory=trajectory_col,
        turn=turn_col,
        reward=reward_col,
        reward_kind=reward_kind,
        mask=mask_col,
        mask_kind=mask_kind,
        reasons=reasons,
    )


def _pick(
    schema: pl.Schema,
    where: str,
    role: str,
    chosen: str | None,
    candidates: Sequence[str],
    option: str,
    reasons: dict[str, str],
) -> str:
    if chosen is not None:
        if chosen not in schema:
            raise AdvcliError(f"{where}: column '{chosen}' ({option}) not found")
        reasons[role] = f"named by {option}"
        return chosen
    for index, name in enumerate(candidates):
        if name in schema:
            absent = ", ".join(f"'{c}'" for c in candidates[:index])
            reasons[role] = (
                "the default name" if index == 0 else f"the first default present ({absent} absent)"
            )
            return name
    names = " or ".join(f"'{c}'" for c in candidates)
    raise AdvcliError(f"{where}: no {role} column: expected {names}, or name one with {option}")


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

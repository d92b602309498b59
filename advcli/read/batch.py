"""Reading a trainer's batch: a verl ``DataProto`` (``.batch`` tensors, ``.non_tensor_batch``
numpy arrays) or a plain mapping of tensors, numpy arrays and lists, as entries by key
(:func:`batch_entries`), the roles of its keys found with the command line's vocabulary
(:func:`batch_roles`, :data:`advcli.read.columns.DIALECTS`), one entry as a Polars column
(:func:`batch_column`), and the batch's key projection (:func:`batch_projection`, the frame stage
1 makes of a dump). Used by :mod:`advcli.dump` (writing a batch) and :mod:`advcli.verl`
(computing in a training step).

torch is not imported: tensors are recognised by their methods and moved to numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from advcli.errors import AdvcliError, first_line
from advcli.keys import (
    ANCHOR,
    GROUP,
    ROW,
    SCORE,
    STEP_RETURN,
    STEP_REWARD,
    TOKENS,
    TRAJECTORY,
    TURN,
)
from advcli.read.columns import ColumnRoles
from advcli.read.dialects import ADVCLI, DIALECTS, STEP_NAMES, Role, dialect_named
from advcli.read.dtypes import is_anchor_type
from advcli.read.picker import Options
from advcli.read.projection import anchor_key
from advcli.read.roles import read_roles
from advcli.read.trainer_advantage import trainer_advantage_exprs, with_trainer_advantage
from advcli.settings.config import ColumnNames
from advcli.settings.rules import DEFAULT_STEP_GROUPS, STEP_GROUPINGS

# How the errors name the arguments that give a role its key: write_batch's (``trajectory=``);
# advcli.verl passes its own. A batch is one training step: there is no option to split it.
WRITE_BATCH_OPTIONS = Options(
    {
        "group": "group",
        "trajectory": "trajectory",
        "turn": "turn",
        "reward": "reward",
        "mask": "mask",
        "anchor": "anchor",
        "step_reward": "step_reward",
        "step_return": "step_return",
    },
    keywords=True,
    by=None,
    holder="batch",
    rows_without_trajectory=True,
)


def batch_roles(  # noqa: PLR0913
    entries: Mapping[str, Any],
    *,
    group: str | None = None,
    trajectory: str | None = None,
    turn: str | None = None,
    reward: str | None = None,
    mask: str | None = None,
    mask_needed_for: str | None = None,
    options: Options = WRITE_BATCH_OPTIONS,
    steps: bool | None = False,
    anchor: str | None = None,
    step_reward: str | None = None,
    step_return: str | None = None,
) -> ColumnRoles:
    """The roles of a batch's keys, found as the command line finds columns (the trainers'
    dialects) from the entries' types and shapes, and checked against the values of the few
    entries that could contradict that reading (:func:`advcli.read.roles.read_roles`): a batch whose
    ``trajectory_id`` repeats within a group is not read one row a trajectory. ``options``: how
    the errors name the caller's arguments for the keys. ``steps``: GiGPO's roles too (the
    anchor, the step reward or return; ``anchor``…: their keys); None: where the batch has an
    anchor and a step reward or return under a trainer's names (:func:`has_step_keys`)."""

    def values(names: Sequence[str], limit: int | None) -> pl.DataFrame:
        return pl.DataFrame([batch_column(name, entries[name][:limit]) for name in names])

    if steps is None:
        steps = has_step_keys(entries) or any(
            name is not None for name in (anchor, step_reward, step_return)
        )
    return read_roles(
        _schema(entries),
        "the batch",
        ColumnNames(
            group,
            trajectory,
            turn,
            reward,
            mask,
            anchor=anchor,
            step_reward=step_reward,
            step_return=step_return,
        ),
        values,
        mask_needed_for=mask_needed_for,
        options=options,
        steps=steps,
    )


def has_step_keys(entries: Mapping[str, Any]) -> bool:
    """Whether the batch has an anchor and a step reward or return under a trainer's names."""

    def names(*roles: Role) -> set[str]:
        found = {name for role in roles for name in ADVCLI.names(role)}
        found |= {name for role in roles for dialect in DIALECTS for name in dialect.names(role)}
        return found | {name for role in roles for _, name in STEP_NAMES[role]}

    return any(name in entries for name in names("anchor")) and any(
        name in entries for name in names("step_reward", "step_return")
    )


class TurnRewardError(AdvcliError):
    """A batch's per-turn reward no advantage can be computed from: null, NaN or infinite."""


def per_turn_inputs(
    entries: Mapping[str, Any],
    roles: ColumnRoles,
    step_groups: str | None,
    step_reward_key: str | None = None,
    anchor_key: str | None = None,
) -> dict[str, Any]:
    """:func:`advcli.torch.compute_advantage`'s per-turn inputs read from the batch: its
    per-turn rewards (``step_rewards``: the ``step_reward_key`` entry, else its trainer's
    per-step reward, verl-agent's ``rewards``; none: each row's token rewards summed are its
    turn's reward) and, for anchor step groups, its anchors (``anchor_key``, else the
    trainer's) hashed as stage 1 hashes a dump's. A null, NaN or infinite per-turn reward is
    a :class:`TurnRewardError` naming the key and the row."""
    inputs: dict[str, Any] = {}
    key = _trainer_key(entries, roles, "step_reward", step_reward_key, "step_reward_key")
    if key is not None:
        inputs["step_rewards"] = turn_rewards(key, entries[key])
    grouping = STEP_GROUPINGS.get(step_groups or DEFAULT_STEP_GROUPS)
    anchor = _trainer_key(entries, roles, "anchor", anchor_key, "anchor_key")
    if grouping is not None and grouping.anchors and anchor is not None:
        inputs["anchor_index"] = anchor_codes(anchor, entries[anchor])
    return inputs


def _trainer_key(
    entries: Mapping[str, Any], roles: ColumnRoles, role: Role, key: str | None, argument: str
) -> str | None:
    """The batch's key for a step role: ``key`` where given, else its trainer's name for it
    that the batch has (None: neither)."""
    if key is not None:
        if key not in entries:
            raise AdvcliError(f"the batch has no '{key}' ({argument})")
        return key
    dialect = dialect_named(roles.dialect)
    names = dialect.names(role) if dialect is not None else ()
    return next((name for name in names if name in entries), None)


def turn_rewards(name: str, value: Any) -> np.ndarray:
    """A batch's per-turn rewards (one number a row) as float64, refused where one is null,
    NaN or infinite, naming the key and the row."""
    if as_numpy(value).ndim != 1:
        raise AdvcliError(f"the batch's '{name}' (per-turn reward) must hold one number a row")
    try:
        series = batch_column(name, value)
    except AdvcliError as error:
        raise TurnRewardError(str(error)) from None
    if not series.dtype.is_numeric():
        raise AdvcliError(
            f"the batch's '{name}' (per-turn reward) holds {series.dtype}, not numbers"
        )
    rewards = series.cast(pl.Float64).to_numpy(writable=True)
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise TurnRewardError(
            f"the batch's '{name}' (per-turn reward) is {rewards[bad[0]]} at row {bad[0]}"
        )
    return rewards


def anchor_column(name: str, value: Any) -> pl.Series:
    """A batch's anchors as one column that stage 1 reads as an anchor: strings, integers and
    booleans as they are; numpy arrays flattened into lists (verl-agent's ``to_hashable``
    compares them flattened), lists and tuples as lists, dicts as structs with their keys
    sorted (the order they were made in is no part of a state). An anchor that holds floats,
    or rows of different kinds, is refused: equal states must compare equal."""
    array = as_numpy(value)
    if array.dtype.kind == "O" and len(array) and not isinstance(array[0], str | int | bool):
        # Python objects have no vectorized form: each is made canonical in turn.
        canonical = [_canonical(name, v) for v in array]
        series = _one_column(name, lambda: pl.Series(name, canonical))
        # Polars makes one type of the rows' values, a 1 among strings becoming "1": a state
        # changed so would join another's.
        read = series.to_list()
        changed = next((i for i, v in enumerate(read) if v != canonical[i]), None)
        if changed is not None:
            raise AdvcliError(
                f"the batch's '{name}' (anchor) holds values of more than one type: row "
                f"{changed}'s {array[changed]!r} would be read as {read[changed]!r}; give its "
                "values one type"
            )
    elif array.ndim == 2:
        series = pl.Series(name, array.tolist())
    else:
        series = batch_column(name, array)
    if series.null_count():
        raise AdvcliError(
            f"the batch's '{name}' holds a null (None) at row {series.is_null().arg_max()}"
        )
    if not is_anchor_type(series.dtype):
        raise AdvcliError(
            f"the batch's '{name}' (anchor) holds {series.dtype}; an anchor must be strings, "
            "integers, or lists or dicts of them (equal states must compare equal, which floats "
            "need not)"
        )
    return series


def step_columns(entries: Mapping[str, Any], roles: ColumnRoles) -> list[pl.Series]:
    """GiGPO's columns of the batch's key projection, where its roles have them: the anchors
    hashed as stage 1 hashes a dump's, and the step rewards or returns (one finite number a
    row)."""
    anchor, mask = roles.anchor, roles.mask
    if anchor is None:
        return []
    assert mask is not None
    named = [(anchor, pl.Series(ANCHOR, anchor_codes(anchor, entries[anchor])))]
    for key, name in ((STEP_REWARD, roles.step_reward), (STEP_RETURN, roles.step_return)):
        if name is not None:
            named.append((name, pl.Series(key, turn_rewards(name, entries[name]))))
    rows = len(as_numpy(entries[mask]))
    for name, column in named:
        if column.len() != rows:
            raise AdvcliError(f"the batch's '{name}' has {column.len():,} rows, '{mask}' {rows:,}")
    return [column for _, column in named]


def anchor_codes(name: str, value: Any) -> np.ndarray:
    """Each row's anchor hashed as stage 1 hashes a dump's anchor column (the same column
    :func:`anchor_column` writes), as uint64 ids: equal anchors, equal ids."""
    series = anchor_column(name, value)
    return pl.DataFrame([series]).select(anchor_key(name, series.dtype)).to_series().to_numpy()


def _canonical(name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.ravel().tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        key = next((key for key in value if not isinstance(key, str)), None)
        if key is not None:
            # A column's struct names its fields by strings: {1: x} and {"1": x} would be one.
            raise AdvcliError(
                f"the batch's '{name}' (anchor) has a dict with the key {key!r}, not a string; "
                "an anchor's dict keys must be strings"
            )
        return {key: _canonical(name, value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_canonical(name, element) for element in value]
    return value


def batch_projection(
    entries: Mapping[str, Any], roles: ColumnRoles, scores: np.ndarray
) -> pl.DataFrame:
    """The batch's key projection (:mod:`advcli.keys`), as stage 1 makes it of a dump: ``row``,
    ``group``, ``trajectory`` (the row number where the batch has no trajectory key), ``turn``
    where it has one, ``score`` (``scores``: each row's, float64) and ``tokens``, the sum of its
    0/1 mask."""
    assert roles.group is not None and roles.mask is not None
    tokens = as_numpy(entries[roles.mask]).sum(axis=-1, dtype=np.float64)
    if not np.array_equal(tokens, np.round(tokens)):
        first = int(np.flatnonzero(tokens != np.round(tokens))[0])
        raise AdvcliError(
            f"the batch's '{roles.mask}' is not a 0/1 mask: row {first} counts "
            f"{tokens[first]:g} tokens"
        )
    row = pl.Series(ROW, np.arange(len(scores), dtype=np.uint32))

    def ids(name: str, key: str) -> pl.Series:
        column = batch_column(name, entries[name]).alias(key)
        if column.len() != len(scores):
            raise AdvcliError(
                f"the batch's '{name}' has {column.len():,} rows, '{roles.reward}' {len(scores):,}"
            )
        return column

    columns = [
        row,
        ids(roles.group, GROUP),
        ids(roles.trajectory, TRAJECTORY)
        if roles.trajectory is not None
        else row.alias(TRAJECTORY),
    ]
    if roles.turn is not None:
        columns.append(ids(roles.turn, TURN))
    columns += [pl.Series(SCORE, scores, dtype=pl.Float64), pl.Series(TOKENS, tokens, pl.Int64)]
    return pl.DataFrame(columns)


def batch_entries(batch: Any) -> dict[str, Any]:
    """The batch's columns by key: a DataProto's tensors and non-tensor arrays, or a mapping."""
    if hasattr(batch, "batch") and hasattr(batch, "non_tensor_batch"):
        tensors = batch.batch
        # keys(), not iteration: a TensorDict iterates over its rows.
        names = tensors.keys() if tensors is not None else ()
        entries = {key: tensors[key] for key in names}
        entries.update(batch.non_tensor_batch)
        return entries
    if isinstance(batch, Mapping):
        return dict(batch)
    raise TypeError(
        f"write_batch takes a verl DataProto or a mapping of arrays, not {type(batch).__name__}"
    )


def as_numpy(value: Any) -> np.ndarray:
    """A tensor, array or list as numpy; bfloat16 (which numpy lacks) widened to float32, which
    holds every bfloat16 value exactly."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return np.asarray(value.numpy())
    return np.asarray(value)


def _schema(entries: Mapping[str, Any]) -> pl.Schema:
    """The Polars types the entries would be written as, from their dtype and shape alone (no
    tensor is converted to find the roles)."""
    return pl.Schema({key: _dtype(value) for key, value in entries.items()})


def _dtype(value: Any) -> pl.DataType:
    shape = tuple(value.shape) if hasattr(value, "shape") else (len(value),)
    kind = _kind(value)
    element: pl.DataType = (
        pl.Float32()
        if kind == "f"
        else pl.Int64()
        if kind in "iu"
        else pl.Boolean()
        if kind == "b"
        else pl.String()
    )
    if len(shape) == 2:
        return pl.Array(element, shape[1])
    if len(shape) == 1:
        return element
    return pl.Object()


def _kind(value: Any) -> str:
    """numpy's dtype kind letter (``f``, ``i``, ``u``, ``b``, ``U``, ``O``…) of a tensor, array
    or list; an object array or list by its first element."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and str(dtype).startswith("torch."):
        name = str(dtype)
        return "b" if name == "torch.bool" else "f" if "float" in name else "i"
    array = np.asarray(value) if dtype is None else value
    if array.dtype.kind == "O" and len(array):
        return np.asarray([array[0]]).dtype.kind
    return str(array.dtype.kind)


def batch_column(name: str, value: Any) -> pl.Series:
    array = as_numpy(value)

    def series_of() -> pl.Series:
        if array.dtype.kind == "O":
            return pl.Series(name, array.tolist(), strict=True)
        if array.dtype.kind == "U":
            return pl.Series(name, array.astype(object).tolist(), dtype=pl.String)
        return pl.Series(name, array)

    series = _one_column(name, series_of)
    if series.null_count():
        raise AdvcliError(
            f"the batch's '{name}' holds a null (None) at row {series.is_null().arg_max()}"
        )
    return series


def _one_column(name: str, make: Callable[[], pl.Series]) -> pl.Series:
    """``make()``'s column, or the error that the batch's ``name`` is not one column."""
    try:
        return make()
    except (TypeError, ValueError, pl.exceptions.PolarsError) as error:
        raise AdvcliError(
            f"the batch's '{name}' cannot be written as one column ({first_line(error)}); give "
            "its values one type"
        ) from None


def batch_trainer_advantages(
    entries: Mapping[str, Any], roles: ColumnRoles, key: str, option: str
) -> tuple[ColumnRoles, pl.DataFrame]:
    """A trainer's batch's own advantages (its ``key``, named by ``option``, beside the 0/1
    mask of ``roles``) read as a dump's are: the roles with it, and TRAINER_FIRST,
    TRAINER_LOW and TRAINER_HIGH, a row each. A broken value is an error naming its row."""
    if key not in entries:
        raise AdvcliError(f"the batch has no '{key}' (the trainer's advantages); {option} names it")
    assert roles.mask is not None
    mask, advantages = (
        batch_column(roles.mask, entries[roles.mask]),
        batch_column(key, entries[key]),
    )
    if advantages.len() != mask.len():
        raise AdvcliError(
            f"the batch's '{key}' (the trainer's advantages) has {advantages.len():,} rows, "
            f"'{roles.mask}' {mask.len():,}"
        )
    frame = pl.DataFrame([mask, advantages])
    columns = with_trainer_advantage(roles, frame.schema, "the batch", key, option)
    exprs, rules = trainer_advantage_exprs(frame.schema, columns, columns.mask_list().list.sum())
    broken = frame.select(
        pl.concat_list(broken.fill_null(False) for broken, _ in rules).list.arg_max().alias("rule"),
        pl.any_horizontal(broken.fill_null(False) for broken, _ in rules).alias("any"),
    )
    if broken["any"].any():
        row = int(broken["any"].arg_true()[0])
        raise AdvcliError(f"the batch's row {row}: {rules[broken['rule'][row]][1]}")
    return columns, frame.select(exprs)

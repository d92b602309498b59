"""The advantages a trainer computed, read beside the key columns for ``audit``: which column
holds them, and each row's value over its response tokens.

A trainer writes its advantages per token (verl's ``advantages``, NeMo-RL's lists) or per row
(TRL's, prime-rl's ``advantage``). An outcome estimator gives every response token of a row one
value; a row whose response tokens carry different values (GAE, a per-token estimator) is kept
apart, never averaged into a value no rule made.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from advcli.errors import AdvcliError
from advcli.keys import TRAINER_FIRST, TRAINER_HIGH, TRAINER_LOW
from advcli.read.columns import ColumnRoles
from advcli.read.dtypes import is_number, sequence_of

# The names a dump's own advantage column goes by, per token first.
ADVANTAGE_NAMES = ("advantages", "advantage")


def with_trainer_advantage(
    columns: ColumnRoles,
    schema: pl.Schema,
    where: str,
    chosen: str | None,
    option: str = "--advantage-col",
) -> ColumnRoles:
    """``columns`` with the column of the trainer's advantages: ``chosen`` (by ``option``),
    else the one a trainer's own dump makes, else ``advantages`` or ``advantage``. A dump with
    none, or with a column that holds no numbers, is an error."""
    reasons = dict(columns.reasons)
    if chosen is not None:
        name = chosen
        reasons["trainer_advantage"] = option
        if name not in schema:
            raise AdvcliError(f"{where}: column '{name}' ({option}) not found")
    elif columns.trainer_advantage is not None:
        name = columns.trainer_advantage
    else:
        found = [name for name in ADVANTAGE_NAMES if name in schema]
        if not found:
            raise AdvcliError(
                f"{where}: no column of the trainer's advantages ('advantages' per token or "
                "'advantage' per row); name it with --advantage-col"
            )
        name = found[0]
        reasons["trainer_advantage"] = f"the column named '{name}'"
    taken = {
        "reward": columns.reward,
        "mask": columns.mask,
        "group id": columns.group,
        "trajectory id": columns.trajectory,
        "turn index": columns.turn,
    }
    role = next((role for role, column in taken.items() if column == name), None)
    if role is not None:
        raise AdvcliError(f"{where}: column '{name}' is the {role}, not the trainer's advantages")
    dtype = schema[name]
    inner = sequence_of(dtype)[0]
    if not (is_number(dtype) or (inner is not None and is_number(inner))):
        raise AdvcliError(
            f"{where}: column '{name}' (the trainer's advantages) is {dtype}, not numbers or "
            "lists of them"
        )
    reasons["trainer_advantage"] += ", a value per token" if inner is not None else ", one per row"
    if chosen is None and columns.trainer_advantage is None and len(found) > 1:
        reasons["trainer_advantage"] += f" ('{found[1]}' is not read)"
    return replace(columns, trainer_advantage=name, reasons=reasons)


def trainer_advantage_exprs(
    schema: pl.Schema, columns: ColumnRoles, tokens: pl.Expr
) -> tuple[list[pl.Expr], list[tuple[pl.Expr, str]]]:
    """Each row's trainer advantage as TRAINER_FIRST, TRAINER_LOW and TRAINER_HIGH, and the
    (broken, message) rules of the column: null for a row with response tokens, a list of
    another length than the mask's, a null, NaN or infinite value (or one beyond its LIMITS)
    on a response token."""
    name = columns.trainer_advantage
    if name is None:
        raise ValueError("the roles name no column of the trainer's advantages")
    what = f"column '{name}' (the trainer's advantages)"
    inner, width = sequence_of(schema[name])
    responded = tokens.is_null() | (tokens > 0)
    rules = [(pl.col(name).is_null() & responded, f"{what} is null")]
    if inner is None:
        value = pl.col(name).cast(pl.Float64)
        rules.append((~value.is_finite(), f"{what} is not a finite number"))
        return [
            value.alias(TRAINER_FIRST),
            value.alias(TRAINER_LOW),
            value.alias(TRAINER_HIGH),
        ], rules
    listed = pl.col(name).arr.to_list() if width is not None else pl.col(name)
    # float32 lists (most trainers') are reduced as they are: a cast to float64 first would
    # copy every token's value.
    dtype = pl.Float32 if inner == pl.Float32 else pl.Float64
    values = listed.cast(pl.List(dtype))
    if columns.mask is not None and columns.mask_kind == "mask":
        mask = columns.mask_list()
        same_length = values.list.len() == mask.list.len()
        rules.append((~same_length, f"{what} and column '{columns.mask}' have different lengths"))
        exprs, on_response = _over_mask(values, dtype, mask, same_length, tokens, what)
        return exprs, rules + on_response
    values = values.cast(pl.List(pl.Float64))
    if columns.mask is not None:
        rules.append(
            (
                values.list.len() < tokens,
                f"{what} is shorter than the response length in column '{columns.mask}'",
            )
        )
        values = values.list.head(tokens)
    # One pass over the values for all: a null, a value that is no finite number, one beyond.
    limit = LIMITS[pl.Float64][0]
    broken = ~pl.element().is_finite().fill_null(False) | (pl.element().abs() >= limit)
    rules.append((values.list.eval(broken).list.any(), f"{what} {broken_value(limit)}"))
    exprs = [
        values.list.first().alias(TRAINER_FIRST),
        values.list.min().alias(TRAINER_LOW),
        values.list.max().alias(TRAINER_HIGH),
    ]
    return exprs, rules


# (broken, outside) for the float type the reading runs in. A token's value beyond ``broken``
# (or null, or NaN) is broken: each becomes it, so that list arithmetic over the mask tells the
# response tokens' values from the others' (garbage there is no error) without gathering them;
# no float32 advantage comes near either. ``outside`` is added to (or taken from) every token
# outside the response, so that a row's least (greatest) value is its response tokens'.
LIMITS = {pl.Float32: (1e38, 2e38), pl.Float64: (1e300, 1e308)}


def broken_value(limit: float) -> str:
    shown = f"{limit:g}".replace("e+", "e")
    return f"has a null, NaN or infinite value (or one beyond ±{shown}) on a response token"


def _over_mask(
    values: pl.Expr,
    dtype: type[pl.Float32] | type[pl.Float64],
    mask: pl.Expr,
    same_length: pl.Expr,
    tokens: pl.Expr,
    what: str,
) -> tuple[list[pl.Expr], list[tuple[pl.Expr, str]]]:
    """TRAINER_FIRST, TRAINER_LOW and TRAINER_HIGH over the tokens ``mask`` marks (lists of
    ``dtype`` of the same length; null where they differ, or where no token is marked), and the
    rule of a broken value on one: by arithmetic over the whole lists, several times cheaper at
    a hundred tokens a row than gathering the marked tokens first."""
    broken, outside = LIMITS[dtype]
    bounded = pl.element().fill_nan(broken).fill_null(broken).clip(-broken, broken)
    kept = pl.when(same_length).then(values.list.eval(bounded))
    off = (1 - mask.cast(pl.List(dtype))) * pl.lit(outside, dtype=dtype)
    low = pl.when(tokens > 0).then((kept + off).list.min().cast(pl.Float64))
    high = pl.when(tokens > 0).then((kept - off).list.max().cast(pl.Float64))
    first = pl.when(tokens > 0).then(kept.list.get(mask.list.arg_max()).cast(pl.Float64))
    # The bound as ``dtype`` holds it (float32's 1e38 is a little less than float64's).
    bound = pl.lit(broken, dtype=dtype).cast(pl.Float64)
    rule = ((low <= -bound) | (high >= bound), f"{what} {broken_value(broken)}")
    exprs = [first.alias(TRAINER_FIRST), low.alias(TRAINER_LOW), high.alias(TRAINER_HIGH)]
    return exprs, [rule]

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
    another length than the mask's, a null, NaN or infinite value on a response token."""
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
    values = (pl.col(name).arr.to_list() if width is not None else pl.col(name)).cast(
        pl.List(pl.Float64)
    )
    if columns.mask is not None and columns.mask_kind == "mask":
        mask = columns.mask_list()
        rules.append(
            (
                values.list.len() != mask.list.len(),
                f"{what} and column '{columns.mask}' have different lengths",
            )
        )
        at = mask.list.eval(pl.arg_where(pl.element().cast(pl.Boolean)))
        values = values.list.gather(at, null_on_oob=True)
    elif columns.mask is not None:
        rules.append(
            (
                values.list.len() < tokens,
                f"{what} is shorter than the response length in column '{columns.mask}'",
            )
        )
        values = values.list.head(tokens)
    # One pass over the values for both: a null and a value that is no finite number.
    not_finite = ~pl.element().is_finite().fill_null(False)
    rules.append(
        (
            values.list.eval(not_finite).list.any(),
            f"{what} has a null, NaN or infinite value on a response token",
        )
    )
    exprs = [
        values.list.first().alias(TRAINER_FIRST),
        values.list.min().alias(TRAINER_LOW),
        values.list.max().alias(TRAINER_HIGH),
    ]
    return exprs, rules

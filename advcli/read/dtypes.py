"""What a column's type can hold: ids (integers, strings), numbers, lists and one-dimensional
arrays of them, and so which roles a column can be meant for."""

from __future__ import annotations

from typing import Any

import polars as pl
from polars.datatypes import DataTypeClass

from advcli.read.dialects import Role


def sequence_of(dtype: pl.DataType | DataTypeClass) -> tuple[Any, int | None]:
    """(element type, fixed width) of a list (width None) or a one-dimensional array; (None,
    None) for anything else."""
    if isinstance(dtype, pl.List):
        return dtype.inner, None
    if isinstance(dtype, pl.Array) and len(dtype.shape) == 1:
        return dtype.inner, dtype.size
    return None, None


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
        return is_number(dtype)
    inner = sequence_of(dtype)[0]
    if role == "reward":
        return is_number(dtype) or (inner is not None and is_number(inner))
    return dtype.is_integer() or (inner is not None and (is_number(inner) or inner == pl.Boolean))


def is_anchor_type(dtype: pl.DataType | DataTypeClass) -> bool:
    """An anchor compares by equality: ids, booleans, binary, and lists, arrays and structs of
    them (never floats, whose equal states can differ in their last bits)."""
    inner = sequence_of(dtype)[0]
    if isinstance(dtype, pl.List | pl.Array):
        return inner is not None and is_anchor_type(inner)
    if isinstance(dtype, pl.Struct):
        return all(is_anchor_type(field.dtype) for field in dtype.fields)
    return is_id_type(dtype) or dtype in (pl.Boolean, pl.Binary)


def is_number(dtype: pl.DataType | DataTypeClass) -> bool:
    return dtype.is_numeric() and dtype != pl.Boolean


def is_enum(dtype: pl.DataType | DataTypeClass) -> bool:
    return isinstance(dtype, pl.Enum)

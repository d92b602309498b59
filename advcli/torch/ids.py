"""A batch's ids as integer codes on tensors: equal ids get equal codes,
without a Python loop over rows where the ids are numbers.

Integer ids whose range is small are their own codes (shifted by their minimum); wider ranges and
floating ids are factorized with one ``torch.unique``; strings and other Python objects go
through one C-level dict pass, each row's code being the position of the first row with an equal
id. Needs torch (the ``advcli[torch]`` extra), as the rest of :mod:`advcli.torch`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

import numpy as np
import torch

#: Row ids: a numpy array (object/str/int), a 1-D torch tensor, or a sequence of hashable values.
Ids: TypeAlias = "np.ndarray | torch.Tensor | Sequence[Any]"

# Integer codes whose range is at most this many times the batch size are used as scatter
# indices directly (no sort); wider ranges are factorized with torch.unique.
_DIRECT_RANGE_FACTOR = 4
_DIRECT_RANGE_MIN = 1 << 16
# Combined (group, trajectory) keys must stay below this to be formed without overflow.
KEY_LIMIT = 1 << 62
INT32_LIMIT = 1 << 31
# Python ints kept for the hash factorization of object ids: a bounded cache.
_POSITIONS_CACHED = 1 << 18


@dataclass(frozen=True)
class Codes:
    """int64 codes of row ids, ``values - offset`` in ``[0, bound)``; equal ids, equal codes.

    ``first_rows``: each value is the position of the first row with the same id (offset 0).
    The offset is subtracted only when the codes are used (:attr:`codes`), so ids that go
    straight to :func:`dense` skip that pass.
    """

    values: torch.Tensor
    bound: int
    offset: int = 0
    first_rows: bool = False

    @property
    def codes(self) -> torch.Tensor:
        return self.values - self.offset if self.offset else self.values


def check_length(ids: Ids, n: int, name: str) -> None:
    length = ids.shape[0] if isinstance(ids, torch.Tensor | np.ndarray) and ids.ndim else None
    if length is None:
        length = len(ids)
    if length != n:
        raise ValueError(f"{name} has {length} ids for {n} rows")


def raw_codes(ids: Ids, n: int, device: torch.device, name: str) -> Codes:
    """Integer codes for the ids, on ``device``; not necessarily dense (see :func:`compact`)."""
    if isinstance(ids, torch.Tensor) or (isinstance(ids, np.ndarray) and ids.dtype.kind in "biuf"):
        tensor = ids if isinstance(ids, torch.Tensor) else numpy_to_tensor(ids)
        if tensor.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
        check_length(tensor, n, name)
        tensor = tensor.detach().to(device)
        if tensor.is_floating_point() or tensor.is_complex():
            nan = torch.isnan(tensor)
            if bool(nan.any()):
                _refuse_id(name, int(nan.to(torch.uint8).argmax()), math.nan)
            return dense(Codes(tensor, 0))
        if tensor.dtype == torch.uint64:
            # Reinterpret as int64: a bijection, so equal ids keep equal codes.
            tensor = tensor.view(torch.int64)
        tensor = tensor.to(torch.int64)
        if n == 0:
            return Codes(tensor, 0)
        low, high = (int(value) for value in torch.aminmax(tensor))
        if high - low >= KEY_LIMIT:
            return dense(Codes(tensor, 0))
        return Codes(tensor, high - low + 1, offset=low)
    values: Sequence[Any] | np.ndarray
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {ids.shape}")
        # Iterating an object array yields its elements as they are; other dtypes (str_, ...)
        # convert faster in one tolist().
        values = ids if ids.dtype == object else ids.tolist()
    elif isinstance(ids, str | bytes):
        raise TypeError(f"{name} must be a sequence of ids, not a single {type(ids).__name__}")
    else:
        values = ids
    check_length(values, n, name)
    # Hash-based factorization in C (map over dict.setdefault): each row's code is the position
    # of the first row with an equal id, so codes are < n.
    first_row_of: dict[Any, int] = {}
    try:
        first_rows = np.fromiter(
            map(first_row_of.setdefault, values, _python_positions(n)), dtype=np.int64, count=n
        )
    except TypeError as error:
        raise TypeError(f"{name}: ids must be hashable ({error})") from None
    # Looked for among the distinct ids only: far fewer than the rows.
    for value, row in first_row_of.items():
        if value is None or (isinstance(value, float | np.floating) and math.isnan(value)):
            _refuse_id(name, row, value)
    return Codes(torch.from_numpy(first_rows).to(device), n, first_rows=True)


def _refuse_id(name: str, row: int, value: Any) -> NoReturn:
    """A null or NaN id names no group or trajectory: NaN is equal to no id, itself included,
    so each of its rows would be a group of its own; None would make the rows that lack an id
    one group."""
    raise ValueError(
        f"{name}: row {row} has the id {value!r}, which names no group or trajectory (NaN "
        "equals no id, not even itself; None is no id)"
    )


_positions_cache: list[int] = []


def _python_positions(n: int) -> Sequence[int]:
    """0, 1, ... n - 1 as Python ints, reused across calls up to ``_POSITIONS_CACHED`` (making
    those int objects is a good part of the cost of the hash factorization); map() stops at the
    shortest input, so a longer list is fine."""
    global _positions_cache
    if n > _POSITIONS_CACHED:
        return range(n)
    cache = _positions_cache
    if len(cache) < n:
        # Rebinding (not extending) keeps a concurrent reader's list intact.
        cache = list(range(min(max(n, 2 * len(cache)), _POSITIONS_CACHED)))
        _positions_cache = cache
    return cache


def numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A numeric numpy array as a tensor, sharing memory when it can (it is only read)."""
    array = np.ascontiguousarray(array)  # torch.from_numpy refuses negative strides
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        # A read-only array is fine: the tensor is never written to.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def direct_limit(n: int) -> int:
    return max(_DIRECT_RANGE_FACTOR * n, _DIRECT_RANGE_MIN)


def compact(codes: Codes, n: int) -> Codes:
    """Codes usable as indices into per-group buffers: dense, or kept when their range is small."""
    if codes.first_rows:
        # Number the first rows 0, 1, ... in batch order (no sort), so the group buffers have
        # one slot per group rather than one per row.
        of_row, first_rows = _number_by_first_row(codes.values)
        return Codes(of_row, first_rows.numel())
    if codes.bound <= direct_limit(n):
        return Codes(codes.codes, codes.bound)
    return dense(codes)


def _number_by_first_row(first_of_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Given each row's first row with the same key, number the keys 0, 1, … in the order of
    their first rows: (each row's number, each number's first row). No sort, and no cumulative
    sum (slow on CPU for a bool tensor)."""
    n = first_of_row.numel()
    positions = torch.arange(n, device=first_of_row.device)
    first_rows = torch.nonzero(first_of_row == positions).squeeze(1)
    number_at = torch.empty(n, dtype=torch.int64, device=first_of_row.device)
    number_at.index_copy_(0, first_rows, torch.arange(first_rows.numel(), device=positions.device))
    return number_at.index_select(0, first_of_row), first_rows


def dense(codes: Codes) -> Codes:
    """Factorize to ``0 .. k-1`` with one sort (torch.unique)."""
    if 0 < codes.bound <= INT32_LIMIT:
        unique, inverse = unique_codes(codes.codes, codes.bound)
    else:
        # Floating ids, a range too wide to shift (bound 0), or too wide for int32: factorize the
        # values as they are (shifting them changes no equality, and costs a pass).
        unique, inverse = torch.unique(codes.values, return_inverse=True)
    return Codes(inverse.to(torch.int64), unique.numel())


def unique_codes(codes: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.unique of codes in ``[0, bound)``, sorted as int32 when they fit (a faster sort)."""
    if bound <= INT32_LIMIT:
        codes = codes.to(torch.int32)
    unique, inverse = torch.unique(codes, return_inverse=True)
    return unique.to(torch.int64), inverse.to(torch.int64)

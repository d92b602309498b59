"""The batch's tensors in and out: each row's score from its token rewards, after the checks
that no reward or mask value makes a NaN or a rounded score, and the float32 result, refused
where it does not fit."""

from __future__ import annotations

import math

import torch

from advcli.errors import AdvcliError
from advcli.settings.rules import EXACT_INTEGER_LIMIT, FLOAT32_MAX

# Rewards are summed in float64 by blocks of about this many values (see row_scores).
_SUM_BLOCK = 1 << 20
# torch runs an op of fewer values than this (at::internal::GRAIN_SIZE) on the calling thread;
# larger ones are split across its intra-op threads, which then wait for each other: with the
# machine's other cores busy, that wait is most of a small batch's time.
_GRAIN = 1 << 15
# A batch of fewer rows than _GRAIN and at most this many token values is a small one: its
# per-token passes go by blocks of rows below _GRAIN (the same per-row arithmetic, no thread
# handoff); larger batches are worth the threads.
_SMALL_VALUES = 64 * _GRAIN


def is_small(rows: int, length: int) -> bool:
    """Whether a ``(rows, length)`` batch on CPU takes the path without intra-op threads: its
    per-row ops are below the grain already, its per-token ones go by blocks
    (:func:`row_blocks`)."""
    return rows < _GRAIN and length < _GRAIN and rows * length <= _SMALL_VALUES


def row_blocks(rows: int, length: int) -> range:
    """The first row of each block of rows whose values stay below the grain (a small batch's)."""
    return range(0, rows, max(1, (_GRAIN - 1) // max(length, 1)))


class RewardError(AdvcliError, ValueError):
    """Rewards or a mask no advantage can be computed from: a NaN or infinite value, integer
    rewards beyond 2^53, scores too large for the float32 result. The message names the row
    (batch index) and the value. An :class:`~advcli.errors.AdvcliError`, as the command line
    raises for the same rows, and a ``ValueError``, as every other bad input of this module."""


def row_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each row's score, the sum of its token-level rewards, in float64, after the checks that
    no reward or mask value can make a NaN or a rounded score (:func:`_check_integers`,
    :func:`_check_scores`, :func:`_check_mask`)."""
    check_holds_numbers(token_level_rewards, "token_level_rewards")
    check_holds_numbers(response_mask, "response_mask")
    if token_level_rewards.dim() != 2:
        raise ValueError(
            "token_level_rewards must be (bs, response_length), got shape "
            f"{tuple(token_level_rewards.shape)}"
        )
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}, token_level_rewards "
            f"{tuple(token_level_rewards.shape)}"
        )
    rewards = token_level_rewards.detach()
    small = rewards.device.type == "cpu" and is_small(*rewards.shape)
    _check_integers(rewards)
    scores = sum_rows(rewards, small)
    _check_scores(rewards, scores)
    _check_mask(response_mask.detach(), small)
    return scores


def check_holds_numbers(tensor: torch.Tensor, name: str) -> None:
    """Refuse a tensor whose values cannot be read as real numbers: one on the meta device
    holds none, a sparse one is not laid out as (bs, response_length), and a complex one would
    lose its imaginary part."""
    if tensor.device.type == "meta":
        raise ValueError(f"{name} is on the meta device, which holds no values")
    if tensor.layout is not torch.strided:
        raise ValueError(f"{name} must be a dense tensor, got layout {tensor.layout}")
    if tensor.is_complex():
        raise ValueError(f"{name} holds complex numbers ({tensor.dtype}); it takes real ones")


def sum_rows(values: torch.Tensor, small: bool) -> torch.Tensor:
    """Each row's sum in float64 (exact for the integer rewards _check_integers lets through);
    ``small`` (:func:`is_small`): by blocks of rows below the grain."""
    rows, length = values.shape
    if length == 1:  # the sum of one token; torch reduces a length-1 dim slowly
        return values[:, 0].to(torch.float64)
    if small:
        return _sum_blocks(values, row_blocks(rows, length).step)
    block = max(1, _SUM_BLOCK // max(length, 1))
    if values.device.type != "cpu" or block >= rows:
        return values.sum(dim=-1, dtype=torch.float64)
    return _sum_blocks(values, block)


def _sum_blocks(rewards: torch.Tensor, block: int) -> torch.Tensor:
    """Each row's float64 sum by blocks of ``block`` rows, each converted in one reused buffer
    (the same result as one ``sum(dtype=float64)``: a row is reduced the same way whatever rows
    share its block)."""
    rows, length = rewards.shape
    # On CPU, sum(dtype=float64) materializes a float64 copy of the whole tensor, which is slow
    # (fresh pages) for a long response_length: convert and sum blocks of rows in one reused
    # buffer instead (a loop over blocks of values, not over rows; same result).
    scores = torch.empty(rows, dtype=torch.float64)
    buffer = torch.empty(min(block, rows), length, dtype=torch.float64)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        piece = buffer[: stop - start]
        piece.copy_(rewards[start:stop])
        torch.sum(piece, dim=-1, out=scores[start:stop])
    return scores


# Integer sums below this are exact in int64 (with room for the float64 rounding of the
# |rewards| sum that selects them).
_INT64_EXACT_SUMS = 2.0**61


def _check_integers(rewards: torch.Tensor) -> None:
    """Refuse integer rewards whose float64 score could be rounded, as the command line does:
    a row whose rewards add up, in absolute value, beyond 2^53 (every partial sum of a row within
    it is an integer float64 holds exactly, so the score is the exact sum)."""
    if rewards.is_floating_point() or rewards.dtype == torch.bool or not rewards.numel():
        return
    info = torch.iinfo(rewards.dtype)
    largest = max(-info.min, info.max)
    if largest * rewards.shape[1] > EXACT_INTEGER_LIMIT and rewards.dtype == torch.int64:
        low, high = torch.aminmax(rewards)
        largest = max(-int(low), int(high))
    if largest * rewards.shape[1] <= EXACT_INTEGER_LIMIT:
        return  # no row can add up beyond 2^53
    magnitude = rewards.to(torch.float64).abs_().sum(dim=-1)
    # The float64 sum of |rewards| is exact up to 2^53 and at least 2^53 beyond it (rounding is
    # monotone), so only rows that reach 2^53 are looked at, with exact int64 sums where those
    # cannot overflow.
    suspect = torch.nonzero(magnitude >= EXACT_INTEGER_LIMIT).squeeze(1)
    if not suspect.numel():
        return
    near = suspect[magnitude.index_select(0, suspect) <= _INT64_EXACT_SUMS]
    exact = rewards.index_select(0, near).to(torch.int64).abs_().sum(dim=-1)
    far = suspect[magnitude.index_select(0, suspect) > _INT64_EXACT_SUMS]
    beyond = torch.cat([near[exact > EXACT_INTEGER_LIMIT], far])
    if not beyond.numel():
        return
    row = int(beyond.min())
    at = torch.nonzero(near == row)
    total = f"{int(exact[at[0, 0]])}" if at.numel() else f"about {float(magnitude[row]):.6g}"
    raise RewardError(
        f"row {row}: the integer rewards of the row add up (in absolute value) to {total}, "
        "beyond 2^53, where float64 cannot hold every integer"
    )


def _non_finite_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def _check_scores(rewards: torch.Tensor, scores: torch.Tensor) -> None:
    """Refuse a NaN or infinite reward, naming its row and token: it would make its group's
    statistics NaN. Every token counts, masked out or not: the score sums them all (as verl's
    estimators do). A row of finite float64 rewards whose sum overflows is "too large"."""
    if _fits_float32(scores):
        return  # the usual case, one pass; finite scores beyond float32 are check_fits's
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return
    row = int(torch.nonzero(~finite)[0, 0])
    values = rewards[row]
    tokens = torch.nonzero(~torch.isfinite(values))
    if tokens.numel():
        token = int(tokens[0, 0])
        raise RewardError(
            f"row {row}: the reward at token {token} is {_non_finite_name(float(values[token]))}"
        )
    raise RewardError(
        f"row {row}: the rewards of the row add up beyond float64 (the scores are too large; "
        "rescale the rewards)"
    )


def _check_mask(mask: torch.Tensor, small: bool) -> None:
    """Refuse a NaN or infinite value in a floating mask, naming its row and token: the
    advantage times it would be NaN there (and the token counts NaN)."""
    if not mask.is_floating_point() or not mask.numel():
        return
    # Sums are a cheap screen (no per-value result): a non-finite value makes the total and its
    # row's sum non-finite. A sum that overflows with finite values only (a float16 mask of more
    # than 65504 ones) is let through.
    if small:
        starts = row_blocks(*mask.shape)
        totals = torch.stack([mask[start : start + starts.step].sum() for start in starts])
        if bool(torch.isfinite(totals).all()):
            return
    elif bool(torch.isfinite(mask.sum())):
        return
    suspect = torch.nonzero(~torch.isfinite(mask.sum(dim=-1))).squeeze(1)
    if not suspect.numel():
        return
    bad = torch.nonzero(~torch.isfinite(mask.index_select(0, suspect)))
    if not bad.numel():
        return
    row, token = int(suspect[bad[0, 0]]), int(bad[0, 1])
    raise RewardError(
        f"row {row}: the response mask at token {token} is "
        f"{_non_finite_name(float(mask[row, token]))}"
    )


def broadcast(advantage: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The float32 ``(bs, response_length)`` result: each row's advantage times its mask."""
    # Cast first: a float64 x float32 multiply into a float32 output is much slower on CPU.
    per_row = advantage.to(torch.float32).unsqueeze(-1)
    mask = response_mask.detach()
    if mask.device.type == "cpu" and is_small(*mask.shape):
        # The same products, by blocks of rows below the grain (a small batch's path).
        out = torch.empty(mask.shape, dtype=torch.result_type(per_row, mask))
        starts = row_blocks(*mask.shape)
        for start in starts:
            stop = start + starts.step
            torch.mul(per_row[start:stop], mask[start:stop], out=out[start:stop])
    else:
        out = per_row * mask
    return out if out.dtype == torch.float32 else out.to(torch.float32)


def check_fits(
    scores: torch.Tensor, advantage: torch.Tensor, unit_rows: torch.Tensor | None
) -> None:
    """Refuse scores or advantages that do not fit a float32 (the result's type), as the
    command line does, naming the first row: never a silent inf or NaN. The rewards are finite
    (:func:`_check_scores`), so only finite scores that overflow end here. ``advantage`` may be
    per unit, ``unit_rows`` each unit's first row (None: per row)."""
    if _fits_float32(scores) and _fits_float32(advantage):
        return
    rows = torch.nonzero(~(scores.abs() <= FLOAT32_MAX)).squeeze(1)
    bad_units = torch.nonzero(~(advantage.abs() <= FLOAT32_MAX)).squeeze(1)
    if unit_rows is not None:
        bad_units = unit_rows.index_select(0, bad_units)
    row = int(torch.cat([rows, bad_units]).min())
    raise RewardError(
        f"row {row}: the score or its advantage does not fit a float32 (the scores are too "
        "large; rescale the rewards)"
    )


def _fits_float32(values: torch.Tensor) -> bool:
    if not values.numel():
        return True
    low, high = torch.aminmax(values)
    # aminmax propagates NaN, which compares False: it does not fit.
    return bool((low >= -FLOAT32_MAX) & (high <= FLOAT32_MAX))

"""What stage 3 attaches to each input row: its score and advantage, its ``loss_weight`` if
asked for, and the padding rows' own."""

from __future__ import annotations

import polars as pl

from advcli.advantages.estimators import Advantages
from advcli.advantages.loss import token_weight, unwritable_weight
from advcli.errors import UsageError
from advcli.keys import ROW, SCORE, TOKENS
from advcli.read.duplicates import DuplicateRows
from advcli.run.loading import LoadedDump
from advcli.settings.config import LossMode
from advcli.write.rows import with_padding


def row_values(
    every_row: LoadedDump,
    dump: LoadedDump,
    duplicates: DuplicateRows,
    advantages: Advantages,
    loss_weight: LossMode | None,
    loss_scale_factor: float | None,
) -> pl.DataFrame:
    """What stage 3 attaches to each input row (``dump``: the rows stage 2 counted, of
    ``every_row``): its score and advantage, as the float32 they are written as, its
    ``loss_weight`` if asked for, and the padding rows' own."""
    values = advantages.rows(dump.projection).select(
        ROW, pl.col(SCORE, "advantage").cast(pl.Float32)
    )
    if dump.projection is not every_row.projection:  # its copies were dropped
        values = duplicates.spread_to_copies(values)
    if loss_weight is not None:
        # Over every row: the weights are of the batch as written, copies included.
        values = values.join(
            loss_weights(every_row, loss_weight, loss_scale_factor),
            on=ROW,
            how="left",
            maintain_order="left",
        )
    return with_padding(values, dump.padding)


def loss_weights(dump: LoadedDump, mode: LossMode, scale_factor: float | None) -> pl.DataFrame:
    """Each row's ``loss_weight`` under ``mode``."""
    if mode is LossMode.SEQ_MEAN_TOKEN_SUM_NORM and scale_factor is None:
        scale_factor = dump.columns.mask_width
        if scale_factor is None:
            raise UsageError(
                "--loss-weight seq-mean-token-sum-norm divides by verl's loss_scale_factor (by "
                "default the padded response length, which a list mask does not state): pass "
                "--loss-scale-factor N"
            )
    # With --by each step is its own batch, as for the advantages.
    batch = dump.steps.name if dump.steps is not None else None
    weight = token_weight(mode.value, scale_factor or 1.0, batch)
    weights = dump.projection.select(ROW, TOKENS, weight.alias("loss_weight"))
    bad = unwritable_weight(weights)
    if bad is not None:
        kind = "overflows to infinity" if abs(bad) > 1 else "underflows float64's range"
        message = f"--loss-weight {mode.value}: the rows' loss_weight ({bad:g}) {kind}"
        if mode is LossMode.SEQ_MEAN_TOKEN_SUM_NORM:
            message = (
                f"--loss-scale-factor {scale_factor:g}: the rows' loss_weight 1 / (rows × "
                f"{scale_factor:g}) = {bad:g} {kind}; pass a factor near the padded response "
                "length"
            )
        raise UsageError(message)
    return weights.drop(TOKENS)

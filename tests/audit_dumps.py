"""Dumps that carry a trainer's own advantages, for ``audit``'s tests: the rows of
:func:`conftest.dump_frame` with an ``advantages`` column, each row's value on every response
token, in float32 as trainers write them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
from conftest import dump_frame

from advcli.run.audit import audit


def audited_frame(
    rows: Sequence[tuple[object, object, int, float, int]], found: Sequence[float]
) -> pl.DataFrame:
    """``dump_frame(rows)`` with the trainer's advantage ``found[i]`` on each token of row i."""
    return dump_frame(rows).with_columns(
        pl.Series(
            "advantages",
            [[value] * row[4] for row, value in zip(rows, found, strict=True)],
            dtype=pl.List(pl.Float32),
        )
    )


def audit_rows(
    folder: Path,
    rows: Sequence[tuple[object, object, int, float, int]],
    found: Sequence[float],
    name: str = "audited.parquet",
) -> dict:
    """The audit report of a dump of ``rows`` whose trainer computed ``found``."""
    path = folder / name
    audited_frame(rows, found).write_parquet(path)
    return audit([path])


def kinds(report: dict) -> list[str]:
    return [finding["kind"] for finding in report["findings"]]

"""Stage 3: the per-token column and every output format.

:func:`write_advantages` is the only pass over every column: it streams the input through Polars,
attaches each row's score and advantage by row number and writes the result through
:func:`advcli.write.atomic.atomic_output`.
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
from polars.io.plugins import register_io_source

from advcli._runtime.native_stderr import cancelled_tasks_unreported
from advcli._runtime.process import available_memory
from advcli._runtime.signals import held
from advcli.errors import AdvcliError, first_line
from advcli.keys import ROW, SCORE
from advcli.names import native_name
from advcli.read.columns import OUTPUT_COLUMNS, ColumnRoles, unused_name
from advcli.read.dataset import Dataset
from advcli.read.scan import closing_sources
from advcli.settings.config import OutputColumns, OutputFormat
from advcli.write.atomic import atomic_output

# The most rows of a row group compute --by file sets: the default row group of Polars' sinks
# before they chose one by the data (512 × 512); a larger file's rows fill several.
PART_ROW_GROUP_LIMIT = 512 * 512


# One part of the output's rows: a dataset (the whole run's, or a file of it), the roles it was
# read with, and its rows' values (``row``, ``score``, ``advantage`` and any extra columns).
Part = tuple[Dataset, ColumnRoles, pl.DataFrame]


def write_advantages(
    dataset: Dataset,
    parts: Iterable[Part],
    output: Path,
    *,
    output_format: OutputFormat,
    tokens: bool = True,
    force: bool = False,
    output_columns: OutputColumns = OutputColumns.ALL,
) -> None:
    """Attach ``score`` and ``advantage`` (one per row, ordered by ``row``) to every input row of
    each of ``parts``, one part after another, and write the result (replacing input columns of
    those names). Without ``force`` an ``output`` that exists by the time the result is complete
    is an error. ``output_columns`` says which input columns are written
    (:class:`~advcli.settings.OutputColumns`): only those and the mask (for ``advantages``) are
    read again.

    A run of one batch is one part, ``dataset`` itself: its rows go to the sink as one frame
    (the padded arrays, ``npz`` and ``pt``, are made whole from it; Parquet row groups are
    Polars' choice). Parts of ``dataset`` (its files, each made only once the rows before it
    are written) stream through one source, so that what is held is about one part's; their
    Parquet row groups are the largest file's rows (up to :data:`PART_ROW_GROUP_LIMIT`), and
    the padded arrays, which are made whole, are refused.

    The inputs must still be the files stage 1 read: checked before they are read again (a
    change fails here, not after the long write) and before the result is published.
    """
    remaining = iter(parts)
    part, columns, values = next(remaining)
    frame, kept = output_frame(part, columns, values, output, output_format, tokens, output_columns)
    if part is dataset:
        if next(remaining, None) is not None:
            raise ValueError("the dataset itself is the run's one part: no part may follow it")
        _write(frame, dataset, columns, kept, output, output_format, tokens, force)
        return
    if output_format in ("npz", "pt"):
        raise ValueError("padded arrays are written whole, not part by part")
    frames = itertools.chain(
        [frame],
        (
            output_frame(*later, output, output_format, tokens, output_columns)[0]
            for later in remaining
        ),
    )

    def rows(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        # The sinks take every column and row of this source, which makes each part once:
        # anything asked of it less than that would be a silently shorter output.
        if (with_columns, predicate, n_rows) != (None, None, None):
            raise ValueError("the parts' rows are streamed whole, once")
        for each in frames:
            yield from each.collect_batches()

    source = register_io_source(rows, schema=frame.collect_schema(), validate_schema=True)
    # Parquet row groups of the largest file's rows (up to a bound for large files): Polars'
    # own size would hold a file's rows, or two, while the next file is read and computed.
    row_group = min(max(dataset.row_counts), PART_ROW_GROUP_LIMIT)
    _write(source, dataset, None, None, output, output_format, tokens, force, row_group)


def output_frame(
    dataset: Dataset,
    columns: ColumnRoles,
    row_values: pl.DataFrame,
    output: Path,
    output_format: OutputFormat,
    tokens: bool,
    output_columns: OutputColumns,
) -> tuple[pl.LazyFrame, list[str] | None]:
    """The output rows of one part of :func:`write_advantages`, as a frame to stream, and the
    input columns it keeps (None: every one), once the inputs and ``row_values`` are checked."""
    dataset.check_unchanged()
    check_roles_kept(columns, dataset.describe())
    if not row_values[ROW].equals(
        pl.Series(ROW, range(dataset.num_rows), dtype=row_values[ROW].dtype)
    ):
        raise ValueError("row_values must hold one row per input row, in input order")
    # Each streamed row looks its values up by its row number in two float32 arrays (8 bytes a
    # row): cheaper than a join, and the only per-row state kept while the token data streams.
    score = pl.lit(row_values[SCORE].cast(pl.Float32))
    advantage = pl.lit(row_values["advantage"].cast(pl.Float32))
    row_number = unused_name(dataset.schema)
    arrays = output_format in ("npz", "pt")
    if tokens and columns.mask_kind == "length" and not arrays:
        _check_longest_row(dataset, columns, output)
    extra = {
        name: pl.lit(row_values[name]).gather(pl.col(row_number))
        for name in row_values.columns
        if name in EXTRA_COLUMNS
    }
    kept = kept_columns(dataset.schema.names(), columns, output_columns)
    if kept and arrays:
        _check_array_columns(dataset.schema, kept, output_format, output)
    if output_format == "parquet":
        inputs = dataset.stored_schema.names() if kept is None else kept
        _check_parquet_holds(dataset.schema, inputs, output)
    frame = output_rows(
        _input_rows(dataset, row_values, columns, kept, row_number, tokens or arrays),
        columns,
        score=score.gather(pl.col(row_number)),
        advantage=advantage.gather(pl.col(row_number)),
        # The padded arrays make their own per-token array.
        tokens=tokens and not arrays,
        extra=extra,
    ).drop(row_number, *(_made_mask(dataset, columns, kept) if tokens and not arrays else []))
    if kept is not None and not arrays:
        written = ("score", "advantage", *extra, *(["advantages"] if tokens else []))
        frame = frame.select(*kept, *written)
    return frame, kept


def _write(  # noqa: PLR0913
    frame: pl.LazyFrame,
    dataset: Dataset,
    columns: ColumnRoles | None,
    kept: list[str] | None,
    output: Path,
    output_format: OutputFormat,
    tokens: bool,
    force: bool,
    row_group: int | None = None,
) -> None:
    """``frame`` written to ``output`` (``columns``: the roles, for padded arrays; ``row_group``:
    the rows of a Parquet row group, None for Polars' choice), published once whole and the
    inputs are as they were opened."""
    with (
        atomic_output(
            output, force=force, keep=dataset.inputs, before_publish=dataset.check_unchanged
        ) as partial,
        closing_sources(),
        cancelled_tasks_unreported(),
    ):
        try:
            if output_format in ("npz", "pt"):
                assert columns is not None
                _write_arrays(frame, columns, partial, output_format, tokens, output, kept)
            elif output_format == "arrows":
                _write_arrow_stream(frame, partial)
            else:
                with native_name(partial) as target:
                    if output_format == "parquet":
                        frame.sink_parquet(target, row_group_size=row_group)
                    else:
                        frame.sink_ipc(target)
        except (pl.exceptions.PolarsError, AdvcliError, OSError) as error:
            # Polars, Arrow and torch report a pipe whose reader went away as errors of their
            # own: it ends the run as a broken pipe does (quietly, exit 141).
            if partial == output and reader_gone(output):
                raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe") from None
            if isinstance(error, pl.exceptions.PolarsError):
                raise AdvcliError(f"{output}: cannot write ({first_line(error)})") from None
            raise


def _check_parquet_holds(schema: pl.Schema, names: list[str], output: Path) -> None:
    """Refuse, before any row is read, a column Parquet has no type for: an empty JSON object
    (a struct of no field, at any depth), which a trainer's JSON records may hold."""
    for name in names:
        if _has_empty_struct(schema[name]):
            raise AdvcliError(
                f"{output}: column '{name}' holds an empty JSON object (a struct of no field), "
                "which Parquet cannot hold; write .arrow, or keep only the key columns with "
                "--columns keys"
            )


def _has_empty_struct(dtype: object) -> bool:
    if isinstance(dtype, pl.Struct):
        return not dtype.fields or any(_has_empty_struct(field.dtype) for field in dtype.fields)
    if isinstance(dtype, pl.List | pl.Array):
        return _has_empty_struct(dtype.inner)
    return False


def _made_mask(dataset: Dataset, columns: ColumnRoles, kept: list[str] | None) -> list[str]:
    """The mask, where a trainer's dump's reading makes it and every input column is written
    (the padded arrays write none): read for the per-token column, not written."""
    view = dataset.view
    if kept is None and view is not None and columns.mask in view.made:
        return [columns.mask]
    return []


def kept_columns(
    names: Iterable[str], columns: ColumnRoles, output_columns: OutputColumns
) -> list[str] | None:
    """The input columns ``output_columns`` writes, in input order: None for every one (``all``,
    but those named like an output), the group, trajectory and turn columns for ``keys`` (but
    one named like an output), none for ``none``."""
    if output_columns is OutputColumns.ALL:
        return None
    if output_columns is OutputColumns.NONE:
        return []
    names = list(names)
    roles = {columns.group, columns.trajectory, columns.turn} - set(earlier_outputs(names))
    return [name for name in names if name in roles]


def _input_rows(
    dataset: Dataset,
    row_values: pl.DataFrame,
    columns: ColumnRoles,
    kept: list[str] | None,
    row_number: str,
    mask: bool,
) -> pl.LazyFrame:
    """The input rows stage 3 reads, numbered in ``row_number``: every column, or the ``kept``
    ones and (with ``mask``) the mask column. With no input column to read, the row numbers
    come from ``row_values``: a scan of no columns has no rows."""
    if kept is None:
        # The files' own columns (those a trainer's dump's reading makes are not written), and
        # a mask it makes, read for the per-token column.
        read = dataset.stored_schema.names()
        if mask and columns.mask is not None and columns.mask not in read:
            read.append(columns.mask)
        return dataset.scan().select(read).with_row_index(row_number)
    read = [*kept, *([columns.mask] if mask and columns.mask and columns.mask not in kept else [])]
    if not read:
        return row_values.lazy().select(pl.col(ROW).alias(row_number))
    return dataset.scan().select(read).with_row_index(row_number)


def with_padding(row_values: pl.DataFrame, padding: pl.DataFrame) -> pl.DataFrame:
    """``row_values`` (``row``, ``score``, ``advantage``, any extra columns: the rows of the
    statistics) with a row for each padding row of the key projection, in row order: its own
    score, and 0 for its advantage and every extra column (its loss weight), so that its
    per-token advantages are 0 as well."""
    if padding.is_empty():
        return row_values
    schema = row_values.schema
    padding_values = padding.select(
        pl.col(ROW).cast(schema[ROW]),
        *(
            (pl.col(SCORE) if name == SCORE else pl.lit(0)).cast(schema[name]).alias(name)
            for name in row_values.columns
            if name != ROW
        ),
    )
    return pl.concat([row_values, padding_values]).sort(ROW)


Rows = TypeVar("Rows", pl.DataFrame, pl.LazyFrame)


def output_rows(
    rows: Rows,
    columns: ColumnRoles,
    *,
    score: pl.Expr,
    advantage: pl.Expr,
    tokens: bool,
    extra: dict[str, pl.Expr] | None = None,
) -> Rows:
    """The output's rows, for both engines: every input column but those named like an output
    (an earlier run's, which this run writes again or not at all), then ``score`` and
    ``advantage`` as float32, any ``extra`` columns (``loss_weight``) and, with ``tokens``, the
    per-token ``advantages``."""
    extra = extra or {}
    out = rows.drop(earlier_outputs(rows.collect_schema().names())).with_columns(
        score.cast(pl.Float32).alias("score"),
        advantage.cast(pl.Float32).alias("advantage"),
        *(value.alias(name) for name, value in extra.items()),
    )
    if tokens:
        out = out.with_columns(per_token_advantages(columns).alias("advantages"))
    return out


# Per-row output columns a run may add: ``compute --loss-weight``'s.
EXTRA_COLUMNS = ("loss_weight",)


def check_roles_kept(columns: ColumnRoles, where: str) -> None:
    """Refuse a key or mask column named like an output column: the output would replace its
    values (a group id column ``score`` would hold scores), and a run on the output would read
    them as the key. A scalar reward named ``score`` is the one kept out of this: the output's
    score is that reward, as float32."""
    roles = {
        "group": columns.group,
        "trajectory": columns.trajectory,
        "turn": columns.turn,
        "mask": columns.mask,
        "anchor": columns.anchor,
        "step reward": columns.step_reward,
        "step return": columns.step_return,
    }
    for role, name in roles.items():
        if name is not None and name in (*OUTPUT_COLUMNS, *EXTRA_COLUMNS):
            raise AdvcliError(
                f"{where}: the {role} column '{name}' has the name of a column the output "
                "writes, which would replace it; rename it in the input"
            )


def earlier_outputs(names: Iterable[str]) -> list[str]:
    """The input columns named like a column ``compute`` writes (an earlier run's output, when
    a run reads one): never written on, whether this run writes that column again (its own
    values replace them) or not (a stale ``loss_weight`` would pass for this run's)."""
    present = set(names)
    return [name for name in (*OUTPUT_COLUMNS, *EXTRA_COLUMNS) if name in present]


def per_token_advantages(columns: ColumnRoles) -> pl.Expr:
    """``advantages``: the row's ``advantage`` times each element of its mask (float32, in the
    mask's shape: a fixed-size array stays one, padding included), or that many copies of it for
    a ``response_length`` column."""
    if columns.mask is None:
        raise ValueError("the per-token advantages need a mask column")
    if columns.mask_kind == "length":
        return pl.col("advantage").repeat_by(pl.col(columns.mask))
    values = columns.mask_list().cast(pl.List(pl.Float32)) * pl.col("advantage")
    return values.list.to_array(columns.mask_width) if columns.mask_width is not None else values


def reader_gone(output: Path) -> bool:
    """Whether ``output`` is a pipe that nobody reads any more (its reader closed it, or a named
    pipe has none): a write there fails with EPIPE."""
    try:
        descriptor = os.open(output, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return error.errno == errno.ENXIO
    try:
        if not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
            return False
        poller = select.poll()
        poller.register(descriptor, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    finally:
        os.close(descriptor)


def _write_arrow_stream(frame: pl.LazyFrame, path: Path) -> None:
    """An Arrow IPC *stream* (what a pipe reader such as ``pyarrow.ipc.open_stream`` expects),
    written batch by batch as the rows stream through. Through a Python file, which counts the
    bytes written: Arrow's own asks the file for its position, which a pipe does not have."""
    with path.open("wb") as sink:
        writer = None
        for batch in frame.collect_batches():
            table = batch.to_arrow()
            if writer is None:
                writer = pa.ipc.new_stream(sink, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()


def _write_arrays(
    frame: pl.LazyFrame,
    columns: ColumnRoles,
    partial: Path,
    output_format: OutputFormat,
    tokens: bool,
    output_name: Path,
    kept: list[str] | None,
) -> None:
    """Padded arrays: ``advantage`` (N,), ``response_mask`` (N, Lmax) and, unless ``tokens`` is
    off, ``advantages`` (N, Lmax); with ``kept`` (``--columns keys|none``) ``score`` (N,) and
    each kept column (N,) as well."""
    if columns.mask is None:
        raise ValueError("padded arrays need a mask column")
    if columns.mask_kind == "mask":
        mask = columns.mask_list().cast(pl.List(pl.Float32))
    else:
        # A length column is checked before its mask rows are made: one huge length would
        # otherwise be materialized first.
        rows, width = frame.select(pl.len(), pl.col(columns.mask).max()).collect().row(0)
        _check_padding(rows, int(width or 0), tokens, output_name)
        mask = pl.lit(1.0, dtype=pl.Float32).repeat_by(pl.col(columns.mask))
    extra = [name for name in EXTRA_COLUMNS if name in frame.collect_schema().names()]
    named = ["advantage", *extra] if kept is None else [*kept, "score", "advantage", *extra]
    collected = frame.select(mask.alias("response_mask"), pl.col(named)).collect(engine="streaming")
    if columns.mask_kind == "mask":  # a length column was checked above
        width = collected["response_mask"].list.len().max()
        _check_padding(collected.height, int(width or 0), tokens, output_name)  # type: ignore[arg-type]
    response_mask = padded(collected["response_mask"])
    arrays: dict[str, Any] = {"response_mask": response_mask}
    for name in named:
        arrays[name] = _column_array(collected[name])
    advantage = arrays["advantage"]
    if tokens:
        arrays["advantages"] = response_mask * advantage[:, None]
    if output_format == "npz":
        with partial.open("wb") as handle:
            np.savez(handle, **arrays)
    else:
        with held():  # a Ctrl-C inside torch's import would fail it half-way
            import torch

        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        try:
            # To an open file, not a path: torch names the archive's folder after a path, and
            # the partial's name is random, so the same input would give different bytes.
            with partial.open("wb") as handle:
                torch.save(tensors, handle)
        except RuntimeError as error:  # torch's writer reports a failed write so
            raise AdvcliError(f"{output_name}: cannot write ({first_line(error)})") from None


def _column_array(values: pl.Series) -> np.ndarray:
    """One output column as a numpy array: numbers as they are (writable: torch refuses, with a
    warning, to wrap memory it may not write), text as fixed-width strings (no pickled objects)."""
    if values.dtype == pl.String:
        return values.to_numpy().astype(np.str_)
    return values.to_numpy(writable=True)


def _check_array_columns(
    schema: pl.Schema, kept: list[str], output_format: OutputFormat, output: Path
) -> None:
    """Refuse, before any row is read, a kept column that the padded arrays cannot hold: a
    ``.npz`` holds numbers and text, a tensor numbers only."""
    for name in kept:
        dtype = schema[name]
        if dtype.is_numeric() or dtype == pl.Boolean:
            continue
        if dtype == pl.String and output_format == "npz":
            continue
        holds = "numbers" if output_format == "pt" else "numbers and text"
        raise AdvcliError(
            f"{output}: the column '{name}' is {dtype}, and a .{output_format.value} file holds "
            f"{holds} only; write .npz or .parquet, or pass --columns none"
        )


def _check_longest_row(dataset: Dataset, columns: ColumnRoles, output: Path) -> None:
    """Refuse a response length whose per-token list cannot fit in memory (it is made whole,
    in float32, and copied on its way out), before any row is written."""
    assert columns.mask is not None
    with closing_sources():
        longest = dataset.scan().select(pl.col(columns.mask).max()).collect().item() or 0
    needed, available = int(longest) * 4 * 3, available_memory()
    if needed > available:
        raise AdvcliError(
            f"{output}: a row's {columns.mask} of {longest:,} tokens needs "
            f"{needed / 2**30:,.1f} GiB of memory for its per-token advantages "
            f"({available / 2**30:,.1f} GiB available); check the column, or pass --no-tokens"
        )


def _check_padding(rows: int, width: int, tokens: bool, output: Path) -> None:
    """Refuse padding that does not fit in memory, up front: numpy would fail half-way, or the
    kernel would end the process. Counted as float32 (N, Lmax) arrays: the mask lists as read
    (at most that size), the padded mask and, unless `tokens` is off, the advantages and the
    product they are made from."""
    needed, available = rows * int(width) * 4 * (4 if tokens else 2), available_memory()
    if needed > available:
        raise AdvcliError(
            f"{output}: padding {rows:,} rows to {width:,} tokens needs "
            f"{needed / 2**30:,.1f} GiB of memory ({available / 2**30:,.1f} GiB available); "
            "write .parquet or .arrow instead"
        )


def padded(lists: pl.Series) -> np.ndarray:
    """A ``list[f32]`` series as a zero-padded ``(N, Lmax)`` float32 array, with no row loop."""
    lengths = lists.list.len().to_numpy().astype(np.int64)
    flat = lists.explode().to_numpy() if lengths.sum() else np.zeros(0, dtype=np.float32)
    width = int(lengths.max()) if len(lengths) else 0
    out = np.zeros((len(lengths), width), dtype=np.float32)
    row_ids = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[row_ids, np.arange(len(row_ids)) - starts] = flat[: len(row_ids)]
    return out

"""The Arrow-backed Parquet source that feeds Polars: read-ahead by record batch, validation,
and closing every scan on the main thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from polars.io.plugins import register_io_source

from advcli._runtime import progress
from advcli.errors import AdvcliError, first_line

# Parquet is read in Arrow record batches of about this many values of the columns read (list
# elements count one each), whatever the width of the rows: some 50 MB of token data a batch.
BATCH_VALUES = 8_000_000


@dataclass(frozen=True)
class ScannedFile:
    """What a scan needs of one input file: the name Polars and Arrow open it by, its name in
    messages, and the rows it held when it was opened (a scan that reads another count fails);
    the rows read are ``start`` to ``stop`` (excluded; None: to the end) of them."""

    source: str
    label: str
    rows: int
    start: int = 0
    stop: int | None = None


def scan_parquet(files: Sequence[ScannedFile], schema: pl.Schema) -> pl.LazyFrame:
    """Parquet files as a Polars LazyFrame whose batches Arrow decodes.

    Arrow's Parquet reader decodes list columns about twice as fast as Polars' (the token lists of
    the 1M-row benchmark dump: ~1 s against ~2 s), and both passes over the input decode them, so
    Polars gets the data through an IO source. Polars pushes the column selection, row filter and
    row limit down to the source, which must apply them. The source is an unstable Polars API;
    tests/read/test_parquet_scan.py checks all three. Run queries on it inside
    :func:`closing_sources`.
    """

    return _registered(_parquet_frames, files, schema)


class _Source:
    """The batches of one scan, which Polars pulls from its own threads.

    ``close`` waits for a batch being read (Arrow reads without the Python lock) and then ends the
    scan on the calling thread.
    """

    def __init__(self, frames: Generator[pl.DataFrame, None, None]) -> None:
        self._frames = frames
        self._reading = threading.Lock()

    def __iter__(self) -> _Source:
        return self

    def __next__(self) -> pl.DataFrame:
        with self._reading:
            return next(self._frames)

    def close(self) -> None:
        with self._reading:
            self._frames.close()


# Every scan Polars has started. Polars drops a scan it stopped early (an error, a row limit,
# Ctrl-C) on one of its threads, possibly after the query has returned: if Python is shutting
# down by then, that thread is stopped inside Arrow and the process aborts (exit 134). Holding
# the scans here and closing them on the main thread when a stage ends leaves Polars nothing to
# clean up.
_OPEN_SOURCES: list[_Source] = []


@contextlib.contextmanager
def closing_sources() -> Iterator[None]:
    """Run Polars queries over :func:`scan_parquet` or :func:`scan_arrow_stream` (what
    ``Dataset.scan`` returns); end their Parquet scans when the block ends."""
    try:
        yield
    finally:
        while _OPEN_SOURCES:
            _OPEN_SOURCES.pop().close()
        # Arrow keeps the memory of freed batches for its next allocation, but what follows a
        # scan allocates through Polars' allocator: give it back (measured: 170 MB at 2M rows).
        release_freed_memory()


def release_freed_memory() -> None:
    """Give back what Arrow's pools keep of freed buffers, among them the kept id columns' (see
    :func:`_kept_apart`), whose pool Polars' allocations cannot reuse: call it once the key
    projection is let go."""
    pa.default_memory_pool().release_unused()
    _KEPT_POOL.release_unused()


def open_parquet(path: Path | str) -> pq.ParquetFile:
    """A Parquet file opened for reading. INT96 timestamps (Spark, old Impala) are read as
    microseconds: Arrow's default, nanoseconds, wraps dates outside the years 1677–2262."""
    return pq.ParquetFile(path, coerce_int96_timestamp_unit="us")


def _registered(
    frames_of: Callable[
        [Sequence[ScannedFile], list[str] | None, pl.Expr | None, int | None],
        Generator[pl.DataFrame, None, None],
    ],
    files: Sequence[ScannedFile],
    schema: pl.Schema,
) -> pl.LazyFrame:
    """``frames_of`` as a Polars IO source: each query opens its own frames (with the selection,
    filter and limit Polars pushes down), closed by :func:`closing_sources`."""

    def source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> _Source:
        opened = _Source(frames_of(files, with_columns, predicate, n_rows))
        _OPEN_SOURCES.append(opened)
        return opened

    return register_io_source(source, schema=schema)


def _parquet_frames(
    files: Sequence[ScannedFile],
    columns: list[str] | None,
    predicate: pl.Expr | None,
    n_rows: int | None,
) -> Generator[pl.DataFrame, None, None]:
    """The files' rows in batches, with the selection, filter and limit applied.

    Each batch is fully validated first (offsets, UTF-8), as Polars' own reader does: Arrow's
    does not check strings, and Polars would write invalid UTF-8 to the output. It costs about
    6 ms per 40 MB of strings.
    """

    @contextlib.contextmanager
    def batches(file: ScannedFile) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        with open_parquet(file.source) as parquet_file:
            rows = _batch_rows(parquet_file, columns)
            first, groups = _row_groups(parquet_file.metadata, file)
            yield (
                first,
                parquet_file.iter_batches(batch_size=rows, row_groups=groups, columns=columns),
            )

    def damaged(file: ScannedFile, read: int) -> str:
        # Row numbers, and so every row's advantage, rest on the counts read from the footers.
        return (
            f"{file.label}: the file holds {read:,} rows but its footer counts {file.rows:,}; "
            "the file is damaged"
        )

    return _frames(files, batches, predicate, n_rows, damaged)


def scan_arrow_stream(files: Sequence[ScannedFile], schema: pl.Schema) -> pl.LazyFrame:
    """Arrow IPC stream files (Polars scans IPC *files* only) as a LazyFrame, each file
    memory-mapped and read batch by batch as it was written, with the selection, filter and
    limit applied as :func:`scan_parquet` applies them. Run queries on it inside
    :func:`closing_sources`."""

    return _registered(_stream_frames, files, schema)


def _stream_frames(
    files: Sequence[ScannedFile],
    columns: list[str] | None,
    predicate: pl.Expr | None,
    n_rows: int | None,
) -> Generator[pl.DataFrame, None, None]:
    """The stream files' rows in batches, validated and counted as Parquet's are
    (:func:`_parquet_frames`)."""

    @contextlib.contextmanager
    def batches(file: ScannedFile) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        with pa.memory_map(file.source) as mapped:
            stream = pa.ipc.open_stream(mapped)
            yield 0, (batch if columns is None else batch.select(columns) for batch in stream)

    def changed(file: ScannedFile, read: int) -> str:
        return (
            f"{file.label}: the stream holds {read:,} rows but held {file.rows:,} when it was "
            "opened; the file changed"
        )

    return _frames(files, batches, predicate, n_rows, changed)


# A file's record batches (the selected columns), opened for a scan and closed with it, and the
# row number they start at.
FileBatches = Callable[
    [ScannedFile], contextlib.AbstractContextManager[tuple[int, Iterator[pa.RecordBatch]]]
]


def _frames(
    files: Sequence[ScannedFile],
    batches: FileBatches,
    predicate: pl.Expr | None,
    n_rows: int | None,
    miscounted: Callable[[ScannedFile, int], str],
) -> Generator[pl.DataFrame, None, None]:
    """:func:`_read_frames`, with the rows it reads told to the progress bar
    (:mod:`advcli._runtime.progress`): those of the files' windows (at most ``n_rows``) when it
    starts, each batch's as it is read, and those it did not read when it ends (a row limit,
    an error, a scan Polars stopped)."""
    windows = sum((file.rows if file.stop is None else file.stop) - file.start for file in files)
    announced = windows if n_rows is None else min(windows, n_rows)
    progress.to_read(announced)
    told = 0
    try:
        for frame, rows in _read_frames(files, batches, predicate, n_rows, miscounted):
            # A row limit ends inside a batch: the rows past it were not to be read.
            rows = min(rows, announced - told)
            progress.read(rows)
            told += rows
            yield frame
    finally:
        progress.read(max(announced - told, 0))


def _read_frames(
    files: Sequence[ScannedFile],
    batches: FileBatches,
    predicate: pl.Expr | None,
    n_rows: int | None,
    miscounted: Callable[[ScannedFile, int], str],
) -> Generator[tuple[pl.DataFrame, int], None, None]:
    """Each file's ``batches`` (the selected columns, from the row number they give on), cut
    to the file's rows from ``start`` to ``stop``, validated in full, filtered and cut to
    ``n_rows`` in all, each with the rows of the file it was read from; a file that gives other
    rows than it held when it was opened (fewer than ``stop``, when it is not read to the end)
    is refused with ``miscounted``'s message."""
    remaining = n_rows
    for file in files:
        if remaining == 0:
            return
        try:
            with batches(file) as (read, file_batches):
                for batch in file_batches:
                    first, read = read, read + batch.num_rows
                    if read <= file.start:
                        continue
                    end = read if file.stop is None else min(read, file.stop)
                    if file.start > first or end < read:
                        batch = batch.slice(
                            max(file.start - first, 0), end - max(file.start, first)
                        )
                    batch.validate(full=True)
                    frame = _frame_of(batch)
                    window = frame.height
                    if predicate is not None:
                        frame = frame.filter(predicate)
                    if remaining is not None:
                        frame = frame.head(remaining)
                        remaining -= frame.height
                    yield frame, window
                    if remaining == 0 or end < read or end == file.stop:
                        break
        except (pa.ArrowException, OSError) as error:
            raise AdvcliError(f"{file.label}: cannot read the file ({first_line(error)})") from None
        if remaining != 0 and read != file.rows and (file.stop is None or read < file.stop):
            raise AdvcliError(miscounted(file, read))


def _frame_of(batch: pa.RecordBatch) -> pl.DataFrame:
    """A record batch as a Polars frame, handed over column by column.

    Polars keeps Arrow's buffers without a copy, and a batch handed over whole stays alive until
    every one of its columns is freed: the key projection keeps the id columns, and with them every
    batch's token lists, so memory would grow with the input (measured: 1.1 GB → 2.0 GB from 1M to
    2M rows). Column by column, a kept id column keeps only itself. Each column goes with its field,
    whose metadata carries Polars' Enum and Categorical types.
    """
    if batch.num_columns == 0:  # a query that needs only the row count
        return pl.DataFrame(height=batch.num_rows)
    columns = [
        pl.DataFrame(pa.RecordBatch.from_arrays([_kept_apart(column)], schema=pa.schema([field])))
        for column, field in zip(batch.columns, batch.schema, strict=True)
    ]
    return pl.concat(columns, how="horizontal")


def _kept_apart(column: pa.Array) -> pa.Array:
    """A column that is not a list, copied into memory of its own; lists as they are.

    Stage 1 keeps every batch's id columns while the batches' token lists come and go, and in the
    allocator they were decoded in, the kept columns pin the pages of the freed lists: stage 1's
    peak grew 30 % from 2.1M to 4.3M rows (515 → 677 MiB). Copied out (a few bytes a row), it
    grows 15–22 % (about 505 → 615 MiB)."""
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return column
    return pa.concat_arrays([column], memory_pool=_KEPT_POOL)


def _separate_pool() -> pa.MemoryPool:
    """An allocator other than the one Arrow decodes in (mimalloc in the wheels): jemalloc, else
    the system's."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


_KEPT_POOL = _separate_pool()


def _row_groups(metadata: pq.FileMetaData, file: ScannedFile) -> tuple[int, list[int] | None]:
    """The row groups that hold ``file``'s rows from ``start`` to ``stop`` (None: every one),
    and the number of the first one's first row."""
    if file.start == 0 and file.stop is None:
        return 0, None
    stop = metadata.num_rows if file.stop is None else file.stop
    first, groups, row = None, [], 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if row < stop and file.start < row + rows:
            first = row if first is None else first
            groups.append(group)
        row += rows
    return first or 0, groups


def _batch_rows(parquet_file: pq.ParquetFile, columns: list[str] | None) -> int:
    """Rows per record batch so that a batch holds about ``BATCH_VALUES`` values of the
    ``columns`` read (None: every one): a read of the small columns and the mask gets batches
    as large in memory as a read of every column, and so fewer of them, each of which costs a
    round of the source's Python code."""
    metadata = parquet_file.metadata
    leaf = 0
    read: list[int] = []
    # The file's own Arrow schema, made once: the footer's to_arrow_schema() leaves memory
    # behind at every call, which grew with the parts of compare --by COLUMN over one dump.
    for field in parquet_file.schema_arrow:
        # Found by position, not by the dotted leaf path: a column's name may hold a dot.
        leaves = _leaf_count(field.type)
        if columns is None or field.name in columns:
            read.extend(range(leaf, leaf + leaves))
        leaf += leaves
    values = sum(
        metadata.row_group(group).column(column).num_values
        for group in range(metadata.num_row_groups)
        for column in read
    )
    values_per_row = max(1.0, values / max(1, metadata.num_rows))
    return max(1, int(BATCH_VALUES / values_per_row))


def _leaf_count(kind: pa.DataType) -> int:
    """How many Parquet leaf columns hold a field of type ``kind``: one per primitive inside it."""
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(index).type) for index in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1

"""JSON lines read once, into an Arrow IPC file: the fast reading of a JSON-lines input.

Polars reads JSON lines with the schema of the file's first lines, and it leaves out a field
that first appears later and refuses a value of a wider type (``1.5`` in a column of ``1``):
to read any file as its whole says, it must read every line for the schema first, a second
parse of the whole file, held whole in memory. Here the schema is Polars' of the first
:data:`PREFIX_ROWS` lines, and Arrow's JSON reader reads the whole file with it, a block of
lines at a time, strictly: a field that is not in it (at any depth), a value of another JSON
type, a number an integer column cannot hold, a key given twice, each stops it. The rows it
reads go to an Arrow IPC file in the run's spool folder, which the run then reads as any Arrow
input.

A file the strict reading stops on, or reads otherwise than Polars would, is read by Polars
with the schema of all its lines, as before: the result is the same table either way
(tests/read/test_json_translation.py reads each such file both ways), only slower. Those are:

- a field or a type that the first lines do not show (above);
- a ``NaN`` or ``Infinity`` literal, which Arrow reads and JSON does not have (Polars refuses
  it, and advcli says where);
- more than one object on a line, or a blank line (Arrow reads the objects, Polars refuses the
  line): the rows must be as many as the lines;
- a line that is ``null`` (Arrow reads a row of nulls, Polars refuses the line; at the start of
  a block Arrow's reader crashes the process), or any row whose every field is null (``{}``);
- the integer literal ``-0`` in a float column (Arrow reads −0.0, Polars 0.0);
- files whose first lines give a float column where another file's hold nulls or no such
  field (Arrow would read that file's integers as floats, where Polars' types of every line
  conflict: an error);
- a byte-order mark, invalid UTF-8 or a lone surrogate escape;
- types Arrow's reader does not take (an object with no field);
- a file whose name is not UTF-8 (Polars reads the first lines through ``/proc/self/fd``, which
  the run opens later).
"""

from __future__ import annotations

import contextlib
import re
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# The lines whose types make the schema the whole file is then read with.
PREFIX_ROWS = 1_000

# Arrow parses a block of lines of about this many bytes at a time (one on each core): larger
# blocks are no faster and hold more memory (1M NeMo-RL rows: 6.1 s and 220 MiB at 4 MiB,
# 7.0 s and 290 MiB at 8 MiB).
BLOCK_BYTES = 4 << 20

UTF8_BOM = b"\xef\xbb\xbf"


def prefix_schema(source: str) -> pl.Schema | None:
    """Polars' schema of a JSON-lines file's first :data:`PREFIX_ROWS` lines; None where it
    cannot read them (the reading that follows says why)."""
    try:
        return pl.scan_ndjson(source, infer_schema_length=PREFIX_ROWS).collect_schema()
    except pl.exceptions.PolarsError:
        return None


def floats_from_nulls(schemas: Sequence[pl.Schema], merged: pl.Schema) -> bool:
    """Whether ``merged``, the files' first lines' schemas united, has a float where one of
    them had nulls or no such field: Arrow would read that file's integers as floats there,
    where the types of all its lines could conflict with the other file's."""
    return any(
        _float_from_null(schema.get(name), dtype)
        for schema in schemas
        for name, dtype in merged.items()
    )


def _float_from_null(own: PolarsDataType | None, merged: PolarsDataType) -> bool:
    if own is None or own == pl.Null:
        return _holds_float(merged)
    if isinstance(own, pl.List) and isinstance(merged, pl.List):
        return _float_from_null(own.inner, merged.inner)
    if isinstance(own, pl.Struct) and isinstance(merged, pl.Struct):
        fields = {field.name: field.dtype for field in own.fields}
        return any(_float_from_null(fields.get(f.name), f.dtype) for f in merged.fields)
    return False


def _holds_float(dtype: PolarsDataType) -> bool:
    if dtype == pl.Float64:
        return True
    if isinstance(dtype, pl.List):
        return _holds_float(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_holds_float(field.dtype) for field in dtype.fields)
    return False


def translate_json_lines(
    files: Sequence[Path], schema: pl.Schema, folder: Path
) -> tuple[Path, ...] | None:
    """Each file read strictly with ``schema`` into an Arrow IPC file in ``folder``; None (and
    nothing left in ``folder``) where any one is not read so (see the module's docstring)."""
    arrow_schema = _arrow_schema(schema)
    if arrow_schema is None:
        return None
    targets: list[Path] = []
    for index, path in enumerate(files):
        target = folder / f"json-lines-{index}.arrow"
        targets.append(target)
        if not _translated(path, arrow_schema, target):
            for written in targets:
                written.unlink(missing_ok=True)
            return None
    return tuple(targets)


def _translated(path: Path, schema: pa.Schema, target: Path) -> bool:
    """Whether ``path`` was read strictly with ``schema`` into ``target``.

    The file is cut into blocks of whole lines, each parsed by Arrow in one call on a thread of
    a pool (:func:`_in_order`), while this thread writes the blocks parsed before. Arrow's own
    streaming reader is as fast, but a reader stopped before its end (a NaN, Ctrl-C) crashes
    the process when it exits (a segmentation fault or ``terminate called without an active
    exception``, 7 times in 15): a call that returns leaves nothing running.

    ``target`` is an Arrow IPC file compressed with LZ4: written about as fast as Arrow parses
    (Parquet's encoding of the token lists took half as long again as the parse), and read back
    by Polars in less time and memory than Parquet (1M NeMo-RL rows: 2.4 s and 500 MiB against
    4.3 s and 900 MiB; uncompressed, the memory-mapped file counts whole in the process's
    memory).
    """
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    rows = lines = 0
    try:
        with path.open("rb") as file, pa.ipc.new_file(target, schema, options=IPC_OPTIONS) as out:
            if file.read(len(UTF8_BOM)) == UTF8_BOM:
                return False
            file.seek(0)
            with contextlib.closing(_in_order(_line_blocks(file), options)) as parsed:
                for table, block_lines in parsed:
                    if table is None:
                        return False
                    out.write_table(table)
                    rows += table.num_rows
                    lines += block_lines
        return rows > 0 and rows == lines
    except (pa.ArrowException, OSError, ValueError):
        return False


def _in_order(
    blocks: Iterator[bytes], options: pj.ParseOptions
) -> Generator[tuple[pa.Table | None, int], None, None]:
    """Each block parsed (:func:`_parsed`) on a pool's thread (one for each core Arrow may use,
    a block more queued), in the blocks' order; the pool ends with the iteration."""
    workers = max(1, pa.cpu_count())
    pool = ThreadPoolExecutor(workers, thread_name_prefix="advcli-json")
    try:
        parsing: deque[Future[tuple[pa.Table | None, int]]] = deque()
        for block in blocks:
            parsing.append(pool.submit(_parsed, block, options))
            while len(parsing) > workers or (parsing and parsing[0].done()):
                yield parsing.popleft().result()
        while parsing:
            yield parsing.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def _line_blocks(file: IO[bytes]) -> Iterator[bytes]:
    """The file's bytes in blocks of whole lines, each of :data:`BLOCK_BYTES` or so (a line
    longer than that, whole: its pieces are joined once); the last line as it ends."""
    pending: list[bytes] = []
    while data := file.read(BLOCK_BYTES):
        cut = data.rfind(b"\n") + 1
        if not cut:
            pending.append(data)
            continue
        yield b"".join([*pending, data[:cut]])
        pending = [data[cut:]] if cut < len(data) else []
    if pending:
        yield b"".join(pending)


# A block whose first line is ``null``: Arrow's reader crashes the process on it.
NULL_FIRST = re.compile(rb"\s*null")
# The integer literal -0, which Polars reads as 0 and Arrow, in a float column, as -0.0 (also
# matched inside a string: that block is then read by Polars, the same table, more slowly).
INTEGER_MINUS_ZERO = re.compile(rb"-0[,\]}\s]")


def _parsed(block: bytes, options: pj.ParseOptions) -> tuple[pa.Table | None, int]:
    """A block of lines parsed by Arrow and checked, on this thread alone (the pool's threads
    check blocks side by side), as one batch, and its lines; no batch where Arrow would crash
    (a first line ``null``) or read it otherwise than Polars: invalid UTF-8 (Arrow's reader does
    not check strings), NaN or Infinity, a row of nulls alone (a ``null`` line), a negative
    zero written ``-0``."""
    lines = block.count(b"\n") + (not block.endswith(b"\n"))
    if NULL_FIRST.match(block):
        return None, lines
    read = pj.ReadOptions(use_threads=False, block_size=len(block))
    table = pj.read_json(pa.py_buffer(block), read_options=read, parse_options=options)
    table.validate(full=True)
    if table.num_columns and _some_row_all_null(table):
        return None, lines
    floats = [leaf for column in table.columns for leaf in _float_leaves(column)]
    if not all(pc.all(pc.is_finite(leaf)).as_py() is not False for leaf in floats):
        return None, lines
    if any(_negative_zero(leaf) for leaf in floats) and INTEGER_MINUS_ZERO.search(block):
        return None, lines
    return table, lines


def _some_row_all_null(table: pa.Table) -> bool:
    every = pc.is_null(table.column(0))
    for column in table.columns[1:]:
        every = pc.and_(every, pc.is_null(column))
    return bool(pc.any(every).as_py())


def _float_leaves(array: pa.Array | pa.ChunkedArray) -> Iterator[pa.Array | pa.ChunkedArray]:
    """The floats inside ``array``, at any depth, each leaf's values flattened."""
    kind = array.type
    if pa.types.is_floating(kind):
        yield array
    elif pa.types.is_list(kind):
        yield from _float_leaves(pc.list_flatten(array))
    elif pa.types.is_struct(kind):
        for index in range(kind.num_fields):
            yield from _float_leaves(pc.struct_field(array, [index]))


def _negative_zero(leaf: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a float leaf holds −0.0: its zeros (few, or small: a reward's) looked at."""
    zeros = pc.filter(leaf, pc.equal(leaf, 0.0))
    return len(zeros) > 0 and bool(np.signbit(zeros.to_numpy(zero_copy_only=False)).any())


def _arrow_schema(schema: pl.Schema) -> pa.Schema | None:
    """``schema`` as the Arrow types Arrow's JSON reader builds (lists and strings with 32-bit
    offsets); None where a type is not one JSON gives it (or one it does not take)."""
    fields = []
    for name, dtype in schema.items():
        kind = _arrow_type(dtype)
        if kind is None:
            return None
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def _arrow_type(dtype: PolarsDataType) -> pa.DataType | None:
    simple = {
        pl.Int64: pa.int64(),
        pl.Float64: pa.float64(),
        pl.Boolean: pa.bool_(),
        pl.String: pa.string(),
        pl.Null: pa.null(),
    }
    if isinstance(dtype, pl.List):
        inner = _arrow_type(dtype.inner)
        return None if inner is None else pa.list_(inner)
    if isinstance(dtype, pl.Struct):
        fields = [(field.name, _arrow_type(field.dtype)) for field in dtype.fields]
        if not fields or any(kind is None for _, kind in fields):
            return None
        return pa.struct(fields)
    return next((kind for polars_type, kind in simple.items() if dtype == polars_type), None)

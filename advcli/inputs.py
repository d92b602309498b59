"""Opening inputs: paths, globs, directories, standard input, format sniffing, each file's
header (row count, schema, types Polars cannot hold), schemas agreeing across files, and the
JSON-lines checks that need the raw text.

Every Polars or Arrow error met while opening is re-raised as :class:`~advcli.errors.AdvcliError`
naming the file (and line or row).
"""

from __future__ import annotations

import bisect
import glob
import io
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa

from advcli.errors import AdvcliError, first_line
from advcli.process import stdin_closed
from advcli.scan import open_parquet, scan_parquet

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
ARROW_SUFFIXES = (".arrow", ".ipc", ".feather")
DIRECTORY_JSON_SUFFIXES = (".jsonl", ".ndjson")
GLOB_CHARS = frozenset("*?[")
STDIN = "-"
InputFormat = Literal["parquet", "json", "arrow"]


@dataclass(frozen=True)
class Dataset:
    """Input files of one format read as one table, rows numbered across files in the order
    given. ``labels`` name the files in messages (``<stdin>`` for standard input)."""

    files: tuple[Path, ...]
    schema: pl.Schema
    row_counts: tuple[int, ...]
    input_format: InputFormat = "parquet"
    labels: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(self.row_counts)

    def scan(self) -> pl.LazyFrame:
        """The files as one LazyFrame (Parquet decoded by Arrow: see :func:`scan_parquet`)."""
        files = list(self.files)
        if self.input_format == "json":
            return pl.scan_ndjson(files, schema=self.schema)
        if self.input_format == "arrow":
            return pl.scan_ipc(files)
        return scan_parquet(self)

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else str(self.files[index])

    def describe(self) -> str:
        """The inputs in one phrase, for messages."""
        first = self.label(0)
        return first if len(self.files) == 1 else f"{first} (and {len(self.files) - 1} more)"

    def locate(self, row: int) -> str:
        """Name a global row number as ``file row k`` (k counted from 0 within that file)."""
        starts = np.cumsum((0, *self.row_counts[:-1])).tolist()
        file_number = bisect.bisect_right(starts, row) - 1
        return f"{self.label(file_number)} row {row - starts[file_number]}"


def resolve_inputs(specs: Sequence[str]) -> list[Path]:
    """Expand files, globs and directories into a list of input files, in the order given.

    A directory contributes its Parquet files, or if it has none its ``.jsonl``/``.ndjson`` files
    (recursively, sorted by path); a glob its matches, sorted. A file named twice is read once.
    """
    if not specs:
        raise AdvcliError("no input files given")
    files: list[Path] = []
    for spec in specs:
        if GLOB_CHARS & set(spec):
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise AdvcliError(f"{spec}: the pattern matches no file")
            for match in matches:
                files.extend(_expand_path(Path(match), spec))
        else:
            files.extend(_expand_path(Path(spec), spec))
    return list(dict.fromkeys(files))


def _expand_path(path: Path, spec: str) -> list[Path]:
    if path.is_dir():
        # A directory's Parquet files; failing those, its JSON-lines files (a stray config.json
        # beside Parquet files is not data).
        files = sorted(p for p in path.rglob("*") if p.is_file())
        for suffixes in (PARQUET_SUFFIXES, DIRECTORY_JSON_SUFFIXES):
            found = [p for p in files if p.suffix in suffixes]
            if found:
                return found
        raise AdvcliError(
            f"{spec}: the directory holds no Parquet file (*.parquet, *.pq) "
            "or JSON-lines file (*.jsonl, *.ndjson)"
        )
    if not path.exists():
        raise AdvcliError(f"{spec}: no such file or directory")
    return [path]


def input_format_of(path: Path) -> InputFormat:
    """The format a file is read as, from its extension (Parquet when unknown)."""
    if path.suffix.lower() in JSON_LINES_SUFFIXES:
        return "json"
    if path.suffix.lower() in ARROW_SUFFIXES:
        return "arrow"
    return "parquet"


def open_dataset(specs: Sequence[str], *, spool: Path | None = None) -> Dataset:
    """Resolve the inputs, read each file's schema and row count, and check that they agree.

    ``-`` reads standard input (Parquet or an Arrow IPC stream, told apart by their bytes); it is
    copied to a file in ``spool`` (a temporary folder the caller removes), since the data flow reads
    its input twice.
    """
    if STDIN in specs:
        if list(specs) != [STDIN]:
            raise AdvcliError("'-' (standard input) cannot be combined with other inputs")
        if spool is None:
            raise ValueError("reading standard input needs a spool folder")
        files = [spool_stdin(spool)]
        labels: tuple[str, ...] = ("<stdin>",)
    else:
        files = resolve_inputs(specs)
        labels = tuple(str(path) for path in files)
    formats = {input_format_of(path) for path in files}
    if len(formats) > 1:
        raise AdvcliError(
            f"{labels[0]}: inputs mix formats ({', '.join(sorted(formats))}); give one format"
        )
    input_format = formats.pop()
    row_counts, schemas = [], []
    for path, label in zip(files, labels, strict=True):
        num_rows, schema = _read_header(path, label, input_format)
        row_counts.append(num_rows)
        schemas.append(schema)
    _check_schemas_agree(labels, schemas)
    dataset = Dataset(tuple(files), schemas[0], tuple(row_counts), input_format, labels)
    if dataset.num_rows == 0:
        raise AdvcliError(f"{dataset.describe()}: the input has no rows")
    return dataset


def spool_stdin(folder: Path) -> Path:
    """Copy standard input to a file in ``folder``: Parquet and Arrow IPC files as they are, an
    Arrow IPC stream rewritten as an IPC file (which Polars can scan)."""
    if stdin_closed():
        raise AdvcliError("<stdin>: standard input is closed")
    source = sys.stdin.buffer
    head = source.read(8)
    if not head:
        raise AdvcliError("<stdin>: standard input is empty")
    if head.startswith((b"PAR1", b"ARROW1")):
        path = folder / ("stdin.parquet" if head.startswith(b"PAR1") else "stdin.arrow")
        with path.open("wb") as sink:
            sink.write(head)
            shutil.copyfileobj(source, sink)
        return path
    if not head.startswith(b"\xff\xff\xff\xff"):
        raise AdvcliError("<stdin>: not Parquet or an Arrow IPC stream (checked the first bytes)")
    path = folder / "stdin.arrow"
    try:
        reader = pa.ipc.open_stream(_Prefixed(head, source))
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as out:
            for batch in reader:
                out.write_batch(batch)
    except pa.ArrowException as error:
        raise AdvcliError(
            f"<stdin>: not a readable Arrow IPC stream ({first_line(error)})"
        ) from None
    return path


class _Prefixed(io.RawIOBase):
    """A readable stream that yields ``head`` and then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _read_header(path: Path, label: str, input_format: InputFormat) -> tuple[int, pl.Schema]:
    """A file's row count and schema, without reading its data where the format allows."""
    try:
        if path.stat().st_size == 0:
            kind = {"parquet": "Parquet", "json": "JSON-lines", "arrow": "Arrow"}[input_format]
            raise AdvcliError(f"{label}: the file is empty (0 bytes), not a {kind} file")
        if input_format == "parquet":
            with open_parquet(path) as parquet_file:
                metadata = parquet_file.metadata
                arrow_schema = parquet_file.schema_arrow
            in_groups = sum(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
            if in_groups != metadata.num_rows:
                raise AdvcliError(
                    f"{label}: the Parquet footer counts {metadata.num_rows:,} rows but its row "
                    f"groups hold {in_groups:,}; the file is damaged"
                )
            _check_arrow_types(arrow_schema, label)
            # Not arrow_schema.empty_table(): that imports pandas (half a second) for nothing.
            empty = pa.Table.from_batches([], schema=arrow_schema)
            return metadata.num_rows, pl.DataFrame(empty).schema
        if input_format == "arrow":
            with pa.memory_map(str(path)) as source:
                _check_arrow_types(pa.ipc.open_file(source).schema, label)
            frame = pl.scan_ipc(path)
        else:
            frame = pl.scan_ndjson(path, infer_schema_length=None)
        return frame.select(pl.len()).collect().item(), frame.collect_schema()
    except AdvcliError:
        raise
    except PermissionError as error:
        raise AdvcliError(f"{label}: cannot read the file ({error.strerror})") from None
    except (pa.ArrowException, OSError, pl.exceptions.PolarsError) as error:
        if input_format == "json":
            bad_line = _first_bad_json_line(path)
            if bad_line is not None:
                raise AdvcliError(f"{label} {bad_line}") from None
        kind = {"parquet": "Parquet", "json": "JSON-lines", "arrow": "Arrow IPC"}[input_format]
        raise AdvcliError(f"{label}: not a readable {kind} file ({first_line(error)})") from None


# Arrow types Polars cannot hold (it fails, or panics, on their data): such a column is refused by
# name when the input is opened, instead of ending in a panic half-way.
_UNSUPPORTED_ARROW_TYPES = tuple(
    getattr(pa, name)
    for name in (
        "ListViewType",
        "LargeListViewType",
        "RunEndEncodedType",
        "UnionType",
        "Decimal256Type",
        "MonthDayNanoIntervalType",
    )
    if hasattr(pa, name)
)


def _check_arrow_types(schema: pa.Schema, label: str) -> None:
    for column in schema:
        bad = _unsupported_type(column.type)
        if bad is not None:
            raise AdvcliError(
                f"{label}: column '{column.name}' has the Arrow type {bad}, which advcli cannot "
                "read or pass through; drop the column or convert it"
            )


def _unsupported_type(dtype: pa.DataType) -> pa.DataType | None:
    """``dtype`` or the first type nested in it that Polars cannot hold, else None."""
    if isinstance(dtype, _UNSUPPORTED_ARROW_TYPES) or pa.types.is_interval(dtype):
        return dtype
    children: list[pa.DataType] = []
    if isinstance(dtype, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)):
        children = [dtype.value_type]
    elif isinstance(dtype, pa.MapType):
        children = [dtype.key_type, dtype.item_type]
    elif isinstance(dtype, pa.StructType):
        children = [dtype.field(i).type for i in range(dtype.num_fields)]
    elif isinstance(dtype, pa.DictionaryType):
        children = [dtype.value_type]
    for child in children:
        found = _unsupported_type(child)
        if found is not None:
            return found
    return None


def _first_bad_json_line(path: Path) -> str | None:
    """``line K: …`` for the first line of a JSON-lines file that is not a JSON object (a
    line-by-line parse, on the error path only), or None."""
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as error:
                    return f"line {number}: not valid JSON ({error.msg} at column {error.colno})"
                if not isinstance(value, dict):
                    return f"line {number}: not a JSON object"
    except UnicodeDecodeError as error:
        return f"byte {error.start}: not UTF-8 text"
    except OSError:
        return None
    return None


def check_json_ids(dataset: Dataset, names: Sequence[str]) -> None:
    """Refuse a JSON-lines id column that holds both JSON strings and numbers (or booleans).

    Polars reads such a column as strings, so ``0`` and ``"0"`` would become one group. Whether a
    column read as strings has any number in it is asked of Polars (a number read as a number);
    only then are the file's lines parsed one by one, to name the two lines.
    """
    for index, path in enumerate(dataset.files):
        for name in names:
            if dataset.schema[name] != pl.String:
                continue
            mixed = any(
                pl.scan_ndjson(path, schema={name: dtype}, ignore_errors=True)
                .select(pl.col(name).is_not_null().any())
                .collect()
                .item()
                for dtype in (pl.Float64, pl.Boolean)
            )
            if mixed:
                raise AdvcliError(f"{dataset.label(index)} {_mixed_id_lines(path, name)}")


def _mixed_id_lines(path: Path, name: str) -> str:
    first: dict[bool, tuple[int, Any]] = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                value = json.loads(line).get(name)
                if value is not None:
                    first.setdefault(isinstance(value, str), (number, value))
            if len(first) == 2:
                break
    if len(first) < 2:
        return f": column '{name}' mixes JSON strings and other JSON types; give the ids one type"
    (text_line, text), (other_line, other) = first[True], first[False]
    later = max(text_line, other_line)
    return (
        f"line {later}: column '{name}' mixes JSON strings with numbers or booleans (line "
        f"{text_line} holds "
        f"{json.dumps(text)}, line {other_line} holds {json.dumps(other)}); advcli would read "
        "both as one id: give the ids one JSON type"
    )


def _check_schemas_agree(files: Sequence[str], schemas: Sequence[pl.Schema]) -> None:
    first_file, first = files[0], schemas[0]
    for path, schema in zip(files[1:], schemas[1:], strict=True):
        for name in dict.fromkeys([*first.keys(), *schema.keys()]):
            if name not in schema:
                raise AdvcliError(
                    f"schemas conflict: column '{name}' is in {first_file} but not in {path}"
                )
            if name not in first:
                raise AdvcliError(
                    f"schemas conflict: column '{name}' is in {path} but not in {first_file}"
                )
            if schema[name] != first[name]:
                raise AdvcliError(
                    f"schemas conflict: column '{name}' is {first[name]} in {first_file} "
                    f"but {schema[name]} in {path}"
                )

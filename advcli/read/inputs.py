"""Opening inputs: paths, globs, directories, standard input, format sniffing (Arrow IPC file or
stream by the first bytes), each file's header (row count, schema, types Polars cannot hold),
schemas agreeing across files, and the JSON-lines checks that need the raw text. Paths that are
not UTF-8 are read through :mod:`advcli.names` and labelled with their bytes escaped.

Every Polars or Arrow error met while opening is re-raised as :class:`~advcli.errors.AdvcliError`
naming the file (and line or row).
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa

from advcli._runtime.process import stdin_closed
from advcli.errors import AdvcliError, InputChanged, first_line
from advcli.names import NativeNames, shown_path
from advcli.read.scan import (
    ScannedFile,
    closing_sources,
    open_parquet,
    scan_arrow_stream,
    scan_parquet,
)
from advcli.rules import EXACT_INTEGER_LIMIT

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
# Arrow IPC files and streams: which of the two a file holds is told by its first bytes.
ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc", ".feather")
IPC_FILE_MAGIC = b"ARROW1"
IPC_STREAM_MARKER = b"\xff\xff\xff\xff"
FEATHER_V1_MAGIC = b"FEA1"
DIRECTORY_JSON_SUFFIXES = (".jsonl", ".ndjson")
# What a directory's reading picks up (either kind, depending on what else it holds).
FOLDER_SUFFIXES = PARQUET_SUFFIXES + DIRECTORY_JSON_SUFFIXES
GLOB_CHARS = frozenset("*?[")
STDIN = "-"
# What may come before the first '{' of JSON lines: white space and a UTF-8 byte-order mark.
UTF8_BOM = b"\xef\xbb\xbf"
JSON_BLANK = b" \t\r\n" + UTF8_BOM
# How far into standard input to look for that '{'.
SNIFF_LIMIT = 1 << 16
InputFormat = Literal["parquet", "json", "arrow", "arrow_stream"]
FORMAT_NAMES = {
    "parquet": "Parquet",
    "json": "JSON-lines",
    "arrow": "Arrow IPC",
    "arrow_stream": "Arrow IPC stream",
}


@dataclass(frozen=True)
class FileIdentity:
    """What tells that a path still names the file advcli opened: its device and inode (a file
    renamed over it has others), its size and its modification time (a rewrite in place, an
    append, change them)."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity | None:
        """The identity of the file at ``path`` now; None when there is none (removed)."""
        try:
            info = os.stat(path)
        except OSError:
            return None
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def change_to(self, now: FileIdentity | None) -> str | None:
        """What differs in ``now``, in words; None when nothing does."""
        if now is None:
            return "it was removed"
        changes = []
        if now.device != self.device:
            changes.append(f"device {self.device}, now {now.device}")
        if now.inode != self.inode:
            changes.append(f"inode {self.inode}, now {now.inode}")
        if now.size != self.size:
            changes.append(f"size {self.size:,} bytes, now {now.size:,}")
        if now.mtime_ns != self.mtime_ns:
            changes.append(f"mtime {_clock(self.mtime_ns)}, now {_clock(now.mtime_ns)}")
        return "; ".join(changes) or None


def _clock(ns: int) -> str:
    """A modification time to the nanosecond, in local time."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ns // 10**9))}.{ns % 10**9:09d}"


@dataclass(frozen=True)
class Dataset:
    """Input files of one format read as one table, rows numbered across files in the order
    given. ``labels`` name the files in messages (``<stdin>`` for standard input); ``folders``
    are the directories among the inputs (:func:`input_folders`); ``identities`` are the
    files' identities when they were opened (:meth:`check_unchanged`)."""

    files: tuple[Path, ...]
    schema: pl.Schema
    row_counts: tuple[int, ...]
    input_format: InputFormat = "parquet"
    labels: tuple[str, ...] = ()
    folders: tuple[Path, ...] = ()
    # What Polars and Arrow open each file by (see NativeNames); the paths themselves if None.
    native: NativeNames | None = field(default=None, compare=False, repr=False)
    identities: tuple[FileIdentity, ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(self.row_counts)

    def scan(self) -> pl.LazyFrame:
        """The files as one LazyFrame (Parquet decoded by Arrow: see :func:`scan_parquet`; an
        Arrow IPC stream, which Polars cannot scan: :func:`scan_arrow_stream`). It may read a
        file through a descriptor the dataset holds (:class:`~advcli.names.NativeNames`): keep
        the dataset until the query has run."""
        files = [self.source(index) for index in range(len(self.files))]
        if self.input_format == "json":
            return pl.scan_ndjson([as_pattern(name) for name in files], schema=self.schema)
        if self.input_format == "arrow":
            return pl.scan_ipc(files, glob=False)
        scanned = [
            ScannedFile(self.source(index), self.label(index), rows)
            for index, rows in enumerate(self.row_counts)
        ]
        if self.input_format == "arrow_stream":
            return scan_arrow_stream(scanned, self.schema)
        return scan_parquet(scanned, self.schema)

    def source(self, index: int) -> str:
        """The name Polars and Arrow open file ``index`` by."""
        return self.native.names[index] if self.native else str(self.files[index])

    def read_columns(self, names: Sequence[str], limit: int | None = None) -> pl.DataFrame:
        """The named columns in input order, every row or the first ``limit`` (small columns
        only: ids, flags)."""
        scan = self.scan().select(list(names))
        try:
            with closing_sources():
                return (scan if limit is None else scan.head(limit)).collect(engine="streaming")
        except pl.exceptions.PolarsError as error:
            listed = ", ".join(f"'{name}'" for name in names)
            raise AdvcliError(
                f"{self.describe()}: cannot read the columns {listed} ({first_line(error)})"
            ) from None

    def file_numbers(self) -> pl.Series:
        """Each input row's file, as its position among ``files`` (``file``, one per row)."""
        return pl.Series("file", np.repeat(np.arange(len(self.files)), self.row_counts))

    def file_of(self, row: int) -> int:
        """The index of the file that holds global row number ``row``."""
        starts = np.cumsum((0, *self.row_counts[:-1])).tolist()
        return bisect.bisect_right(starts, row) - 1

    def changed_input(self) -> InputChanged | None:
        """The error for the first input that is no longer the file that was opened (renamed
        over, rewritten, appended to, removed); None when every input is as it was."""
        for index, (path, identity) in enumerate(zip(self.files, self.identities, strict=True)):
            change = identity.change_to(FileIdentity.of(path))
            if change is not None:
                return InputChanged(self.label(index), change)
        return None

    def check_unchanged(self) -> None:
        """Raise :class:`InputChanged` if an input changed since it was opened. Called after
        the last read of an input and before anything derived from it is published: every read
        in between saw the files as they were opened. (A change that keeps the size and lands
        within the filesystem's timestamp granularity of the previous write is not seen.)"""
        changed = self.changed_input()
        if changed is not None:
            raise changed

    @contextlib.contextmanager
    def changes_reported(self) -> Iterator[None]:
        """Report an error raised in the block as the change of an input, when one changed: a
        row count that no longer matches, a half-written line or a file gone come from that."""
        try:
            yield
        except InputChanged:
            raise
        except Exception:
            changed = self.changed_input()
            if changed is None:
                raise
            raise changed from None

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else shown_path(self.files[index])

    def describe(self) -> str:
        """The inputs in one phrase, for messages."""
        first = self.label(0)
        return first if len(self.files) == 1 else f"{first} (and {len(self.files) - 1} more)"

    def locate(self, row: int) -> str:
        """Name a global row number as ``file row k`` (k counted from 0 within that file)."""
        file_number = self.file_of(row)
        start = sum(self.row_counts[:file_number])
        return f"{self.label(file_number)} row {row - start}"


def as_pattern(name: str) -> str:
    """A file name as a glob pattern that matches only that file, for Polars' JSON reader, which
    reads every name as a pattern (``step[1].jsonl`` would match no file, ``a*.jsonl`` others)."""
    return glob.escape(name) if GLOB_CHARS & set(name) else name


def resolve_inputs(specs: Sequence[str]) -> list[Path]:
    """Expand files, globs and directories into a list of input files, in the order given.

    A directory contributes its Parquet files, or if it has none its ``.jsonl``/``.ndjson`` files
    (recursively, sorted by path); a glob its matches, sorted. A name that exists is that file or
    directory, even when it holds ``*``, ``?`` or ``[``: only a name that does not exist is read
    as a glob. A file named twice is read once.
    """
    if not specs:
        raise AdvcliError("no input files given")
    files: list[Path] = []
    for spec in specs:
        for match in _matches(spec):
            files.extend(_expand_path(match, spec))
    return list(dict.fromkeys(files))


def input_folders(specs: Sequence[str]) -> tuple[Path, ...]:
    """The directories among the inputs (named, or matched by a glob): every file a directory's
    reading picks up (:data:`FOLDER_SUFFIXES`) is an input, also one written there later."""
    folders = (match for spec in specs for match in _matches(spec) if match.is_dir())
    return tuple(dict.fromkeys(folders))


def _matches(spec: str) -> list[Path]:
    """The path ``spec`` names, or a glob's matches, sorted."""
    if not GLOB_CHARS & set(spec) or os.path.lexists(spec):
        return [Path(spec)]
    matches = sorted(glob.glob(spec, recursive=True))
    if not matches:
        raise AdvcliError(f"{spec}: the pattern matches no file")
    return [Path(match) for match in matches]


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
    """The format a file is read as, from its extension (Parquet when unknown); for an Arrow
    extension, an IPC file or stream as its first bytes say (``.arrows`` a stream unless they
    say file)."""
    suffix = path.suffix.lower()
    if suffix in JSON_LINES_SUFFIXES:
        return "json"
    if suffix not in ARROW_SUFFIXES:
        return "parquet"
    try:
        with path.open("rb") as file:
            head = file.read(len(IPC_FILE_MAGIC))
    except OSError:
        head = b""
    if head.startswith(IPC_FILE_MAGIC):
        return "arrow"
    if head.startswith(IPC_STREAM_MARKER) or suffix == ".arrows":
        return "arrow_stream"
    return "arrow"


def open_dataset(specs: Sequence[str], *, spool: Path | None = None) -> Dataset:
    """Resolve the inputs, read each file's schema and row count, and check that they agree.

    ``-`` reads standard input (Parquet, an Arrow IPC stream or JSON lines, told apart by their
    first bytes); it is copied to a file in ``spool`` (a temporary folder the caller removes),
    since the data flow reads its input twice.
    """
    if STDIN in specs:
        if list(specs) != [STDIN]:
            raise AdvcliError("'-' (standard input) cannot be combined with other inputs")
        if spool is None:
            raise ValueError("reading standard input needs a spool folder")
        files = [spool_stdin(spool)]
        labels: tuple[str, ...] = ("<stdin>",)
        folders: tuple[Path, ...] = ()
    else:
        files = resolve_inputs(specs)
        labels = tuple(shown_path(path) for path in files)
        folders = input_folders(specs)
    formats = {input_format_of(path) for path in files}
    if len(formats) > 1:
        raise AdvcliError(
            f"{labels[0]}: inputs mix formats ({', '.join(sorted(formats))}); give one format"
        )
    input_format = formats.pop()
    identities = [_identity_at_open(path, label) for path, label in zip(files, labels, strict=True)]
    native = NativeNames(files, labels)
    row_counts, schemas = [], []
    for path, source, label, identity in zip(files, native.names, labels, identities, strict=True):
        try:
            num_rows, schema = _read_header(path, source, label, input_format)
        except AdvcliError:
            # A half-written file read while it is being written is the change, not damage.
            change = identity.change_to(FileIdentity.of(path))
            if change is None:
                raise
            raise InputChanged(label, change) from None
        row_counts.append(num_rows)
        schemas.append(schema)
    _check_schemas_agree(labels, schemas)
    dataset = Dataset(
        tuple(files),
        schemas[0],
        tuple(row_counts),
        input_format,
        labels,
        folders,
        native,
        tuple(identities),
    )
    if dataset.num_rows == 0:
        raise AdvcliError(f"{dataset.describe()}: the input has no rows")
    return dataset


def _identity_at_open(path: Path, label: str) -> FileIdentity:
    """A file's identity, taken before its header is read: a change after it is then seen."""
    identity = FileIdentity.of(path)
    if identity is None:
        raise AdvcliError(f"{label}: no such file (removed while advcli was starting)")
    return identity


def spool_stdin(folder: Path) -> Path:
    """Copy standard input to a file in ``folder``, named for its format, which its first bytes
    tell: ``PAR1`` Parquet, ``ARROW1`` an Arrow IPC file, an IPC stream's continuation marker a
    stream, a ``{`` after any blank space JSON lines."""
    if stdin_closed():
        raise AdvcliError("<stdin>: standard input is closed")
    source = sys.stdin.buffer
    head = source.read(8)
    if not head:
        raise AdvcliError("<stdin>: standard input is empty")
    # JSON lines may start with blank lines or a byte-order mark: read on to the first other byte.
    while not head.lstrip(JSON_BLANK) and len(head) < SNIFF_LIMIT:
        more = source.read(8)
        if not more:
            break
        head += more
    name = (
        "stdin.parquet"
        if head.startswith(b"PAR1")
        else "stdin.arrow"
        if head.startswith(IPC_FILE_MAGIC)
        else "stdin.arrows"
        if head.startswith(IPC_STREAM_MARKER)
        else "stdin.jsonl"
        if head.lstrip(JSON_BLANK).startswith(b"{")
        else None
    )
    if name is None:
        raise AdvcliError(
            "<stdin>: not Parquet, an Arrow IPC stream or JSON lines (checked the first bytes)"
        )
    path = folder / name
    with path.open("wb") as sink:
        # Polars' JSON reader takes no byte-order mark.
        sink.write(head.removeprefix(UTF8_BOM) if name == "stdin.jsonl" else head)
        shutil.copyfileobj(source, sink)
    return path


def _read_header(
    path: Path, source: str, label: str, input_format: InputFormat
) -> tuple[int, pl.Schema]:
    """A file's row count and schema, without reading its data where the format allows
    (``source``: the name Polars and Arrow open it by)."""
    kind = FORMAT_NAMES[input_format]
    try:
        if path.stat().st_size == 0:
            raise AdvcliError(f"{label}: the file is empty (0 bytes), not {_a(kind)} file")
        if input_format == "parquet":
            with open_parquet(source) as parquet_file:
                metadata = parquet_file.metadata
                arrow_schema = parquet_file.schema_arrow
            in_groups = sum(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
            if in_groups != metadata.num_rows:
                raise AdvcliError(
                    f"{label}: the Parquet footer counts {metadata.num_rows:,} rows but its row "
                    f"groups hold {in_groups:,}; the file is damaged"
                )
            _check_arrow_types(arrow_schema, label, _UNSUPPORTED_FROM_PARQUET)
            # Not arrow_schema.empty_table(): that imports pandas (half a second) for nothing.
            empty = pa.Table.from_batches([], schema=arrow_schema)
            return metadata.num_rows, pl.DataFrame(empty).schema
        if input_format == "arrow_stream":
            # Memory-mapped: counting the rows reads the batches' headers, not their data.
            with pa.memory_map(source) as mapped:
                reader = pa.ipc.open_stream(mapped)
                _check_arrow_types(reader.schema, label)
                num_rows = sum(batch.num_rows for batch in reader)
            return num_rows, pl.DataFrame(pa.Table.from_batches([], schema=reader.schema)).schema
        if input_format == "arrow":
            with pa.memory_map(source) as mapped:
                if mapped.read(len(FEATHER_V1_MAGIC)) == FEATHER_V1_MAGIC:
                    raise AdvcliError(
                        f"{label}: a Feather version 1 file, which advcli does not read; write "
                        "it as Feather version 2 (an Arrow IPC file) or Parquet"
                    )
                mapped.seek(0)
                _check_arrow_types(pa.ipc.open_file(mapped).schema, label)
            frame = pl.scan_ipc(source, glob=False)
        else:
            frame = pl.scan_ndjson(as_pattern(source), infer_schema_length=None)
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
        kind = kind if input_format == "arrow_stream" else f"{kind} file"
        raise AdvcliError(f"{label}: not a readable {kind} ({first_line(error)})") from None


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "AEIOU" else f"a {kind}"


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


# Decimals of 32 and 64 bits: Polars reads them from an Arrow IPC file, but panics on the arrays
# Arrow's Parquet reader hands it.
_UNSUPPORTED_FROM_PARQUET = tuple(
    getattr(pa, name) for name in ("Decimal32Type", "Decimal64Type") if hasattr(pa, name)
)


def _check_arrow_types(
    schema: pa.Schema, label: str, also: tuple[type[pa.DataType], ...] = ()
) -> None:
    for column in schema:
        bad = _unsupported_type(column.type, _UNSUPPORTED_ARROW_TYPES + also)
        if bad is not None:
            raise AdvcliError(
                f"{label}: column '{column.name}' has the Arrow type {bad}, which advcli cannot "
                "read or pass through; drop the column or convert it"
            )


def _unsupported_type(
    dtype: pa.DataType, unsupported: tuple[type[pa.DataType], ...]
) -> pa.DataType | None:
    """``dtype`` or the first type nested in it that Polars cannot hold, else None."""
    if isinstance(dtype, unsupported) or pa.types.is_interval(dtype):
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
        found = _unsupported_type(child, unsupported)
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
                    value = json.loads(line, parse_constant=_NotJson)
                except json.JSONDecodeError as error:
                    return f"line {number}: not valid JSON ({error.msg} at column {error.colno})"
                if not isinstance(value, dict):
                    return f"line {number}: not a JSON object"
                for name, item in value.items():
                    literal = _not_json(item)
                    if literal is not None:
                        return (
                            f"line {number}: column '{name}' holds {literal}, which is not JSON "
                            "(JSON has no NaN or infinity); write null or a number"
                        )
    except UnicodeDecodeError as error:
        return f"byte {error.start}: not UTF-8 text"
    except OSError:
        return None
    return None


class _NotJson(str):
    """``NaN``, ``Infinity`` or ``-Infinity``: literals Python's JSON parser takes (and Polars'
    refuses, without saying where), kept to name the column that holds one."""


def _not_json(value: Any) -> str | None:
    """The first ``NaN``/``Infinity`` literal in a line's value (also inside lists and objects)."""
    if isinstance(value, _NotJson):
        return str(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((found for item in items if (found := _not_json(item)) is not None), None)


def check_json_lines(dataset: Dataset, ids: Sequence[str], reward: str) -> None:
    """What Polars' JSON reader would silently change, refused with the line that shows it.

    - An id column read as strings that also holds other JSON values: Polars turns ``0``,
      ``true``, ``[1]`` or ``{"k": 1}`` into the text ``"0"``, ``"true"``…, so they would join
      the group of that string.
    - A float reward column holding an integer literal beyond 2^53: it is rounded when read.

    Polars reads each file once more as plain lines and finds the candidates with a regular
    expression (a key followed by something other than a string; an integer literal of 16 digits
    or more); only those lines are parsed, to look at their top-level values.
    """
    string_ids = [name for name in ids if dataset.schema[name] == pl.String]
    reward_type = dataset.schema[reward]
    float_reward = reward_type == pl.Float64 or reward_type == pl.List(pl.Float64)
    for index, path in enumerate(dataset.files):
        for name in string_ids:
            for line in _lines_matching(dataset.source(index), _value_after_key(name)):
                value = json.loads(line).get(name)
                if value is not None and not isinstance(value, str):
                    raise AdvcliError(f"{dataset.label(index)} {_mixed_ids(path, name, line)}")
        if float_reward:
            for line in _lines_matching(dataset.source(index), LONG_INTEGER):
                too_large = _beyond_exact(json.loads(line).get(reward))
                if too_large is not None:
                    raise AdvcliError(
                        f"{dataset.label(index)} line {_line_number(path, line)}: column "
                        f"'{reward}' holds the integer {too_large}, beyond 2^53, which float64 "
                        "cannot hold exactly; advcli would round it"
                    )


# An integer literal that may be beyond 2^53 (16 digits or more, no fraction or exponent).
LONG_INTEGER = r"(^|[^\w.])-?\d{16,}([^\w.]|$)"


def _value_after_key(name: str) -> str:
    """``"name":`` followed by the first character of a value that is not a string or null."""
    return re.escape(json.dumps(name, ensure_ascii=False)) + r"\s*:\s*[^\"\sn]"


def _lines_matching(source: str, pattern: str) -> Iterator[str]:
    """The lines of a text file (by its native name: :class:`NativeNames`) that match
    ``pattern``, found by Polars batch by batch (a NUL byte, the separator, cannot occur in JSON
    text)."""
    lines = pl.scan_csv(
        source,
        glob=False,
        has_header=False,
        separator="\x00",
        quote_char=None,
        new_columns=["line"],
        schema={"line": pl.String},
    )
    for batch in lines.filter(pl.col("line").str.contains(pattern)).collect_batches():
        yield from batch["line"]


def _line_number(path: Path, line: str) -> int:
    """The 1-based number of the first line of ``path`` that is ``line`` (error path only)."""
    with path.open(encoding="utf-8") as lines:
        return next(n for n, text in enumerate(lines, start=1) if text.rstrip("\r\n") == line)


def _beyond_exact(value: Any) -> int | None:
    """An integer in ``value`` (a number or a list of them) that float64 cannot hold exactly."""
    values = value if isinstance(value, list) else [value]
    return next(
        (
            v
            for v in values
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > EXACT_INTEGER_LIMIT
        ),
        None,
    )


def _mixed_ids(path: Path, name: str, line: str) -> str:
    """The message for an id column whose ``line`` holds a value other than a string, naming the
    first line with a string."""
    number, value = _line_number(path, line), json.loads(line)[name]
    kind = {bool: "a boolean", list: "a list", dict: "an object"}.get(type(value), "a number")
    with path.open(encoding="utf-8") as lines:
        for text_line, text in enumerate(lines, start=1):
            found = json.loads(text).get(name) if text.strip() else None
            if isinstance(found, str):
                return (
                    f"line {number}: column '{name}' mixes JSON strings with other values (line "
                    f"{text_line} holds {json.dumps(found)}, line {number} {kind}, "
                    f"{json.dumps(value)}); advcli would read both as text: give the ids one "
                    "JSON type"
                )
    return f"line {number}: column '{name}' mixes JSON strings with other values"


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

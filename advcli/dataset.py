"""Reading rollout dumps and writing results: advcli's I/O boundary.

Stage 1 of the data flow lives here: :func:`key_projection` reads only the small columns (keys, the
reward list summed, the mask length) and checks them, so that the statistics never touch token data.
Stage 3, :func:`write_advantages`, is the only pass over every column: it streams the input through
Polars, attaches each row's advantage and sinks the result to a temporary file that is renamed into
place only when complete.

Every Polars or Arrow error met while reading is re-raised as :class:`~advcli.errors.AdvcliError`
naming the file, column and row.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import io
import json
import shutil
import sys
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from polars.datatypes import DataTypeClass
from polars.io.plugins import register_io_source

from advcli.atomic import atomic_output, check_output_path
from advcli.errors import AdvcliError
from advcli.process import available_memory, require_stdout, stdin_closed

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
ARROW_SUFFIXES = (".arrow", ".ipc", ".feather")
DIRECTORY_JSON_SUFFIXES = (".jsonl", ".ndjson")
GLOB_CHARS = frozenset("*?[")
STDIN = "-"

# Internal column names of the key projection. They are ours, so a user column called "group" or
# "score" never collides with them.
ROW = "row"
GROUP = "group"
TRAJECTORY = "trajectory"
TURN = "turn"
SCORE = "score"
TOKENS = "tokens"

# Columns that compute adds to its output.
OUTPUT_COLUMNS = ("score", "advantage", "advantages")

# Parquet is read in Arrow record batches of about this many values (list elements count one
# each), whatever the width of the rows: some 50 MB of token data a batch.
BATCH_VALUES = 8_000_000

# Default column names, in order of preference (verl / verl-agent names as fallbacks).
GROUP_CANDIDATES = ("data_id", "uid")
TRAJECTORY_CANDIDATES = ("rollout_id", "traj_uid")
TURN_CANDIDATES = ("turn_index",)
REWARD_CANDIDATES = ("token_level_rewards", "score", "reward")
MASK_CANDIDATES = ("response_mask", "response_length")

RewardKind = Literal["token_rewards", "scalar"]
MaskKind = Literal["mask", "length"]
# arrow: an Arrow IPC file; arrows: an Arrow IPC stream (what a pipe reader expects).
OutputFormat = Literal["parquet", "arrow", "arrows", "npz", "pt"]
InputFormat = Literal["parquet", "json", "arrow"]


@dataclass(frozen=True)
class Columns:
    """Which input column plays which role."""

    group: str
    trajectory: str
    turn: str | None
    reward: str
    reward_kind: RewardKind
    mask: str
    mask_kind: MaskKind
    # Why each role went to its column, for `advcli inspect`.
    reasons: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> dict[str, str | None]:
        """The roles as a plain dict, for summaries and reports."""
        return {
            "group": self.group,
            "trajectory": self.trajectory,
            "turn": self.turn,
            "reward": self.reward,
            "mask": self.mask,
        }


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
        """The files as one LazyFrame (Parquet decoded by Arrow: see :func:`_scan_parquet`)."""
        files = list(self.files)
        if self.input_format == "json":
            return pl.scan_ndjson(files, schema=self.schema)
        if self.input_format == "arrow":
            return pl.scan_ipc(files)
        return _scan_parquet(self)

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


# --------------------------------------------------------------------------------------------
# Opening inputs


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
            with _open_parquet(path) as parquet_file:
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


def _scan_parquet(dataset: Dataset) -> pl.LazyFrame:
    """Parquet files as a Polars LazyFrame whose batches Arrow decodes.

    Arrow's Parquet reader decodes list columns about twice as fast as Polars' (the token lists of
    the 1M-row benchmark dump: ~1 s against ~2 s), and both passes over the input decode them, so
    Polars gets the data through an IO source. Polars pushes the column selection, row filter and
    row limit down to the source, which must apply them. The source is an unstable Polars API;
    tests/test_parquet_scan.py checks all three. Run queries on it inside :func:`closing_sources`.
    """

    def source(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> _Source:
        opened = _Source(_parquet_frames(dataset, with_columns, predicate, n_rows))
        _OPEN_SOURCES.append(opened)
        return opened

    return register_io_source(source, schema=dataset.schema)


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
    """Run Polars queries over :meth:`Dataset.scan`; end their Parquet scans when the block ends."""
    try:
        yield
    finally:
        while _OPEN_SOURCES:
            _OPEN_SOURCES.pop().close()
        # Arrow keeps the memory of freed batches for its next allocation, but what follows a
        # scan allocates through Polars' allocator: give it back (measured: 170 MB at 2M rows).
        pa.default_memory_pool().release_unused()


def _open_parquet(path: Path) -> pq.ParquetFile:
    """A Parquet file opened for reading. INT96 timestamps (Spark, old Impala) are read as
    microseconds: Arrow's default, nanoseconds, wraps dates outside the years 1677–2262."""
    return pq.ParquetFile(path, coerce_int96_timestamp_unit="us")


def _parquet_frames(
    dataset: Dataset, columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None
) -> Generator[pl.DataFrame, None, None]:
    """The files' rows in batches, with the selection, filter and limit applied.

    Each batch is fully validated first (offsets, UTF-8), as Polars' own reader does: Arrow's
    does not check strings, and Polars would write invalid UTF-8 to the output. It costs about
    6 ms per 40 MB of strings.
    """
    remaining = n_rows
    for index, path in enumerate(dataset.files):
        if remaining == 0:
            return
        read = 0
        try:
            with _open_parquet(path) as parquet_file:
                rows = _batch_rows(parquet_file.metadata)
                for batch in parquet_file.iter_batches(batch_size=rows, columns=columns):
                    batch.validate(full=True)
                    read += batch.num_rows
                    frame = _frame_of(batch)
                    if predicate is not None:
                        frame = frame.filter(predicate)
                    if remaining is not None:
                        frame = frame.head(remaining)
                        remaining -= frame.height
                    yield frame
                    if remaining == 0:
                        return
        except (pa.ArrowException, OSError) as error:
            raise AdvcliError(
                f"{dataset.label(index)}: cannot read the file ({first_line(error)})"
            ) from None
        # Row numbers, and so every row's advantage, rest on the counts read from the footers.
        if read != dataset.row_counts[index]:
            raise AdvcliError(
                f"{dataset.label(index)}: the file holds {read:,} rows but its footer counts "
                f"{dataset.row_counts[index]:,}; the file is damaged"
            )


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
        pl.DataFrame(pa.RecordBatch.from_arrays([column], schema=pa.schema([field])))
        for column, field in zip(batch.columns, batch.schema, strict=True)
    ]
    return pl.concat(columns, how="horizontal")


def _batch_rows(metadata: pq.FileMetaData) -> int:
    """Rows per record batch so that a batch holds about ``BATCH_VALUES`` values (counted over all
    the file's columns, read or not: an upper bound)."""
    values = 0
    for group in range(metadata.num_row_groups):
        chunks = metadata.row_group(group)
        values += sum(chunks.column(column).num_values for column in range(chunks.num_columns))
    values_per_row = max(1.0, values / max(1, metadata.num_rows))
    return max(1, int(BATCH_VALUES / values_per_row))


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


def first_line(error: BaseException) -> str:
    """An error's first line of text (or its type name): Polars' and Arrow's messages run on."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# --------------------------------------------------------------------------------------------
# Column roles


def resolve_columns(
    dataset: Dataset,
    *,
    group: str | None = None,
    trajectory: str | None = None,
    turn: str | None = None,
    reward: str | None = None,
    mask: str | None = None,
) -> Columns:
    """Pick the column for each role (the option's name, else the first default that exists)
    and check its type."""
    schema = dataset.schema
    where = dataset.describe()

    reasons: dict[str, str] = {}
    group_col = _pick(schema, where, "group", group, GROUP_CANDIDATES, "--group-col", reasons)
    trajectory_col = _pick(
        schema, where, "trajectory", trajectory, TRAJECTORY_CANDIDATES, "--traj-col", reasons
    )
    if turn is not None and turn not in schema:
        raise AdvcliError(f"{where}: column '{turn}' (--turn-col) not found")
    turn_col = turn if turn is not None else next((c for c in TURN_CANDIDATES if c in schema), None)
    reasons["turn"] = (
        "named by --turn-col"
        if turn is not None
        else "the default name"
        if turn_col is not None
        else "no 'turn_index' column: turns are ordered by input order"
    )
    # In an advcli output (a re-run) 'score' is advcli's own column, so it is tried last.
    reward_candidates = (
        ("token_level_rewards", "reward", "score") if "advantage" in schema else REWARD_CANDIDATES
    )
    reward_col = _pick(schema, where, "reward", reward, reward_candidates, "--reward-col", reasons)
    mask_col = _pick(schema, where, "mask", mask, MASK_CANDIDATES, "--mask-col", reasons)

    for role, name in (("group", group_col), ("trajectory", trajectory_col)):
        dtype = schema[name]
        if not (dtype.is_integer() or dtype in (pl.String, pl.Categorical) or _is_enum(dtype)):
            raise AdvcliError(
                f"{where}: column '{name}' ({role} id) has type {dtype}; ids must be integers "
                "or strings"
            )
    if turn_col is not None and not schema[turn_col].is_integer():
        raise AdvcliError(
            f"{where}: column '{turn_col}' (turn index) has type {schema[turn_col]}; "
            "expected integers"
        )

    reward_dtype = schema[reward_col]
    reward_kind: RewardKind
    if _is_numeric(reward_dtype):
        reward_kind = "scalar"
    elif isinstance(reward_dtype, pl.List) and _is_numeric(reward_dtype.inner):
        reward_kind = "token_rewards"
    else:
        raise AdvcliError(
            f"{where}: column '{reward_col}' (reward) has type {reward_dtype}; expected a number "
            "or a list of numbers"
        )

    mask_dtype = schema[mask_col]
    mask_kind: MaskKind
    if mask_dtype.is_integer():
        mask_kind = "length"
    elif isinstance(mask_dtype, pl.List) and (
        _is_numeric(mask_dtype.inner) or mask_dtype.inner == pl.Boolean
    ):
        mask_kind = "mask"
    else:
        raise AdvcliError(
            f"{where}: column '{mask_col}' (response mask) has type {mask_dtype}; expected a list "
            "of 0/1 values or an integer response length"
        )

    taken = {reward_col} & {"advantage", "advantages"}
    if taken:
        raise AdvcliError(
            f"{where}: the reward column '{reward_col}' has the name of an output column; "
            "rename it or choose another with --reward-col"
        )
    reasons["reward"] += (
        ", a list of token rewards summed per row"
        if reward_kind == "token_rewards"
        else ", one number per row"
    )
    reasons["mask"] += ", a list of 0/1" if mask_kind == "mask" else ", a response length"
    return Columns(
        group=group_col,
        trajectory=trajectory_col,
        turn=turn_col,
        reward=reward_col,
        reward_kind=reward_kind,
        mask=mask_col,
        mask_kind=mask_kind,
        reasons=reasons,
    )


def _pick(
    schema: pl.Schema,
    where: str,
    role: str,
    chosen: str | None,
    candidates: Sequence[str],
    option: str,
    reasons: dict[str, str],
) -> str:
    if chosen is not None:
        if chosen not in schema:
            raise AdvcliError(f"{where}: column '{chosen}' ({option}) not found")
        reasons[role] = f"named by {option}"
        return chosen
    for index, name in enumerate(candidates):
        if name in schema:
            absent = ", ".join(f"'{c}'" for c in candidates[:index])
            reasons[role] = (
                "the default name" if index == 0 else f"the first default present ({absent} absent)"
            )
            return name
    names = " or ".join(f"'{c}'" for c in candidates)
    raise AdvcliError(f"{where}: no {role} column: expected {names}, or name one with {option}")


def _is_numeric(dtype: pl.DataType | DataTypeClass) -> bool:
    return dtype.is_numeric() and dtype != pl.Boolean


def _is_enum(dtype: pl.DataType | DataTypeClass) -> bool:
    return isinstance(dtype, pl.Enum)


# --------------------------------------------------------------------------------------------
# Stage 1: the key projection


@dataclass(frozen=True)
class KeyProjection:
    """The per-row expressions of stage 1, shared by every engine.

    ``exprs`` turn a batch (or a whole scan) of input rows into ``group``, ``trajectory``,
    [``turn``], ``score``, ``tokens`` and ``problem``: 0 for a sound row, k for the k-th broken rule
    of ``messages``.
    """

    exprs: list[pl.Expr]
    messages: list[str]

    @classmethod
    def of(cls, schema: pl.Schema, columns: Columns) -> KeyProjection:
        reward, mask = pl.col(columns.reward), pl.col(columns.mask)
        keys = [
            _as_key(columns.group, schema).alias(GROUP),
            _as_key(columns.trajectory, schema).alias(TRAJECTORY),
        ]
        if columns.turn is not None:
            keys.append(pl.col(columns.turn).alias(TURN))
        # Summed in float64 whatever the list's type: float16 and float32 lose the small terms
        # of long lists (3000 float16 ones sum to 2048), and integers wrap around.
        score = (
            reward.cast(pl.List(pl.Float64)).list.sum()
            if columns.reward_kind == "token_rewards"
            else reward.cast(pl.Float64)
        )
        tokens = mask.list.sum() if columns.mask_kind == "mask" else mask
        tokens = tokens.cast(pl.Int64)

        rules = _row_rules(schema, columns, score, tokens)
        # One small code per row (0 = fine, k = the k-th rule broken) instead of a column per
        # rule, so the projection stays a handful of scalars per row.
        problem: Any = pl.when(rules[0][0]).then(pl.lit(1, dtype=pl.UInt8))
        for code, (broken, _) in enumerate(rules[1:], start=2):
            problem = problem.when(broken).then(pl.lit(code, dtype=pl.UInt8))
        exprs = [
            *keys,
            score.alias(SCORE),
            tokens.alias(TOKENS),
            problem.otherwise(pl.lit(0, dtype=pl.UInt8)).alias("problem"),
        ]
        return cls(exprs, [message for _, message in rules])

    def check(
        self,
        projection: pl.DataFrame,
        dataset: Dataset,
        columns: Columns,
        *,
        unique_turns: bool = True,
    ) -> pl.DataFrame:
        """Raise for the first broken row (input order); return the projection without
        ``problem``. ``projection`` must carry ``row``, the input row number."""
        first_problem = projection.select(
            pl.col(ROW, "problem").filter(pl.col("problem") > 0).first()
        ).row(0)
        if first_problem[0] is not None:
            row, code = first_problem
            raise AdvcliError(f"{dataset.locate(row)}: {self.messages[code - 1]}")
        projection = projection.drop("problem")
        if unique_turns and columns.turn is not None:
            _check_unique_turns(projection, dataset, columns)
        return projection


def key_projection(
    dataset: Dataset, columns: Columns, *, unique_turns: bool = True
) -> pl.DataFrame:
    """Read and check the small per-row columns: row, group, trajectory, [turn], score, tokens.

    With ``unique_turns`` a repeated ``(group, trajectory, turn)`` is an error; ``inspect`` turns
    it off to count them instead.

    ``score`` is the row's reward (the sum of its token-level rewards) as Float64; ``tokens`` is the
    number of response tokens (the sum of the mask, or the response length). Token data is read
    once, batch by batch, and reduced to these scalars on the way.
    """
    if dataset.input_format == "json":
        check_json_ids(dataset, [columns.group, columns.trajectory])
    plan = KeyProjection.of(dataset.schema, columns)
    row_number = unused_name(dataset.schema)
    try:
        with closing_sources():
            projection = (
                dataset.scan()
                .with_row_index(row_number)
                .select(pl.col(row_number).alias(ROW), *plan.exprs)
                .collect(engine="streaming")
            )
    except pl.exceptions.PolarsError as error:
        raise AdvcliError(
            f"{dataset.describe()}: cannot read the key columns ({first_line(error)})"
        ) from None
    return plan.check(projection, dataset, columns, unique_turns=unique_turns)


def _row_rules(
    schema: pl.Schema, columns: Columns, score: pl.Expr, tokens: pl.Expr
) -> list[tuple[pl.Expr, str]]:
    """(broken, message) for every per-row rule, in the order they are reported for one row."""
    reward, mask = columns.reward, columns.mask
    rules: list[tuple[pl.Expr, str]] = [
        (pl.col(columns.group).is_null(), f"column '{columns.group}' (group id) is null"),
        (
            pl.col(columns.trajectory).is_null(),
            f"column '{columns.trajectory}' (trajectory id) is null",
        ),
    ]
    if columns.turn is not None:
        rules.append(
            (pl.col(columns.turn).is_null(), f"column '{columns.turn}' (turn index) is null")
        )
    rules.append((pl.col(reward).is_null(), f"column '{reward}' (reward) is null"))
    if columns.reward_kind == "token_rewards":
        rules.append(
            (
                pl.col(reward).list.eval(pl.element().null_count()).list.first() > 0,
                f"column '{reward}' has a null element",
            )
        )
    rules += _exactness_rules(schema, columns)
    rules += [
        (score.is_nan(), f"column '{reward}': the score is NaN"),
        (score == float("inf"), f"column '{reward}': the score is +inf"),
        (score == float("-inf"), f"column '{reward}': the score is -inf"),
        (pl.col(mask).is_null(), f"column '{mask}' (response mask) is null"),
    ]
    if columns.mask_kind == "mask":
        rules.append(
            (
                pl.col(mask).list.eval(pl.element().null_count()).list.first() > 0,
                f"column '{mask}' has a null element",
            )
        )
        if schema[mask].inner != pl.Boolean:  # type: ignore[attr-defined]
            # Compared, not looked up: a float mask (0.0/1.0) is as good as an integer one.
            zero_or_one = (pl.element() == 0) | (pl.element() == 1)
            rules.append(
                (
                    pl.col(mask).list.eval(~zero_or_one).list.any(),
                    f"column '{mask}' holds a value other than 0 and 1",
                )
            )
        if columns.reward_kind == "token_rewards":
            rules.append(
                (
                    pl.col(mask).list.len() != pl.col(reward).list.len(),
                    f"column '{mask}' and column '{reward}' have different lengths",
                )
            )
    else:
        rules.append((tokens < 0, f"column '{mask}' (response length) is negative"))
        if columns.reward_kind == "token_rewards":
            rules.append(
                (
                    tokens > pl.col(reward).list.len(),
                    f"column '{mask}' (response length) is longer than the row's list in "
                    f"column '{reward}'",
                )
            )
    return rules


# Integers beyond this are not all representable in float64, the type scores are summed in.
EXACT_INTEGER_LIMIT = 2**53


def _exactness_rules(schema: pl.Schema, columns: Columns) -> list[tuple[pl.Expr, str]]:
    """Integer rewards whose score float64 cannot hold exactly: refused, never rounded."""
    reward = columns.reward
    dtype = schema[reward]
    inner = dtype.inner if columns.reward_kind == "token_rewards" else dtype  # type: ignore[attr-defined]
    if not inner.is_integer():
        return []
    if columns.reward_kind == "token_rewards":
        # While the sum of |reward| stays below 2**53 every partial sum is an exact integer; the
        # float64 sum of |reward| reaches 2**53 as soon as the exact one does.
        magnitude = pl.col(reward).cast(pl.List(pl.Float64)).list.eval(pl.element().abs())
        return [
            (
                magnitude.list.sum() >= EXACT_INTEGER_LIMIT,
                f"column '{reward}': the integer rewards of the row add up beyond 2^53, where "
                "float64 cannot hold every integer",
            )
        ]
    if inner in (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16, pl.UInt32):
        return []  # float64 holds every one of their values
    beyond = pl.col(reward) > EXACT_INTEGER_LIMIT
    if inner.is_signed_integer():
        beyond = beyond | (pl.col(reward) < -EXACT_INTEGER_LIMIT)
    return [
        (
            beyond,
            f"column '{reward}': the integer reward is beyond 2^53, where float64 cannot hold "
            "every integer",
        )
    ]


def _as_key(name: str, schema: pl.Schema) -> pl.Expr:
    # Categorical ids compare and join as strings; the physical codes may differ between files.
    dtype = schema[name]
    return (
        pl.col(name).cast(pl.String) if dtype == pl.Categorical or _is_enum(dtype) else pl.col(name)
    )


def unused_name(schema: pl.Schema, base: str = "__advcli_row") -> str:
    """A column name that ``schema`` does not have, for a row number added beside the user's
    columns: any name of the user's, ``row`` included, passes through untouched."""
    name = base
    while name in schema:
        name += "_"
    return name


def repeated_turn() -> pl.Expr:
    """True for a row whose ``(group, trajectory, turn)`` an earlier row already has."""
    return ~pl.struct(GROUP, TRAJECTORY, TURN).is_first_distinct()


def _check_unique_turns(projection: pl.DataFrame, dataset: Dataset, columns: Columns) -> None:
    # Whether any turn repeats, from sorted 64-bit hashes of the keys: half the memory of a
    # group-by on millions of rows. Equal keys hash alike, so no repeat is missed; a collision of
    # different keys only sends the check on to the exact search below, which then finds nothing.
    hashes = projection.select(pl.struct(GROUP, TRAJECTORY, TURN).hash().sort()).to_series()
    repeats = bool((hashes == hashes.shift(1)).any())  # not diff(): it is null above 2**63
    if not repeats:
        return
    duplicated = projection.select(pl.col(ROW).filter(repeated_turn()).first()).item()
    if duplicated is not None:
        key = projection.row(duplicated, named=True)
        raise AdvcliError(
            f"{dataset.locate(duplicated)}: duplicate turn: ({columns.group}={key[GROUP]!r}, "
            f"{columns.trajectory}={key[TRAJECTORY]!r}, {columns.turn}={key[TURN]!r}) "
            "appears more than once"
        )


# --------------------------------------------------------------------------------------------
# Stage 3: writing the output


def write_advantages(
    dataset: Dataset,
    columns: Columns,
    row_values: pl.DataFrame,
    output: Path,
    *,
    output_format: OutputFormat,
    tokens: bool = True,
    force: bool = False,
) -> None:
    """Attach ``score`` and ``advantage`` (one per row, ordered by ``row``) to every input row and
    write the result (replacing input columns of those names). Without ``force`` an ``output``
    that exists by the time the result is complete is an error.

    ``row_values`` must hold the columns ``row`` (0, 1, 2, … in order), ``score`` and
    ``advantage``.
    """
    if not row_values[ROW].equals(
        pl.Series(ROW, range(dataset.num_rows), dtype=row_values[ROW].dtype)
    ):
        raise ValueError("row_values must hold one row per input row, in input order")
    replaced = replaced_columns(dataset)
    # Each streamed row looks its values up by its row number in two float32 arrays (8 bytes a
    # row): cheaper than a join, and the only per-row state kept while the token data streams.
    score = pl.lit(row_values[SCORE].cast(pl.Float32))
    advantage = pl.lit(row_values["advantage"].cast(pl.Float32))
    row_number = unused_name(dataset.schema)
    frame = (
        dataset.scan()
        .with_row_index(row_number)
        .drop(replaced)
        .with_columns(
            score.gather(pl.col(row_number)).alias("score"),
            advantage.gather(pl.col(row_number)).alias("advantage"),
        )
        .drop(row_number)
    )
    per_token = per_token_advantages(columns)
    with (
        atomic_output(output, force=force, keep=dataset.files) as partial,
        closing_sources(),
    ):
        try:
            if output_format in ("npz", "pt"):
                _write_arrays(frame, columns, partial, output_format, tokens, output)
            else:
                if tokens:
                    frame = frame.with_columns(per_token.alias("advantages"))
                if output_format == "parquet":
                    frame.sink_parquet(partial)
                elif output_format == "arrow":
                    frame.sink_ipc(partial)
                else:
                    _write_arrow_stream(frame, partial)
        except pl.exceptions.PolarsError as error:
            raise AdvcliError(
                f"{dataset.describe()}: cannot write {output} ({first_line(error)})"
            ) from None


def replaced_columns(dataset: Dataset) -> list[str]:
    """The input columns that the output's ``score``, ``advantage``, ``advantages`` replace."""
    return [name for name in OUTPUT_COLUMNS if name in dataset.schema]


def per_token_advantages(columns: Columns) -> pl.Expr:
    """``advantages``: the row's ``advantage`` times each element of its mask (float32), or that
    many copies of it for a ``response_length`` column."""
    if columns.mask_kind == "mask":
        return pl.col(columns.mask).cast(pl.List(pl.Float32)) * pl.col("advantage")
    return pl.col("advantage").repeat_by(pl.col(columns.mask))


def _write_arrow_stream(frame: pl.LazyFrame, path: Path) -> None:
    """An Arrow IPC *stream* (what a pipe reader such as ``pyarrow.ipc.open_stream`` expects),
    written batch by batch as the rows stream through."""
    with pa.OSFile(str(path), "wb") as sink:
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
    columns: Columns,
    partial: Path,
    output_format: OutputFormat,
    tokens: bool,
    output_name: Path,
) -> None:
    """Padded arrays: ``advantage`` (N,), ``response_mask`` (N, Lmax) and, unless ``tokens`` is
    off, ``advantages`` (N, Lmax)."""
    if columns.mask_kind == "mask":
        mask = pl.col(columns.mask).cast(pl.List(pl.Float32))
    else:
        # A length column is checked before its mask rows are made: one huge length would
        # otherwise be materialized first.
        rows, width = frame.select(pl.len(), pl.col(columns.mask).max()).collect().row(0)
        _check_padding(rows, int(width or 0), tokens, output_name)
        mask = pl.lit(1.0, dtype=pl.Float32).repeat_by(pl.col(columns.mask))
    collected = frame.select(mask.alias("response_mask"), pl.col("advantage")).collect(
        engine="streaming"
    )
    width = collected["response_mask"].list.len().max()
    _check_padding(collected.height, int(width or 0), tokens, output_name)  # type: ignore[arg-type]
    response_mask = padded(collected["response_mask"])
    # Writable: torch refuses (with a warning) to wrap memory it may not write.
    advantage = collected["advantage"].to_numpy(writable=True)
    arrays: dict[str, Any] = {"response_mask": response_mask, "advantage": advantage}
    if tokens:
        arrays["advantages"] = response_mask * advantage[:, None]
    if output_format == "npz":
        with partial.open("wb") as handle:
            np.savez(handle, **arrays)
    else:
        import torch

        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        try:
            # To an open file, not a path: torch names the archive's folder after a path, and
            # the partial's name is random, so the same input would give different bytes.
            with partial.open("wb") as handle:
                torch.save(tensors, handle)
        except RuntimeError as error:  # torch's writer reports a failed write so
            raise AdvcliError(f"{output_name}: cannot write ({first_line(error)})") from None


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


def check_output(
    output: Path, dataset: Dataset, *, force: bool, folder_output: bool = False
) -> None:
    """Refuse an output that is one of the inputs, or that :func:`advcli.atomic.check_output_path`
    refuses (``-``, standard output, is always fine)."""
    if str(output) == STDIN:
        require_stdout("the output")
        return
    for path in dataset.files:
        if output.resolve() == path.resolve():
            raise AdvcliError(f"{output}: the output is also an input; choose another path")
    check_output_path(output, force=force, folder_output=folder_output)

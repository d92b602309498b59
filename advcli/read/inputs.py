"""Opening inputs: paths, globs, directories, standard input (:mod:`advcli.read.stdin`), each
file's format (:mod:`advcli.read.formats`) and header (row count, schema, types Polars cannot
hold), and schemas agreeing across files. Paths that are not UTF-8 are read through
:mod:`advcli.names` and labelled with their bytes escaped.

Every Polars or Arrow error met while opening is re-raised as :class:`~advcli.errors.AdvcliError`
naming the file (and line or row).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from advcli._runtime.signals import held
from advcli.errors import AdvcliError, InputChanged, first_line
from advcli.names import NativeNames, is_utf8, shown_path
from advcli.read.containers import (
    RLLM_TRAINING_FOLDER,
    Unit,
    input_units,
    is_rllm_episode,
    is_skyrl_batch,
    is_slime_dump,
    translated,
)
from advcli.read.dataset import GLOB_CHARS, Dataset, FileIdentity, as_pattern
from advcli.read.file_roles import FileRoles, read_file_roles
from advcli.read.formats import (
    DIRECTORY_JSON_SUFFIXES,
    FEATHER_V1_MAGIC,
    FORMAT_NAMES,
    PARQUET_SUFFIXES,
    READ,
    READ_AS_TRAINERS,
    InputFormat,
    input_format_of,
    not_read,
)
from advcli.read.json_lines import first_bad_line
from advcli.read.json_translation import (
    floats_from_nulls,
    prefix_schema,
    translate_json_lines,
)
from advcli.read.scan import open_parquet
from advcli.read.stdin import spool_stdin
from advcli.read.step_files import number_order
from advcli.read.trainer_dumps import STEP_FILE_NAMES, TrainerDump, trainer_dump_of

STDIN = "-"


# A folder's listing (the files read, the others, what those read are), kept by a run that
# lists a folder more than once (its inputs, then its unread files).
Listings = dict[Path, tuple[list[Path], list[Path], str]]


def resolve_inputs(specs: Sequence[str], listed: Listings | None = None) -> list[Path]:
    """Expand files, globs and directories into a list of input files, in the order given.

    A directory contributes its Parquet files, or if it has none its ``.jsonl``/``.ndjson`` files
    (recursively, sorted by path, a number in it as a number: ``global_step_2`` before
    ``global_step_10``); a glob its matches, sorted so. A name that exists is that file or
    directory, even when it holds ``*``, ``?`` or ``[``: only a name that does not exist is read
    as a glob. A file named twice is read once. ``listed`` keeps each folder's listing.
    """
    if not specs:
        raise AdvcliError("no input files given")
    files: list[Path] = []
    for spec in specs:
        for match in _matches(spec):
            files.extend(_expand_path(match, spec, listed))
    return list(dict.fromkeys(files))


def input_folders(specs: Sequence[str]) -> tuple[Path, ...]:
    """The directories among the inputs (named, or matched by a glob): every file a directory's
    reading picks up (:data:`FOLDER_SUFFIXES`) is an input, also one written there later."""
    folders = (match for spec in specs for match in _matches(spec) if match.is_dir())
    return tuple(dict.fromkeys(folders))


def _matches(spec: str) -> list[Path]:
    """The path ``spec`` names, or a glob's matches, sorted (numbers as numbers:
    :func:`~advcli.read.step_files.number_order`)."""
    if not GLOB_CHARS & set(spec) or os.path.lexists(spec):
        return [Path(spec)]
    matches = sorted(glob.glob(spec, recursive=True), key=number_order)
    if not matches:
        raise AdvcliError(f"{spec}: the pattern matches no file")
    return [Path(match) for match in matches]


def _expand_path(path: Path, spec: str, listed: Listings | None) -> list[Path]:
    if path.is_dir():
        found = _read_and_not(path, listed)[0]
        if found:
            return found
        raise AdvcliError(
            f"{spec}: the directory holds no Parquet file (*.parquet, *.pq), JSON-lines file "
            "(*.jsonl, *.ndjson) or trainer's dump advcli reads (rLLM's episode_*.json, slime's "
            "rollout_data/{id}.pt, SkyRL's global_step_{N}_training_input.pkl)"
        )
    if not path.exists():
        raise AdvcliError(f"{spec}: no such file or directory")
    return [path]


def directory_files(path: Path) -> list[Path]:
    """A directory's input files, sorted by path with numbers as numbers (recursively:
    :func:`~advcli.read.step_files.number_order`): its Parquet files, failing those
    its JSON-lines files (a stray config.json beside Parquet files is not data), of those only
    a trainer's step files where it holds any (NeMo-RL's log folder: its train data, not its
    validation data), failing those rLLM's episode files (its training steps' where it holds
    any), failing those slime's dump files (each step's rollout and train files, not its
    evaluations'), failing those SkyRL's pickled training inputs; none if it holds none of
    these."""
    return _read_and_not(path)[0]


def _read_and_not(path: Path, listed: Listings | None = None) -> tuple[list[Path], list[Path], str]:
    """A directory's files, listed once and sorted: those :func:`directory_files` reads, the
    others, and what those read are (kept in ``listed``, where given)."""
    if listed is not None:
        if path not in listed:
            listed[path] = _read_and_not(path)
        return listed[path]
    files = sorted((p for p in path.rglob("*") if p.is_file()), key=number_order)
    for suffixes, kind in ((PARQUET_SUFFIXES, "Parquet"), (DIRECTORY_JSON_SUFFIXES, "JSON-lines")):
        found = [p for p in files if p.suffix in suffixes]
        if found:
            for name, pattern in STEP_FILE_NAMES.items():
                steps = [p for p in found if pattern.fullmatch(p.relative_to(path).as_posix())]
                if steps:
                    found, kind = steps, name
            return found, _others(files, found), f"{kind} files"
    found = [p for p in files if is_rllm_episode(p)]
    training = [p for p in found if RLLM_TRAINING_FOLDER.fullmatch(p.parent.name)]
    if training:
        found = training
    kind = "rLLM train_step_{N}_epoch_{E}/episode_*.json" if training else "rLLM episode_*.json"
    if not found:
        found, kind = [p for p in files if is_slime_dump(p)], "slime {rollout,train}_data/{id}.pt"
    if not found:
        found, kind = (
            [p for p in files if is_skyrl_batch(p)],
            "SkyRL global_step_{N}_training_input.pkl",
        )
    return found, _others(files, found), f"{kind} files" if found else ""


def _others(files: list[Path], found: list[Path]) -> list[Path]:
    """The files not among ``found``, in order (a set: a folder may hold 100,000 files)."""
    taken = set(found)
    return [path for path in files if path not in taken]


# How many of a folder's files that are not read a note names.
UNREAD_SHOWN = 5


def unread_notes(folders: Sequence[Path], listed: Listings | None = None) -> tuple[str, ...]:
    """For each input folder holding files that are not read (a config beside the step files,
    JSON lines beside Parquet, another format): a note naming them, for the reading."""
    notes = []
    for folder in folders:
        read, unread, kind = _read_and_not(folder, listed)
        if unread and read:
            names = ", ".join(shown_path(p.relative_to(folder)) for p in unread[:UNREAD_SHOWN])
            more = f" and {len(unread) - UNREAD_SHOWN:,} more" if len(unread) > UNREAD_SHOWN else ""
            notes.append(
                f"{shown_path(folder)}: {len(unread):,} file{'s' if len(unread) > 1 else ''} not "
                f"read (only its {kind} "
                f"are): {names}{more}"
            )
    return tuple(notes)


def open_dataset(
    specs: Sequence[str],
    *,
    spool: Callable[[], Path] | None = None,
    empty_ok: bool = False,
    train_files: bool = True,
) -> Dataset:
    """Resolve the inputs, read each file's schema and row count, and check that they agree;
    inputs without rows are an error unless ``empty_ok``.

    ``-`` reads standard input (Parquet, an Arrow IPC stream or JSON lines, told apart by their
    first bytes); it is copied to a file in ``spool()`` (a temporary folder the caller makes on
    the call and removes), since the data flow reads its input twice. A trainer's dump that is
    no table (:mod:`advcli.read.containers`) is translated into one there, once the inputs are
    known to be of one kind (``train_files``: as :func:`translated` takes it).
    """
    if STDIN in specs:
        if list(specs) != [STDIN]:
            raise AdvcliError("'-' (standard input) cannot be combined with other inputs")
        spooled = spool_stdin(_spool(spool)())
        units = [Unit(spooled, None, (spooled,))]
        labels: tuple[str, ...] = ("<stdin>",)
        folders: tuple[Path, ...] = ()
        unread: tuple[str, ...] = ()
    else:
        listed: Listings = {}
        units = input_units(resolve_inputs(specs, listed))
        labels = tuple(shown_path(unit.path) for unit in units)
        folders = input_folders(specs)
        unread = unread_notes(folders, listed)
    for unit, label in zip(units, labels, strict=True):
        kind = not_read(unit.path) if unit.container is None else None
        if kind is not None:
            trainers = READ_AS_TRAINERS.get(unit.path.suffix.lower())
            which = f"reads only as {trainers}" if trainers else "does not read"
            raise AdvcliError(
                f"{label}: {kind}, which advcli {which}: convert it (Polars reads most "
                f"formats and writes Parquet); advcli reads {READ}"
            )
    formats = {unit.container or FORMAT_NAMES[input_format_of(unit.path)] for unit in units}
    if len(formats) > 1:
        raise AdvcliError(
            f"{labels[0]}: inputs mix formats ({', '.join(sorted(formats))}); give one format"
        )
    files = list(translated(units, _spool(spool), train_files=train_files))
    input_format = input_format_of(files[0])  # a container's translation's: Parquet
    # A container's translation is a snapshot of the trainer's files: its own identity is the
    # input's. JSON lines' is their own file's, taken before they are read into Arrow.
    identified = list(files)
    identities = [_identity_at_open(path, label) for path, label in zip(files, labels, strict=True)]
    json_lines = None
    if input_format == "json" and spool is not None:
        json_lines = _json_lines_translated(files, labels, spool)
        if json_lines is not None:
            files, input_format = list(json_lines), "arrow"
    native = NativeNames(files, labels)
    row_counts, schemas, roles = [], [], []
    for path, source, label, identity, own in zip(
        files, native.names, labels, identities, identified, strict=True
    ):
        try:
            num_rows, schema, file_roles = _read_header(path, source, label, input_format)
        except AdvcliError:
            # A half-written file read while it is being written is the change, not damage.
            change = identity.change_to(FileIdentity.of(own))
            if change is None:
                raise
            raise InputChanged(label, change) from None
        row_counts.append(num_rows)
        schemas.append(schema)
        roles.append(file_roles)
    _check_one_layout(labels, schemas, roles)
    if input_format == "json":
        schemas = [_json_schema(labels, schemas)] * len(schemas)
    _check_schemas_agree(labels, schemas)
    _check_roles_agree(labels, roles)
    schema, file_roles, view = _read_as(schemas[0], roles[0], labels[0])
    dataset = Dataset(
        tuple(files),
        schema,
        tuple(row_counts),
        input_format,
        labels,
        folders,
        native,
        tuple(identities),
        file_roles=file_roles,
        view=view,
        # The paths the user has, where a container or JSON lines were translated.
        origins=tuple(unit.path for unit in units) if units[0].container or json_lines else (),
        container=units[0].container,
        translated_from="json" if json_lines else None,
        unread=unread,
    )
    if dataset.num_rows == 0 and not empty_ok:
        raise AdvcliError(f"{dataset.describe()}: the input has no rows")
    return dataset


def _json_lines_translated(
    files: Sequence[Path], labels: Sequence[str], spool: Callable[[], Path]
) -> tuple[Path, ...] | None:
    """JSON-lines files read once into Arrow IPC files in ``spool()``, with one schema: that of
    their first lines (:mod:`advcli.read.json_translation`); None where they are to be read by
    Polars with the schema of all their lines."""
    if not all(is_utf8(path) for path in files):
        return None
    read = [prefix_schema(as_pattern(str(path))) for path in files]
    prefixes = [schema for schema in read if schema is not None]
    if len(prefixes) < len(files):
        return None
    try:
        schema = _json_schema(labels, prefixes)
    except AdvcliError:
        return None
    if floats_from_nulls(prefixes, schema):
        return None
    return translate_json_lines(files, schema, spool())


def _spool(spool: Callable[[], Path] | None) -> Callable[[], Path]:
    """``spool``, or where there is none, a call that says an input needs one."""

    def missing() -> Path:
        raise ValueError("reading standard input or a trainer's container needs a spool folder")

    return spool or missing


def _identity_at_open(path: Path, label: str) -> FileIdentity:
    """A file's identity, taken before its header is read: a change after it is then seen."""
    identity = FileIdentity.of(path)
    if identity is None:
        raise AdvcliError(f"{label}: no such file (removed while advcli was starting)")
    return identity


def _check_one_layout(
    labels: Sequence[str], schemas: Sequence[pl.Schema], roles: Sequence[FileRoles | None]
) -> None:
    """Refuse inputs that are two trainers' own dumps, or one trainer's dump beside another
    table, naming the layout of each: their columns would differ for that reason."""
    views = [
        trainer_dump_of(schema, label) if role is None else None
        for schema, label, role in zip(schemas, labels, roles, strict=True)
    ]
    layouts = [view.layout if view is not None else None for view in views]
    other = next((i for i, layout in enumerate(layouts) if layout != layouts[0]), None)
    if other is not None:
        first, second = (layouts[i] or "no trainer's own dump" for i in (0, other))
        raise AdvcliError(
            f"{labels[other]}: {second}, but {labels[0]}: {first}; read one layout's files at "
            "a time"
        )


def _read_as(
    schema: pl.Schema, file_roles: FileRoles | None, label: str
) -> tuple[pl.Schema, FileRoles | None, TrainerDump | None]:
    """The schema the readers see, the roles the files name and the trainer's dump they are
    read as: a file advcli wrote is read as its metadata says; a trainer's own dump
    (:mod:`advcli.read.trainer_dumps`) with the columns its reading makes."""
    view = trainer_dump_of(schema, label) if file_roles is None else None
    if view is None:
        return schema, file_roles, None
    try:
        made = pl.LazyFrame(schema=schema).with_columns(view.columns()).collect_schema()
    except pl.exceptions.PolarsError as error:
        # Polars names the whole expression after the reason: the reason alone says enough.
        reason = first_line(error).split(" (lhs:")[0]
        if isinstance(error, pl.exceptions.StructFieldNotFoundError):
            reason = f"no field '{reason}'"
        raise AdvcliError(
            f"{label}: its fields are not of the types {view.trainer} writes, so advcli cannot "
            f"read it as {view.layout} ({reason})"
        ) from None
    return made, view.roles, view


def _read_header(
    path: Path, source: str, label: str, input_format: InputFormat
) -> tuple[int, pl.Schema, FileRoles | None]:
    """A file's row count, schema and the roles its advcli metadata names (Parquet only),
    without reading its data where the format allows (``source``: the name Polars and Arrow
    open it by)."""
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
            schema = _polars_schema(arrow_schema)
            return metadata.num_rows, schema, read_file_roles(metadata.metadata, schema, label)
        if input_format == "arrow_stream":
            # Memory-mapped: counting the rows reads the batches' headers, not their data.
            with pa.memory_map(source) as mapped:
                reader = pa.ipc.open_stream(mapped)
                _check_arrow_types(reader.schema, label)
                num_rows = sum(batch.num_rows for batch in reader)
            return num_rows, _polars_schema(reader.schema), None
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
        return frame.select(pl.len()).collect().item(), frame.collect_schema(), None
    except AdvcliError:
        raise
    except PermissionError as error:
        raise AdvcliError(f"{label}: cannot read the file ({error.strerror})") from None
    except (pa.ArrowException, OSError, pl.exceptions.PolarsError) as error:
        if input_format == "json":
            bad_line = first_bad_line(path)
            if bad_line is not None:
                raise AdvcliError(f"{label} {bad_line}") from None
        kind = kind if input_format == "arrow_stream" else f"{kind} file"
        raise AdvcliError(f"{label}: not a readable {kind} ({first_line(error)})") from None


def _polars_schema(arrow_schema: pa.Schema) -> pl.Schema:
    """Polars' schema of an Arrow schema, with signals held: Polars builds its types by calling
    back into Python, and a Ctrl-C raised inside that call is a panic, not an interrupt."""
    # Not arrow_schema.empty_table(): that imports pandas (half a second) for nothing.
    empty = pa.Table.from_batches([], schema=arrow_schema)
    with held():
        return pl.DataFrame(empty).schema


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


def _json_schema(files: Sequence[str], schemas: Sequence[pl.Schema]) -> pl.Schema:
    """One schema for JSON-lines files whose types differ only where a file holds nothing but
    nulls (a field null on every line of one step, ``[]`` for a list): the other file's type
    stands there, and a struct takes the fields of each (a writer may leave out a null field).
    Files whose columns differ, or whose types differ otherwise, are the schemas' conflict."""
    _check_schemas_agree(files, [pl.Schema(dict.fromkeys(schema, pl.Null)) for schema in schemas])
    merged = dict(schemas[0])
    for path, schema in zip(files[1:], schemas[1:], strict=True):
        for name, dtype in schema.items():
            unified = _unified(merged[name], dtype)
            if unified is None:
                raise AdvcliError(
                    f"schemas conflict: column '{name}' is {merged[name]} in {files[0]} but "
                    f"{dtype} in {path}"
                )
            merged[name] = unified
    return pl.Schema(merged)


def _unified(one: Any, other: Any) -> Any:
    """The type of a JSON field read as ``one`` in a file and ``other`` in another, where
    nulls alone account for the difference; None where they conflict."""
    if one == other:
        return one
    if one == pl.Null:
        return other
    if other == pl.Null:
        return one
    if isinstance(one, pl.List) and isinstance(other, pl.List):
        inner = _unified(one.inner, other.inner)
        return None if inner is None else pl.List(inner)
    if isinstance(one, pl.Struct) and isinstance(other, pl.Struct):
        fields = {field.name: field.dtype for field in one.fields}
        for field in other.fields:
            if field.name in fields:
                unified = _unified(fields[field.name], field.dtype)
                if unified is None:
                    return None
                fields[field.name] = unified
            else:
                fields[field.name] = field.dtype
        return pl.Struct(fields)
    return None


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


def _check_roles_agree(files: Sequence[str], roles: Sequence[FileRoles | None]) -> None:
    """The files' advcli metadata say the same of their columns (or none has any): read as one
    batch, the files are read with one set of roles."""
    for path, file_roles in zip(files[1:], roles[1:], strict=True):
        if file_roles != roles[0]:
            said = "; ".join(
                f"{name}: {', '.join(f'{c} {r}' for c, r in held.columns) if held else 'none'}"
                for name, held in ((files[0], roles[0]), (path, file_roles))
            )
            raise AdvcliError(
                f"the files' advcli metadata name different roles for their columns ({said}); "
                "read each file on its own"
            )

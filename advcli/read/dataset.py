"""The input files of one format read as one table (:class:`Dataset`), and what tells that each
is still the file that was opened (:class:`FileIdentity`)."""

from __future__ import annotations

import bisect
import contextlib
import glob
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from advcli.errors import AdvcliError, InputChanged, first_line
from advcli.names import NativeNames, shown_path
from advcli.read.file_roles import FileRoles
from advcli.read.formats import InputFormat
from advcli.read.scan import ScannedFile, closing_sources, scan_arrow_stream, scan_parquet
from advcli.read.step_files import numbered_steps, steps_in_folder
from advcli.read.trainer_dumps import TrainerDump

GLOB_CHARS = frozenset("*?[")


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
class StepRows:
    """The ``rows`` of one value of a column (a part of ``compare --by COLUMN``): those
    numbered ``start`` to ``stop`` (row numbers across the inputs, ``stop`` excluded), or,
    where rows of other values lie between (:attr:`interleaved`), those of them that hold
    ``value``."""

    column: str
    value: Any
    start: int
    stop: int
    rows: int

    @property
    def interleaved(self) -> bool:
        return self.rows < self.stop - self.start

    def holds(self) -> pl.Expr:
        """Whether a row holds the value (a Categorical or Enum column's values as text)."""
        column = pl.col(self.column)
        if isinstance(self.value, str):
            column = column.cast(pl.String)
        holds: pl.Expr = column == self.value
        return holds


@dataclass(frozen=True)
class Dataset:
    """Input files of one format read as one table, rows numbered across files in the order
    given. ``labels`` name the files in messages (``<stdin>`` for standard input); ``folders``
    are the directories among the inputs (:func:`input_folders`); ``identities`` are the
    files' identities when they were opened (:meth:`check_unchanged`; where JSON lines were
    translated, their own files'). With ``step`` the dataset is those rows only
    (:meth:`rows`), still numbered as among every input's, and its messages name the value."""

    files: tuple[Path, ...]
    schema: pl.Schema
    row_counts: tuple[int, ...]
    input_format: InputFormat = "parquet"
    labels: tuple[str, ...] = ()
    folders: tuple[Path, ...] = ()
    # What Polars and Arrow open each file by (see NativeNames); the paths themselves if None.
    native: NativeNames | None = field(default=None, compare=False, repr=False)
    identities: tuple[FileIdentity, ...] = ()
    step: StepRows | None = None
    # The roles of the columns, as the files' advcli metadata names them (write_batch's files)
    # or as a trainer's own dump is read (``view``).
    file_roles: FileRoles | None = None
    # A trainer's own dump read in advcli's layout: its made columns are in ``schema`` (last)
    # and in every scan, never in what the files hold (:attr:`stored_schema`).
    view: TrainerDump | None = None
    # What each file was translated from (a trainer's container: :mod:`advcli.read.containers`),
    # the paths the user has; empty where the files are the inputs themselves.
    origins: tuple[Path, ...] = ()
    # What those were ("rLLM episode files"), for the reports.
    container: str | None = None
    # The format of the ``origins`` where they are tables read into ``files`` (JSON lines:
    # :mod:`advcli.read.json_translation`); None where the inputs are read as they are.
    translated_from: InputFormat | None = None
    # What the reading says of the ``folders``' files that are not read (a config beside the
    # step files), from the listing the inputs were found in.
    unread: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[Path, ...]:
        """The inputs as the user has them: each file, or what it was translated from."""
        return self.origins or self.files

    @property
    def given_format(self) -> InputFormat:
        """The format of the inputs the user gave (of what ``files`` were translated from)."""
        return self.translated_from or self.input_format

    @property
    def num_rows(self) -> int:
        """The rows of every input (a ``step``'s dataset's too)."""
        return sum(self.row_counts)

    @property
    def stored_schema(self) -> pl.Schema:
        """The columns the files hold (``schema`` less the columns a ``view`` makes)."""
        if self.view is None:
            return self.schema
        return pl.Schema(
            (name, dtype) for name, dtype in self.schema.items() if name not in self.view.made
        )

    def scan(self) -> pl.LazyFrame:
        """The files as one LazyFrame, with the columns a ``view`` makes (see :meth:`_scan`)."""
        frame = self._scan()
        return frame if self.view is None else frame.with_columns(self.view.columns())

    def _scan(self) -> pl.LazyFrame:
        """The files as one LazyFrame (Parquet decoded by Arrow: see :func:`scan_parquet`; an
        Arrow IPC stream, which Polars cannot scan: :func:`scan_arrow_stream`); with ``step``,
        only the rows from its start to its stop (files outside them, and Parquet row groups
        around them, are not read; :meth:`rows` keeps the value's alone). It may read a file
        through a descriptor the dataset holds (:class:`~advcli.names.NativeNames`): keep the
        dataset until the query has run."""
        files = [self.source(index) for index in range(len(self.files))]
        if self.input_format in ("json", "arrow"):
            frame = (
                pl.scan_ndjson([as_pattern(name) for name in files], schema=self.stored_schema)
                if self.input_format == "json"
                else pl.scan_ipc(files, glob=False)
            )
            step = self.step
            return frame if step is None else frame.slice(step.start, step.stop - step.start)
        scanned = [
            ScannedFile(self.source(index), self.label(index), rows)
            for index, rows in enumerate(self.row_counts)
        ]
        if self.step is not None:
            scanned = _windows(scanned, self.step.start, self.step.stop)
        if self.input_format == "arrow_stream":
            return scan_arrow_stream(scanned, self.stored_schema)
        return scan_parquet(scanned, self.stored_schema)

    def column(self, name: str) -> pl.LazyFrame:
        """Column ``name`` of every row, alone. Parquet is scanned by Polars itself here: a read
        of one small column gains nothing from Arrow's decoding of lists, and Polars' own scan
        streams it in small pieces (through the Arrow source a large dump's column was held
        whole, several times over, on its way)."""
        if self.input_format != "parquet" or self.step is not None or self.view is not None:
            return self.scan().select(name)
        return pl.concat(
            pl.scan_parquet(self.source(index), glob=False).select(name)
            for index in range(len(self.files))
        )

    def rows(self, row_number: str | None = None) -> pl.LazyFrame:
        """The dataset's rows (``step``'s alone, if it is set), with each row's number among
        every input's in a column ``row_number`` if one is named."""
        rows = self.scan()
        if row_number is not None:
            rows = rows.with_row_index(row_number, offset=self.step.start if self.step else 0)
        if self.step is not None and self.step.interleaved:
            # After the numbering: the rows between keep their numbers.
            rows = rows.filter(self.step.holds())
        return rows

    def source(self, index: int) -> str:
        """The name Polars and Arrow open file ``index`` by."""
        return self.native.names[index] if self.native else str(self.files[index])

    def read_columns(self, names: Sequence[str], limit: int | None = None) -> pl.DataFrame:
        """The named columns in input order, every row or the first ``limit`` (small columns
        only: ids, flags)."""
        scan = self.rows().select(list(names))
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
        identified = self.origins if self.translated_from else self.files
        for index, (path, identity) in enumerate(zip(identified, self.identities, strict=True)):
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

    def part(self, index: int) -> Dataset:
        """File ``index`` alone, as a dataset of its own (``compare --by file`` one part at a
        time): its label, format and identity at open are the whole dataset's."""
        labels = self.labels[index : index + 1]
        files = self.files[index : index + 1]
        return Dataset(
            files,
            self.schema,
            self.row_counts[index : index + 1],
            self.input_format,
            labels,
            identities=self.identities[index : index + 1],
            native=NativeNames(files, labels or [shown_path(files[0])]),
            file_roles=self.file_roles,
            view=self.view,
            origins=self.origins[index : index + 1],
            container=self.container,
            translated_from=self.translated_from,
        )

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else shown_path(self.files[index])

    def file_steps(self) -> list[int] | list[str]:
        """How a run's series names each file (``--by file``): its step where the files' names
        say one (:mod:`advcli.read.step_files`: within the one folder given, each name's
        number; else the number the paths differ in), else its label."""
        labels = [self.label(index) for index in range(len(self.files))]
        folder = self.folders[0] if len(self.folders) == 1 else None
        if folder is not None and all(folder in path.parents for path in self.inputs):
            steps = steps_in_folder([str(path.relative_to(folder)) for path in self.inputs])
        else:
            steps = numbered_steps(labels)
        return steps or labels

    def describe(self) -> str:
        """The inputs in one phrase, for messages (and a ``step``'s value)."""
        first = self.label(0)
        inputs = first if len(self.files) == 1 else f"{first} (and {len(self.files) - 1} more)"
        return inputs + self._value()

    def locate(self, row: int) -> str:
        """Name a global row number as ``file row k`` (k counted from 0 within that file; a
        ``step``'s value after it)."""
        file_number = self.file_of(row)
        start = sum(self.row_counts[:file_number])
        where = f"{self.label(file_number)} row {row - start}"
        source = self.view.row_source if self.view is not None else None
        if source is not None:
            # A translation's row (an rLLM folder's): named by the trainer's file it came from.
            name = pl.scan_parquet(self.source(file_number)).select(source)
            found = name.slice(row - start, 1).collect().item()
            where = f"{self.label(file_number)}/{found} (row {row - start} of the folder's)"
        return where + self._value()

    def _value(self) -> str:
        return "" if self.step is None else f" ({self.step.column}={self.step.value!r})"


def _windows(files: list[ScannedFile], start: int, stop: int) -> list[ScannedFile]:
    """The files that hold rows ``start`` to ``stop`` (numbered across them), each to be read
    from its first such row to its last."""
    windows, first = [], 0
    for file in files:
        if first < stop and start < first + file.rows:
            end = stop - first if stop - first < file.rows else None
            windows.append(replace(file, start=max(start - first, 0), stop=end))
        first += file.rows
    return windows


def as_pattern(name: str) -> str:
    """A file name as a glob pattern that matches only that file, for Polars' JSON reader, which
    reads every name as a pattern (``step[1].jsonl`` would match no file, ``a*.jsonl`` others)."""
    return glob.escape(name) if GLOB_CHARS & set(name) else name

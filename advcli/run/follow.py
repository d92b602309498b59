"""``advcli watch DIR`` (and ``compare DIR --by file --follow``): each step file of a folder
reported as it appears, while the trainer writes them.

A file is taken once it is complete: at once when advcli published it whole (``write_batch``, or
any advcli output, renamed into place with a mark of its size and modification time:
:func:`advcli.write.atomic.published_whole`), else once its size and modification time have not
changed for ``settle`` seconds. Each step is what a step reader makes of the file alone: its
``compare --by file`` entry (bit for bit the entry of a whole-folder run,
:func:`advcli.report.by_step.by_step`; :func:`compare_step`) or its ``audit --by file`` entry
(:func:`advcli.run.audit.audit_step`), with how the file was read: every step is read as the
first was, or the watch ends with an error naming both. Each path is reported once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advcli.errors import AdvcliError
from advcli.names import shown_path
from advcli.read.alike import ReadAlike
from advcli.read.containers import is_rllm_episode, is_slime_dump
from advcli.read.dataset import Dataset
from advcli.read.inputs import directory_files
from advcli.read.step_files import step_in_name
from advcli.report.by_step import empty_step
from advcli.report.views import steps_of
from advcli.run.loading import check_by, check_engine, opened
from advcli.run.parts import compare_parts
from advcli.settings.config import AdvantageConfig, ColumnNames, Engine
from advcli.write.atomic import PARTIAL_SUFFIX, published_whole

# How often the folder is listed: a step file is reported within this of being complete, and
# a listing of a folder of thousands of files costs milliseconds.
POLL_SECONDS = 0.25


@dataclass
class _Watch:
    """The files not taken yet, each with its last (size, modification time) and since when
    it has held them (monotonic seconds), and the files taken."""

    settle: float
    changing: dict[Path, tuple[tuple[int, int], float]] = field(default_factory=dict)
    taken: set[Path] = field(default_factory=set)
    # The files taken once unchanged for ``settle`` seconds (not published whole), with their
    # (size, modification time) then.
    settled: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def complete(self, folder: Path) -> list[Path]:
        """The files of ``folder`` that are complete now and were not taken before, in the
        order ``compare --by file`` sorts them."""
        now = time.monotonic()
        ready, changing = [], {}
        try:
            listed = directory_files(folder)
        except FileNotFoundError:  # a subfolder removed while it was listed: list it again
            return []
        for path in listed:
            if path in self.taken or any(p.endswith(PARTIAL_SUFFIX) for p in path.parts):
                continue
            try:
                info = path.stat()
            except FileNotFoundError:  # replaced or removed since the listing
                continue
            state = (info.st_size, info.st_mtime_ns)
            last = self.changing.get(path)
            since = last[1] if last is not None and last[0] == state else now
            if published_whole(path):
                ready.append(path)
            elif now - since >= self.settle:
                ready.append(path)
                self.settled[path] = state
            else:
                changing[path] = (state, since)
        # A file removed before it settled is forgotten.
        self.changing = changing
        self.taken.update(ready)
        return ready

    def written_since(self, path: Path) -> bool:
        """Whether ``path``, taken once it settled, has changed since: it was still being
        written (its writer paused longer than ``settle``), so it is watched again."""
        taken = self.settled.get(path)
        try:
            info = path.stat()
        except FileNotFoundError:
            return False
        if taken is None or (info.st_size, info.st_mtime_ns) == taken:
            return False
        self.taken.discard(path)
        return True


class _Unreadable(AdvcliError):
    """A step file that could not be opened as data (a half-written one among them)."""


# What a watch makes of one step file (opened, named by its step label), every step read as
# the watch's first (the ReadAlike): its JSON line, with how it was read (``reading``, None
# for a file without rows).
StepReader = Callable[[Dataset, Any, ReadAlike], dict[str, Any]]


def compare_step(
    config: AdvantageConfig = AdvantageConfig(),
    names: ColumnNames = ColumnNames(),
    drop_duplicates: bool = False,
) -> StepReader:
    """``watch``'s reading of a step: its ``compare --by file`` entry, compared alone (a file
    without rows keeps its place with no figures and no reading, as in a whole-folder run).
    What a step's compare would refuse is refused here, before the first step."""
    check_engine(Engine.LOCAL, None, config, compare=True, by="file")

    def read(dataset: Dataset, label: Any, reading: ReadAlike) -> dict[str, Any]:
        if dataset.num_rows == 0:
            return {**empty_step(label), "reading": None}
        check_by(dataset, "file")
        # A step's entry lists no groups or trajectories: the top kept is one of each.
        report = compare_parts(dataset, "file", config, names, 1, drop_duplicates, reading=reading)
        step = steps_of(report.summary)[0]
        return {**step, "step": label, "reading": report.summary["settings"]["reading"]}

    return read


def _step(path: Path, folder: Path, read: StepReader, reading: ReadAlike) -> dict[str, Any]:
    """The step file ``path`` as ``read`` makes it, named by its step where its name within
    ``folder`` says one, as in a whole-folder run; a file that cannot be opened as data is
    :class:`_Unreadable`."""
    with contextlib.ExitStack() as stack:
        try:
            # A slime step's train file is written after its rollout file: not read here.
            dataset = stack.enter_context(opened([str(path)], empty_ok=True, train_files=False))
        except AdvcliError as error:
            raise _Unreadable(str(error)) from None
        said = step_in_name(os.path.relpath(path, folder))
        return read(dataset, said if said is not None else dataset.label(0), reading)


def follow_steps(
    folder: Path, read: StepReader | None = None, *, settle: float
) -> Iterator[dict[str, Any]]:
    """Each step file of ``folder`` as it is complete (published by advcli, or unchanged for
    ``settle`` seconds), as ``read`` makes it (by default its ``compare --by file`` entry:
    :func:`compare_step`; ``audit``'s: :func:`advcli.run.audit.audit_step`), the ones there
    already first; forever, sleeping :data:`POLL_SECONDS` between listings. A file that cannot
    be read raises :class:`~advcli.errors.AdvcliError` naming it."""
    read = read or compare_step()
    if not folder.is_dir():
        shown = shown_path(folder)
        if not folder.exists():
            raise AdvcliError(f"{shown}: no such folder (a watch takes a folder of step files)")
        raise AdvcliError(f"{shown}: a watch takes a folder of step files; this is not one")
    watch, reading = _Watch(settle), ReadAlike()
    while True:
        for path in watch.complete(folder):
            if is_rllm_episode(path):
                raise AdvcliError(
                    f"{shown_path(folder)}: holds rLLM's episode files, a folder of them a step, "
                    "which a watch does not take (it takes a step a file); compare the "
                    "episodes folder with --by file"
                )
            if is_slime_dump(path) and path.parent.name == "train_data":
                # slime writes a step's train file after its rollout file, which is the step.
                continue
            try:
                step = _step(path, folder, read, reading)
            except _Unreadable as error:
                if watch.written_since(path):
                    continue
                if path not in watch.settled:
                    raise AdvcliError(str(error)) from None
                raise AdvcliError(
                    f"{error} (the file was taken once unchanged for --settle {settle:g} s: "
                    "if it was still being written, a longer --settle waits for it)"
                ) from None
            yield step
        if not folder.is_dir():
            raise AdvcliError(
                f"{shown_path(folder)}: the watched folder was removed (or replaced by a file); "
                "the watch ends"
            )
        time.sleep(POLL_SECONDS)

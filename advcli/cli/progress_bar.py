"""The progress bar on stderr: the stage being worked on and, while the inputs are read, the
rows read of those to read, with an estimate of the time left (:mod:`advcli._runtime.progress`).

Drawn on a terminal only, from :data:`PROGRESS_DELAY_SECONDS` on (a quick run shows none), and
gone when the run ends; nothing in a pipe or with ``--quiet``.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from advcli._runtime.progress import listening
from advcli.cli.consoles import stderr

if TYPE_CHECKING:
    from rich.progress import Progress, Task
    from rich.text import Text

# A run shorter than this draws no bar.
PROGRESS_DELAY_SECONDS = 1.0

Stage = Callable[[str], None]


class _Bar:
    """A rich ``Progress`` of one task a stage: its description the stage, its total the rows
    the stage's scans are to read (None, and a pulsing bar, until one starts), its times the
    stage's."""

    def __init__(self, progress: Progress, first_stage: str) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._task = progress.add_task(first_stage, total=None)
        self._total = 0

    def stage(self, name: str) -> None:
        # A new task: rich's update and reset take a total of None as "unchanged". The stage
        # that ends is drawn as it ended first (its rows all read), if the bar is shown.
        with self._lock:
            if self._progress.live.is_started:
                self._progress.refresh()
            self._progress.remove_task(self._task)
            self._task = self._progress.add_task(name, total=None)
            self._total = 0

    def to_read(self, rows: int) -> None:
        with self._lock:
            self._total += rows
            self._progress.update(self._task, total=self._total)

    def read(self, rows: int) -> None:
        with self._lock:
            self._progress.advance(self._task, rows)


@contextlib.contextmanager
def progress_bar(enabled: bool, first_stage: str) -> Iterator[Stage | None]:
    """Yield a callback that names the stage being worked on (the run's first is
    ``first_stage``) while the bar counts the rows read; yield None where no bar is drawn (not
    ``enabled``: ``--quiet``; stderr not a terminal)."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class RowsColumn(ProgressColumn):
        """``1,234,567 / 2,000,000 rows, 0:00:03 left`` while the stage reads its rows, else
        nothing."""

        def render(self, task: Task) -> Text:
            if task.total is None:
                return Text("")
            left = task.time_remaining
            eta = "" if left is None else f", {datetime.timedelta(seconds=int(left))} left"
            return Text(f"{task.completed:,.0f} / {task.total:,.0f} rows{eta}")

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        RowsColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    bar = _Bar(progress, first_stage)
    timer = threading.Timer(PROGRESS_DELAY_SECONDS, progress.start)
    timer.start()
    try:
        with listening(bar):
            yield bar.stage
    finally:
        timer.cancel()
        progress.stop()

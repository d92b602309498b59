"""A run's step files in the order of their steps, and each named by its step.

Trainers number their step files without padding (``global_step_2``, ``global_step_10``), so
the order of the paths' text puts step 10 before step 2. The paths are ordered with each run of
digits compared as a number. A file's step is the one number of its name within the run's
folder (``step-00000007.parquet``: 7, ``global_step_10/data.parquet``: 10; of several numbers,
the one after ``step``) or, for files named
one by one, the one number in which their paths differ; where names say no step (none, several,
two files the same), the files are named by their paths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

_DIGITS = re.compile(r"(\d+)")
_STEP_NUMBER = re.compile(r"step[_-]?(\d+)", re.IGNORECASE)


def number_order(path: Path | str) -> tuple[tuple[str | int, ...], str]:
    """A sort key: the path's text, each run of digits compared as a number (then the text,
    so that ``step-01`` and ``step-1`` still have an order)."""
    text = str(path)
    pieces = _DIGITS.split(text)
    # The split alternates text and digits, so keys compare text with text, numbers with numbers.
    return tuple(int(piece) if index % 2 else piece for index, piece in enumerate(pieces)), text


def step_in_name(name: str) -> int | None:
    """The step a file's name within its run's folder says: its one number
    (``global_step_10/data.parquet``: 10), or of several the one after ``step``
    (rLLM's ``train_step_3_epoch_1``: 3); None where it says none or several."""
    numbers = _DIGITS.findall(name)
    if len(numbers) == 1:
        return int(numbers[0])
    named = _STEP_NUMBER.findall(name)
    return int(named[0]) if len(named) == 1 else None


def numbered_steps(names: Sequence[str]) -> list[int] | None:
    """Each file's step, from paths named one by one (not within a folder): the one number in
    which the names differ, where they are alike but for it and no two share it; None where the
    names say no step."""
    if len(names) < 2:
        return None
    pieces = [_DIGITS.split(name) for name in names]
    if len({len(split) for split in pieces}) > 1:
        return None
    if any(len({split[i] for split in pieces}) > 1 for i in range(0, len(pieces[0]), 2)):
        return None
    differing = [
        i for i in range(1, len(pieces[0]), 2) if len({int(split[i]) for split in pieces}) > 1
    ]
    if len(differing) != 1:
        return None
    return _distinct([int(split[differing[0]]) for split in pieces])


def steps_in_folder(names: Sequence[str]) -> list[int] | None:
    """Each file's step from its name within the run's folder (:func:`step_in_name`), where
    every name says one and no two the same."""
    steps = [step_in_name(name) for name in names]
    if any(step is None for step in steps):
        return None
    return _distinct([step for step in steps if step is not None])


def _distinct(steps: list[int]) -> list[int] | None:
    return steps if len(set(steps)) == len(steps) else None

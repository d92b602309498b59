"""Trainers' dumps that are not tables, translated into one: rLLM's folder of episode files (one
pretty-printed JSON object each, its trajectories' steps nested inside).

Each input (a folder of one step's episode files) is translated once, one file at a time, into a
Parquet file in a spool folder the caller removes, one row per step, its columns named by the
trainer's fields (``trajectories.reward``: a trajectory's ``reward``). A trainer's dump view
(:mod:`advcli.read.trainer_dumps`) then reads that file as it reads any other; what the
translation keeps is every field the reading needs and the ids that name a row.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from advcli.errors import AdvcliError
from advcli.names import shown_path

# rLLM's EpisodeLogger (rllm/utils/episode_logger.py) names each episode's file
# episode_hash{first 8 hex digits of the task's sha256}_id{episode id}.json.
RLLM_EPISODE = re.compile(r"episode_hash[0-9a-f]{8}_id.*\.json")
# The folder of one step's episodes: {mode}_step_{step}_epoch_{epoch}, mode train or val.
RLLM_TRAINING_FOLDER = re.compile(r"train_step_\d+_epoch_\d+")
# How many rows a translation holds before it writes them out.
SPOOL_ROWS = 1 << 16

RLLM_SCHEMA = pa.schema(
    [
        ("training_step", pa.int64()),
        ("epoch", pa.int64()),
        ("episode_id", pa.string()),
        ("termination_reason", pa.string()),
        ("is_correct", pa.bool_()),
        ("trajectories.name", pa.string()),
        ("trajectories.uid", pa.string()),
        ("trajectories.reward", pa.float64()),
        # The step's place in its trajectory's steps; null for a trajectory with no step.
        ("steps:index", pa.int64()),
        ("steps.reward", pa.float64()),
        ("steps.done", pa.bool_()),
    ]
)


@dataclass(frozen=True)
class Translated:
    """The inputs as they are read: ``files`` (a container's translation in place of it), each
    one's ``label`` and ``origin``, the path the user has (the file itself where it is one)."""

    files: tuple[Path, ...]
    labels: tuple[str, ...]
    origins: tuple[Path, ...]
    # What each input is where it was translated (None where it was not).
    containers: tuple[str | None, ...]

    @property
    def any(self) -> bool:
        return self.files != self.origins


def is_rllm_episode(path: Path) -> bool:
    """Whether ``path`` is named as rLLM names an episode's file."""
    return RLLM_EPISODE.fullmatch(path.name) is not None


def translated(files: Sequence[Path], spool: Callable[[], Path]) -> Translated:
    """The inputs with each container translated into a file in ``spool()`` (called only where
    one is): rLLM's episode files, one input for each folder of them."""
    out_files: list[Path] = []
    labels: list[str] = []
    origins: list[Path] = []
    containers: list[str | None] = []
    folder: Path | None = None
    for parent, run in groupby(files, key=_episode_folder):
        if parent is None:
            for path in run:
                out_files.append(path)
                labels.append(shown_path(path))
                origins.append(path)
                containers.append(None)
            continue
        if parent in origins:
            raise AdvcliError(
                f"{shown_path(parent)}: its episode files are given apart, with other inputs "
                "between them; give the folder, or its files together"
            )
        folder = folder or spool()
        target = folder / f"{len(out_files)}.parquet"
        _translate_rllm(list(run), target)
        out_files.append(target)
        labels.append(shown_path(parent))
        origins.append(parent)
        containers.append("rLLM episode files")
    return Translated(tuple(out_files), tuple(labels), tuple(origins), tuple(containers))


def _episode_folder(path: Path) -> Path | None:
    """The folder of an rLLM episode file, whose files are read as one input; None for a file
    that is not one."""
    return path.parent if is_rllm_episode(path) else None


def _translate_rllm(episodes: Sequence[Path], target: Path) -> None:
    """rLLM's episode files (one folder's) as one table of steps in ``target``: a row for each
    step of each trajectory, and one for a trajectory with no step (which rLLM leaves out)."""
    with pq.ParquetWriter(target, RLLM_SCHEMA) as writer:
        rows: dict[str, list[Any]] = {name: [] for name in RLLM_SCHEMA.names}
        for path in episodes:
            _episode_rows(_episode(path), shown_path(path), rows)
            if len(rows["episode_id"]) >= SPOOL_ROWS:
                writer.write_table(pa.table(rows, schema=RLLM_SCHEMA))
                rows = {name: [] for name in RLLM_SCHEMA.names}
        writer.write_table(pa.table(rows, schema=RLLM_SCHEMA))


def _episode(path: Path) -> dict[str, Any]:
    """One episode file's object (an error naming the file where it is not one)."""
    where = shown_path(path)
    try:
        with path.open(encoding="utf-8") as file:
            episode = json.load(file)
    except json.JSONDecodeError as error:
        raise AdvcliError(
            f"{where}: not an rLLM episode file (not JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno})"
        ) from None
    except UnicodeDecodeError as error:
        raise AdvcliError(f"{where}: byte {error.start}: not UTF-8 text") from None
    except OSError as error:
        raise AdvcliError(f"{where}: cannot read the file ({error.strerror})") from None
    if not isinstance(episode, dict):
        raise AdvcliError(f"{where}: not an rLLM episode file (not one JSON object)")
    return episode


def _episode_rows(episode: dict[str, Any], where: str, rows: dict[str, list[Any]]) -> None:
    """Append an episode's rows (a step each) to ``rows``, its fields checked as read."""
    fields = {
        "training_step": _value(episode, "training_step", int, where),
        "epoch": _value(episode, "epoch", int, where),
        "episode_id": _value(episode, "episode_id", str, where, required=True),
        "termination_reason": _value(episode, "termination_reason", str, where),
        "is_correct": _value(episode, "is_correct", bool, where),
    }
    for t, trajectory in enumerate(_items(episode, "trajectories", where)):
        at = f"{where}: trajectories[{t}]"
        if not isinstance(trajectory, dict):
            raise AdvcliError(f"{at} is not a JSON object")
        fields["trajectories.name"] = _value(trajectory, "name", str, at, required=True)
        fields["trajectories.uid"] = _value(trajectory, "uid", str, at, required=True)
        fields["trajectories.reward"] = _value(trajectory, "reward", float, at)
        steps = _items(trajectory, "steps", at)
        for s, step in enumerate(steps or [None]):
            if step is not None and not isinstance(step, dict):
                raise AdvcliError(f"{at}.steps[{s}] is not a JSON object")
            step_at = f"{at}.steps[{s}]"
            fields["steps:index"] = s if step is not None else None
            fields["steps.reward"] = _value(step or {}, "reward", float, step_at)
            fields["steps.done"] = _value(step or {}, "done", bool, step_at)
            for name, value in fields.items():
                rows[name].append(value)


_KINDS = {int: "an integer", str: "a string", bool: "true or false", float: "a number"}


def _value(obj: dict[str, Any], name: str, kind: type, where: str, required: bool = False) -> Any:
    """Field ``name`` of ``obj`` where it is of ``kind`` (a number for float: an integer too),
    None where it is null or absent unless ``required``; an error naming it otherwise."""
    value = obj.get(name)
    if value is None:
        if required:
            raise AdvcliError(f"{where}: no '{name}', which rLLM writes and advcli reads")
        return None
    fits = (
        isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    )
    if not fits:
        raise AdvcliError(f"{where}: '{name}' is {json.dumps(value)[:40]}, not {_KINDS[kind]}")
    if kind is not float:
        return value
    number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(number):
        raise AdvcliError(f"{where}: '{name}' is {json.dumps(value)[:40]}, not a finite number")
    return number


def _items(obj: dict[str, Any], name: str, where: str) -> Iterable[Any]:
    """List field ``name`` of ``obj`` (none where it is null or absent)."""
    value = obj.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AdvcliError(f"{where}: '{name}' is not a list")
    return value

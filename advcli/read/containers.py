"""Trainers' dumps that are not tables, translated into one: rLLM's folder of episode files (one
pretty-printed JSON object each, its trajectories' steps nested inside), slime's torch files
(plain dicts of samples, read with ``torch.load(weights_only=True)``) and SkyRL's pickled batch
(read by an unpickler that knows three stand-in names): a dump never runs code.

Each input (a folder of one step's episode files; a slime step's rollout file with its train
file; a SkyRL pickle) is translated once, one file at a time, into a Parquet file in a spool
folder the caller removes, a row for each step (rLLM), sample (slime) or batch row (SkyRL), its
columns named by the trainer's fields (``trajectories.reward``: a trajectory's ``reward``). A
trainer's dump view (:mod:`advcli.read.trainer_dumps`) then reads that file as it reads any
other; what the translation keeps is every field the reading needs and the ids that name a row.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import pickle
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from advcli.errors import AdvcliError, first_line
from advcli.names import shown_path

# rLLM's EpisodeLogger (rllm/utils/episode_logger.py) names each episode's file
# episode_hash{first 8 hex digits of the task's sha256}_id{episode id}.json.
RLLM_EPISODE = re.compile(r"episode_hash[0-9a-f]{8}_id.*\.json")
# The folder of one step's episodes: {mode}_step_{step}_epoch_{epoch}, mode train or val.
RLLM_TRAINING_FOLDER = re.compile(r"train_step_\d+_epoch_\d+")
# slime's --dump-details DIR: rollout_data/{rollout id}.pt, the samples as generated and scored
# (slime/observability/rollout_data_utils.py), and train_data/{rollout id}.pt, the same samples
# as trained on (train_data_utils.py); eval_{id}.pt files are evaluations.
SLIME_DUMP = re.compile(r"(rollout|train)_data/\d+\.pt")

SLIME_SCHEMA = pa.schema(
    [
        ("rollout_data.rollout_id", pa.int64()),
        ("group_index", pa.int64()),
        ("index", pa.int64()),
        ("reward", pa.float64()),
        ("response_length", pa.int64()),
        ("loss_mask", pa.list_(pa.int64())),
        ("status", pa.string()),
        ("remove_sample", pa.bool_()),
        # From the train file beside it, by each sample's rollout_position: its
        # group-normalized reward (null without a train file).
        ("train_data.rewards", pa.float64()),
    ]
)
# SkyRL's trainer.dump_data_batch: {export_path}/dumped_data/global_step_{N}_training_input.pkl,
# a pickled TrainingInputBatch (skyrl/train/trainer.py, dump_data).
SKYRL_BATCH = re.compile(r"global_step_(\d+)_training_input\.pkl")
_SKYRL_MODULE = "skyrl.backends.skyrl_train.training_batch"
SKYRL_SCHEMA = pa.schema(
    [
        # The N of the file's name: its groups are its own (their ranges restart every step).
        ("global_step", pa.int64()),
        # The row's range among the metadata's policy_prompt_boundaries (null on a pad row).
        ("policy_prompt_boundaries", pa.int64()),
        ("loss_mask:tokens", pa.int64()),
        # The row's advantage: its value on the first response token (null where it has none).
        ("advantages:first", pa.float64()),
        # The metadata's pad_size last rows, copies SkyRL adds to fill the data-parallel ranks.
        ("pad_size:padding", pa.bool_()),
    ]
)
RLLM_EPISODES = "rLLM episode files"
SLIME_DUMPS = "slime dump files"
SKYRL_BATCHES = "SkyRL training input pickles"
# How many rows a translation holds before it writes them out.
SPOOL_ROWS = 1 << 16

RLLM_SCHEMA = pa.schema(
    [
        # The name of the episode's file in its folder, which errors name.
        ("episode_file", pa.string()),
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


def is_rllm_episode(path: Path) -> bool:
    """Whether ``path`` is named as rLLM names an episode's file."""
    return RLLM_EPISODE.fullmatch(path.name) is not None


@dataclass(frozen=True)
class Unit:
    """One input as it is read: ``path`` (a file, an rLLM step's folder, a slime step's rollout
    file), what it is (``container``, None for a table) and the files it is read from."""

    path: Path
    container: str | None
    members: tuple[Path, ...]


def input_units(files: Sequence[Path]) -> list[Unit]:
    """The inputs ``files`` make: rLLM's episode files one for each folder of them; slime's
    dump files one for each rollout id (its rollout file with its train file); any other file
    (a SkyRL pickle too) one each. Nothing is read."""
    units: dict[Path, tuple[str | None, list[Path]]] = {}
    for path in files:
        unit, container = _unit_of(path)
        units.setdefault(unit, (container, []))[1].append(path)
    return [Unit(path, kind, tuple(members)) for path, (kind, members) in units.items()]


def translated(
    units: Sequence[Unit], spool: Callable[[], Path], *, train_files: bool = True
) -> tuple[Path, ...]:
    """The files the inputs are read from: each table itself, each container translated into a
    file in ``spool()`` (called only where one is). ``train_files``: slime's train file is read
    beside its rollout file (a watch, which takes a step as its rollout file appears, reads
    none: it may be half-written)."""
    files: list[Path] = []
    folder: Path | None = None
    for index, unit in enumerate(units):
        if unit.container is None:
            files.append(unit.path)
            continue
        folder = folder or spool()
        target = folder / f"{index}.parquet"
        if unit.container == RLLM_EPISODES:
            _translate_rllm(unit.members, target)
        elif unit.container == SLIME_DUMPS:
            _translate_slime(unit.path, target, train_files)
        else:
            _translate_skyrl(unit.path, target)
        files.append(target)
    return tuple(files)


def _unit_of(path: Path) -> tuple[Path, str | None]:
    """The input a file is read as part of, and what that input is: an rLLM episode's folder,
    a slime file's rollout file, any other file itself (None)."""
    if is_rllm_episode(path):
        return path.parent, RLLM_EPISODES
    if is_slime_dump(path):
        return _slime_rollout(path), SLIME_DUMPS
    if is_skyrl_batch(path):
        return path, SKYRL_BATCHES
    return path, None


def _translate_rllm(episodes: Sequence[Path], target: Path) -> None:
    """rLLM's episode files (one folder's) as one table of steps in ``target``: a row for each
    step of each trajectory, and one for a trajectory with no step (which rLLM leaves out)."""
    with pq.ParquetWriter(target, RLLM_SCHEMA) as writer:
        rows: dict[str, list[Any]] = {name: [] for name in RLLM_SCHEMA.names}
        for path in episodes:
            _episode_rows(_episode(path), shown_path(path), rows, path.name)
            if len(rows["episode_id"]) >= SPOOL_ROWS:
                writer.write_table(pa.table(rows, schema=RLLM_SCHEMA))
                rows = {name: [] for name in RLLM_SCHEMA.names}
        writer.write_table(pa.table(rows, schema=RLLM_SCHEMA))


def is_slime_dump(path: Path) -> bool:
    """Whether ``path`` is named as slime's --dump-details names a training step's file."""
    return SLIME_DUMP.fullmatch(f"{path.parent.name}/{path.name}") is not None


def _slime_rollout(path: Path) -> Path:
    """The rollout file of a slime dump's file: itself, or its train file's sibling."""
    return path.parent.parent / "rollout_data" / path.name


def _translate_slime(rollout: Path, target: Path, with_train: bool) -> None:
    """slime's rollout file (with its train file, where there is one) as a table of samples in
    ``target``."""
    label = shown_path(rollout)
    if not rollout.exists():
        raise AdvcliError(
            f"{label}: no such file, which holds the groups and rewards of the train file beside "
            "it (slime's train_data holds neither); give the --dump-details folder"
        )
    payload = _torch_load(rollout)
    samples = payload.get("samples") if isinstance(payload, dict) else None
    if not isinstance(samples, list) or "rollout_id" not in payload:
        raise AdvcliError(
            f"{label}: not slime's rollout dump (a dict of 'rollout_id' and 'samples', the "
            "samples' dicts)"
        )
    step = _value(payload, "rollout_id", int, label, required=True)
    columns: dict[str, list[Any]] = {name: [] for name in SLIME_SCHEMA.names}
    rollouts: dict[int, int] = {}  # each sample's own rollout_id, and its first sample
    for number, sample in enumerate(samples):
        where = f"{label}: samples[{number}]"
        if not isinstance(sample, dict):
            raise AdvcliError(f"{where} is not a dict")
        own = _value(sample, "rollout_id", int, where)
        if own is not None and rollouts.setdefault(own, number) != number:
            raise AdvcliError(
                f"{where}: its 'rollout_id' {own} is samples[{rollouts[own]}]'s too: a compact "
                "rollout, several samples slime counts as one trajectory, which advcli does not "
                "read (it reads a sample a trajectory)"
            )
        reward = sample.get("reward")
        if isinstance(reward, dict):
            raise AdvcliError(
                f"{where}: 'reward' holds several rewards ({', '.join(map(str, reward))}), of "
                "which slime trains on the one --reward-key names; advcli reads one number"
            )
        columns["rollout_data.rollout_id"].append(step)
        columns["group_index"].append(_value(sample, "group_index", int, where, required=True))
        columns["index"].append(_value(sample, "index", int, where))
        columns["reward"].append(_value(sample, "reward", float, where))
        columns["response_length"].append(_value(sample, "response_length", int, where))
        columns["loss_mask"].append(_int_list(sample, "loss_mask", where))
        columns["status"].append(_value(sample, "status", str, where))
        columns["remove_sample"].append(_value(sample, "remove_sample", bool, where))
    train = rollout.parent.parent / "train_data" / rollout.name
    # Beside it, whatever the inputs named; a step without one (a run stopped before it
    # trained, or a watch that took the step before it) has none of slime's advantages.
    columns["train_data.rewards"] = (
        _slime_train_rewards(train, len(samples))
        if train.exists() and with_train
        else [None] * len(samples)
    )
    pq.write_table(pa.table(columns, schema=SLIME_SCHEMA), target)


def _slime_train_rewards(path: Path, count: int) -> list[float | None]:
    """Each rollout sample's ``rewards`` in slime's train file (by its ``rollout_position``),
    the scalar slime puts on every response token; None for a sample it did not train on."""
    label = shown_path(path)
    payload = _torch_load(path)
    samples = payload.get("samples") if isinstance(payload, dict) else None
    if not isinstance(samples, list) or payload.get("format_version") != 2:
        raise AdvcliError(
            f"{label}: not slime's train dump of format_version 2 (a dict of 'samples', one "
            "dict each), which advcli reads"
        )
    rewards: list[float | None] = [None] * count
    for number, sample in enumerate(samples):
        where = f"{label}: samples[{number}]"
        if not isinstance(sample, dict):
            raise AdvcliError(f"{where} is not a dict")
        position = _value(sample, "rollout_position", int, where, required=True)
        if not 0 <= position < count:
            raise AdvcliError(
                f"{where}: 'rollout_position' is {position}, but the rollout file beside it "
                f"holds {count:,} samples"
            )
        if rewards[position] is not None:  # every one read is a number
            raise AdvcliError(
                f"{where}: 'rollout_position' {position} is an earlier sample's too: each "
                "sample of the rollout file is trained once"
            )
        rewards[position] = _value(sample, "rewards", float, where, required=True)
    return rewards


def _torch_load(path: Path) -> Any:
    """A ``.pt`` file's object, read with ``torch.load(weights_only=True)``: tensors, plain
    containers and numpy's scalars and arrays only, so a dump never runs code."""
    label = shown_path(path)
    if path.stat().st_size == 0:
        raise AdvcliError(f"{label}: the file is empty (0 bytes), not a torch file")
    torch = _torch(label)
    # torch.serialization.safe_globals is torch 2.5's: before it, numpy values are refused.
    allowed = getattr(torch.serialization, "safe_globals", None)
    try:
        with allowed(_numpy_data()) if allowed else contextlib.nullcontext():
            return torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise AdvcliError(f"{label}: {_refusal(error)}") from None
    except Exception as error:  # damaged bytes fail torch.load in many ways (struct, zip, …)
        raise AdvcliError(f"{label}: not a readable torch file ({first_line(error)})") from None


def _numpy_data() -> list[Any]:
    """What numpy's scalars and arrays pickle as (data, no code): a sample's reward is often a
    numpy float."""
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1
        multiarray = importlib.import_module("numpy.core.multiarray")
    # Not the object dtype: an object array rebuilt from a file's bytes reads them as pointers.
    dtypes = [type(np.dtype(kind)) for kind in "?bhilqBHILQefdgFDGSU"]
    return [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


def _refusal(error: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, naming what it holds."""
    text = str(error)
    named = re.search(r"Unsupported global: GLOBAL (\S+)|but got <class '([^']+)'>", text)
    # torch's message opens with advice on loading the file unsafely: its reason is later.
    reason = text.partition("WeightsUnpickler error:")[2].split("Check the documentation")[0]
    why = (
        f"it names {named.group(1) or named.group(2)}, which torch.load(weights_only=True) "
        "does not load"
        if named
        else "torch.load(weights_only=True) refuses it "
        f"({(' '.join(reason.split()) or first_line(error))[:160]})"
    )
    return (
        f"{why}; advcli reads only tensors, plain containers and numpy values from a torch "
        "file, and never runs a dump's code"
    )


def _torch(label: str) -> Any:
    """torch, imported where a dump needs it (``advcli --help`` never does)."""
    try:
        import torch
    except ImportError:
        raise AdvcliError(f"{label}: reading it needs torch: pip install 'advcli[torch]'") from None
    return torch


def _int_list(obj: dict[str, Any], name: str, where: str) -> list[int] | None:
    """List field ``name`` of integers (a tensor's too); None where it is null or absent."""
    value = obj.get(name)
    if value is None:
        return None
    if hasattr(value, "tolist") and not getattr(value, "is_meta", False):
        value = value.tolist()
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise AdvcliError(f"{where}: '{name}' is not a list of integers")
    return value


def is_skyrl_batch(path: Path) -> bool:
    """Whether ``path`` is named as SkyRL's trainer.dump_data_batch names a step's batch."""
    return SKYRL_BATCH.fullmatch(path.name) is not None


class _TrainingInputBatch:
    """Stands in for SkyRL's class in its pickle, which names it as the batch's type."""


def _rebuild_batch(kind: object, state: object) -> object:
    """Stands in for SkyRL's ``_rebuild_tensor_batch``: the batch's state as it is."""
    return state


def _device(*args: object) -> object:
    """Stands in for ``torch.device``: its arguments, which nothing reads."""
    return args


class _SkyrlUnpickler(pickle.Unpickler):
    """An unpickler of SkyRL's batch that builds plain containers only: the three names its
    pickle holds are stand-ins, and any other name is refused before anything of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _SKYRL_NAMES.get((module, name))
        if allowed is None:
            raise _Refused(f"{module}.{name}")
        return allowed


_SKYRL_NAMES: dict[tuple[str, str], Any] = {
    (_SKYRL_MODULE, "_rebuild_tensor_batch"): _rebuild_batch,
    (_SKYRL_MODULE, "TrainingInputBatch"): _TrainingInputBatch,
    ("torch", "device"): _device,
}


class _Refused(Exception):
    """A name in a pickle that advcli does not load."""


def _translate_skyrl(path: Path, target: Path) -> None:
    """SkyRL's pickled training input as a table of its rows in ``target``: each row's prompt
    group, tokens to train on, advantage and whether it is padding."""
    label = shown_path(path)
    state = _skyrl_state(path)
    batch, metadata = state.get("batch_dict"), state.get("metadata")
    size = state.get("batch_size")
    if not isinstance(batch, dict) or not isinstance(metadata, dict) or not isinstance(size, int):
        raise AdvcliError(
            f"{label}: not SkyRL's TrainingInputBatch (its state holds 'batch_dict', "
            "'batch_size' and 'metadata')"
        )
    loss_mask, response_mask, advantages = (
        _skyrl_array(batch, name, size, label)
        for name in ("loss_mask", "response_mask", "advantages")
    )
    if not loss_mask.shape == response_mask.shape == advantages.shape or not size:
        raise AdvcliError(
            f"{label}: its tensors 'loss_mask', 'response_mask' and 'advantages' are not of "
            "one shape of its rows by their response tokens"
        )
    pad = metadata.get("pad_size", 0)
    if not isinstance(pad, int) or not 0 <= pad <= size:
        raise AdvcliError(f"{label}: metadata 'pad_size' is {pad!r}, not a count of its rows")
    groups = _skyrl_groups(metadata.get("policy_prompt_boundaries"), size - pad, label)
    responded = response_mask.astype(bool)
    first = advantages[np.arange(size), responded.argmax(axis=1)].astype(np.float64)
    named = SKYRL_BATCH.fullmatch(path.name)
    assert named is not None  # a file of another name is no SkyRL batch
    step = int(named.group(1))
    table = pa.table(
        {
            "global_step": np.full(size, step, dtype=np.int64),
            "policy_prompt_boundaries": pa.array(
                np.append(groups, np.zeros(pad, np.int64)), mask=np.arange(size) >= size - pad
            ),
            "loss_mask:tokens": loss_mask.sum(axis=1).round().astype(np.int64),
            "advantages:first": pa.array(first, mask=~responded.any(axis=1)),
            "pad_size:padding": np.arange(size) >= size - pad,
        },
        schema=SKYRL_SCHEMA,
    )
    pq.write_table(table, target)


def _skyrl_state(path: Path) -> dict[str, Any]:
    """The state SkyRL pickled its batch with, through :class:`_SkyrlUnpickler`."""
    label = shown_path(path)
    try:
        with path.open("rb") as file:
            state = _SkyrlUnpickler(file).load()
    except _Refused as refused:
        raise AdvcliError(
            f"{label}: the pickle names {refused}, which advcli does not load: a SkyRL batch "
            f"names only {_SKYRL_MODULE}._rebuild_tensor_batch, TrainingInputBatch and "
            "torch.device, and advcli never runs a dump's code"
        ) from None
    except OSError as error:
        raise AdvcliError(f"{label}: cannot read the file ({error.strerror})") from None
    except Exception as error:  # a damaged pickle fails in many ways (frames, opcodes, memo)
        raise AdvcliError(f"{label}: not a readable pickle ({first_line(error)})") from None
    if not isinstance(state, dict):
        raise AdvcliError(
            f"{label}: not SkyRL's TrainingInputBatch pickled by its __reduce__ (SkyRL since "
            "2026-03), which advcli reads"
        )
    return state


def _skyrl_array(batch: dict[str, Any], name: str, rows: int, label: str) -> np.ndarray:
    """Tensor ``name`` of the batch as a [rows, response length] array, from SkyRL's
    serialized form (numpy bytes; torch.save bytes, read with weights_only, for a dtype numpy
    has not)."""
    value = batch.get(name)
    array: np.ndarray
    if not isinstance(value, dict) or "data" not in value:
        raise AdvcliError(f"{label}: the batch holds no tensor '{name}', which advcli reads")
    try:
        if value.get("format") == "torch":
            array = _torch_load_bytes(value["data"], label).float().numpy()
        else:
            array = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
            array = array.reshape(value["shape"])
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as error:
        # torch.load's errors on damaged bytes are RuntimeErrors; bytes of no tensor have
        # no .float().
        reason = first_line(error)[:120]
        raise AdvcliError(f"{label}: tensor '{name}' is not readable ({reason})") from None
    numbers = array.dtype.kind in "biuf"  # bool, integer, unsigned, float
    if array.ndim != 2 or array.shape[0] != rows or not array.shape[1] or not numbers:
        raise AdvcliError(
            f"{label}: tensor '{name}' is {array.dtype} of shape {list(array.shape)}, where "
            f"numbers for the batch's {rows:,} rows of response tokens were expected"
        )
    return array


def _skyrl_groups(boundaries: Any, rows: int, label: str) -> np.ndarray:
    """Each of the first ``rows`` rows' range among ``policy_prompt_boundaries``, the (start,
    end) rows of each prompt's group, which must cover them in order."""
    if not isinstance(boundaries, (list, tuple)) or not boundaries:
        raise AdvcliError(
            f"{label}: the metadata has no 'policy_prompt_boundaries' (SkyRL keeps them since "
            "2026-06), so its prompt groups cannot be told"
        )
    try:
        starts = np.array([bound[0] for bound in boundaries], dtype=np.int64)
        ends = np.array([bound[1] for bound in boundaries], dtype=np.int64)
    except (TypeError, IndexError, KeyError, ValueError):
        starts = ends = np.array([-1])  # not pairs of row numbers: refused below
    if starts.ndim != 1:
        starts = ends = np.array([-1])
    if (
        starts[0] != 0
        or ends[-1] != rows
        or (starts[1:] != ends[:-1]).any()
        or (ends <= starts).any()
    ):
        raise AdvcliError(
            f"{label}: the metadata's 'policy_prompt_boundaries' do not cover its {rows:,} rows "
            "(less its pad_size) one range after another"
        )
    return np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)


def _torch_load_bytes(data: bytes, label: str) -> Any:
    """A tensor SkyRL saved with torch.save into bytes, loaded with weights_only."""
    torch = _torch(label)
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as error:
        raise AdvcliError(f"{label}: a tensor in it: {_refusal(error)}") from None
    except Exception as error:  # damaged bytes fail torch.load in many ways (struct, zip, …)
        raise ValueError(first_line(error)) from None


def _episode(path: Path) -> dict[str, Any]:
    """One episode file's object (an error naming the file where it is not one)."""
    where = shown_path(path)
    try:
        with path.open(encoding="utf-8") as file:
            episode = json.load(file)
    except RecursionError:
        raise AdvcliError(f"{where}: not an rLLM episode file (nested too deep)") from None
    except json.JSONDecodeError as error:
        raise AdvcliError(
            f"{where}: not an rLLM episode file (not JSON: {error.msg.removesuffix(' at')} at "
            f"line {error.lineno} "
            f"column {error.colno})"
        ) from None
    except UnicodeDecodeError as error:
        raise AdvcliError(f"{where}: byte {error.start}: not UTF-8 text") from None
    except OSError as error:
        raise AdvcliError(f"{where}: cannot read the file ({error.strerror})") from None
    if not isinstance(episode, dict):
        raise AdvcliError(f"{where}: not an rLLM episode file (not one JSON object)")
    return episode


def _episode_rows(
    episode: dict[str, Any], where: str, rows: dict[str, list[Any]], name: str
) -> None:
    """Append an episode's rows (a step each) to ``rows``, its fields checked as read (``name``:
    its file's)."""
    fields = {
        "episode_file": name,
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
    """Field ``name`` of ``obj`` where it is of ``kind`` (a number for float: an integer too; a
    numpy scalar or a one-value tensor as its value), None where it is null or absent unless
    ``required``; an error naming it otherwise."""
    value = _plain(obj.get(name))
    if value is None:
        if required:
            raise AdvcliError(f"{where}: no '{name}', which advcli reads")
        return None
    fits = (
        isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    )
    if not fits:
        raise AdvcliError(f"{where}: '{name}' is {_shown(value)}, not {_KINDS[kind]}")
    if kind is int and not -(2**63) <= value < 2**63:
        raise AdvcliError(f"{where}: '{name}' is {_shown(value)}, beyond a 64-bit integer")
    if kind is not float:
        return value
    number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(number):
        raise AdvcliError(f"{where}: '{name}' is {_shown(value)}, not a finite number")
    return number


def _plain(value: Any) -> Any:
    """A numpy scalar or a tensor or array of one value as that value; anything else as it is
    (a tensor of no data, torch's meta device, too: refused as not a number)."""
    if value is None or type(value) in (int, float, str, bool):  # JSON's own, most of all
        return value
    if getattr(value, "is_meta", False):
        return value
    size = getattr(value, "size", None)
    if hasattr(value, "item") and (size == 1 or (callable(size) and value.numel() == 1)):
        return value.item()
    return value


def _shown(value: Any) -> str:
    """A value as a message shows it: its JSON, or for what JSON has not, its repr (shortened)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _items(obj: dict[str, Any], name: str, where: str) -> Iterable[Any]:
    """List field ``name`` of ``obj`` (none where it is null or absent)."""
    value = obj.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AdvcliError(f"{where}: '{name}' is not a list")
    return value

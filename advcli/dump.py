"""Getting a dump out of a trainer: :func:`write_batch` writes one training batch in advcli's
schema, one Parquet file per call in a dump folder.

It takes a verl ``DataProto`` (``.batch`` tensors, ``.non_tensor_batch`` numpy arrays) or a plain
mapping of tensors, numpy arrays and lists, and finds the group, trajectory, turn, reward and mask
among its keys with the command line's vocabulary (:data:`advcli.read.dialects.DIALECTS`), so a
batch of any trainer advcli knows is written with no arguments (the batch is read by
:mod:`advcli.read.batch`). Only those roles (and ``keys``) are converted and written, never the
prompts or the logits.

torch is not imported: tensors are recognised by their methods and moved to numpy.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from advcli.errors import AdvcliError, first_line
from advcli.read.batch import anchor_column, batch_column, batch_entries, batch_roles
from advcli.read.columns import ColumnRoles
from advcli.read.file_roles import TRAINING_STEP, FileRoles
from advcli.write.atomic import OutputAppeared, atomic_output

# What the written file's columns are called: advcli's own names, so the dump is read with no
# flags whatever trainer it came from.
GROUP, TRAJECTORY, TURN, STEP = "data_id", "rollout_id", "turn_index", "step"
ANCHOR, STEP_REWARD, STEP_RETURN = "anchor", "step_reward", "step_return"
TOKEN_REWARDS, SCORE, MASK, LENGTH = (
    "token_level_rewards",
    "score",
    "response_mask",
    "response_length",
)

# A role given as values rather than a key is stored under this name while the roles are found:
# the argument it came from, as an error about its values names it ('turn=').
_GIVEN = "{}="

IfExists = Literal["error", "replace", "skip"]


@dataclass(frozen=True)
class BatchFile:
    """What :func:`write_batch` did: ``path``, the batch's file, and ``action``: ``"written"``
    (a new file), ``"replaced"`` (the step's file that was there before, replaced) or
    ``"skipped"`` (the step's file was there before and is left as it is; this batch is not
    written)."""

    path: Path
    action: Literal["written", "replaced", "skipped"]


def write_batch(  # noqa: PLR0913
    batch: Any,
    folder: str | Path,
    *,
    step: int | None = None,
    group: str | Sequence[Any] | None = None,
    trajectory: str | Sequence[Any] | None = None,
    turn: str | Sequence[Any] | None = None,
    reward: str | None = None,
    mask: str | None = None,
    anchor: str | None = None,
    step_reward: str | None = None,
    step_return: str | None = None,
    keys: Sequence[str] = (),
    if_exists: IfExists = "replace",
) -> BatchFile:
    """Write ``batch`` as a Parquet file in ``folder`` (created if missing) and say where and
    what was done: ``step-00000042.parquet`` with ``step``, else the next free name of
    ``batch-000000.parquet``, ``batch-000001.parquet``, …

    ``if_exists``: what to do when the step's file is there already. A run resumed from a
    checkpoint trains the steps after it again, on new rollouts, and writes them again:
    ``"replace"`` (the default) puts this batch in the old one's place, so that the folder holds
    the batches the run's model was trained on, and a training loop that resumes goes on
    without an error. The file is replaced atomically: a reader sees the old file or the new
    one, never half of one. ``"skip"`` keeps the old file and writes nothing; ``"error"``
    raises :class:`~advcli.errors.AdvcliError`. A file that appears while the batch is being
    written is never replaced but with ``"replace"``.

    ``batch``: a verl ``DataProto`` or a mapping of key → tensor, numpy array or list, one entry
    per row. The roles are found among the keys by the trainers' names, as on the command line;
    ``group``/``trajectory``/``turn`` may also be given as one value per row (verl's v1 path
    keeps the turn only in its row keys ``{uid}_{session}_{index}``), and every role by key name.
    A batch with no trajectory key has one row per trajectory (verl's agent loop concatenates a
    conversation into one response): its row numbers become the trajectory ids.

    The file holds ``data_id``, ``rollout_id``, ``turn_index`` (if any), the reward
    (``token_level_rewards`` per token, bfloat16 widened to float32 exactly; or ``score``), the
    mask (``response_mask`` or ``response_length``), GiGPO's ``anchor`` and ``step_reward`` or
    ``step_return`` where the batch has an anchor and a step reward or return (verl-agent's
    ``anchor_obs``, ``rewards``, ``step_rewards``…, or the keys ``anchor``, ``step_reward``,
    ``step_return`` name; :func:`advcli.batch.anchor_column` says how an anchor is written),
    ``step`` (if given) and the ``keys`` asked for. Its Parquet metadata names each column's
    role and the training step's (:mod:`advcli.read.file_roles`): every reader of the file takes
    them, so that ``step`` is never read as a turn.

    Examples
    --------
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> batch = {
    ...     "uid": np.array(["p0", "p0", "p1"], dtype=object),
    ...     "traj_uid": np.array(["t0", "t1", "t2"], dtype=object),
    ...     "token_level_rewards": np.array([[0, 1.0], [0, 0], [0.5, 0]], dtype=np.float32),
    ...     "response_mask": np.array([[1, 1], [1, 0], [1, 1]]),
    ... }
    >>> written = write_batch(batch, folder, step=7)
    >>> written.path.name, written.action
    ('step-00000007.parquet', 'written')
    >>> pl.read_parquet(written.path).columns
    ['data_id', 'rollout_id', 'token_level_rewards', 'response_mask', 'step']
    >>> write_batch(batch, folder, step=7, if_exists="skip").action
    'skipped'
    """
    if if_exists not in ("error", "replace", "skip"):
        raise AdvcliError(f"if_exists is 'error', 'replace' or 'skip', not {if_exists!r}")
    step = _step_number(step)
    entries = batch_entries(batch)
    given: dict[str, str | None] = {}
    for role, value in (("group", group), ("trajectory", trajectory), ("turn", turn)):
        if value is None or isinstance(value, str):
            given[role] = value
        else:
            name = _GIVEN.format(role)
            entries[name] = value
            given[role] = name
    rows = _row_count(entries)
    if rows == 0:
        # Its id columns would have no type, and the folder's other files would not read with it.
        raise AdvcliError("the batch has no rows: nothing to write")
    roles = _roles(entries, given, reward, mask, (anchor, step_reward, step_return))
    if step is not None and STEP in keys:
        raise AdvcliError(
            f"keys= names '{STEP}', the column that holds the training step given as step="
        )
    frame, role_of = _frame(entries, roles, rows, keys)
    if step is not None:
        frame = frame.with_columns(pl.lit(step, dtype=pl.Int64).alias(STEP))
        role_of[STEP] = TRAINING_STEP
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AdvcliError(
            f"{folder}: cannot make the folder for the batches: {error.strerror}"
        ) from None
    said = FileRoles(tuple(role_of.items()), trainer=roles.dialect)
    if step is None:
        return _publish_next(frame, said, folder)
    return _publish(frame, said, folder / f"step-{step:08d}.parquet", if_exists)


def _roles(
    entries: Mapping[str, Any],
    given: Mapping[str, str | None],
    reward: str | None,
    mask: str | None,
    step_keys: tuple[str | None, str | None, str | None],
) -> ColumnRoles:
    """The batch's roles (``given``: the group, trajectory and turn keys; ``step_keys``: the
    anchor, step reward and step return keys), GiGPO's where the batch has them; a SkyRL
    step-wise batch is refused."""
    anchor, step_reward, step_return = step_keys
    roles = batch_roles(
        entries,
        group=given["group"],
        trajectory=given["trajectory"],
        turn=given["turn"],
        reward=reward,
        mask=mask,
        steps=None,
        anchor=anchor,
        step_reward=step_reward,
        step_return=step_return,
    )
    if roles.last_step is not None:
        # advcli's schema has no last-step flag: the trajectories' scores, skyrl 0.4.0's
        # trajectories and the padding rows would be read wrong from the written file.
        raise AdvcliError(
            f"the batch is a SkyRL step-wise batch ('{roles.last_step}'), which advcli's schema "
            "cannot hold; write its columns to Parquet as they are and read that file"
        )
    return roles


def _step_number(step: object) -> int | None:
    """The training step's number as an int (a numpy integer too), None without one."""
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise AdvcliError(f"step is the training step's number, an integer from 0 on, not {step!r}")
    return int(step)


def _publish(frame: pl.DataFrame, roles: FileRoles, path: Path, if_exists: IfExists) -> BatchFile:
    """Write ``frame`` at ``path`` atomically, its columns' ``roles`` in its metadata, as
    ``if_exists`` says for a file already there."""
    existed = os.path.lexists(path)
    if existed and if_exists == "skip":
        return BatchFile(path, "skipped")
    if existed and if_exists == "error":
        raise AdvcliError(
            f"{path}: the step's file exists already (a run resumed from a checkpoint writes "
            "its steps again); if_exists='replace' writes this batch in its place, 'skip' keeps "
            "it"
        )
    try:
        with atomic_output(
            path,
            force=if_exists == "replace",
            replace_hint="if_exists='replace' writes the batch in its place",
        ) as partial:
            _write(frame, roles, partial, path)
    except OutputAppeared:
        if if_exists == "skip":
            return BatchFile(path, "skipped")
        raise
    return BatchFile(path, "replaced" if existed else "written")


def _publish_next(frame: pl.DataFrame, roles: FileRoles, folder: Path) -> BatchFile:
    """Write ``frame`` under the next free ``batch-NNNNNN.parquet`` name of ``folder``, claimed
    as the file is published (renamed into place without replacing): a name another writer
    took meanwhile (two processes of one run) is never replaced; the batch takes the next."""
    while True:
        path = folder / _next_name(folder)
        try:
            with atomic_output(path, replace_hint="the batch goes under the next name") as partial:
                _write(frame, roles, partial, path)
        except OutputAppeared:
            continue
        return BatchFile(path, "written")


def _write(frame: pl.DataFrame, roles: FileRoles, partial: Path, path: Path) -> None:
    """The batch's Parquet bytes into ``partial``; a write that fails (a full disk, a file-size
    limit) is an error naming ``path``, and the partial file goes with it."""
    try:
        frame.write_parquet(partial, metadata=roles.metadata())
    except (OSError, pl.exceptions.PolarsError) as error:
        reason = error.strerror if isinstance(error, OSError) else first_line(error)
        raise AdvcliError(f"{path}: cannot write the batch ({reason})") from None


def _row_count(entries: Mapping[str, Any]) -> int:
    lengths = {key: len(value) for key, value in entries.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{key} {length}" for key, length in lengths.items())
        raise AdvcliError(f"the batch's entries have different lengths: {listed}")
    return next(iter(lengths.values()), 0)


def _frame(
    entries: Mapping[str, Any], roles: ColumnRoles, rows: int, keys: Sequence[str]
) -> tuple[pl.DataFrame, dict[str, str]]:
    """The file's columns, and the role of each that has one (column → role)."""
    columns: dict[str, pl.Series] = {}
    if roles.group is None:
        raise AdvcliError("the batch has no group ids: pass group= (a key, or one id per row)")
    columns[GROUP] = batch_column(GROUP, entries[roles.group])
    columns[TRAJECTORY] = (
        batch_column(TRAJECTORY, entries[roles.trajectory])
        if roles.trajectory is not None
        else pl.Series(TRAJECTORY, np.arange(rows, dtype=np.int64))
    )
    role_of = {GROUP: "group", TRAJECTORY: "trajectory"}
    if roles.turn is not None:
        columns[TURN] = batch_column(TURN, entries[roles.turn])
        role_of[TURN] = "turn"
    reward_name = TOKEN_REWARDS if roles.reward_kind == "token_rewards" else SCORE
    columns[reward_name] = batch_column(reward_name, entries[roles.reward])
    role_of[reward_name] = "reward"
    if roles.mask is not None:
        mask_name = MASK if roles.mask_kind == "mask" else LENGTH
        columns[mask_name] = batch_column(mask_name, entries[roles.mask])
        role_of[mask_name] = "mask"
    if roles.anchor is not None:
        columns[ANCHOR] = anchor_column(roles.anchor, entries[roles.anchor]).alias(ANCHOR)
        role_of[ANCHOR] = "anchor"
    for name, key in ((STEP_REWARD, roles.step_reward), (STEP_RETURN, roles.step_return)):
        if key is not None:
            columns[name] = batch_column(name, entries[key])
            role_of[name] = name
    for key in keys:
        if key not in entries:
            raise AdvcliError(f"the batch has no key '{key}' (keys=)")
        if key in columns:
            raise AdvcliError(f"keys= names '{key}', which the dump already writes")
        columns[key] = batch_column(key, entries[key])
    return pl.DataFrame(columns), role_of


_NUMBERED = re.compile(r"batch-(\d+)\.parquet")


def _next_name(folder: Path) -> str:
    numbers = [
        int(match.group(1))
        for match in map(_NUMBERED.fullmatch, (p.name for p in folder.iterdir()))
        if match
    ]
    return f"batch-{max(numbers, default=-1) + 1:06d}.parquet"

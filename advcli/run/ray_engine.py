"""`--engine ray`: the same three stages on Ray Data, for dumps that outgrow one machine.

- Stage 1 runs distributed: each block of rows is reduced to the key projection by the very
  expressions the local engine uses (:class:`advcli.read.projection.KeyExpressions`), and only
  those few
  scalars per row travel to the driver.
- Stage 2 runs on the driver, on that small table, with the local engine's code
  (:func:`advcli.advantages.estimators.compute_advantages`), batch-wide quantities included.
- Stage 3 runs distributed: each block looks its rows' advantages up in a table broadcast through
  the object store (one row per trajectory at trajectory level, two for REINFORCE++ when some
  of its rows have no response tokens; one per turn at turn level) and is
  written as one file of a Parquet dataset folder. Token data is never shuffled.

Ray is an optional extra (``advcli[ray]``); this module imports it, and only ``--engine ray``
imports this module.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import pyarrow as pa
import ray
from ray.data.datasource import FilenameProvider

from advcli.advantages.estimators import Advantages
from advcli.errors import AdvcliError, first_line
from advcli.keys import GROUP, ROW, SCORE, TOKENS, TRAJECTORY, TURN
from advcli.names import is_utf8
from advcli.read.columns import ColumnRoles
from advcli.read.dataset import Dataset
from advcli.read.projection import KeyExpressions
from advcli.settings.config import AdvantageConfig, Estimator, Level, OutputColumns
from advcli.settings.rules import RULES
from advcli.write.atomic import atomic_output
from advcli.write.rows import check_roles_kept, kept_columns, output_rows


def start(address: str | None) -> None:
    """Connect to the cluster at ``address``, or start a local one; quietly, and in an order
    the output rows can rely on."""
    _cluster_messages_to_stderr()
    if not ray.is_initialized():
        # A cluster advcli starts keeps its session folder in a folder of advcli's own, removed
        # with the cluster; one it joins (an address, RAY_ADDRESS) keeps the cluster's.
        own_folder = None if address or os.environ.get("RAY_ADDRESS") else _session_folder()
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
                _temp_dir=own_folder,
            )
        except (ConnectionError, RuntimeError, ValueError, OSError) as error:
            if own_folder is not None:
                shutil.rmtree(own_folder, ignore_errors=True)
            raise AdvcliError(
                f"cannot start or reach Ray at {address or 'local'}: {error}"
            ) from None
        if own_folder is not None:
            # Registered after ray.init's own exit hook, so it runs first: the cluster is
            # stopped before its folder goes (also after an error or an interrupt, both of
            # which end the process through its exit hooks).
            atexit.register(_stop_local_cluster, own_folder)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    # Ray Data narrates every execution at INFO on stderr; advcli prints its own summary.
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def _cluster_messages_to_stderr() -> None:
    """Send what the cluster tells this driver to standard error: Ray's driver prints its
    messages (the raylet's warnings, such as "N worker processes have been started") on
    standard output, whatever ``log_to_driver``, from a thread of its own at any moment, and
    standard output may carry advcli's report (``--json -``). The thread looks the printer up
    at each message, so the one put here serves a cluster started or joined before."""
    worker = ray._private.worker
    printer = worker.print_to_stdstream
    if getattr(printer, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        printer({**data, "is_err": True}, *args, **kwargs)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


# What Ray adds under its temporary folder for its longest Unix socket path
# ("/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store"), and that path's limit.
SOCKET_SUFFIX = 72
SOCKET_PATH_LIMIT = 107


def _session_folder() -> str:
    """A new folder for a local cluster's session files, in Ray's own base folder (RAY_TMPDIR,
    else the temporary folder) unless its path is too long for Ray's socket paths there (then in
    /tmp)."""
    prefix = "advcli-ray-"
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    if len(os.fsencode(base)) + len(prefix) + 10 + SOCKET_SUFFIX > SOCKET_PATH_LIMIT:
        base = "/tmp"
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def _stop_local_cluster(folder: str) -> None:
    """Stop the local cluster advcli started, then remove its session folder."""
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def _read(dataset: Dataset, names: list[str] | None = None) -> Any:
    if dataset.given_format != "parquet":
        raise AdvcliError(f"{dataset.describe()}: --engine ray reads Parquet inputs")
    if dataset.view is not None:
        raise AdvcliError(
            f"{dataset.describe()}: --engine ray does not read {dataset.view.layout}, whose "
            "columns are made as the file is read; use the local engine"
        )
    for index, path in enumerate(dataset.files):
        if not is_utf8(path):  # its workers open the files by a name, which Arrow takes as UTF-8
            raise AdvcliError(
                f"{dataset.label(index)}: --engine ray reads only files whose names are UTF-8; "
                "rename the file or use --engine local"
            )
    return ray.data.read_parquet([str(path) for path in dataset.files], columns=names)


def _project_block(block: pa.Table, schema: pl.Schema, columns: ColumnRoles) -> pa.Table:
    frame = pl.from_arrow(block)
    assert isinstance(frame, pl.DataFrame)
    return frame.select(KeyExpressions.of(schema, columns).exprs).to_arrow()


def key_projection(
    dataset: Dataset, columns: ColumnRoles, *, unique_turns: bool = True
) -> pl.DataFrame:
    """Stage 1 on Ray Data: the same projection and checks as the local engine."""
    projected = _read(dataset).map_batches(
        _project_block,
        batch_format="pyarrow",
        fn_kwargs={"schema": dataset.schema, "columns": columns},
    )
    tables = [table for table in ray.get(projected.to_arrow_refs()) if table.num_rows]
    frame = pl.from_arrow(pa.concat_tables(tables))
    assert isinstance(frame, pl.DataFrame)
    plan = KeyExpressions.of(dataset.schema, columns)
    return plan.check(frame.with_row_index(ROW), dataset, columns, unique_turns=unique_turns)


# Whether a row has response tokens: at trajectory level REINFORCE++ writes a row without them as
# 0 and its trajectory's other rows with the trajectory's value, so the lookup tells them apart.
HAS_TOKENS = "has_tokens"


def lookup_keys(config: AdvantageConfig, columns: ColumnRoles) -> list[str]:
    """What identifies a row's advantage: its trajectory at trajectory level (and whether the row
    has response tokens, for REINFORCE++); at turn level its turn, or (without a turn column) its
    score, which fixes a row's advantage within its trajectory for every estimator but
    grpo_passk, and not under per-turn rewards, which stage 1 refuses on Ray without a turn
    column (a row's reward-to-go is not its own reward)."""
    if config.level is Level.TRAJECTORY:
        if RULES[config.estimator].whitens:
            return [GROUP, TRAJECTORY, HAS_TOKENS]
        return [GROUP, TRAJECTORY]
    if columns.turn is not None:
        return [GROUP, TRAJECTORY, TURN]
    if config.estimator is Estimator.GRPO_PASSK:
        raise AdvcliError(
            "--engine ray needs a turn column for grpo_passk at turn level (the top row is told "
            "apart from its trajectory's other rows by its turn); pass --turn-col"
        )
    return [GROUP, TRAJECTORY, SCORE]


def _key_columns(keys: list[str]) -> list[pl.Expr]:
    """The lookup keys over a frame of the key projection's columns."""
    return [(pl.col(TOKENS) > 0).alias(key) if key == HAS_TOKENS else pl.col(key) for key in keys]


def lookup_table(
    projection: pl.DataFrame,
    advantages: Advantages,
    keys: list[str],
    padding: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per key with the ``score`` and ``advantage`` its rows get; the ``padding`` rows
    (their ids are no other row's) get their own score and advantage 0."""
    rows = projection.select(
        ROW, *_key_columns([k for k in keys if k != SCORE]), pl.col(SCORE)
    ).join(
        advantages.rows(projection).select(ROW, pl.col(SCORE).alias("score_used"), "advantage"),
        on=ROW,
        how="left",
    )
    table = rows.select(*keys, "score_used", "advantage")
    if padding is not None and not padding.is_empty():
        padding_values = padding.select(
            *_key_columns([k for k in keys if k != SCORE]),
            pl.col(SCORE),
            pl.col(SCORE).alias("score_used"),
            pl.lit(0.0, dtype=table.schema["advantage"]).alias("advantage"),
        )
        table = pl.concat([table, padding_values.select(table.columns)])
    return table.unique(subset=keys, keep="first")


def _lookup_expressions(schema: pl.Schema, columns: ColumnRoles, keys: list[str]) -> list[pl.Expr]:
    """Stage 1's expressions of the lookup keys, over a block of input rows."""
    plan = KeyExpressions.of(schema, columns)
    needed = {TOKENS if key == HAS_TOKENS else key for key in keys}
    return [expr for expr in plan.exprs if expr.meta.output_name() in needed]


def _attach_block(
    block: pa.Table,
    schema: pl.Schema,
    columns: ColumnRoles,
    keys: list[str],
    lookup: Any,
    tokens: bool,
    kept: list[str] | None = None,
) -> pa.Table:
    table = ray.get(lookup) if isinstance(lookup, ray.ObjectRef) else lookup
    frame = pl.from_arrow(block)
    assert isinstance(frame, pl.DataFrame)
    projected = _lookup_expressions(schema, columns, keys)
    # Blocks do not know their rows' global numbers, so a row finds its values by its keys, in a
    # frame of their own: a user column named like one of them ("group", "turn", ...) passes
    # through untouched.
    found = (
        frame.select(projected)
        .select(_key_columns(keys))
        .join(
            pl.from_arrow(table),  # type: ignore[arg-type]
            on=keys,
            how="left",
            maintain_order="left",
        )
    )
    attached = output_rows(
        frame,
        columns,
        score=pl.lit(found["score_used"]),
        advantage=pl.lit(found["advantage"]),
        tokens=tokens,
    )
    if kept is not None:
        attached = attached.select(*kept, "score", "advantage", *(["advantages"] if tokens else []))
    return attached.to_arrow()


class LoadedKeys(Protocol):
    """What stage 3 needs of stage 1's loaded dump (:class:`advcli.loading.LoadedDump`)."""

    columns: ColumnRoles
    projection: pl.DataFrame
    padding: pl.DataFrame


def write_advantages(
    dataset: Dataset,
    dump: LoadedKeys,
    advantages: Advantages,
    config: AdvantageConfig,
    output: Path,
    tokens: bool = True,
    force: bool = False,
    output_columns: OutputColumns = OutputColumns.ALL,
) -> None:
    """Stage 3 on Ray Data: attach each row's advantage by a broadcast lookup and write a Parquet
    dataset folder (``part-000000.parquet``, … in input order), renamed into place when complete
    and the inputs are still the files stage 1 read. With ``output_columns`` other than ``all``
    the blocks read only the columns the lookup and the output need."""
    dataset.check_unchanged()  # before the blocks read the inputs again
    columns = dump.columns
    check_roles_kept(columns, dataset.describe())
    keys = lookup_keys(config, columns)
    kept = kept_columns(dataset.schema.names(), columns, output_columns)
    read = None
    if kept is not None:
        needed = set(kept).union(
            *(expr.meta.root_names() for expr in _lookup_expressions(dataset.schema, columns, keys))
        )
        if tokens and columns.mask is not None:
            needed.add(columns.mask)
        read = [name for name in dataset.schema.names() if name in needed]
    lookup = ray.put(lookup_table(dump.projection, advantages, keys, dump.padding).to_arrow())
    with atomic_output(
        output,
        force=force,
        folder=True,
        keep=dataset.files,
        before_publish=dataset.check_unchanged,
    ) as partial:
        try:
            _read(dataset, read).map_batches(
                _attach_block,
                batch_format="pyarrow",
                fn_kwargs={
                    "schema": dataset.schema,
                    "columns": columns,
                    "keys": keys,
                    "lookup": lookup,
                    "tokens": tokens,
                    "kept": kept,
                },
            ).write_parquet(
                str(partial),
                filename_provider=_PartNames(),
                # The folder is new and ours alone, so names need no write id to stay unique.
                mode=ray.data.SaveMode.OVERWRITE,
            )
        except ray.exceptions.RayError as error:
            raise AdvcliError(f"{output}: the Ray job failed ({first_line(error)})") from None


class _PartNames(FilenameProvider):
    """``part-000000.parquet``, …: names that sort in the order of the rows they hold."""

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return f"part-{task_index:06d}.parquet"

    def get_filename_for_block(
        self, block: Any, write_uuid: str, task_index: int, block_index: int
    ) -> str:
        return f"part-{task_index:06d}-{block_index:06d}.parquet"


def run_parts(work: Callable[[Any], Any], tasks: list[Any]) -> Generator[Any, None, None]:
    """``work`` on each of ``tasks`` as one Ray task each on the cluster, the results in the
    tasks' order, each as it is taken; a task's error is raised as itself (it names its part),
    not as Ray's."""
    remote = ray.remote(work)
    for result in [remote.remote(task) for task in tasks]:
        try:
            yield ray.get(result)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, AdvcliError):
                raise error.cause from None
            raise

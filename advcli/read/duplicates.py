"""Duplicated rows: copies of a row that a trainer added to its batch.

verl-agent and ROLL pad a batch to a multiple of the data-parallel size by appending copies of
random rows (``adjust_batch(mode="copy")``) before the advantages are computed, so a copy counts
in its group's statistics like any other row. Their dumps have no turn index, so stage 1's
repeated-turn check cannot see the copies.

Two rows are duplicates when they are alike in every key (group, trajectory, turn if any) and in
their token content: the reward and mask columns' values (lists element by element) and each of
:data:`TOKEN_COLUMNS` the dump has. A dump whose rows are whole trajectories (no trajectory id)
has none: its trajectory key is the row itself, and a second rollout that happened to write the
same response is no copy. A trainer whose rows repeat a turn only by copying (ROLL,
:attr:`advcli.read.dialects.Dialect.copies_repeat_turns`) confirms its copies without token
ids: rows alike in every key, the turn among them, and in reward and mask.

Stage 1 reads only small columns, so the token columns are read only when the key projection
has candidates (rows alike in keys, score and token count), and only for those rows. A dump with
no token ids cannot tell a copy from a turn alike in reward and mask, so nothing is read: its
rows alike in keys, score and tokens are reported as possible copies, and ``--drop-duplicates``
refuses them; but for a trainer that pads with padding rows of its own (SkyRL), which adds no
copies, they are its steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from advcli.errors import AdvcliError, first_line
from advcli.keys import COPY_OF, GROUP, ROW, SCORE, TOKENS, TRAJECTORY, TURN, rows_sharing
from advcli.read.columns import ColumnRoles, unused_name
from advcli.read.dataset import Dataset
from advcli.read.scan import closing_sources

# The trainers' names for a row's prompt and response token ids (verl and verl-agent:
# responses, prompts, input_ids; SkyRL: response_ids, prompt_token_ids; TRL: prompt_ids).
TOKEN_COLUMNS = (
    "responses",
    "response_ids",
    "prompts",
    "prompt_ids",
    "input_ids",
    "prompt_token_ids",
)
# How many copies the report lists.
EXAMPLES = 5
_CONTENT_HASH = "content_hash"


@dataclass(frozen=True)
class DuplicateRows:
    """The copies found: ``copies`` has one row per copy, in input order, with ``row`` (the
    copy's input row), ``copy_of`` (the first row of its identical set), ``group``,
    ``trajectory`` and, where the dump has one, ``turn``. ``sets``: how many rows were copied.
    ``compared``: the columns whose values the copies share besides the keys; in a dump with no
    token ids none, and the copies are only possible ones (alike in keys, score and tokens)."""

    copies: pl.DataFrame
    sets: int
    compared: tuple[str, ...] = ()
    # The trainer whose rows repeat a turn only by copying, which confirms the copies that
    # repeat one (ROLL's); None where only token ids can.
    turn_copies_of: str | None = None

    @property
    def token_ids_compared(self) -> bool:
        return any(name in TOKEN_COLUMNS for name in self.compared)

    @property
    def confirmed_by(self) -> str | None:
        """What makes the copies sure ones, None where they are only possible copies (two
        turns alike in score and tokens could be taken for one another)."""
        if self.token_ids_compared:
            return "token ids"
        if self.turn_copies_of is not None and self.compared:
            return f"{self.turn_copies_of} repeats a turn only in its padding copies"
        return None

    @property
    def confirmed(self) -> bool:
        return self.confirmed_by is not None

    @property
    def count(self) -> int:
        """Rows beyond the first of each identical set."""
        return self.copies.height

    def report(self, locate: Callable[[int], str]) -> dict[str, Any]:
        """``{"count": n, "first": [...]}``: the first few copies, each with its file row and
        that of the row it copies (as ``locate`` names them), its group, trajectory and turn."""
        return {
            "count": self.count,
            "compared": list(self.compared),
            "token_ids_compared": self.token_ids_compared,
            "confirmed_by": self.confirmed_by,
            "first": [
                {
                    "row": locate(copy[ROW]),
                    "group": copy[GROUP],
                    "trajectory": copy[TRAJECTORY],
                    "turn": copy.get(TURN),
                    "copy_of_row": locate(copy[COPY_OF]),
                }
                for copy in self.copies.head(EXAMPLES).iter_rows(named=True)
            ],
        }

    def drop_from(self, projection: pl.DataFrame) -> pl.DataFrame:
        """``projection`` without the copies: each identical set counted by its first row."""
        return projection.filter(~pl.col(ROW).is_in(self.copies[ROW].implode()))

    def spread_to_copies(self, row_values: pl.DataFrame) -> pl.DataFrame:
        """Per-row values computed without the copies (``row`` and any columns, from the
        projection of :meth:`drop_from`) for every row: each copy gets the values of the row it
        copies."""
        copied = (
            self.copies.select(ROW, COPY_OF)
            .join(row_values.rename({ROW: COPY_OF}), on=COPY_OF, how="left")
            .drop(COPY_OF)
        )
        return pl.concat([row_values, copied]).sort(ROW)


def _none_in(projection: pl.DataFrame, content: list[str]) -> DuplicateRows:
    keys = [name for name in (GROUP, TRAJECTORY, TURN) if name in projection.columns]
    copies = projection.select(ROW, pl.col(ROW).alias(COPY_OF), *keys).clear()
    return DuplicateRows(copies, 0, tuple(content))


def find_duplicates(
    dataset: Dataset, columns: ColumnRoles, projection: pl.DataFrame
) -> DuplicateRows:
    """The rows of ``dataset`` that repeat an earlier row in every key and all token content.

    Candidates come from the key projection (rows alike in group, trajectory, turn, score and
    token count); for those rows only, a hash of their content columns (reward, mask, token ids)
    is read, in one streaming pass that keeps 8 bytes a candidate. The rows whose keys and hash
    then agree are read whole and compared exactly, so no hash collision makes two different
    rows duplicates.
    """
    keys = [name for name in (GROUP, TRAJECTORY, TURN, SCORE, TOKENS) if name in projection.columns]
    content = _content_columns(dataset.schema, columns)
    candidates = rows_sharing(projection, keys).select(ROW, *keys)
    if candidates.is_empty():
        return _none_in(projection, content)
    by_turn = columns.turn_copies_of if TURN in keys else None
    if not any(name in TOKEN_COLUMNS for name in content) and by_turn is None:
        if columns.padding_ids is not None:
            # A trainer that pads with rows of its own (SkyRL's pad0, pad1, …) adds no copies:
            # its steps alike in score and tokens are steps, not possible copies.
            return _none_in(projection, content)
        # Without token ids no read could confirm a copy (two turns alike in reward and mask
        # look the same), so none is made: the candidates are the possible copies.
        return _copies(candidates, keys, keys, ())
    hashed = _read_rows(dataset, candidates[ROW], [pl.struct(content).hash().alias(_CONTENT_HASH)])
    alike = (
        candidates.join(hashed, on=ROW, how="left", maintain_order="left")
        .filter(pl.struct(*keys, _CONTENT_HASH).is_duplicated())
        .drop(_CONTENT_HASH)
    )
    if alike.is_empty():
        return _none_in(projection, content)
    # Named apart from the projection's columns: a scalar reward may be called 'score'.
    values = [f"content_{index}" for index in range(len(content))]
    exact = alike.join(
        _read_rows(
            dataset,
            alike[ROW],
            [pl.col(name).alias(value) for name, value in zip(content, values, strict=True)],
        ),
        on=ROW,
        how="left",
        maintain_order="left",
    )
    return _copies(exact, keys, [*keys, *values], tuple(content), by_turn)


def _copies(
    rows: pl.DataFrame,
    keys: list[str],
    alike: list[str],
    compared: tuple[str, ...],
    turn_copies_of: str | None = None,
) -> DuplicateRows:
    """The rows of ``rows`` alike in ``alike`` to an earlier one, each with that first row."""
    first = rows.with_columns(pl.col(ROW).min().over(pl.struct(*alike)).alias(COPY_OF))
    copies = first.filter(pl.col(ROW) != pl.col(COPY_OF)).select(
        ROW, COPY_OF, *(name for name in (GROUP, TRAJECTORY, TURN) if name in keys)
    )
    return DuplicateRows(copies, copies[COPY_OF].n_unique(), compared, turn_copies_of)


def _content_columns(schema: pl.Schema, columns: ColumnRoles) -> list[str]:
    """The columns whose values two duplicates share besides the keys."""
    names = [columns.reward, columns.mask, *TOKEN_COLUMNS]
    return list(dict.fromkeys(name for name in names if name is not None and name in schema))


def _read_rows(dataset: Dataset, rows: pl.Series, values: list[pl.Expr]) -> pl.DataFrame:
    """``values`` of the input rows numbered ``rows``, with their ``row``, in input order."""
    row_number = unused_name(dataset.schema)
    try:
        with closing_sources():
            return (
                dataset.rows(row_number)
                .filter(pl.col(row_number).is_in(rows.implode()))
                .select(pl.col(row_number).alias(ROW), *values)
                .collect(engine="streaming")
            )
    except pl.exceptions.PolarsError as error:
        raise AdvcliError(
            f"{dataset.describe()}: cannot read the rows' token columns to compare them "
            f"({first_line(error)})"
        ) from None

"""The advantage math: stage 2 of the data flow, pure Polars, no files.

A *unit* is what counts once in its group's statistics: a row at turn level, a trajectory
(``(group, trajectory)`` pair) at trajectory level. :func:`build_units` turns the key projection
into units, :func:`group_statistics` computes every group quantity any estimator needs in one
group-by, and :func:`compute_advantages` applies the chosen estimator and broadcasts each unit's
advantage back to its rows.

Every numeric rule is stated where it is applied; the README's table lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from advcli.advantages.units import Trajectories, index_trajectories, sorted_sum
from advcli.errors import AdvcliError
from advcli.keys import GROUP, LAST_STEP, ROW, SCORE, TOKENS, TRAJECTORY, TURN
from advcli.rules import (
    FLOAT32_MAX,
    RULES,
    SCORE_TOLERANCE,
    SINGLETON_MEAN,
    SINGLETON_STD,
    STD_DDOF,
    WHITEN_EPSILON,
    WHITEN_MIN_TOKENS,
    ZERO_STD,
    Baseline,
    EstimatorRule,
)
from advcli.settings import (
    AdvantageConfig,
    Level,
    Scale,
    Singleton,
    TrajScore,
)


def _row_number(row: int) -> str:
    return f"row {row}"


def _one_file(row: int) -> int:
    return 0


@dataclass(frozen=True)
class Naming:
    """How error messages name things: the user's key column names and a row locator (which the
    I/O layer sets to name the file too), and which input file a row is in."""

    group: str = GROUP
    trajectory: str = TRAJECTORY
    locate: Callable[[int], str] = _row_number
    file_of: Callable[[int], int] = _one_file
    # Said after an error on a trajectory's scores when the turn column is in doubt.
    turn_hint: str = ""


@dataclass(frozen=True)
class Advantages:
    """Stage 2's result.

    ``units``: one row per unit (``group``, ``trajectory``, ``score``, ``tokens``, ``turns``,
    ``first_row``, ``advantage``). ``groups``: one row per group (``group``, ``units``,
    ``baseline``, ``std`` — the value subtracted and the divisor before epsilon, after the singleton
    rule — and ``zero_std``). At trajectory level ``trajectories`` says which unit each row is.
    Nothing of the rows is kept: :meth:`rows` makes their table when a caller needs it.
    """

    level: Level
    units: pl.DataFrame
    groups: pl.DataFrame
    trajectories: Trajectories | None
    # REINFORCE++ at trajectory level: a row without response tokens gets 0, as verl's mask does.
    empty_rows_zero: bool = False

    def without_index(self) -> Advantages:
        """The same result without the index of the rows' trajectories (4 bytes a row, and its
        table), for a caller that is done with the rows, such as the report."""
        return replace(self, trajectories=None)

    @property
    def singleton_groups(self) -> int:
        return int((self.groups["units"] == 1).sum())

    @property
    def zero_std_groups(self) -> int:
        return int(self.groups["zero_std"].sum())

    def rows(self, projection: pl.DataFrame) -> pl.DataFrame:
        """One row per row of ``projection`` (the key projection these advantages were computed
        from), in input order: ``row``, ``score``, ``advantage``."""
        if self.level is Level.TURN:  # the units are the rows
            return self.units.select(pl.col("first_row").alias(ROW), SCORE, "advantage")
        if self.trajectories is None:
            raise ValueError("the index of the rows' trajectories was let go (without_index)")
        unit = pl.Series(self.trajectories.of_row)
        advantage = self.units["advantage"].gather(unit)
        if self.empty_rows_zero:
            advantage = pl.select(
                pl.when(projection[TOKENS] > 0).then(advantage).otherwise(0.0).alias("advantage")
            ).to_series()
        return pl.DataFrame([projection[ROW], self.units[SCORE].gather(unit), advantage])


def build_units(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming,
    trajectories: Trajectories | None = None,
) -> pl.DataFrame:
    """One row per unit with ``group``, ``trajectory``, ``score``, ``tokens``, ``turns`` and
    ``first_row`` (the unit's first input row, which fixes the units' order).

    ``naming`` says how error messages name the key columns and rows. At trajectory level the
    units come from ``trajectories``, the projection's index (:func:`index_trajectories`).
    Without a ``traj_score`` rule, a projection with ``last_step`` (SkyRL's step-wise dumps) gives
    each trajectory the score of its last-step row, SkyRL's own rule.
    """
    if config.level is Level.TURN:
        return projection.select(
            pl.col(GROUP),
            pl.col(TRAJECTORY),
            pl.col(SCORE),
            pl.col(TOKENS),
            pl.lit(1, dtype=pl.UInt32).alias("turns"),
            pl.col(ROW).alias("first_row"),
        )

    if trajectories is None:
        raise ValueError("trajectory-level units need the projection's trajectory index")
    # "first" and "last" follow turn_index when the dump has one, else the input row order.
    order = projection[TURN].to_numpy() if TURN in projection.columns else None
    rule = config.traj_score
    table = trajectories.table
    flagged = LAST_STEP in projection.columns
    if rule is TrajScore.LAST and flagged:
        # The flagged row is the last step whatever the rows' order (SkyRL's own rule).
        score = projection[SCORE].gather(
            _last_step_positions(projection, trajectories, naming, in_row_order=False)
        )
    elif rule is TrajScore.LAST:
        score = projection[SCORE].gather(trajectories.last_position(order))
    elif rule is TrajScore.MAX:
        score = table["score_max"]
    elif rule in (TrajScore.MEAN, TrajScore.SUM):
        # Added over the sorted scores: the result does not depend on the row order.
        total = sorted_sum(projection, trajectories)
        score = pl.Series(total / table["turns"].to_numpy() if rule is TrajScore.MEAN else total)
        if rule is TrajScore.MEAN:
            # Rows that agree have their score as the mean exactly, not a rounding of it: a group
            # of them stays zero-std.
            agree = table["score_min"] == table["score_max"]
            score = pl.select(pl.when(agree).then(table["score_min"]).otherwise(score)).to_series()
    elif rule is None and flagged:
        score = projection[SCORE].gather(_last_step_positions(projection, trajectories, naming))
    else:  # the first turn's score: rule "first", or rows that agree (checked below)
        if rule is TrajScore.FIRST and flagged and order is None:
            # Without a turn column "first" is the first row: the rows must be in step order,
            # which the flag on each trajectory's last row shows.
            _last_step_positions(projection, trajectories, naming, rule="--traj-score first")
        score = projection[SCORE].gather(trajectories.first_position(order))
    units = table.with_columns(score.alias(SCORE))
    if rule is None and not flagged:
        _check_consistent_scores(projection, units, naming)
    return units.select(GROUP, TRAJECTORY, SCORE, TOKENS, "turns", "first_row")


def _last_step_positions(
    projection: pl.DataFrame,
    trajectories: Trajectories,
    naming: Naming,
    *,
    in_row_order: bool = True,
    rule: str = "",
) -> np.ndarray:
    """The projection position of each trajectory's last-step row, SkyRL's score rule: its
    step-wise advantage runs the estimator on the last-step rows only and broadcasts the result
    to the trajectory's other steps. Each trajectory must have exactly one such row and, with
    ``in_row_order``, it must be its last in row order (SkyRL's steps of a trajectory are
    contiguous, the flagged one last). ``rule``: the option that relies on that order, for the
    error message."""
    flagged = projection[LAST_STEP].to_numpy()
    last = trajectories.last_position()
    flags = np.bincount(trajectories.of_row, weights=flagged, minlength=trajectories.count)
    broken = flags != 1
    if in_row_order:
        broken |= ~flagged[last]
    broken = np.flatnonzero(broken)
    if not len(broken):
        if in_row_order:
            return last
        positions = np.flatnonzero(flagged)
        out = np.empty(trajectories.count, dtype=np.int64)
        out[trajectories.of_row[positions]] = positions
        return out
    trajectory = int(broken[0])  # the trajectories are in input order
    positions = np.flatnonzero(trajectories.of_row == trajectory)
    key = trajectories.table.row(trajectory, named=True)
    named = f"trajectory ({naming.group}={key[GROUP]!r}, {naming.trajectory}={key[TRAJECTORY]!r})"
    rows = projection[ROW]
    relies = f"; {rule} takes its first row, which needs its steps in row order" if rule else ""
    other_rules = " (or choose a rule with --traj-score first|last|mean|max|sum)"
    if not in_row_order:
        count = int(flags[trajectory])
        where = positions[flagged[positions]][1] if count > 1 else last[trajectory]
        raise AdvcliError(
            f"{naming.locate(rows[int(where)])}: {named} has {count} rows flagged "
            "'is_last_step'; SkyRL flags exactly one, a trajectory's last step, whose reward "
            "--traj-score last takes"
        )
    early = positions[flagged[positions] & (positions != last[trajectory])]
    if len(early):
        raise AdvcliError(
            f"{naming.locate(rows[int(early[0])])}: {named} has a row flagged 'is_last_step' "
            f"before its last row ({naming.locate(rows[int(last[trajectory])])}); SkyRL flags only "
            f"a trajectory's last step, whose reward is the trajectory's score{relies}"
        )
    raise AdvcliError(
        f"{naming.locate(rows[int(last[trajectory])])}: {named} ends at this row, which is not "
        "flagged 'is_last_step'; SkyRL flags a trajectory's last step, whose reward is the "
        f"trajectory's score{relies or other_rules}"
    )


def scores_disagree(low: pl.Expr, high: pl.Expr) -> pl.Expr:
    """True where ``high - low`` exceeds the relative tolerance: ``max − min > 1e-6 · max(|max|,
    |min|)``. Shared by ``compute`` (an error) and ``inspect`` (a count)."""
    return (high - low) > SCORE_TOLERANCE * pl.max_horizontal(high.abs(), low.abs())


def _check_consistent_scores(projection: pl.DataFrame, units: pl.DataFrame, naming: Naming) -> None:
    offenders = units.filter(scores_disagree(pl.col("score_min"), pl.col("score_max")))
    if offenders.is_empty():
        return
    first = offenders.row(0, named=True)  # units are in input order
    rows = projection.filter(
        (pl.col(GROUP) == first[GROUP]) & (pl.col(TRAJECTORY) == first[TRAJECTORY])
    ).sort(ROW)
    # Name the first row holding one of the two extremes that disagree.
    extreme = (pl.col(SCORE) == first["score_min"]) | (pl.col(SCORE) == first["score_max"])
    disagreeing = rows.filter(extreme)[ROW][0]
    scores = rows[SCORE].unique(maintain_order=True).to_list()
    trajectory = (
        f"trajectory ({naming.group}={first[GROUP]!r}, {naming.trajectory}={first[TRAJECTORY]!r})"
    )
    first_row, last_row = rows[ROW][0], rows[ROW][-1]
    if naming.file_of(first_row) != naming.file_of(last_row):
        # A rule would merge what are two trajectories of two steps whose ids repeat.
        raise AdvcliError(
            f"{naming.locate(last_row)}: {trajectory} has rows in two files (first at "
            f"{naming.locate(first_row)}) with different scores {scores}: the ids repeat "
            "across files; if each file is a training step, pass --by file to read each as "
            "its own batch"
        )
    raise AdvcliError(
        f"{naming.locate(disagreeing)}: {trajectory} has rows with different scores {scores}; "
        f"choose a rule with --traj-score first|last|mean|max|sum{naming.turn_hint}"
    )


def group_statistics(units: pl.DataFrame, units_per_part: int | None = None) -> pl.DataFrame:
    """Every per-group quantity an estimator needs, in one group-by, before any singleton rule.

    ``std`` is the unbiased sample std (ddof=1, as torch.std and verl), null for a single unit.
    When every unit of a group has the same score, ``mean`` is set to that score exactly and ``std``
    to 0, so the advantages are exactly 0 rather than rounding noise divided by epsilon.
    ``top_row`` is the first unit (in input order) with the group's highest score; ``score_second``
    the second highest score (equal to the highest on a tie). ``units_per_part``: see below.
    """
    all_equal = pl.col("score_max") == pl.col("score_min")
    # Groups are independent: in parts of about a million units, split by a hash of the group,
    # the sort below copies one part at a time, not every unit (every row, at turn level), and
    # each group's figures are the same bit for bit.
    parts = min(255, max(1, -(-units.height // (units_per_part or UNITS_PER_PART))))
    columns = units.select(GROUP, SCORE, TOKENS, "first_row")
    if parts == 1:
        pieces = [_group_figures(columns)]
    else:
        part = columns.select((pl.col(GROUP).hash() % parts).cast(pl.UInt8)).to_series()
        pieces = [_group_figures(columns.filter(part == index)) for index in range(parts)]
    return (
        pl.concat(pieces)
        .with_columns(
            pl.when(all_equal).then(pl.col("score_max")).otherwise(pl.col("mean")).alias("mean"),
            pl.when(all_equal & (pl.col("units") > 1))
            .then(ZERO_STD)
            .otherwise(pl.col("std"))
            .alias("std"),
            (all_equal & (pl.col("units") > 1)).alias("zero_std"),
        )
        .sort("first_row")
    )


# Units per part of group_statistics' sort (at most 255 parts: the part number is a UInt8;
# measured: compare's peak at 4.3M rows 788 → 675 MiB in the turn level's statistics).
UNITS_PER_PART = 1_000_000


def _group_figures(units: pl.DataFrame) -> pl.DataFrame:
    # Sorting by (group, score, tokens) first fixes the order in which each group's floats are
    # summed, so the statistics are bit-identical whatever the input files' order or the thread
    # count.
    in_order = units.sort(GROUP, SCORE, TOKENS)
    key, keyed = GROUP, []
    if isinstance(units.schema[GROUP], pl.Struct):
        # The (step, group) keys of --by: Polars sums a sorted struct key's groups another way
        # than a sorted integer or string key's; grouped by the run number of the sorted key,
        # each group's figures are those of its step compared alone, bit for bit.
        in_order = in_order.with_columns(pl.col(GROUP).rle_id().set_sorted().alias(RUN))
        key, keyed = RUN, [pl.col(GROUP).first()]
    return (
        in_order.group_by(key)
        .agg(
            *keyed,
            pl.len().alias("units"),
            pl.col(SCORE).mean().alias("mean"),
            pl.col(SCORE).std(ddof=STD_DDOF).alias("std"),
            pl.col(SCORE).max().alias("score_max"),
            pl.col(SCORE).min().alias("score_min"),
            pl.col(SCORE).top_k(2).min().alias("score_second"),
            pl.col("first_row").filter(pl.col(SCORE) == pl.col(SCORE).max()).min().alias("top_row"),
            pl.col(TOKENS).sum().alias("tokens_sum"),
            (pl.col(TOKENS) * pl.col(SCORE)).sum().alias("tokens_score_sum"),
            pl.col("first_row").min().alias("first_row"),
        )
        .select(pl.exclude(RUN))
    )


# The run number of a sorted struct group key, while _group_figures runs.
RUN = "__run"


def _batch_stds(units: pl.DataFrame, batch: str | None) -> pl.DataFrame:
    """The std (ddof=1) of every unit's score in each batch: the divisor of ``--scale batch``.
    One row per batch, ``__batch`` and ``batch_std``; one batch (key 0) when ``batch`` is None.

    A single unit has std 1 (as a singleton group); identical scores have std 0. The scores are
    sorted first (a fixed summation order, as in group_statistics), and the key is flagged
    sorted, so that each batch's std is that of its scores as one Series, bit for bit."""
    return (
        units.select(_batch_key(batch), SCORE)
        .sort(BATCH, SCORE)
        .with_columns(pl.col(BATCH).set_sorted())
        .group_by(BATCH, maintain_order=True)
        .agg(
            pl.when(pl.len() == 1)
            .then(SINGLETON_STD)
            .when(pl.col(SCORE).min() == pl.col(SCORE).max())
            .then(ZERO_STD)
            .otherwise(pl.col(SCORE).std(ddof=STD_DDOF))
            .alias("batch_std")
        )
    )


# The column naming each unit's (or row's) batch while batch-wide quantities are computed.
BATCH = "__batch"


def _batch_key(batch: str | None) -> pl.Expr:
    """Each unit's batch: field ``batch`` of its group key (``--by``: each step is its own batch),
    or one batch for the whole input."""
    if batch is None:
        return pl.lit(0, dtype=pl.UInt8).alias(BATCH)
    return pl.col(GROUP).struct.field(batch).alias(BATCH)


def _baseline(rule: EstimatorRule) -> pl.Expr:
    """The value a unit's score is centred on, over the group statistics' columns (groups of
    more than one unit). For rloo it is the group mean: each unit's leave-one-out baseline follows
    from it in :func:`_unit_advantage`."""
    if rule.baseline is Baseline.TOKEN_WEIGHTED_MEAN:
        # All-equal units: the mean (set to that score exactly), not a token-weighted rounding.
        return (
            pl.when(pl.col("zero_std"))
            .then(pl.col("mean"))
            .when(pl.col("tokens_sum") > 0)
            .then(pl.col("tokens_score_sum") / pl.col("tokens_sum"))
            .otherwise(0.0)
        )
    if rule.baseline is Baseline.SECOND_BEST:
        return pl.col("score_second")
    return pl.col("mean")


def _divisor(config: AdvantageConfig) -> pl.Expr:
    """What a centred score is divided by before epsilon (1 when the estimator does not divide)."""
    return {
        Scale.GROUP: pl.col("std"),
        Scale.BATCH: pl.col("batch_std"),
        Scale.NONE: pl.lit(1.0),
    }[config.effective_scale]


def _unit_advantage(rule: EstimatorRule, config: AdvantageConfig) -> pl.Expr:
    """The advantage of a unit in a group of more than one unit, over the joined group columns."""
    centred = pl.col(SCORE) - pl.col("baseline")
    if rule.baseline is Baseline.LEAVE_ONE_OUT:
        # s minus the mean of the other n - 1 units = n / (n - 1) * (s - mean).
        return pl.col("units") / (pl.col("units") - 1) * centred
    if rule.baseline is Baseline.SECOND_BEST:
        # Only the top unit (first in input order on a tie) gets s_max - s_second.
        centred = pl.when(pl.col("first_row") == pl.col("top_row")).then(centred).otherwise(0.0)
    if config.effective_scale is Scale.NONE:
        return centred
    # A zero-std group has centred == 0 exactly; keep it 0 even when epsilon is 0 (not 0/0).
    return pl.when(centred == 0).then(0.0).otherwise(centred / (pl.col("divisor") + config.epsilon))


def _singleton_advantage(rule: EstimatorRule, config: AdvantageConfig) -> pl.Expr:
    """A single-unit group's advantage: with ``--singleton raw`` the unit keeps its score, as
    (s − SINGLETON_MEAN) / (std + ε) when the estimator divides, the std being SINGLETON_STD
    with the group scale and the batch std, which every other unit shares, with ``--scale
    batch`` (SINGLETON_STD when the batch std is 0: no other unit is divided then, each being
    exactly 0); 0 with ``zero`` or where the rule says so."""
    if config.singleton is Singleton.ZERO or not rule.singleton_keeps_score:
        return pl.lit(0.0)
    centred = pl.col(SCORE) - SINGLETON_MEAN
    if config.effective_scale is Scale.NONE:
        return centred
    if config.effective_scale is Scale.BATCH:
        batch_std = pl.col("batch_std")
        std = pl.when(batch_std != ZERO_STD).then(batch_std).otherwise(SINGLETON_STD)
        # Times the reciprocal: what Polars makes of a division by a constant, so one batch's
        # numbers are the same whether its std is a constant or a column of one per batch.
        return centred * (1.0 / (std + config.epsilon))
    return centred / (SINGLETON_STD + config.epsilon)


def compute_advantages(
    projection: pl.DataFrame,
    config: AdvantageConfig,
    naming: Naming | None = None,
    trajectories: Trajectories | None = None,
    batch: str | None = None,
) -> Advantages:
    """Stage 2: the key projection in, per-unit and per-group advantages out (and each row's,
    through :meth:`Advantages.rows`). ``trajectories``: the projection's index, if already made.

    ``batch``: a field of the projection's (struct) group key whose each value is its own batch
    (``--by``: the step), for the batch-wide quantities (``--scale batch``, REINFORCE++
    whitening); by default the whole input is one batch."""
    naming = naming or Naming()
    if config.level is Level.TRAJECTORY:
        trajectories = trajectories or index_trajectories(projection)
    else:
        trajectories = None
    units = build_units(projection, config, naming, trajectories)
    stats = group_statistics(units)
    by_batch = config.effective_scale is Scale.BATCH
    if by_batch:
        stats = stats.with_columns(_batch_key(batch)).join(
            _batch_stds(units, batch), on=BATCH, how="left", maintain_order="left"
        )
    batch_columns = ["batch_std"] if by_batch else []

    rule = RULES[config.estimator]
    singleton = pl.col("units") == 1
    groups = stats.select(
        pl.col(GROUP),
        pl.col("units"),
        pl.col("top_row"),
        pl.when(singleton).then(SINGLETON_MEAN).otherwise(_baseline(rule)).alias("baseline"),
        pl.when(singleton).then(SINGLETON_STD).otherwise(_divisor(config)).alias("divisor"),
        pl.col("zero_std"),
        *batch_columns,
    )
    # Streaming, and only the advantage comes out: the group columns are never copied out to
    # every unit (at turn level, every row).
    advantage = (
        units.lazy()
        .select(GROUP, SCORE, "first_row")
        .join(
            groups.lazy().select(GROUP, "units", "top_row", "baseline", "divisor", *batch_columns),
            on=GROUP,
            how="left",
            maintain_order="left",
        )
        .select(
            pl.when(singleton)
            .then(_singleton_advantage(rule, config))
            .otherwise(_unit_advantage(rule, config))
            .alias("advantage")
        )
        .collect(engine="streaming")
        .to_series()
    )
    units = units.with_columns(advantage)
    if rule.whitens:
        if trajectories is None:  # turn level: the units are the rows
            rows = units.select("advantage", TOKENS, _batch_key(batch))
        else:
            rows = projection.select(TOKENS, _batch_key(batch)).with_columns(
                units["advantage"].gather(pl.Series(trajectories.of_row))
            )
        whitening = _token_whitening(rows, batch)
        del rows
        units = units.with_columns(_batch_key(batch)).join(
            whitening, on=BATCH, how="left", maintain_order="left"
        )
        # Times the reciprocal, as for --scale batch's singletons (_singleton_advantage).
        whitened = (pl.col("advantage") - pl.col("whiten_mean")) * (1.0 / pl.col("whiten_scale"))
        # verl multiplies the whitened values by the mask: a row without response tokens gets 0
        # (at turn level the units are the rows; at trajectory level Advantages.rows does it).
        if trajectories is None:
            whitened = pl.when(pl.col(TOKENS) > 0).then(whitened).otherwise(0.0)
        units = units.with_columns(whitened.alias("advantage")).drop(
            BATCH, "whiten_mean", "whiten_scale"
        )
    masked_rows = (projection, trajectories) if rule.whitens and trajectories is not None else None
    _check_finite(units, naming, masked_rows)
    groups = groups.rename({"divisor": "std"}).drop("top_row", *batch_columns)
    return Advantages(
        level=config.level,
        units=units,
        groups=groups,
        trajectories=trajectories,
        empty_rows_zero=masked_rows is not None,
    )


def _check_finite(
    units: pl.DataFrame,
    naming: Naming,
    masked_rows: tuple[pl.DataFrame, Trajectories] | None = None,
) -> None:
    """Scores near the float64 limit overflow the statistics; beyond the float32 limit they
    overflow the output. Either is an error naming the first row written with such a value, never
    a silent inf or NaN.

    ``masked_rows`` (the projection and its index) where a row without response tokens is written
    as 0 whatever its unit's advantage (REINFORCE++ at trajectory level): the advantage counts
    only in the rows with tokens."""
    bad_score = pl.col(SCORE).abs() > FLOAT32_MAX
    bad_advantage = ~pl.col("advantage").is_finite() | (pl.col("advantage").abs() > FLOAT32_MAX)
    if masked_rows is None:
        row = units.select(pl.col("first_row").filter(bad_score | bad_advantage).min()).item()
    else:
        projection, trajectories = masked_rows
        row = units.select(pl.col("first_row").filter(bad_score).min()).item()
        unit_is_bad = units.select(bad_advantage).to_series().to_numpy()
        written_bad = unit_is_bad[trajectories.of_row] & (projection[TOKENS] > 0).to_numpy()
        if written_bad.any():
            first = int(projection[ROW][int(written_bad.argmax())])
            row = first if row is None else min(row, first)
    if row is not None:
        raise AdvcliError(
            f"{naming.locate(row)}: the score or its advantage does not fit a float32 (the "
            "scores are too large; rescale the rewards)"
        )


def _token_whitening(rows: pl.DataFrame, batch: str | None) -> pl.DataFrame:
    """REINFORCE++ whitening over every response token of each batch (``rows``' ``__batch``):
    one row per batch with ``whiten_mean`` μ and ``whiten_scale`` sqrt(σ² + 1e-8).

    Every token of a row carries the row's value x, so with T = Σ tokens the token mean is
    μ = Σ tokens·x / T and the unbiased token variance σ² = Σ tokens·(x − μ)² / (T − 1);
    x becomes (x − μ) / sqrt(σ² + 1e-8), as verl's masked_whiten.
    """
    weight = pl.col(TOKENS).cast(pl.Float64)
    # Summed in a fixed order (sorted values), so the result does not depend on the row order;
    # the batch key flagged sorted, so each batch's sums are those of its rows alone.
    in_order = (
        rows.select(BATCH, "advantage", TOKENS)
        .sort(BATCH, "advantage", TOKENS)
        .with_columns(pl.col(BATCH).set_sorted())
    )
    totals = in_order.group_by(BATCH, maintain_order=True).agg(
        pl.col(TOKENS).sum().alias("total"),
        (weight * pl.col("advantage")).sum().alias("weighted"),
    )
    short = totals.filter(pl.col("total") < WHITEN_MIN_TOKENS)
    if not short.is_empty():
        total = short["total"][0]
        where = "the input" if batch is None else f"{batch} {short[BATCH][0]!r} (--by)"
        raise AdvcliError(
            "reinforce_pp_baseline whitens over response tokens and needs at least "
            f"{WHITEN_MIN_TOKENS}; {where} has {total}"
        )
    means = totals.select(BATCH, "total", (pl.col("weighted") / pl.col("total")).alias("mean"))
    return (
        in_order.join(means, on=BATCH, how="left", maintain_order="left")
        .with_columns(pl.col(BATCH).set_sorted())
        .group_by(BATCH, maintain_order=True)
        .agg(
            pl.col("mean").first().alias("whiten_mean"),
            (
                (weight * (pl.col("advantage") - pl.col("mean")) ** 2).sum()
                / (pl.col("total").first() - 1)
                + WHITEN_EPSILON
            )
            .sqrt()
            .alias("whiten_scale"),
        )
    )

"""The termination-bias report (``compare --reward-mode per-turn``): every step grouping of
per-turn rewards on the same rows, against the zero-padded one (docs/per-turn-rewards.md).

:func:`termination_report` is a pure function over the rows of
:func:`advcli.advantages.groupings.every_grouping`; it returns a :class:`TerminationReport` whose
``summary`` is the JSON document of docs/compare.md ("Per-turn rewards"). Its judgement is in
:mod:`advcli.report.verdict`, its documents in :mod:`advcli.report.termination_documents`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from advcli.report.bias import BiasReport
from advcli.report.figures import number
from advcli.report.verdict import REFERENCE_GROUPING, judge_grouping, termination_verdict
from advcli.settings.config import AdvantageConfig

# A row "continues" when its trajectory takes another turn after it, and "stops" at its last.
CONTINUES = pl.col("turn") < pl.col("turns") - 1


@dataclass(frozen=True)
class TerminationReport:
    """``summary``: the JSON report. ``rows``: one row per dump row, the groupings' columns of
    :func:`advcli.advantages.groupings.every_grouping`."""

    summary: dict[str, Any]
    rows: pl.DataFrame


# Either report compare writes: the bias report (outcome rewards) or the termination report.
Report = BiasReport | TerminationReport


def names_of(rows: pl.DataFrame) -> list[str]:
    """The groupings whose columns ``rows`` holds, in its order."""
    return [
        name.removeprefix("advantage:") for name in rows.columns if name.startswith("advantage:")
    ]


def termination_report(
    rows: pl.DataFrame, *, config: AdvantageConfig, settings: dict[str, Any], version: str
) -> TerminationReport:
    """The termination-bias report of ``rows`` (``config`` per-turn, one of its groupings the
    reference :data:`~advcli.report.verdict.REFERENCE_GROUPING`). ``settings`` (what the caller
    says of the input) and ``version`` go into the report's ``settings`` as they are."""
    per_turn = config.per_turn
    if per_turn is None:
        raise ValueError("the termination report is of per-turn rewards")
    names = names_of(rows)
    contrasts = _contrasts(rows, names)
    by_length, long_shares = _by_length(rows, names)
    groupings = {
        name: _grouping_figures(rows, name, contrasts, long_shares[name]) for name in names
    }
    for name, entry in groupings.items():
        entry["verdict"] = judge_grouping(name, entry)
    summary: dict[str, Any] = {
        "counts": {
            "rows": rows.height,
            "trajectories": rows["trajectory"].n_unique(),
            "groups": rows["group"].n_unique(),
        },
        "settings": {
            "reward_mode": "per-turn",
            "estimator": config.estimator.value,
            "gamma": per_turn.gamma,
            "singleton": config.singleton.value,
            "std": config.std_in_use.value if config.std_in_use else None,
            "epsilon": config.epsilon,
            "groupings": names,
            "reference": REFERENCE_GROUPING,
            "in_use": per_turn.groups.value,
            "as_computed": config.describe(),
            **settings,
            "advcli_version": version,
        },
        "groupings": groupings,
        "by_turn_index": _by_turn_index(rows, names, contrasts),
        "by_length": by_length,
    }
    summary["assessment"], summary["verdict"] = termination_verdict(summary)
    return TerminationReport(summary=summary, rows=rows)


def _difference(name: str, column: str) -> pl.Expr:
    """A grouping's ``column`` (advantage or baseline) less the reference grouping's."""
    return pl.col(f"{column}:{name}") - pl.col(f"{column}:{REFERENCE_GROUPING}")


@dataclass(frozen=True)
class Contrast:
    """One grouping's "continue" against "stop" contrast: ``by_turn`` one row per turn index
    (``turn``, ``continue_minus_stop``, ``implied_bonus``, ``implied_bonus_se``; null at a turn
    where no row continues or none stops), and the row-weighted mean of the bonus over the turns
    that have both, with its standard error."""

    by_turn: pl.DataFrame
    bonus: float | None
    se: float | None


def _contrasts(rows: pl.DataFrame, names: list[str]) -> dict[str, Contrast]:
    """Per grouping, per turn index: the mean advantage of the rows that continue less that of
    the rows that stop (``continue_minus_stop``), and the hidden bonus on continuing
    (``implied_bonus``): the same contrast of d = −(the grouping's leave-one-out baseline − the
    reference's), the derivation's β_t in the return's units (the reference's is 0 by the
    derivation; its own baseline is subtracted so that the others' noise cancels). Its standard
    error takes the group as the sampling unit (the rows of a group share their baselines):
    from each group's linearized residual of the difference of two ratios of means,
    (Σ_c d − mean_c·n_c) / n̄_c − (Σ_s d − mean_s·n_s) / n̄_s, n̄ the mean count over every
    group of the dump (one without rows at the turn counting 0). The overall bonus weighs each
    turn by its rows; its residual is the same weighted sum of each group's residuals."""
    groups = rows["group"].n_unique()
    both = (pl.col("continue_rows") > 0) & (pl.col("stop_rows") > 0)
    out = {}
    for name in names:
        d, a = -_difference(name, "loo"), pl.col(f"advantage:{name}")
        cells = rows.group_by("turn", "group").agg(
            d.filter(CONTINUES).sum().alias("d_c"),
            d.filter(~CONTINUES).sum().alias("d_s"),
            a.filter(CONTINUES).sum().alias("a_c"),
            a.filter(~CONTINUES).sum().alias("a_s"),
            CONTINUES.sum().alias("n_c"),
            (~CONTINUES).sum().alias("n_s"),
        )
        by_turn = (
            cells.group_by("turn")
            .agg(pl.col("d_c", "d_s", "a_c", "a_s", "n_c", "n_s").sum())
            .rename({"n_c": "continue_rows", "n_s": "stop_rows"})
            .with_columns(
                pl.when(both).then(pl.col("d_c") / pl.col("continue_rows")).alias("mean_c"),
                pl.when(both).then(pl.col("d_s") / pl.col("stop_rows")).alias("mean_s"),
                pl.when(both)
                .then(pl.col("a_c") / pl.col("continue_rows") - pl.col("a_s") / pl.col("stop_rows"))
                .alias("continue_minus_stop"),
            )
            .with_columns(
                (pl.col("mean_c") - pl.col("mean_s")).alias("implied_bonus"),
                (pl.col("continue_rows") + pl.col("stop_rows")).alias("rows"),
            )
            .with_columns((pl.col("rows") / pl.col("rows").filter(both).sum()).alias("weight"))
        )
        residuals = cells.join(
            by_turn.filter(both).select(
                "turn", "mean_c", "mean_s", "continue_rows", "stop_rows", "weight"
            ),
            on="turn",
        ).with_columns(
            (
                (pl.col("d_c") - pl.col("mean_c") * pl.col("n_c"))
                / (pl.col("continue_rows") / groups)
                - (pl.col("d_s") - pl.col("mean_s") * pl.col("n_s"))
                / (pl.col("stop_rows") / groups)
            ).alias("residual")
        )
        se = _standard_error(groups)
        turn_se = residuals.group_by("turn").agg(se(pl.col("residual")).alias("implied_bonus_se"))
        overall = residuals.group_by("group").agg((pl.col("weight") * pl.col("residual")).sum())
        bonus = by_turn.select(
            (pl.col("weight") * pl.col("implied_bonus")).filter(both).sum(), both.any()
        )
        out[name] = Contrast(
            by_turn=by_turn.join(turn_se, on="turn", how="left")
            .select("turn", "continue_minus_stop", "implied_bonus", "implied_bonus_se")
            .sort("turn"),
            bonus=number(bonus.item(0, 0)) if bonus.item(0, 1) else None,
            se=number(overall.select(se(pl.col("weight"))).item()) if bonus.item(0, 1) else None,
        )
    return out


def _standard_error(groups: int) -> Callable[[pl.Expr], pl.Expr]:
    """The standard error of a mean from residuals that sum to 0 over the ``groups`` groups,
    the groups missing from the frame counting 0: sqrt(Σ e² / (J − 1) / J); none for one group."""

    def se(residual: pl.Expr) -> pl.Expr:
        if groups < 2:
            return pl.lit(None, dtype=pl.Float64)
        return ((residual**2).sum() / (groups - 1) / groups).sqrt()

    return se


def _by_turn_index(
    rows: pl.DataFrame, names: list[str], contrasts: dict[str, Contrast]
) -> list[dict[str, Any]]:
    """``by_turn_index``: per turn index its rows, groups, continuing and stopping rows, and per
    grouping the mean over the groups with rows there of (the group's mean baseline there − the
    reference grouping's), and the contrasts of :func:`_contrasts`."""
    per_group = rows.group_by("turn", "group").agg(
        pl.len().alias("rows"),
        CONTINUES.sum().alias("continue_rows"),
        *(_difference(name, "baseline").mean().alias(f"shift:{name}") for name in names),
    )
    turns = (
        per_group.group_by("turn")
        .agg(
            pl.col("rows", "continue_rows").sum(),
            pl.len().alias("groups"),
            *(pl.col(f"shift:{name}").mean() for name in names),
        )
        .sort("turn")
    )
    by_turn = {name: contrasts[name].by_turn.rows_by_key("turn", named=True) for name in names}
    entries = []
    for entry in turns.iter_rows(named=True):
        turn = entry["turn"]
        figures = {name: by_turn[name][turn][0] for name in names}
        entries.append(
            {
                "turn": turn,
                "rows": entry["rows"],
                "groups": entry["groups"],
                "continue_rows": entry["continue_rows"],
                "stop_rows": entry["rows"] - entry["continue_rows"],
                "baseline_minus_padded": {name: number(entry[f"shift:{name}"]) for name in names},
                **{
                    key: {name: number(figures[name][key]) for name in names}
                    for key in ("continue_minus_stop", "implied_bonus", "implied_bonus_se")
                },
            }
        )
    return entries


def _by_length(
    rows: pl.DataFrame, names: list[str]
) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """``by_length``: per trajectory length (its rows) its trajectories and rows, and per
    grouping the mean advantage of those rows, their sign flips against the reference grouping
    and their share of the grouping's gradient mass Σ|A| over every row; and per grouping the
    share of that mass on the trajectories longer than the median trajectory's length."""
    flips = {
        name: (
            pl.col(f"advantage:{name}").sign() != pl.col(f"advantage:{REFERENCE_GROUPING}").sign()
        )
        for name in names
    }
    mass = {name: pl.col(f"advantage:{name}").abs() for name in names}
    lengths = (
        rows.group_by("turns")
        .agg(
            pl.col("trajectory").n_unique().alias("trajectories"),
            pl.len().alias("rows"),
            *(pl.col(f"advantage:{name}").mean().alias(f"mean:{name}") for name in names),
            *(flips[name].sum().alias(f"flips:{name}") for name in names),
            *(mass[name].sum().alias(f"mass:{name}") for name in names),
        )
        .sort("turns")
    )
    totals = {name: float(lengths[f"mass:{name}"].sum()) for name in names}
    entries = [
        {
            "turns": entry["turns"],
            "trajectories": entry["trajectories"],
            "rows": entry["rows"],
            "mean_advantage": {name: number(entry[f"mean:{name}"]) for name in names},
            "sign_flips": {name: entry[f"flips:{name}"] for name in names},
            "gradient_mass_share": {
                name: number(entry[f"mass:{name}"] / totals[name]) if totals[name] else None
                for name in names
            },
        }
        for entry in lengths.iter_rows(named=True)
    ]
    median = rows.group_by("trajectory").agg(pl.col("turns").first())["turns"].median()
    longer = lengths.filter(pl.col("turns") > median)
    long_shares = {
        name: number(float(longer[f"mass:{name}"].sum()) / totals[name]) if totals[name] else None
        for name in names
    }
    return entries, long_shares


def _grouping_figures(
    rows: pl.DataFrame, name: str, contrasts: dict[str, Contrast], long_share: float | None
) -> dict[str, Any]:
    """``groupings.<name>``: its headline figures, judged by
    :func:`advcli.report.verdict.judge_grouping`."""
    advantage = pl.col(f"advantage:{name}")
    flips = (advantage.sign() != pl.col(f"advantage:{REFERENCE_GROUPING}").sign()).sum()
    centred = (pl.col("return") - pl.col(f"loo:{REFERENCE_GROUPING}")).abs().mean()
    mean, mean_abs, flipped, scale = rows.select(
        advantage.mean().alias("mean"),
        advantage.abs().mean().alias("abs"),
        flips.alias("flips"),
        centred.alias("scale"),
    ).row(0)
    bonus = contrasts[name].bonus
    return {
        "mean_advantage": number(mean),
        "mean_abs_advantage": number(mean_abs),
        "implied_bonus": bonus,
        "implied_bonus_se": contrasts[name].se,
        # The bonus's size against a typical centred return (the reference's).
        "implied_bonus_relative": number(abs(bonus) / scale)
        if bonus is not None and scale
        else None,
        "sign_flips": flipped,
        "sign_flip_share": flipped / rows.height if rows.height else 0.0,
        "long_mass_share": long_share,
    }

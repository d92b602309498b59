"""The report's figure as PNG bytes: one matplotlib panel a function, drawn off screen.

Everything here reads a :class:`~advcli.report.bias.BiasReport`; nothing computes a metric, and
nothing is written here (:mod:`advcli.write.documents` writes the bytes to their file).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advcli.errors import AdvcliError
from advcli.report.views import SHOWN_STEPS, shown

if TYPE_CHECKING:
    from advcli.report.bias import BiasReport
    from advcli.report.summary import BySteps, ByTurns
    from advcli.report.termination import TerminationReport

# The most step names under panel (e).
PLOT_STEP_LABELS = 20


def figure_png(report: BiasReport, where: Path | str = "the figure") -> bytes:
    """One PNG: (a) mean advantage by turn count under both levels, (b) the histogram of
    per-trajectory differences, (c) each group's baseline shift against the share of its rows
    held by its longest trajectory, (d) each loss mode's weight by turn count, with ``--by``
    (e) the headline figures over the steps, and for gigpo (f) mean |A_episode| and
    |ω·A_step| by turn index and (g) the step group sizes."""
    return _drawn(lambda: _figure(report), where)


def termination_figure_png(report: TerminationReport, where: Path | str = "the figure") -> bytes:
    """The termination report's PNG, one line per grouping in each panel: (a) the baseline
    less the zero-padded one by turn index, (b) the hidden bonus on continuing by turn index,
    (c) the mean advantage by trajectory length, (d) the share of gradient mass by length."""
    return _drawn(lambda: _termination_figure(report), where)


def _drawn(draw: Callable[[], bytes], where: Path | str) -> bytes:
    """``draw``'s PNG, matplotlib set to draw off screen and text as written."""
    # The figure is drawn off screen whatever backend the environment names: a bad name in
    # MPLBACKEND would fail matplotlib's import.
    os.environ["MPLBACKEND"] = "Agg"
    try:
        import matplotlib
    except ImportError:
        raise AdvcliError(f"{where}: a plot needs matplotlib: pip install 'advcli[plot]'") from None
    matplotlib.use("Agg")

    # Text from the data ($^$, $\\frac{1}{2}$ as a step label) is drawn as written, never as
    # mathtext or TeX, which would fail on it or draw something else.
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        return draw()


def _figure(report: BiasReport) -> bytes:
    import matplotlib.pyplot as plt

    summary = report.summary
    credit = summary.get("step_credit")
    if credit is None:
        figure, axes = plt.subplots(2, 3, figsize=(16, 9), constrained_layout=True)
        (left, middle, right), (loss, steps, spare) = axes
        spare.axis("off")
    else:
        figure, axes = plt.subplots(3, 3, figsize=(16, 13.5), constrained_layout=True)
        (left, middle, right), (loss, steps, spare), (by_turn, sizes, last) = axes
        _step_terms_panel(by_turn, credit)
        _step_sizes_panel(sizes, credit)
        spare.axis("off")
        last.axis("off")
    _mean_advantage_panel(left, summary["by_turns"])
    _difference_panel(middle, report)
    _baseline_shift_panel(right, report)
    _loss_weight_panel(loss, summary.get("loss_weights"))
    _steps_panel(steps, summary.get("by_step"))

    counts = summary["counts"]
    figure.suptitle(
        f"advcli compare — {summary['settings']['estimator']}: turn level vs trajectory level "
        f"({counts['trajectories']:,} trajectories, {counts['groups']:,} groups; bias "
        f"{summary['assessment']['level']})"
    )
    return png_of(figure)


def png_of(figure: Any) -> bytes:
    """A matplotlib figure's PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=100)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def _paired_bars(
    axes: Any,
    positions: list[int],
    left: tuple[list[float], str, str],
    right: tuple[list[float], str, str],
) -> None:
    """Two bars at each position, side by side: each side's (heights, label, colour)."""
    width = 0.38
    for shift, (heights, label, color) in ((-width / 2, left), (width / 2, right)):
        axes.bar([t + shift for t in positions], heights, width, label=label, color=color)


def _height(value: float | None) -> float:
    """A bar's height: a figure the report has none of (null) draws no bar."""
    return math.nan if value is None else value


def _mean_advantage_panel(axes: Any, by_turns: list[ByTurns]) -> None:
    """(a) Each turn count's mean advantage under both levels, side by side."""
    turns = [entry["turns"] for entry in by_turns]
    _paired_bars(
        axes,
        turns,
        (
            [_height(e["mean_advantage_turn"]) for e in by_turns],
            "turn level (every turn counts)",
            "#d95f02",
        ),
        (
            [_height(e["mean_advantage_trajectory"]) for e in by_turns],
            "trajectory level (each trajectory once)",
            "#1b9e77",
        ),
    )
    axes.axhline(0, color="black", linewidth=0.8)
    axes.set_xticks(turns)
    axes.set_xlabel("turns in the trajectory")
    axes.set_ylabel("mean advantage")
    axes.set_title("(a) Mean advantage by turn count")
    axes.legend(fontsize="small")


def _difference_panel(axes: Any, report: BiasReport) -> None:
    """(b) The histogram of the trajectories' advantage differences."""
    diff = report.trajectories["diff"].to_numpy()
    # Differences a rounding apart (5e-17) leave no room for 40 bins of finite width.
    narrow = diff.size == 0 or diff.max() - diff.min() <= 1e-9 * max(1.0, abs(diff).max())
    axes.hist(diff, bins=1 if narrow else 40, color="#7570b3")
    axes.axvline(0, color="black", linewidth=0.8)
    axes.set_xlabel("advantage difference (trajectory − turn level)")
    axes.set_ylabel("trajectories")
    axes.set_title("(b) Per-trajectory difference")


def _baseline_shift_panel(axes: Any, report: BiasReport) -> None:
    """(c) Each group's baseline shift against its longest trajectory's share of its rows."""
    axes.scatter(
        report.groups["longest_share"].to_numpy(),
        report.groups["baseline_shift"].to_numpy(),
        s=14,
        alpha=0.7,
        color="#e7298a",
    )
    axes.set_xlabel("share of the group's rows held by its longest trajectory")
    axes.set_ylabel("|baseline shift|")
    axes.set_title("(c) Group baseline shift")


def _loss_weight_panel(axes: Any, weights: dict[str, Any] | None) -> None:
    """(d) Each loss mode's weight by turn count, or why there is none."""
    if weights:
        for mode, entry in weights.items():
            axes.plot(
                [e["turns"] for e in entry["by_turns"]],
                [e["relative_weight"] for e in entry["by_turns"]],
                marker="o",
                label=mode,
            )
        axes.axhline(1, color="black", linewidth=0.8)
        axes.legend(fontsize="small")
    else:
        axes.text(0.5, 0.5, "no mask column: token counts unknown", ha="center", va="center")
    axes.set_xlabel("turns in the trajectory")
    axes.set_ylabel("weight ÷ an equal share per trajectory")
    axes.set_title("(d) Loss weight by turn count")


def _steps_panel(axes: Any, by_step: BySteps | None) -> None:
    """(e) With ``--by``, the headline figures over the steps; else an empty panel."""
    series = by_step["steps"] if by_step is not None else []
    if by_step is None or not series:
        axes.axis("off")
        return
    positions = list(range(len(series)))
    few = len(series) <= SHOWN_STEPS
    axes.plot(
        positions,
        [e["advantage_diff_mean"] if e["rows"] else math.nan for e in series],
        marker="o" if few else None,
        label="mean |advantage diff|",
    )
    axes.plot(
        positions,
        [e["baseline_shift_mean"] if e["rows"] else math.nan for e in series],
        marker="s" if few else None,
        label="mean |baseline shift|",
    )
    # At most PLOT_STEP_LABELS names, evenly spaced, the last step's among them.
    every = -(-len(series) // PLOT_STEP_LABELS)
    named = sorted({*positions[::every], positions[-1]})
    axes.set_xticks(named, [shown(series[i]["step"]) for i in named], rotation=30, fontsize="small")
    axes.set_xlabel(shown(by_step["by"]))
    axes.legend(fontsize="small")
    axes.set_title("(e) Over training steps")


def _step_terms_panel(axes: Any, credit: dict[str, Any]) -> None:
    """(f) gigpo: mean |A_episode| and mean |ω·A_step| by turn index, or why there is none."""
    entries = credit["by_turn"]
    if entries:
        turns = [entry["turn"] for entry in entries]
        _paired_bars(
            axes,
            turns,
            ([e["mean_abs_episode"] for e in entries], "mean |A_episode|", "#1b9e77"),
            ([e["mean_abs_step"] for e in entries], "mean |ω·A_step|", "#e6ab02"),
        )
        if len(turns) <= PLOT_STEP_LABELS:
            axes.set_xticks(turns)
        axes.legend(fontsize="small")
    else:
        axes.text(
            0.5, 0.5, f"step term not measured:\n{credit['reason']}", ha="center", va="center"
        )
    axes.set_xlabel("turn index (from 0)")
    axes.set_ylabel("mean |term|")
    axes.set_title("(f) Episode and step terms by turn index")


def _step_sizes_panel(axes: Any, credit: dict[str, Any]) -> None:
    """(g) gigpo: the rows in step groups of each size (a group of one: A_step = 0)."""
    groups = credit["step_groups"]
    if groups is None:
        axes.axis("off")
        return
    sizes = list(groups["histogram"])
    axes.bar(
        range(len(sizes)),
        [groups["histogram"][size]["rows"] for size in sizes],
        color=["#bbbbbb" if size == "1" else "#66a61e" for size in sizes],
    )
    axes.set_xticks(range(len(sizes)), sizes)
    axes.set_xlabel("step group size (rows; grey: a group of one, A_step = 0)")
    axes.set_ylabel("rows")
    axes.set_title(f"(g) Step group sizes ({groups['anchor_scope']} scope)")


def _termination_figure(report: TerminationReport) -> bytes:
    import matplotlib.pyplot as plt

    summary = report.summary
    settings, counts = summary["settings"], summary["counts"]
    figure, axes = plt.subplots(2, 2, figsize=(13, 9), constrained_layout=True)
    (shift, bonus), (mean, mass) = axes
    by_turn, by_length = summary["by_turn_index"], summary["by_length"]
    panels = [
        (shift, by_turn, "turn", "baseline_minus_padded", "(a) Baseline − zero-padded baseline"),
        (bonus, by_turn, "turn", "implied_bonus", "(b) Hidden bonus on continuing"),
        (mean, by_length, "turns", "mean_advantage", "(c) Mean advantage by trajectory length"),
        (mass, by_length, "turns", "gradient_mass_share", "(d) Share of gradient mass Σ|A|"),
    ]
    for panel, entries, key, figure_name, title in panels:
        _grouping_lines(panel, entries, key, figure_name, settings["groupings"])
        panel.set_title(title)
        panel.set_xlabel("turn index (from 0)" if key == "turn" else "turns in the trajectory")
    shift.set_ylabel("mean over groups of the mean baseline at the turn")
    bonus.set_ylabel("continue − stop, in the return's units")
    mean.set_ylabel("mean advantage of the rows")
    mass.set_ylabel("share of the grouping's Σ|A|")
    figure.suptitle(
        f"advcli compare — per-turn rewards, {settings['estimator']}, gamma "
        f"{settings['gamma']:g} ({counts['trajectories']:,} trajectories, "
        f"{counts['groups']:,} groups; in use {settings['in_use']}: "
        f"{summary['assessment']['level']})"
    )
    return png_of(figure)


def _grouping_lines(
    axes: Any, entries: list[dict[str, Any]], key: str, figure_name: str, names: list[str]
) -> None:
    """One line per grouping of ``entries``' ``figure_name`` against ``key`` (a missing figure
    leaves a gap)."""
    positions = [entry[key] for entry in entries]
    for name in names:
        values = [entry[figure_name][name] for entry in entries]
        axes.plot(
            positions,
            [math.nan if value is None else value for value in values],
            marker="o",
            label=name,
        )
    axes.axhline(0, color="black", linewidth=0.8)
    if len(positions) <= PLOT_STEP_LABELS:
        axes.set_xticks(positions)
    axes.legend(fontsize="small")

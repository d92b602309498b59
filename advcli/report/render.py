"""Rendering the bias report: terminal (rich), Markdown, JSON and a matplotlib figure.

Everything here reads a :class:`~advcli.report.bias.BiasReport`; nothing computes a metric.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from advcli.errors import AdvcliError
from advcli.names import NOT_UTF8_ESCAPES
from advcli.write.atomic import atomic_output

if TYPE_CHECKING:
    # Only a type here: `advcli sample` shows its path through this module without Polars.
    from advcli.report.bias import BiasReport

# Short headers so the tables fit an 80-column terminal; "traj" = trajectory level.
BY_TURNS_HEADERS = (
    "turns",
    "trajs",
    "adv turn",
    "adv traj",
    "diff",
    "mass turn",
    "mass traj",
)
TOP_GROUP_HEADERS = (
    "group",
    "rows",
    "trajs",
    "base turn",
    "base traj",
    "std turn",
    "std traj",
    "shift",
)


TOP_TRAJECTORY_HEADERS = (
    "group",
    "trajectory",
    "turns",
    "score",
    "adv turn",
    "adv traj",
    "diff",
)


# A text from the data (an id, a column name, a step label) is shown whole up to this many
# characters; a longer one keeps its head and tail around an ellipsis, so that a view's size and
# the time to draw it do not grow with the id. The JSON report holds every id whole.
SHOWN_CHARS = 64
SHORTENED_NOTE = (
    f"Ids and names longer than {SHOWN_CHARS} characters are shown shortened (head…tail); "
    "the JSON report holds them whole."
)
# Control characters and line breaks from the data are written as escapes (a newline as \n):
# a raw one would break a table row or move the terminal's cursor.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
# The bytes of a file name that is not UTF-8 are written as escapes too.
_ESCAPES |= NOT_UTF8_ESCAPES


def visible(value: Any) -> str:
    """``value`` as text with its control characters written as escapes."""
    return str(value).translate(_ESCAPES)


def shown(value: Any) -> str:
    """An id or a name from the data as the views show it: :func:`visible`, and at most
    :data:`SHOWN_CHARS` characters of it."""
    text = str(value)
    if len(text) > SHOWN_CHARS:
        head = (SHOWN_CHARS - 1) // 2
        text = text[:head] + "…" + text[len(text) - (SHOWN_CHARS - 1 - head) :]
    return visible(text)


def _too_long(values: Any) -> bool:
    return any(len(str(value)) > SHOWN_CHARS for value in values)


def _shortened(report: BiasReport) -> bool:
    """Whether a view of ``report`` shows an id or a name shortened."""
    summary = report.summary
    reading = summary["settings"]["reading"]
    by_step = summary.get("by_step") or {}
    return _too_long(
        [
            by_step.get("by", ""),
            *(group["group"] for group in summary["top_groups"]),
            *(group["group"] for group in summary["top_trajectories"]),
            *(entry["trajectory"] for entry in summary["top_trajectories"]),
            *(entry["step"] for entry in by_step.get("steps") or []),
            *(entry["column"] or "" for entry in reading["roles"].values()),
        ]
    )


def _add_rows(table: Table, rows: Sequence[Sequence[str]]) -> None:
    """Rows of plain text: a '[' from the data is not rich markup, nor ':name:' an emoji."""
    for row in rows:
        table.add_row(*map(Text, row))


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _by_turns_rows(report: BiasReport) -> list[list[str]]:
    return [
        [
            _fmt(entry["turns"]),
            _fmt(entry["trajectories"]),
            _fmt(entry["mean_advantage_turn"]),
            _fmt(entry["mean_advantage_trajectory"]),
            _fmt(entry["mean_advantage_trajectory"] - entry["mean_advantage_turn"]),
            _fmt(entry["token_mass_turn"], 1),
            _fmt(entry["token_mass_trajectory"], 1),
        ]
        for entry in report.summary["by_turns"]
    ]


def _top_group_rows(report: BiasReport) -> list[list[str]]:
    return [
        [
            shown(group["group"]),
            _fmt(group["rows"]),
            _fmt(group["trajectories"]),
            _fmt(group["baseline_turn"]),
            _fmt(group["baseline_trajectory"]),
            _fmt(group["std_turn"]),
            _fmt(group["std_trajectory"]),
            _fmt(group["baseline_shift"]),
        ]
        for group in report.summary["top_groups"]
    ]


def _top_trajectory_rows(report: BiasReport) -> list[list[str]]:
    return [
        [
            shown(entry["group"]),
            shown(entry["trajectory"]),
            _fmt(entry["turns"]),
            _fmt(entry["score"]),
            _fmt(entry["advantage_turn"]),
            _fmt(entry["advantage_trajectory"]),
            _fmt(entry["diff"]),
        ]
        for entry in report.summary["top_trajectories"]
    ]


def _loss_weight_table(report: BiasReport) -> tuple[list[str], list[list[str]]] | None:
    """Turn counts down, loss modes across: each cell a trajectory's mean weight relative to
    equal weight per trajectory (1.00 = a fair share)."""
    weights = report.summary.get("loss_weights")
    if weights is None:
        return None
    modes = list(weights)
    turns = [entry["turns"] for entry in weights[modes[0]]["by_turns"]]
    rows = []
    for index, turn in enumerate(turns):
        rows.append(
            [_fmt(turn)]
            + [_fmt(weights[mode]["by_turns"][index]["relative_weight"], 2) for mode in modes]
        )
    return ["turns", *modes], rows


def _assessment_line(report: BiasReport) -> str:
    assessment = report.summary["assessment"]
    severe = assessment["thresholds"]["severe"]
    material = assessment["thresholds"]["material"]
    return (
        f"bias: {assessment['level']} (mean |advantage diff| "
        f"{assessment['advantage_diff_mean']:.4f}, "
        f"sign flips {100 * assessment['sign_flip_share']:.2f}%; material from "
        f"{material['advantage_diff_mean']} or any flip, severe from "
        f"{severe['advantage_diff_mean']} or {100 * severe['sign_flip_share']:.0f}% flips)"
    )


def _headline_rows(report: BiasReport) -> list[tuple[str, str]]:
    summary = report.summary
    counts, spread = summary["counts"], summary["turns_per_trajectory"]
    groups, trajectories = summary["groups"], summary["trajectories"]
    settings = summary["settings"]
    return [
        (
            "estimator",
            f"{settings['estimator']} (scale {settings['scale']}, singleton "
            f"{settings['singleton']}, epsilon {settings['epsilon']:g})",
        ),
        ("rows", _fmt(counts["rows"])),
        ("groups", _fmt(counts["groups"])),
        ("trajectories", _fmt(counts["trajectories"])),
        ("tokens", _fmt(counts["tokens"])),
        ("singleton groups (one trajectory)", _fmt(counts["singleton_groups"])),
        (
            "zero-std groups (turn / trajectory)",
            f"{counts['zero_std_groups_turn']:,} / {counts['zero_std_groups_trajectory']:,}",
        ),
        (
            "turns per trajectory (min / median / max)",
            f"{spread['min']} / {spread['median']:g} / {spread['max']}",
        ),
        (
            "baseline shift (mean / max)",
            f"{_fmt(groups['baseline_shift_mean'])} / {_fmt(groups['baseline_shift_max'])}",
        ),
        (
            "std shift (mean / max)",
            f"{_fmt(groups['std_shift_mean'])} / {_fmt(groups['std_shift_max'])}",
        ),
        ("sign flips", f"{trajectories['sign_flips']:,} of {counts['trajectories']:,}"),
        (
            "|advantage diff| (mean / max)",
            f"{_fmt(trajectories['advantage_diff_mean'])} / "
            f"{_fmt(trajectories['advantage_diff_max'])}",
        ),
        ("corr(turns, diff)", _fmt(trajectories["corr_turns_diff"], 3)),
        *_duplicate_rows_line(summary),
    ]


def _duplicate_rows_line(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline's line on duplicated rows, when the dump has any."""
    count = summary.get("duplicate_rows", {}).get("count", 0)
    if not count:
        return []
    if not summary["duplicate_rows"]["token_ids_compared"]:
        return [("possible duplicated rows", f"{count:,} (no token ids to confirm them)")]
    if summary["settings"].get("drop_duplicates"):
        return [("duplicated rows", f"{count:,}, each set counted once (--drop-duplicates)")]
    return [
        (
            "duplicated rows",
            f"{count:,} counted as the trainer did; --drop-duplicates to count each once",
        )
    ]


def reading_rows(reading: dict[str, Any]) -> list[tuple[str, str, str]]:
    """How the dump was read, a row a role: (role, column or '-', why), after the layout."""
    rows = [("layout", "", reading["read_as"])]
    for role, entry in reading["roles"].items():
        rows.append((role, shown(entry["column"] or "-"), visible(entry["why"])))
    rows += [("note", "", visible(note)) for note in reading["notes"]]
    return rows


def _reading_table(report: BiasReport) -> Table:
    table = Table(title="How the dump was read", title_justify="left", show_edge=False)
    for header in READING_HEADERS:
        table.add_column(header, overflow="fold")
    _add_rows(table, reading_rows(report.summary["settings"]["reading"]))
    return table


READING_HEADERS = ("role", "column", "why")


def render_terminal(report: BiasReport, console: Console) -> None:
    """The report as rich tables, with the verdict last."""
    headline = Table(
        title="Turn level vs trajectory level", show_header=False, title_justify="left"
    )
    headline.add_column(style="bold")
    headline.add_column(justify="right")
    _add_rows(headline, _headline_rows(report))

    histogram = Table(title="Turns per trajectory", title_justify="left", show_edge=False)
    histogram.add_column("turns", justify="right")
    histogram.add_column("trajectories", justify="right")
    histogram.add_column("")
    counts = report.summary["turns_per_trajectory"]["histogram"]
    widest = max(counts.values())
    for turns, count in counts.items():
        histogram.add_row(turns, f"{count:,}", "█" * max(1, round(30 * count / widest)))

    by_turns = Table(
        title="By turn count (diff = traj − turn; mass = Σ adv × tokens)",
        title_justify="left",
        show_edge=False,
    )
    for header in BY_TURNS_HEADERS:
        by_turns.add_column(header, justify="right")
    _add_rows(by_turns, _by_turns_rows(report))

    top = Table(
        title="Most affected groups (baseline shift)", title_justify="left", show_edge=False
    )
    for header in TOP_GROUP_HEADERS:
        # Ids are folded, not cut at the column's width: two uuids that share a prefix must stay
        # apart.
        top.add_column(header, justify="right", overflow="fold")
    _add_rows(top, _top_group_rows(report))

    worst = Table(
        title="Most affected trajectories (|diff|)", title_justify="left", show_edge=False
    )
    for header in TOP_TRAJECTORY_HEADERS:
        worst.add_column(header, justify="right", overflow="fold")
    _add_rows(worst, _top_trajectory_rows(report))

    parts: list[Any] = [
        _reading_table(report),
        "",
        headline,
        "",
        histogram,
        "",
        by_turns,
        "",
        top,
        "",
        worst,
        "",
    ]
    loss = _loss_weight_table(report)
    if loss is not None:
        weights = Table(
            title="Loss weight by turn count (a trajectory's weight ÷ an equal share)",
            title_justify="left",
            show_edge=False,
        )
        for header in loss[0]:
            weights.add_column(header, justify="right", overflow="fold")
        _add_rows(weights, loss[1])
        parts += [weights, ""]
    step_rows = _step_rows(report)
    if step_rows:
        steps = Table(
            title=Text(f"By {shown(report.summary['by_step']['by'])}"),
            title_justify="left",
            show_edge=False,
        )
        for header in STEP_HEADERS:
            steps.add_column(header, justify="right", overflow="fold")
        _add_rows(steps, step_rows)
        parts += [steps, ""]
    if _shortened(report):
        parts += [Text(SHORTENED_NOTE), ""]
    verdict = report.summary["verdict"] + "\n\n" + _assessment_line(report)
    parts.append(Panel(Text(verdict), title="Verdict", title_align="left"))
    console.print(Group(*parts))


def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(map(_cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines)


# Markdown's inline syntax: emphasis, code, links and strikethrough, and the backslash itself;
# an underscore inside a word (data_id) emphasizes nothing and stays as it is.
_MARKDOWN_SYNTAX = re.compile(r"[\\`*\[\]~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _cell(text: str) -> str:
    """A Markdown table cell, read literally: a '|' in the text (as in |advantage diff|) would end
    the cell, a line break the row, '<' '>' '&' would be read as HTML and '*' '[' '`' as
    Markdown."""
    text = _MARKDOWN_SYNTAX.sub(r"\\\g<0>", escape(visible(text), quote=False))
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    """A Markdown code span holding ``text`` literally: its fence is longer than any run of
    backticks in it (CommonMark), and a space pads a backtick at either end."""
    text = visible(text)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_markdown(report: BiasReport) -> str:
    """The report as Markdown tables, to paste into a PR or an experiment log."""
    summary = report.summary
    histogram = summary["turns_per_trajectory"]["histogram"]
    inputs = ", ".join(map(_code, summary["settings"]["inputs"]))
    return (
        "\n\n".join(
            [
                "# advcli compare: turn level vs trajectory level",
                f"**Verdict.** {summary['verdict']}",
                f"Inputs: {inputs}. advcli {summary['settings']['advcli_version']}.",
                "## How the dump was read",
                _markdown_table(READING_HEADERS, reading_rows(summary["settings"]["reading"])),
                "## Figures",
                _markdown_table(("metric", "value"), _headline_rows(report)),
                "## Turns per trajectory",
                _markdown_table(
                    ("turns", "trajectories"), [(t, f"{n:,}") for t, n in histogram.items()]
                ),
                "## By turn count",
                "diff = trajectory-level advantage − turn-level advantage; token mass = "
                "Σ advantage × response tokens.",
                _markdown_table(BY_TURNS_HEADERS, _by_turns_rows(report)),
                "## Most affected groups",
                _markdown_table(TOP_GROUP_HEADERS, _top_group_rows(report)),
                "## Most affected trajectories",
                _markdown_table(TOP_TRAJECTORY_HEADERS, _top_trajectory_rows(report)),
                *_markdown_loss_weights(report),
                *(
                    ["## By step", _markdown_table(STEP_HEADERS, _step_rows(report))]
                    if _step_rows(report)
                    else []
                ),
                *([SHORTENED_NOTE] if _shortened(report) else []),
                "## Verdict",
                _assessment_line(report),
            ]
        )
        + "\n"
    )


def _markdown_loss_weights(report: BiasReport) -> list[str]:
    loss = _loss_weight_table(report)
    if loss is None:
        return []
    return [
        "## Loss weight by turn count",
        "A trajectory's weight in the loss under each aggregation mode, relative to equal weight "
        "per trajectory (1.00 = a fair share).",
        _markdown_table(*loss),
    ]


def render_json(report: BiasReport) -> str:
    return json.dumps(report.summary, indent=2, ensure_ascii=False) + "\n"


def write_text(path: Path, text: str, *, force: bool = False) -> None:
    """Write a report file atomically (a reader never sees half of it)."""
    with atomic_output(path, force=force) as partial:
        partial.write_text(text, encoding="utf-8")


def write_plot(report: BiasReport, path: Path, *, force: bool = False) -> None:
    """The report's figure as a PNG file (see :func:`figure_png`)."""
    png = figure_png(report, path)
    with atomic_output(path, force=force) as partial:
        partial.write_bytes(png)


def figure_png(report: BiasReport, where: Path | str = "the figure") -> bytes:
    """One PNG: (a) mean advantage by turn count under both levels, (b) the histogram of
    per-trajectory differences, (c) each group's baseline shift against the share of its rows
    held by its longest trajectory, (d) each loss mode's weight by turn count, and with
    ``--by`` (e) the headline figures over the steps."""
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
        return _figure(report)


def _figure(report: BiasReport) -> bytes:
    import matplotlib.pyplot as plt

    summary = report.summary
    by_turns = summary["by_turns"]
    turns = [entry["turns"] for entry in by_turns]
    figure, axes = plt.subplots(2, 3, figsize=(16, 9), constrained_layout=True)
    (left, middle, right), (loss, steps, spare) = axes
    width = 0.38
    left.bar(
        [t - width / 2 for t in turns],
        [e["mean_advantage_turn"] for e in by_turns],
        width,
        label="turn level (every turn counts)",
        color="#d95f02",
    )
    left.bar(
        [t + width / 2 for t in turns],
        [e["mean_advantage_trajectory"] for e in by_turns],
        width,
        label="trajectory level (each trajectory once)",
        color="#1b9e77",
    )
    left.axhline(0, color="black", linewidth=0.8)
    left.set_xticks(turns)
    left.set_xlabel("turns in the trajectory")
    left.set_ylabel("mean advantage")
    left.set_title("(a) Mean advantage by turn count")
    left.legend(fontsize="small")

    middle.hist(report.trajectories["diff"].to_numpy(), bins=40, color="#7570b3")
    middle.axvline(0, color="black", linewidth=0.8)
    middle.set_xlabel("advantage difference (trajectory − turn level)")
    middle.set_ylabel("trajectories")
    middle.set_title("(b) Per-trajectory difference")

    right.scatter(
        report.groups["longest_share"].to_numpy(),
        report.groups["baseline_shift"].to_numpy(),
        s=14,
        alpha=0.7,
        color="#e7298a",
    )
    right.set_xlabel("share of the group's rows held by its longest trajectory")
    right.set_ylabel("|baseline shift|")
    right.set_title("(c) Group baseline shift")

    weights = summary.get("loss_weights")
    if weights:
        for mode, entry in weights.items():
            loss.plot(
                [e["turns"] for e in entry["by_turns"]],
                [e["relative_weight"] for e in entry["by_turns"]],
                marker="o",
                label=mode,
            )
        loss.axhline(1, color="black", linewidth=0.8)
        loss.legend(fontsize="small")
    else:
        loss.text(0.5, 0.5, "no mask column: token counts unknown", ha="center", va="center")
    loss.set_xlabel("turns in the trajectory")
    loss.set_ylabel("weight ÷ an equal share per trajectory")
    loss.set_title("(d) Loss weight by turn count")

    series = (summary.get("by_step") or {}).get("steps")
    if series:
        positions = list(range(len(series)))
        few = len(series) <= SHOWN_STEPS
        steps.plot(
            positions,
            [e["advantage_diff_mean"] if e["rows"] else math.nan for e in series],
            marker="o" if few else None,
            label="mean |advantage diff|",
        )
        steps.plot(
            positions,
            [e["baseline_shift_mean"] if e["rows"] else math.nan for e in series],
            marker="s" if few else None,
            label="mean |baseline shift|",
        )
        # At most PLOT_STEP_LABELS names, evenly spaced, the last step's among them.
        every = -(-len(series) // PLOT_STEP_LABELS)
        named = sorted({*positions[::every], positions[-1]})
        steps.set_xticks(
            named, [shown(series[i]["step"]) for i in named], rotation=30, fontsize="small"
        )
        steps.set_xlabel(shown(summary["by_step"]["by"]))
        steps.legend(fontsize="small")
        steps.set_title("(e) Over training steps")
    else:
        steps.axis("off")
    spare.axis("off")

    counts = summary["counts"]
    figure.suptitle(
        f"advcli compare — {summary['settings']['estimator']}: turn level vs trajectory level "
        f"({counts['trajectories']:,} trajectories, {counts['groups']:,} groups; bias "
        f"{summary['assessment']['level']})"
    )
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=100)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def render_html(report: BiasReport) -> str:
    """One self-contained page: the verdict, every table and the figure (an embedded PNG, when
    matplotlib is installed); no script, stylesheet or image is fetched."""
    summary = report.summary
    sections = [
        "<h1>advcli compare: turn level vs trajectory level</h1>",
        f'<p class="verdict"><strong>Verdict.</strong> {escape(summary["verdict"])}</p>',
        f"<p>{escape(_assessment_line(report))}</p>",
        _html_table(("metric", "value"), _headline_rows(report)),
        "<h2>How the dump was read</h2>",
        _html_table(READING_HEADERS, reading_rows(summary["settings"]["reading"])),
    ]
    try:
        png = base64.b64encode(figure_png(report)).decode("ascii")
        sections.append(f'<img alt="advcli compare figure" src="data:image/png;base64,{png}">')
    except AdvcliError:
        sections.append("<p>(No figure: matplotlib is not installed.)</p>")
    sections += [
        "<h2>By turn count</h2>",
        _html_table(BY_TURNS_HEADERS, _by_turns_rows(report)),
    ]
    loss = _loss_weight_table(report)
    if loss is not None:
        sections += [
            "<h2>Loss weight by turn count</h2>",
            "<p>A trajectory's weight in the loss under each aggregation mode, relative to equal "
            "weight per trajectory (1.00 = a fair share).</p>",
            _html_table(*loss),
        ]
    step_rows = _step_rows(report)
    if step_rows:
        sections += ["<h2>By step</h2>", _html_table(STEP_HEADERS, step_rows)]
    sections += [
        "<h2>Most affected trajectories</h2>",
        _html_table(TOP_TRAJECTORY_HEADERS, _top_trajectory_rows(report)),
        "<h2>Most affected groups</h2>",
        _html_table(TOP_GROUP_HEADERS, _top_group_rows(report)),
        f"<p>Inputs: {escape(visible(', '.join(summary['settings']['inputs'])))}. advcli "
        f"{escape(summary['settings']['advcli_version'])}.</p>",
    ]
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>advcli compare</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:72em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}"
        "img{max-width:100%}.verdict{font-size:1.1em;background:#f3f3f3;padding:1em}"
        "</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STEP_HEADERS = ("step", "rows", "trajs", "mean |diff|", "max |diff|", "shift", "flips", "bias")


def _step_rows(report: BiasReport) -> list[list[str]]:
    """The series' rows for the terminal, Markdown and HTML: every step up to
    :data:`SHOWN_STEPS`, else the first and last halves of them around a row saying how many
    are left out (the JSON's ``by_step`` holds every one)."""
    series = (report.summary.get("by_step") or {}).get("steps") or []
    if len(series) <= SHOWN_STEPS:
        return [_step_row(entry) for entry in series]
    half = SHOWN_STEPS // 2
    left_out = len(series) - 2 * half
    note = [f"… {left_out:,} more (by_step in the JSON)", *[""] * (len(STEP_HEADERS) - 1)]
    return [
        *(_step_row(entry) for entry in series[:half]),
        note,
        *(_step_row(entry) for entry in series[-half:]),
    ]


# The most steps a view lists, and the most step names under the plot's panel (e).
SHOWN_STEPS = 40
PLOT_STEP_LABELS = 20


def _step_row(entry: dict[str, Any]) -> list[str]:
    return [
        shown(_fmt(entry["step"])),
        _fmt(entry["rows"]),
        _fmt(entry["trajectories"]),
        _fmt(entry["advantage_diff_mean"]),
        _fmt(entry["advantage_diff_max"]),
        _fmt(entry["baseline_shift_mean"]),
        _fmt(entry["sign_flips"]),
        entry["level"] or "no rows",
    ]


def render_inspection(summary: dict[str, Any], console: Console) -> None:
    """`advcli inspect` as rich tables: roles, counts, turns, scores, then anything to fix."""
    roles = Table(
        title=Text(f"Columns, read as {visible(summary['inputs']['read_as'])}"),
        title_justify="left",
        show_edge=False,
    )
    for header in ("role", "column", "why"):
        roles.add_column(header)
    _add_rows(
        roles,
        [
            (role, shown(entry["column"] or "-"), visible(entry["why"]))
            for role, entry in summary["columns"].items()
        ],
    )

    counts, spread, scores = summary["counts"], summary["turns_per_trajectory"], summary["scores"]
    facts = Table(title="Dump", title_justify="left", show_header=False, show_edge=False)
    facts.add_column(style="bold")
    facts.add_column(justify="right")
    inputs = summary["inputs"]
    facts.add_row("files", f"{len(inputs['files']):,} ({inputs['format']})")
    for name in ("rows", "groups", "trajectories", "tokens", "empty_responses"):
        facts.add_row(name.replace("_", " "), _fmt(counts[name]))
    if summary["padding_rows"]:
        facts.add_row("padding rows (not counted above)", _fmt(summary["padding_rows"]))
    facts.add_row(
        "turns per trajectory (min / median / max)",
        f"{spread['min']} / {spread['median']:g} / {spread['max']}",
    )
    for label, entry in (("row", scores), ("trajectory", summary["trajectory_scores"])):
        facts.add_row(
            f"{label} score (min / mean / max)",
            f"{_fmt(entry['min'])} / {_fmt(entry['mean'])} / {_fmt(entry['max'])}",
        )
        distribution = entry.get("values") or entry.get("quantiles", {})
        facts.add_row(
            f"{label} score {'values' if 'values' in entry else 'quantiles'}",
            ", ".join(f"{key}: {_fmt(value)}" for key, value in distribution.items()),
        )

    histogram = Table(title="Turns per trajectory", title_justify="left", show_edge=False)
    histogram.add_column("turns", justify="right")
    histogram.add_column("trajectories", justify="right")
    histogram.add_column("")
    widest = max(spread["histogram"].values())
    for turns, count in spread["histogram"].items():
        histogram.add_row(turns, f"{count:,}", "█" * max(1, round(30 * count / widest)))

    checks = Table(title="Before compute", title_justify="left", show_edge=False)
    for header in ("check", "count", "examples"):
        checks.add_column(header)
    examples = []
    for key, label in (
        ("singleton_groups", "singleton groups (one trajectory)"),
        ("zero_std_groups", "zero-std groups (trajectory level)"),
        ("inconsistent_trajectories", "trajectories whose rows disagree on the score"),
        ("duplicate_turns", "repeated (group, trajectory, turn)"),
    ):
        entry = summary[key]
        examples += _example_values(entry["examples"])
        checks.add_row(label, f"{entry['count']:,}", Text(_examples(entry["examples"])))
    duplicates = summary["duplicate_rows"]
    checks.add_row(
        "duplicated rows (a copy of an earlier row)"
        if duplicates["token_ids_compared"]
        else "possible duplicated rows (alike in keys, score and tokens: no token ids)",
        f"{duplicates['count']:,}",
        "; ".join(f"{copy['row']} = {copy['copy_of_row']}" for copy in duplicates["first"]),
    )
    parts: list[Any] = [roles, "", facts, "", histogram, "", checks]
    columns = [entry["column"] or "" for entry in summary["columns"].values()]
    if _too_long([*columns, *examples]):
        parts += ["", Text(SHORTENED_NOTE)]
    console.print(Group(*parts))


def _example_values(examples: list[Any]) -> list[Any]:
    """The ids and values that :func:`_examples` shows."""
    return [
        value
        for example in examples
        for value in (
            [v for k, v in example.items() if k != "where"]
            if isinstance(example, dict)
            else [example]
        )
    ]


def _examples(examples: list[Any]) -> str:
    parts = []
    for example in examples:
        if isinstance(example, dict):
            parts.append(", ".join(f"{k}={shown(v)}" for k, v in example.items() if k != "where"))
        else:
            parts.append(shown(example))
    return "; ".join(parts)

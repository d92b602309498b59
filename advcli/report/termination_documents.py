"""The termination report's tables (the rows every view shares) and its Markdown and HTML
documents, as text; which renderers write a report of either kind (:func:`renderers`).

Everything here reads a :class:`~advcli.report.termination.TerminationReport`; nothing computes
a metric, and nothing is written here.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advcli.errors import AdvcliError
from advcli.report.documents import (
    html_page,
    html_table,
    markdown_code,
    markdown_table,
    render_html,
    render_markdown,
)
from advcli.report.figure import figure_png, termination_figure_png
from advcli.report.views import (
    READING_HEADERS,
    SETTINGS_HEADERS,
    fmt,
    reading_rows,
    settings_rows,
    visible,
)

if TYPE_CHECKING:
    from advcli.report.termination import Report, TerminationReport

TITLE = "advcli compare: per-turn rewards, the termination bias"
GROUPING_HEADERS = (
    "grouping",
    "safe",
    "level",
    "hidden bonus",
    "± se",
    "mean |A|",
    "sign flips",
    "long mass share",
)
# The reasons have a table of their own: a sentence in a column beside eight figures wraps to a
# word a line on a terminal.
REASON_HEADERS = ("grouping", "why")
# What each table's figures are, said under its heading in every view.
SECTIONS = {
    "groupings": "Hidden bonus: the mean advantage of the rows whose trajectory takes another "
    "turn less that of the rows where it stops, less the same of the reference grouping, "
    "row-weighted over the turn indices that have both. Sign flips: rows whose advantage sign "
    "differs from the reference's. Long mass share: the share of Σ|A| on trajectories longer "
    "than the median.",
    "reasons": "Safe by the derivation (docs/per-turn-rewards.md), or judged on the measured "
    "hidden bonus against the thresholds of docs/compare.md.",
    "shift": "Per turn index: the mean over the groups with rows there of (the grouping's "
    "mean baseline there − the zero-padded one); baseline = return − the advantage under the "
    "estimator's centring alone.",
    "bonus": "Per turn index: the mean advantage of continuing rows less that of stopping "
    "rows, less the reference grouping's.",
    "mean": "Per trajectory length: each grouping's mean advantage over the rows of "
    "trajectories of that length.",
    "mass": "Per trajectory length: the share of each grouping's Σ|A| on those rows.",
}


def grouping_rows(report: TerminationReport) -> list[list[str]]:
    """A row per grouping: its verdict and headline figures."""
    return [
        [
            name,
            "yes" if entry["verdict"]["safe"] else "no",
            entry["verdict"]["level"],
            fmt(entry["implied_bonus"]),
            fmt(entry["implied_bonus_se"]),
            fmt(entry["mean_abs_advantage"]),
            f"{entry['sign_flips']:,} ({100 * entry['sign_flip_share']:.1f}%)",
            fmt(entry["long_mass_share"], 3),
        ]
        for name, entry in report.summary["groupings"].items()
    ]


def reason_rows(report: TerminationReport) -> list[list[str]]:
    """A row per grouping: why its verdict is what it is."""
    return [
        [name, entry["verdict"]["reason"]] for name, entry in report.summary["groupings"].items()
    ]


def _compared(report: TerminationReport) -> list[str]:
    """The groupings the by-turn tables compare with the reference (which is 0 in them)."""
    settings = report.summary["settings"]
    return [name for name in settings["groupings"] if name != settings["reference"]]


def shift_table(report: TerminationReport) -> tuple[Sequence[str], list[list[str]]]:
    """Headers and rows: per turn index its rows and groups, and each grouping's baseline less
    the zero-padded one."""
    names = _compared(report)
    rows = [
        [
            str(entry["turn"]),
            fmt(entry["rows"]),
            fmt(entry["groups"]),
            *(fmt(entry["baseline_minus_padded"][name]) for name in names),
        ]
        for entry in report.summary["by_turn_index"]
    ]
    return ["turn", "rows", "groups", *names], rows


def bonus_table(report: TerminationReport) -> tuple[Sequence[str], list[list[str]]]:
    """Headers and rows: per turn index its continuing and stopping rows and each grouping's
    hidden bonus on continuing."""
    names = _compared(report)
    rows = [
        [
            str(entry["turn"]),
            fmt(entry["continue_rows"]),
            fmt(entry["stop_rows"]),
            *(fmt(entry["implied_bonus"][name]) for name in names),
        ]
        for entry in report.summary["by_turn_index"]
    ]
    return ["turn", "continue", "stop", *names], rows


def length_table(report: TerminationReport, figure: str) -> tuple[Sequence[str], list[list[str]]]:
    """Headers and rows: per trajectory length its trajectories and each grouping's
    ``figure`` (``mean_advantage`` or ``gradient_mass_share``)."""
    names = report.summary["settings"]["groupings"]
    rows = [
        [
            str(entry["turns"]),
            fmt(entry["trajectories"]),
            *(fmt(entry[figure][name]) for name in names),
        ]
        for entry in report.summary["by_length"]
    ]
    return ["turns", "trajectories", *names], rows


def tables(report: TerminationReport) -> list[tuple[str, str, Sequence[str], list[list[str]]]]:
    """Every table after the reading, as (title, what its figures are, headers, rows)."""
    return [
        ("Groupings", SECTIONS["groupings"], GROUPING_HEADERS, grouping_rows(report)),
        (
            "Why each grouping is judged so",
            SECTIONS["reasons"],
            REASON_HEADERS,
            reason_rows(report),
        ),
        ("Baseline − zero-padded baseline by turn index", SECTIONS["shift"], *shift_table(report)),
        ("Hidden bonus on continuing by turn index", SECTIONS["bonus"], *bonus_table(report)),
        (
            "Mean advantage by trajectory length",
            SECTIONS["mean"],
            *length_table(report, "mean_advantage"),
        ),
        (
            "Share of gradient mass by trajectory length",
            SECTIONS["mass"],
            *length_table(report, "gradient_mass_share"),
        ),
    ]


def termination_markdown(report: TerminationReport) -> str:
    """The termination report as Markdown tables."""
    summary = report.summary
    settings = summary["settings"]
    inputs = ", ".join(map(markdown_code, settings["inputs"]))
    parts = [
        f"# {TITLE}",
        f"**Verdict.** {summary['verdict']}",
        "## How the dump was read",
        f"Inputs: {inputs}. advcli {settings['advcli_version']}.",
        markdown_table(SETTINGS_HEADERS, settings_rows(settings)),
        markdown_table(READING_HEADERS, reading_rows(settings["reading"])),
    ]
    for title, about, headers, rows in tables(report):
        parts += [f"## {title}", about, markdown_table(headers, rows)]
    return "\n\n".join(parts) + "\n"


def termination_html(report: TerminationReport) -> str:
    """One self-contained page: the verdict, every table and the figure (an embedded PNG, when
    matplotlib is installed)."""
    summary = report.summary
    settings = summary["settings"]
    sections = [
        f"<h1>{escape(TITLE)}</h1>",
        f'<p class="verdict"><strong>Verdict.</strong> {escape(summary["verdict"])}</p>',
        "<h2>How the dump was read</h2>",
        f"<p>Inputs: {escape(visible(', '.join(settings['inputs'])))}. advcli "
        f"{escape(settings['advcli_version'])}.</p>",
        html_table(SETTINGS_HEADERS, settings_rows(settings)),
        html_table(READING_HEADERS, reading_rows(settings["reading"])),
    ]
    try:
        png = base64.b64encode(termination_figure_png(report)).decode("ascii")
        sections.append(f'<img alt="advcli compare figure" src="data:image/png;base64,{png}">')
    except AdvcliError:
        sections.append("<p>(No figure: matplotlib is not installed.)</p>")
    for title, about, headers, rows in tables(report):
        sections += [f"<h2>{escape(title)}</h2>", f"<p>{escape(about)}</p>"]
        sections.append(html_table(headers, rows))
    return html_page(sections)


@dataclass(frozen=True)
class Renderers:
    """How one kind of report is written as Markdown, a PNG and an HTML page."""

    markdown: Callable[[Any], str]
    png: Callable[[Any, Path], bytes]
    html: Callable[[Any], str]


def renderers(report: Report) -> Renderers:
    """The renderers of ``report``'s kind: the bias report's, or the termination report's."""
    from advcli.report.termination import TerminationReport

    if isinstance(report, TerminationReport):
        return Renderers(termination_markdown, termination_figure_png, termination_html)
    return Renderers(render_markdown, figure_png, render_html)

"""The report as documents: JSON, Markdown and a self-contained HTML page, as text.

Everything here reads a :class:`~advcli.report.bias.BiasReport`; nothing computes a metric, and
nothing is written here (:mod:`advcli.write.documents` writes the text to its file).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from advcli.errors import AdvcliError
from advcli.report.figure import figure_png
from advcli.report.views import (
    BY_TURNS_HEADERS,
    READING_HEADERS,
    REMEDY_HEADERS,
    SETTINGS_HEADERS,
    SHORTENED_NOTE,
    STEP_HEADERS,
    STEP_SIZE_HEADERS,
    STEP_TURN_HEADERS,
    TOP_GROUP_HEADERS,
    TOP_TRAJECTORY_HEADERS,
    assessment_line,
    by_turns_rows,
    headline_rows,
    loss_weight_table,
    reading_rows,
    remedy_rows,
    settings_rows,
    shortened,
    step_credit,
    step_credit_rows,
    step_rows,
    step_size_rows,
    step_turn_rows,
    top_group_rows,
    top_trajectory_rows,
    visible,
)

if TYPE_CHECKING:
    from advcli.report.bias import BiasReport
    from advcli.report.summary import BiasSummary
    from advcli.report.termination import TerminationReport


def render_json(report: BiasReport | TerminationReport) -> str:
    return json.dumps(report.summary, indent=2, ensure_ascii=False) + "\n"


def render_markdown(report: BiasReport) -> str:
    """The report as Markdown tables, to paste into a PR or an experiment log."""
    summary = report.summary
    histogram = summary["turns_per_trajectory"]["histogram"]
    inputs = ", ".join(map(markdown_code, summary["settings"]["inputs"]))
    return (
        "\n\n".join(
            [
                "# advcli compare: turn level vs trajectory level",
                f"**Verdict.** {summary['verdict']}",
                *_markdown_remedy(summary),
                "## How the dump was read",
                f"Inputs: {inputs}. advcli {summary['settings']['advcli_version']}.",
                markdown_table(SETTINGS_HEADERS, settings_rows(summary["settings"])),
                markdown_table(READING_HEADERS, reading_rows(summary["settings"]["reading"])),
                "## Figures",
                markdown_table(("metric", "value"), headline_rows(report)),
                "## Turns per trajectory",
                markdown_table(
                    ("turns", "trajectories"), [(t, f"{n:,}") for t, n in histogram.items()]
                ),
                "## By turn count",
                "diff = trajectory-level advantage − turn-level advantage; token mass = "
                "Σ advantage × response tokens.",
                markdown_table(BY_TURNS_HEADERS, by_turns_rows(report)),
                "## Most affected groups",
                markdown_table(TOP_GROUP_HEADERS, top_group_rows(report)),
                "## Most affected trajectories",
                markdown_table(TOP_TRAJECTORY_HEADERS, top_trajectory_rows(report)),
                *_markdown_loss_weights(report),
                *_markdown_step_credit(report),
                *(
                    ["## By step", markdown_table(STEP_HEADERS, step_rows(report))]
                    if step_rows(report)
                    else []
                ),
                *([SHORTENED_NOTE] if shortened(report) else []),
                "## Verdict",
                assessment_line(report),
            ]
        )
        + "\n"
    )


def _markdown_remedy(summary: BiasSummary) -> list[str]:
    rows = remedy_rows(summary)
    if not rows:
        return []
    return ["## What to change", markdown_table(REMEDY_HEADERS, rows)]


def _markdown_loss_weights(report: BiasReport) -> list[str]:
    loss = loss_weight_table(report)
    if loss is None:
        return []
    return [
        "## Loss weight by turn count",
        "A trajectory's weight in the loss under each aggregation mode, relative to equal weight "
        "per trajectory (1.00 = a fair share).",
        markdown_table(*loss),
    ]


def _markdown_step_credit(report: BiasReport) -> list[str]:
    """gigpo's step-credit section: its headline, step group sizes and terms by turn index."""
    credit = step_credit(report)
    if credit is None:
        return []
    parts = [
        "## Step credit (gigpo)",
        credit["verdict"],
        markdown_table(("metric", "value"), step_credit_rows(credit)),
    ]
    if credit["measured"]:
        parts += [
            markdown_table(STEP_SIZE_HEADERS, step_size_rows(credit["step_groups"])),
            markdown_table(STEP_TURN_HEADERS, step_turn_rows(credit)),
        ]
    return parts


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(map(markdown_text, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(markdown_text, row)) + " |" for row in rows]
    return "\n".join(lines)


# Markdown's inline syntax: emphasis, code, links and strikethrough, and the backslash itself;
# an underscore inside a word (data_id) emphasizes nothing and stays as it is.
_MARKDOWN_SYNTAX = re.compile(r"[\\`*\[\]~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def markdown_text(text: str) -> str:
    """Text Markdown reads literally, in a table cell or a paragraph: a '|' in the text (as in
    |advantage diff|) would end a cell, a line break the row, '<' '>' '&' would be read as HTML
    and '*' '[' '`' as Markdown."""
    text = _MARKDOWN_SYNTAX.sub(r"\\\g<0>", escape(visible(text), quote=False))
    return text.replace("|", "\\|")


def markdown_code(text: str) -> str:
    """A Markdown code span holding ``text`` literally: its fence is longer than any run of
    backticks in it (CommonMark), and a space pads a backtick at either end."""
    text = visible(text)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_html(report: BiasReport) -> str:
    """One self-contained page: the verdict, every table and the figure (an embedded PNG, when
    matplotlib is installed); no script, stylesheet or image is fetched."""
    summary = report.summary
    sections = [
        "<h1>advcli compare: turn level vs trajectory level</h1>",
        f'<p class="verdict"><strong>Verdict.</strong> {escape(summary["verdict"])}</p>',
        f"<p>{escape(assessment_line(report))}</p>",
        html_table(("metric", "value"), headline_rows(report)),
    ]
    remedies = remedy_rows(summary)
    if remedies:
        sections += ["<h2>What to change</h2>", html_table(REMEDY_HEADERS, remedies)]
    sections += [
        "<h2>How the dump was read</h2>",
        f"<p>Inputs: {escape(visible(', '.join(summary['settings']['inputs'])))}. advcli "
        f"{escape(summary['settings']['advcli_version'])}.</p>",
        html_table(SETTINGS_HEADERS, settings_rows(summary["settings"])),
        html_table(READING_HEADERS, reading_rows(summary["settings"]["reading"])),
    ]
    try:
        png = base64.b64encode(figure_png(report)).decode("ascii")
        sections.append(f'<img alt="advcli compare figure" src="data:image/png;base64,{png}">')
    except AdvcliError:
        sections.append("<p>(No figure: matplotlib is not installed.)</p>")
    sections += [
        "<h2>By turn count</h2>",
        html_table(BY_TURNS_HEADERS, by_turns_rows(report)),
    ]
    loss = loss_weight_table(report)
    if loss is not None:
        sections += [
            "<h2>Loss weight by turn count</h2>",
            "<p>A trajectory's weight in the loss under each aggregation mode, relative to equal "
            "weight per trajectory (1.00 = a fair share).</p>",
            html_table(*loss),
        ]
    credit = step_credit(report)
    if credit is not None:
        sections += [
            "<h2>Step credit (gigpo)</h2>",
            f"<p>{escape(credit['verdict'])}</p>",
            html_table(("metric", "value"), step_credit_rows(credit)),
        ]
        if credit["measured"]:
            sections += [
                html_table(STEP_SIZE_HEADERS, step_size_rows(credit["step_groups"])),
                html_table(STEP_TURN_HEADERS, step_turn_rows(credit)),
            ]
    steps = step_rows(report)
    if steps:
        sections += ["<h2>By step</h2>", html_table(STEP_HEADERS, steps)]
    sections += [
        "<h2>Most affected trajectories</h2>",
        html_table(TOP_TRAJECTORY_HEADERS, top_trajectory_rows(report)),
        "<h2>Most affected groups</h2>",
        html_table(TOP_GROUP_HEADERS, top_group_rows(report)),
    ]
    return html_page(sections)


def html_page(sections: Sequence[str], title: str = "advcli compare") -> str:
    """The page titled ``title`` around ``sections`` (HTML), with its one inline stylesheet."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:72em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right;overflow-wrap:anywhere}"
        # A long path or config key breaks where it must (the page stays within its width); the
        # first column, a name or a short id, never does.
        "td:first-child,th:first-child{white-space:nowrap}"
        "img{max-width:100%}.verdict{font-size:1.1em;background:#f3f3f3;padding:1em}"
        "</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

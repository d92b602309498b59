"""The terminal views: the bias report and the inspection as rich tables.

The rows come from :mod:`advcli.report.views`, the same as the Markdown and HTML documents'; this
module only lays them out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from advcli.report.views import (
    BY_TURNS_HEADERS,
    READING_HEADERS,
    SETTINGS_HEADERS,
    SHORTENED_NOTE,
    SHOWN_CHARS,
    STEP_HEADERS,
    STEP_SIZE_HEADERS,
    STEP_TURN_HEADERS,
    TOP_GROUP_HEADERS,
    TOP_TRAJECTORY_HEADERS,
    assessment_line,
    by_turns_rows,
    distinct_chars,
    fmt,
    headline_rows,
    id_text,
    loss_weight_table,
    reading_rows,
    remedy_rows,
    settings_rows,
    shortened,
    shown,
    step_credit,
    step_credit_rows,
    step_group_rows,
    step_rows,
    step_size_rows,
    step_turn_rows,
    too_long,
    top_group_rows,
    top_trajectory_rows,
    visible,
)

if TYPE_CHECKING:
    from advcli.report.bias import BiasReport
    from advcli.report.termination import TerminationReport


def _add_rows(table: Table, rows: Sequence[Sequence[str]]) -> None:
    """Rows of plain text: a '[' from the data is not rich markup, nor ':name:' an emoji."""
    for row in rows:
        table.add_row(*map(Text, row))


def render_terminal(report: BiasReport, console: Console) -> None:
    """The report as rich tables, with the verdict last."""
    groups, groups_cut = _top_group_table(report, console.width)
    trajectories, trajectories_cut = _top_trajectory_table(report, console.width)
    parts: list[Any] = [
        _reading_table(report),
        "",
        _headline_table(report),
        "",
        _histogram_table(report.summary["turns_per_trajectory"]["histogram"]),
        "",
        _by_turns_table(report),
        "",
        groups,
        "",
        trajectories,
        "",
    ]
    weights = _loss_weight_table(report, console.width)
    if weights is not None:
        parts += [weights, ""]
    steps = _step_table(report)
    if steps is not None:
        parts += [steps, ""]
    parts += _step_credit_tables(report)
    if shortened(report):
        parts += [Text(SHORTENED_NOTE), ""]
    if groups_cut or trajectories_cut:
        parts += [Text(WIDTH_NOTE), ""]
    remedies = remedy_rows(report.summary)
    if remedies:
        parts += [_remedy_list(remedies), ""]
    verdict = report.summary["verdict"] + "\n\n" + assessment_line(report)
    parts.append(Panel(Text(verdict), title="Verdict", title_align="left"))
    console.print(Group(*parts))


WIDTH_NOTE = (
    "Ids too long for the terminal's width are shown shortened (head…tail); "
    "the JSON report holds them whole."
)


def _remedy_list(rows: Sequence[Sequence[str]]) -> Group:
    """Each trainer's change as a paragraph under its name, wrapped at spaces only: a config key
    folded at a table column's edge would be copied wrong. Its source is in the JSON, Markdown
    and HTML reports."""
    parts: list[Any] = [Text("What to change", style="italic")]
    for trainer, change, _ in rows:
        parts += [Text.assemble((trainer, "bold"), ": ", change), ""]
    return Group(*parts[:-1])


def _reading_table(report: BiasReport) -> Table:
    return reading_table(report.summary["settings"]["reading"])


def reading_table(reading: dict[str, Any]) -> Table:
    """How the dump was read (``reading``: a report's ``settings.reading``), a row a role."""
    table = Table(title="How the dump was read", title_justify="left", show_edge=False)
    for header in READING_HEADERS:
        table.add_column(header, overflow="fold")
    _add_rows(table, reading_rows(reading))
    return table


def _headline_table(report: BiasReport) -> Table:
    headline = Table(
        title="Turn level vs trajectory level", show_header=False, title_justify="left"
    )
    headline.add_column(style="bold")
    headline.add_column(justify="right")
    _add_rows(headline, headline_rows(report))
    return headline


def _histogram_table(counts: dict[str, int]) -> Table:
    """How many trajectories have each turn count, with a bar scaled to the most common."""
    histogram = Table(title="Turns per trajectory", title_justify="left", show_edge=False)
    histogram.add_column("turns", justify="right")
    histogram.add_column("trajectories", justify="right")
    histogram.add_column("")
    widest = max(counts.values())
    for turns, count in counts.items():
        histogram.add_row(turns, f"{count:,}", "█" * max(1, round(30 * count / widest)))
    return histogram


def _by_turns_table(report: BiasReport) -> Table:
    title = "By turn count (diff = traj − turn; mass = Σ adv × tokens)"
    return _right_aligned(title, BY_TURNS_HEADERS, by_turns_rows(report))


def _top_group_table(report: BiasReport, width: int) -> tuple[Table, bool]:
    groups = [group["group"] for group in report.summary["top_groups"]]
    return _id_table(
        "Most affected groups (baseline shift)",
        TOP_GROUP_HEADERS,
        lambda chars: top_group_rows(report, chars),
        [groups],
        width,
    )


def _top_trajectory_table(report: BiasReport, width: int) -> tuple[Table, bool]:
    entries = report.summary["top_trajectories"]
    return _id_table(
        "Most affected trajectories (|diff|)",
        TOP_TRAJECTORY_HEADERS,
        lambda chars: top_trajectory_rows(report, chars),
        [[entry["group"] for entry in entries], [entry["trajectory"] for entry in entries]],
        width,
    )


# An id is shown with at least this many characters however narrow the terminal: head and tail
# of a uuid still tell it apart, where a narrower column is worth a wrapped row.
FEWEST_ID_CHARS = 12


def _id_table(
    title: str,
    headers: Sequence[str],
    rows_of: Callable[[int], list[list[str]]],
    id_columns: Sequence[Sequence[Any]],
    width: int,
) -> tuple[Table, bool]:
    """A table of right-aligned columns whose first columns hold the ids of ``id_columns``, each
    shown with ``rows_of(chars)`` at as many characters as let a row fit ``width`` beside the
    number columns (each as wide as its widest cell or header word, with the table's padding
    and rules): from :data:`FEWEST_ID_CHARS` up to :data:`SHOWN_CHARS`, and never so few that two
    ids of a column look alike. Ids that then do not fit are folded over lines, never cut. Also
    whether an id is shown shortened for the width (and not only past :data:`SHOWN_CHARS`,
    which the documents' note covers)."""
    ids = len(id_columns)

    def widest(rows: list[list[str]], column: int, words: bool = False) -> int:
        texts = [headers[column], *(row[column] for row in rows)]
        return max(len(part) for text in texts for part in (text.split() if words else [text]))

    def id_widths(chars: int) -> int:
        rows = rows_of(chars)
        return sum(max((len(row[column]) for row in rows), default=0) for column in range(ids))

    rows = rows_of(SHOWN_CHARS)
    numbers = sum(widest(rows, column, words=True) for column in range(ids, len(headers)))
    room = width - numbers - 3 * len(headers)
    chars = SHOWN_CHARS
    while chars > FEWEST_ID_CHARS and id_widths(chars) > room:
        chars -= 1
    chars = max(distinct_chars(column, chars) for column in id_columns)
    # Ids that fit are never wrapped, so the number headers wrap first; rich would otherwise
    # narrow the widest column, an id's, before them.
    fits = id_widths(chars) <= room
    table = Table(title=title, title_justify="left", show_edge=False)
    for column, header in enumerate(headers):
        table.add_column(header, justify="right", overflow="fold", no_wrap=fits and column < ids)
    _add_rows(table, rows_of(chars))
    cut = any(chars < len(id_text(v)) <= SHOWN_CHARS for column in id_columns for v in column)
    return table, cut


def _right_aligned(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    overflow: Literal["fold", "ellipsis"] = "ellipsis",
) -> Table:
    """A table of right-aligned columns of plain text, titled on the left."""
    table = Table(title=title, title_justify="left", show_edge=False)
    for header in headers:
        table.add_column(header, justify="right", overflow=overflow)
    _add_rows(table, rows)
    return table


def _loss_weight_table(report: BiasReport, width: int) -> Table | None:
    """The loss weights by turn count, when the dump has a mask column. A loss mode's name is
    broken after its hyphens where the columns share ``width`` (``seq-mean-`` / ``token-sum``),
    never inside a word."""
    loss = loss_weight_table(report)
    if loss is None:
        return None
    headers, rows = loss
    weights = Table(
        title="Loss weight by turn count (a trajectory's weight ÷ an equal share)",
        title_justify="left",
        show_edge=False,
    )
    turns = max(len(text) for text in [headers[0], *(row[0] for row in rows)])
    share = (width - turns - 3 * len(headers)) // (len(headers) - 1)
    weights.add_column(headers[0], justify="right", overflow="fold")
    for header in headers[1:]:
        weights.add_column(_broken_at_hyphens(header, share), justify="right", overflow="fold")
    _add_rows(weights, rows)
    return weights


def _broken_at_hyphens(name: str, width: int) -> str:
    """``name`` in lines of at most ``width`` characters where its hyphens allow, each line but
    the last ending at a hyphen; a piece longer than ``width`` keeps a line of its own."""
    lines = [""]
    for piece in re.findall(r"[^-]*-|[^-]+$", name):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def _step_credit_tables(report: BiasReport) -> list[Any]:
    """gigpo's step credit: its headline, and when measured the step group sizes and both
    terms by turn index."""
    credit = step_credit(report)
    if credit is None:
        return []
    headline = Table(title="Step credit (gigpo)", show_header=False, title_justify="left")
    headline.add_column(style="bold")
    headline.add_column(overflow="fold")
    _add_rows(headline, step_credit_rows(credit))
    parts: list[Any] = [headline, ""]
    if credit["measured"]:
        sizes = step_size_rows(credit["step_groups"])
        turns = step_turn_rows(credit)
        parts += [
            _right_aligned("Step group sizes", STEP_SIZE_HEADERS, sizes),
            "",
            _right_aligned("Both terms by turn index", STEP_TURN_HEADERS, turns),
            "",
        ]
    return parts


def _step_table(report: BiasReport) -> Table | None:
    """The series over steps, with ``--by``."""
    rows = step_rows(report)
    if not rows:
        return None
    steps = Table(
        title=Text(f"By {shown(report.summary['by_step']['by'])}"),
        title_justify="left",
        show_edge=False,
    )
    for header in STEP_HEADERS:
        steps.add_column(header, justify="right", overflow="fold")
    _add_rows(steps, rows)
    return steps


def render_inspection(summary: dict[str, Any], console: Console) -> None:
    """`advcli inspect` as rich tables: roles, counts, turns, scores, then anything to fix."""
    checks, examples = _checks_table(summary)
    parts: list[Any] = [
        _roles_table(summary),
        "",
        _dump_table(summary),
        "",
        _histogram_table(summary["turns_per_trajectory"]["histogram"]),
        "",
        checks,
    ]
    if "step_groups" in summary:
        parts += ["", *_step_group_tables(summary["step_groups"])]
    columns = [entry["column"] or "" for entry in summary["columns"].values()]
    if too_long([*columns, *examples]):
        parts += ["", Text(SHORTENED_NOTE)]
    console.print(Group(*parts))


def _step_group_tables(groups: dict[str, Any]) -> list[Any]:
    """GiGPO's step groups, from the anchors alone (the dump has an anchor column)."""
    facts = Table(title="Step groups (gigpo)", title_justify="left", show_header=False)
    facts.add_column(style="bold")
    facts.add_column(justify="right")
    _add_rows(facts, step_group_rows(groups))
    sizes = _right_aligned("Step group sizes", STEP_SIZE_HEADERS, step_size_rows(groups))
    return [facts, "", sizes]


def _roles_table(summary: dict[str, Any]) -> Table:
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
            *(
                (role, shown(entry["column"] or "-"), visible(entry["why"]))
                for role, entry in summary["columns"].items()
            ),
            *(("note", "", visible(note)) for note in summary["inputs"]["notes"]),
        ],
    )
    return roles


def _dump_table(summary: dict[str, Any]) -> Table:
    """The dump's files, counts, turns and scores."""
    counts, spread, scores = summary["counts"], summary["turns_per_trajectory"], summary["scores"]
    facts = Table(title="Dump", title_justify="left", show_header=False, show_edge=False)
    facts.add_column(style="bold")
    facts.add_column(justify="right")
    inputs = summary["inputs"]
    facts.add_row("files", f"{len(inputs['files']):,} ({inputs['format']})")
    for name in ("rows", "groups", "trajectories", "tokens", "empty_responses"):
        facts.add_row(name.replace("_", " "), fmt(counts[name]))
    if summary["padding_rows"]:
        label = summary.get("padding_label", "padding rows")
        facts.add_row(f"{label} (not counted above)", fmt(summary["padding_rows"]))
    facts.add_row(
        "turns per trajectory (min / median / max)",
        f"{spread['min']} / {spread['median']:g} / {spread['max']}",
    )
    if scores is None:
        facts.add_row("scores", "n/a: the dump holds no rewards")
    else:
        for label, entry in (("row", scores), ("trajectory", summary["trajectory_scores"])):
            _add_spread(facts, f"{label} score", entry)
    advantages = summary.get("trainer_advantages")
    if advantages is not None:
        trainer = summary["inputs"]["trainer"] or "the trainer"
        if advantages["rows"]:
            _add_spread(facts, f"{trainer}'s advantage", advantages)
        if advantages["rows_without"]:
            facts.add_row(f"rows without {trainer}'s advantage", fmt(advantages["rows_without"]))
    return facts


def _add_spread(facts: Table, label: str, entry: dict[str, Any]) -> None:
    """Rows for a summary of values (scores, advantages): their spread, values or quantiles."""
    facts.add_row(
        f"{label} (min / mean / max)",
        f"{fmt(entry['min'])} / {fmt(entry['mean'])} / {fmt(entry['max'])}",
    )
    distribution = entry.get("values") or entry.get("quantiles", {})
    facts.add_row(
        f"{label} {'values' if 'values' in entry else 'quantiles'}",
        ", ".join(f"{key}: {fmt(value)}" for key, value in distribution.items()),
    )


def _checks_table(summary: dict[str, Any]) -> tuple[Table, list[Any]]:
    """What compute would meet, with a few examples of each; and the examples' ids and values,
    to tell whether any is shown shortened."""
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
        if entry is None:  # a figure of scores, of a dump without them
            checks.add_row(label, "n/a", "")
            continue
        examples += _example_values(entry["examples"])
        shown_examples = _examples(entry["examples"])
        if entry["count"] and "rule" in entry:
            shown_examples = f"{entry['rule']}: {shown_examples}"
        checks.add_row(label, f"{entry['count']:,}", Text(shown_examples))
    duplicates = summary["duplicate_rows"]
    checks.add_row(
        "duplicated rows (a copy of an earlier row)"
        if duplicates["confirmed_by"] is not None
        else "possible duplicated rows (alike in keys, score and tokens: no token ids)",
        f"{duplicates['count']:,}",
        "; ".join(f"{copy['row']} = {copy['copy_of_row']}" for copy in duplicates["first"]),
    )
    return checks, examples


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
            parts.append(
                ", ".join(f"{k}={_example_value(v)}" for k, v in example.items() if k != "where")
            )
        else:
            parts.append(shown(example))
    return "; ".join(parts)


def _example_value(value: Any) -> str:
    """An id as :func:`shown`; a list of scores with the report's six significant digits (a
    float32 -0.1 read as float64 is -0.10000000149011612; the JSON keeps every digit)."""
    if isinstance(value, list) and all(isinstance(item, float) for item in value):
        return "[" + ", ".join(f"{item:.6g}" for item in value) + "]"
    return shown(value)


def render_termination(report: TerminationReport, console: Console) -> None:
    """The termination report as rich tables (:mod:`advcli.report.termination_documents`'
    rows), with the verdict last."""
    from advcli.report.termination_documents import tables

    settings = report.summary["settings"]
    chosen = Table(title="Settings", title_justify="left", show_edge=False)
    for header in SETTINGS_HEADERS:
        chosen.add_column(header, overflow="fold")
    _add_rows(chosen, settings_rows(settings))
    parts: list[Any] = [chosen, "", reading_table(settings["reading"]), ""]
    for title, about, headers, rows in tables(report):
        table = _right_aligned(title, headers, rows, overflow="fold")
        for column in table.columns:
            if column.header == "why":  # a sentence reads from the left
                column.justify = "left"
        parts += [table, Text(about), ""]
    parts.append(Panel(Text(report.summary["verdict"]), title="Verdict", title_align="left"))
    console.print(Group(*parts))


def render_audit(report: dict[str, Any], console: Console) -> None:
    """`advcli audit`: how the dump was read, the rule found, each finding with its example,
    then the verdict."""
    from advcli.report.audit import (
        STEP_AUDIT_HEADERS,
        example_detail,
        example_rows,
        rule_rows,
        step_rows,
    )

    reading = report["reading"]
    trainer = reading["roles"]["trainer_advantage"]
    rows = report["rows"]
    parts: list[Any] = [
        Text(f"Read as {visible(reading['read_as'])}"),
        Text(
            f"The trainer's advantages: '{visible(trainer['column'])}', {visible(trainer['why'])}"
        ),
        Text(
            f"Rows: {rows['audited']:,} audited of {rows['total']:,} "
            f"({rows['without_advantage']:,} without an advantage"
            + (
                f"; {rows['left_out']:,} left out: {visible(rows['left_out_what'])}"
                if rows["left_out"]
                else ""
            )
            + ")"
        ),
        *(Text(f"note: {visible(note)}") for note in reading["notes"]),
        *(
            Text(f"not fitted at {level} level: {visible(why)}")
            for level, why in report["not_fitted"].items()
        ),
        "",
    ]
    if report["rule"] is not None:
        rule = Table(title="Rule", title_justify="left", show_header=False, show_edge=False)
        rule.add_column(style="bold")
        rule.add_column()
        _add_rows(rule, rule_rows(report["rule"]))
        parts += [rule, ""]
    for finding in report["findings"]:
        headline = f"{finding['kind']}: {finding['groups']:,} groups, {finding['rows']:,} rows"
        example = Table(
            title=Text(f"Group {shown(finding['example']['group'])}"),
            title_justify="left",
            show_edge=False,
        )
        for header in ("row", "score", "expected", "found"):
            example.add_column(header, justify="right")
        _add_rows(example, example_rows(finding))
        details = [
            Text(f"{name.replace('_', ' ')}: {visible(example_detail(value))}")
            for name, value in finding["example"].items()
            if name not in ("group", "rows")
        ]
        parts += [Text(headline, style="bold"), Text(finding["report"]), *details, example, ""]
    if "by_step" in report:
        parts += [_right_aligned("By step", STEP_AUDIT_HEADERS, step_rows(report)), ""]
    parts.append(Text(report["verdict"], style="bold"))
    console.print(Group(*parts))

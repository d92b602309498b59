"""What every view of a report shows alike: a text from the data as it is shown, and the rows of
each table (terminal, Markdown, HTML), as plain strings.

Everything here reads a :class:`~advcli.report.bias.BiasReport`; nothing computes a metric.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from advcli.names import NOT_UTF8_ESCAPES

if TYPE_CHECKING:
    from collections.abc import Sequence

    # Only a type here: `advcli sample` shows its path through this module without Polars.
    from advcli.report.bias import BiasReport
    from advcli.report.summary import BiasSummary, StepEntry

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
READING_HEADERS = ("role", "column", "why")
SETTINGS_HEADERS = ("setting", "value")
REMEDY_HEADERS = ("trainer", "change", "source")
STEP_HEADERS = ("step", "rows", "trajs", "mean |diff|", "max |diff|", "shift", "flips", "bias")


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


def id_text(value: Any) -> str:
    """An id as text: a key of several columns (a group within a step of ``--by``) as its
    ``name=value`` pairs, ``step=0, group=40``; any other value as itself."""
    if isinstance(value, dict):
        return ", ".join(f"{name}={id_text(item)}" for name, item in value.items())
    return str(value)


def shown(value: Any, chars: int = SHOWN_CHARS) -> str:
    """An id or a name from the data as the views show it: its :func:`id_text`,
    :func:`visible`, and at most ``chars`` characters of it."""
    text = id_text(value)
    if len(text) > chars:
        head = (chars - 1) // 2
        text = text[:head] + "…" + text[len(text) - (chars - 1 - head) :]
    return visible(text)


def distinct_chars(values: Sequence[Any], chars: int) -> int:
    """The fewest characters, from ``chars`` up to :data:`SHOWN_CHARS`, at which
    :func:`shown` keeps ``values`` as many distinct as they are whole: two ids that differ
    only in their middle are shown with enough of it to tell them apart."""
    whole = len({id_text(value) for value in values})
    while chars < SHOWN_CHARS and len({shown(value, chars) for value in values}) < whole:
        chars += 1
    return chars


def too_long(values: Any) -> bool:
    """Whether a view shows any of ``values`` shortened."""
    return any(len(id_text(value)) > SHOWN_CHARS for value in values)


def shortened(report: BiasReport) -> bool:
    """Whether a view of ``report`` shows an id or a name shortened."""
    summary = report.summary
    reading = summary["settings"]["reading"]
    by_step = summary.get("by_step")
    return too_long(
        [
            by_step["by"] if by_step is not None else "",
            *(group["group"] for group in summary["top_groups"]),
            *(group["group"] for group in summary["top_trajectories"]),
            *(entry["trajectory"] for entry in summary["top_trajectories"]),
            *(entry["step"] for entry in steps_of(summary)),
            *(entry["column"] or "" for entry in reading["roles"].values()),
            *((summary.get("step_credit") or {}).get("penalty_hazard") or {}).get("examples", []),
        ]
    )


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` (with thousands separators) and ``noun``, in the plural (``plural``, else
    ``noun`` + s) unless the count is one: ``1 row``, ``1,024 copies``."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def fmt(value: Any, digits: int = 4) -> str:
    """A figure as the tables show it: floats to ``digits`` places, counts with thousands
    separators, a missing figure as n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def by_turns_rows(report: BiasReport) -> list[list[str]]:
    return [
        [
            fmt(entry["turns"]),
            fmt(entry["trajectories"]),
            fmt(entry["mean_advantage_turn"]),
            fmt(entry["mean_advantage_trajectory"]),
            fmt(_difference(entry["mean_advantage_trajectory"], entry["mean_advantage_turn"])),
            fmt(entry["token_mass_turn"], 1),
            fmt(entry["token_mass_trajectory"], 1),
        ]
        for entry in report.summary["by_turns"]
    ]


def top_group_rows(report: BiasReport, id_chars: int = SHOWN_CHARS) -> list[list[str]]:
    return [
        [
            shown(group["group"], id_chars),
            fmt(group["rows"]),
            fmt(group["trajectories"]),
            fmt(group["baseline_turn"]),
            fmt(group["baseline_trajectory"]),
            fmt(group["std_turn"]),
            fmt(group["std_trajectory"]),
            fmt(group["baseline_shift"]),
        ]
        for group in report.summary["top_groups"]
    ]


def top_trajectory_rows(report: BiasReport, id_chars: int = SHOWN_CHARS) -> list[list[str]]:
    return [
        [
            shown(entry["group"], id_chars),
            shown(entry["trajectory"], id_chars),
            fmt(entry["turns"]),
            fmt(entry["score"]),
            fmt(entry["advantage_turn"]),
            fmt(entry["advantage_trajectory"]),
            fmt(entry["diff"]),
        ]
        for entry in report.summary["top_trajectories"]
    ]


def loss_weight_table(report: BiasReport) -> tuple[list[str], list[list[str]]] | None:
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
            [fmt(turn)]
            + [fmt(weights[mode]["by_turns"][index]["relative_weight"], 2) for mode in modes]
        )
    return ["turns", *modes], rows


def assessment_line(report: BiasReport) -> str:
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


def headline_rows(report: BiasReport) -> list[tuple[str, str]]:
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
        ("rows", fmt(counts["rows"])),
        *_padding_rows_line(settings),
        ("groups", fmt(counts["groups"])),
        ("trajectories", fmt(counts["trajectories"])),
        ("tokens", fmt(counts["tokens"])),
        ("singleton groups (one trajectory)", fmt(counts["singleton_groups"])),
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
            f"{fmt(groups['baseline_shift_mean'])} / {fmt(groups['baseline_shift_max'])}",
        ),
        (
            "std shift (mean / max)",
            f"{fmt(groups['std_shift_mean'])} / {fmt(groups['std_shift_max'])}",
        ),
        ("sign flips", f"{trajectories['sign_flips']:,} of {counts['trajectories']:,}"),
        (
            "|advantage diff| (mean / max)",
            f"{fmt(trajectories['advantage_diff_mean'])} / "
            f"{fmt(trajectories['advantage_diff_max'])}",
        ),
        ("corr(turns, diff)", fmt(trajectories["corr_turns_diff"], 3)),
        *_duplicate_rows_line(summary),
    ]


def _difference(one: float | None, other: float | None) -> float | None:
    return None if one is None or other is None else one - other


def _padding_rows_line(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline's line on a trainer's padding rows (SkyRL's), when the dump has any: they are
    in no group, so in none of the counts."""
    padding = settings.get("padding_rows", 0)
    label = settings.get("padding_label", "padding rows")
    return [(f"{label} (not counted)", fmt(padding))] if padding else []


def _duplicate_rows_line(summary: BiasSummary) -> list[tuple[str, str]]:
    """The headline's line on duplicated rows, when the dump has any."""
    count = summary.get("duplicate_rows", {}).get("count", 0)
    if not count:
        return []
    if summary["duplicate_rows"]["confirmed_by"] is None:
        return [("possible duplicated rows", f"{count:,} (no token ids to confirm them)")]
    if summary["settings"].get("drop_duplicates"):
        return [("duplicated rows", f"{count:,}, each set counted once (--drop-duplicates)")]
    return [
        (
            "duplicated rows",
            f"{count:,} counted as the trainer did; --drop-duplicates to count each once",
        )
    ]


def settings_rows(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's ``settings`` as the JSON holds them, a row a key, the trainer (the dialect
    the dump was read in) first. The columns are :func:`reading_rows`'s; the inputs and advcli's
    version each view names in a sentence of its own (a path as a code span in Markdown)."""
    rows = [("trainer", visible(settings["reading"]["trainer"] or "none"))]
    for key, value in settings.items():
        if key in ("columns", "reading", "inputs", "advcli_version"):
            continue
        if isinstance(value, list):
            value = ", ".join(map(str, value))
        rows.append((key, visible(value if isinstance(value, str) else json.dumps(value))))
    return rows


def remedy_rows(summary: BiasSummary) -> list[tuple[str, str, str]]:
    """What to change in each trainer that applies, the dump's own first (none when the bias is
    negligible)."""
    remedy = summary["assessment"]["remedy"]
    if remedy is None:
        return []
    return [(entry["trainer"], entry["change"], entry["source"]) for entry in remedy["advice"]]


def reading_rows(reading: dict[str, Any]) -> list[tuple[str, str, str]]:
    """How the dump was read, a row a role: (role, column or '-', why), after the layout."""
    rows = [("layout", "", reading["read_as"])]
    for role, entry in reading["roles"].items():
        rows.append((role, shown(entry["column"] or "-"), visible(entry["why"])))
    rows += [("note", "", visible(note)) for note in reading["notes"]]
    return rows


# The most steps a view lists (the figure marks each step's point up to as many).
SHOWN_STEPS = 40


def step_rows(report: BiasReport) -> list[list[str]]:
    """The series' rows for the terminal, Markdown and HTML: every step up to
    :data:`SHOWN_STEPS`, else the first and last halves of them around a row saying how many
    are left out (the JSON's ``by_step`` holds every one)."""
    series = steps_of(report.summary)
    if len(series) <= SHOWN_STEPS:
        return [step_row(entry) for entry in series]
    half = SHOWN_STEPS // 2
    left_out = len(series) - 2 * half
    note = [f"… {left_out:,} more (by_step in the JSON)", *[""] * (len(STEP_HEADERS) - 1)]
    return [
        *(step_row(entry) for entry in series[:half]),
        note,
        *(step_row(entry) for entry in series[-half:]),
    ]


def steps_of(summary: BiasSummary) -> list[StepEntry]:
    """The series of ``compare --by`` (none without it)."""
    by_step = summary.get("by_step")
    return by_step["steps"] if by_step is not None else []


def step_row(entry: StepEntry) -> list[str]:
    """One step of the series as a row (``compare --follow`` prints them one at a time)."""
    return [
        shown(fmt(entry["step"])),
        fmt(entry["rows"]),
        fmt(entry["trajectories"]),
        fmt(entry["advantage_diff_mean"]),
        fmt(entry["advantage_diff_max"]),
        fmt(entry["baseline_shift_mean"]),
        fmt(entry["sign_flips"]),
        entry["level"] or "no rows",
    ]


STEP_SIZE_HEADERS = ("step group size", "step groups", "rows")
STEP_TURN_HEADERS = ("turn index", "rows", "mean |A_episode|", "mean |ω·A_step|")


def step_credit(report: BiasReport) -> dict[str, Any] | None:
    """The report's ``step_credit`` (gigpo only), None for the other estimators."""
    credit: dict[str, Any] | None = report.summary.get("step_credit")
    return credit


def step_credit_rows(credit: dict[str, Any]) -> list[tuple[str, str]]:
    """The step term's headline: its settings, what its step groups hold and its size against
    the episode term's; or why it was not measured."""
    settings = credit["settings"]
    gamma = "returns given" if settings["gamma"] is None else f"{settings['gamma']:g}"
    floor = "" if settings["std_floor"] is None else f", std floor {settings['std_floor']:g}"
    rows = [
        ("episode term", f"{settings['level']} level: {settings['episode_rule']}"),
        (
            "step term",
            f"gamma {gamma}, step weight {settings['step_weight']:g}, norm "
            f"{settings['norm']}{floor}, anchor scope {settings['anchor_scope']}",
        ),
    ]
    if not credit["measured"]:
        rows.append(("not measured", visible(credit["reason"])))
    else:
        groups = credit["step_groups"]
        rows += [
            ("turn order", visible(settings["turn_order"])),
            ("returns", visible(settings["returns"])),
            *step_group_rows(groups),
            ("tied step groups (rows)", f"{groups['tied_groups']:,} ({groups['tied_rows']:,})"),
            ("rows with A_step = 0", f"{credit['zero_rows']:,} ({_percent(credit['zero_share'])})"),
            (
                "mean |A_episode| / |ω·A_step|",
                f"{fmt(credit['mean_abs_episode'])} / {fmt(credit['mean_abs_step'])}",
            ),
            ("step / episode", _percent(credit["step_to_episode"])),
        ]
    hazard = credit["penalty_hazard"]
    named = "".join(f", {shown(group)}" for group in hazard["examples"])
    rows.append(
        (
            "verl-agent ±1e5 hazard (groups / rows)",
            f"{hazard['groups']:,} / {hazard['rows']:,}{named}",
        )
    )
    rows.append(("step signal", credit["assessment"]["level"].replace("_", " ")))
    return rows


def step_group_rows(groups: dict[str, Any]) -> list[tuple[str, str]]:
    """What the anchors alone tell (compare's and inspect's): step groups, rows in groups of
    one, the hit ratio and the anchors shared across task groups."""
    shared = groups["shared_anchors"]
    return [
        (f"step groups ({groups['anchor_scope']} scope)", fmt(groups["step_groups"])),
        (
            "rows in step groups of one",
            f"{groups['singleton_rows']:,} ({_percent(groups['singleton_share'])})",
        ),
        ("hit ratio", _percent(groups["hit_ratio"])),
        (
            "anchors in > 1 task group (rows)",
            f"{shared['anchors']:,} ({shared['rows']:,})",
        ),
    ]


def step_size_rows(groups: dict[str, Any]) -> list[list[str]]:
    return [
        [size, fmt(entry["step_groups"]), fmt(entry["rows"])]
        for size, entry in groups["histogram"].items()
    ]


def step_turn_rows(credit: dict[str, Any]) -> list[list[str]]:
    return [
        [
            fmt(entry["turn"]),
            fmt(entry["rows"]),
            fmt(entry["mean_abs_episode"]),
            fmt(entry["mean_abs_step"]),
        ]
        for entry in credit["by_turn"]
    ]


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"

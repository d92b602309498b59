"""``audit``'s findings: the trainer's advantages that its rule does not explain, grouped by
group and each group classed by the bug of the field it reproduces.

Each kind is one rule over a group's rows at the rule's level (``RuleFit.checked``), tried in
the order of :data:`KINDS`; a group takes the first kind that fits it. Two kinds are no bug
and are reported for what they say of the trainer: ``turn-level-counting`` (the rule counts
every turn row) and ``per-token-advantages`` (rows a per-token estimator made).
"""

from __future__ import annotations

from html import escape
from typing import Any, TypedDict

import polars as pl

from advcli.advantages.fit import (
    MATCH_ABSOLUTE,
    RuleFit,
    matches,
    matches_bfloat16,
)
from advcli.advantages.units import Trajectories
from advcli.keys import GROUP, ROW, SCORE, TRAINER_FIRST, TRAINER_HIGH, TRAINER_LOW
from advcli.report.documents import (
    html_page,
    html_table,
    markdown_code,
    markdown_table,
    markdown_text,
)
from advcli.report.views import id_text, visible
from advcli.settings.config import Level
from advcli.settings.resolve import ExpectedRule

# Each kind, and the field's report it reproduces.
KINDS: dict[str, str] = {
    "unexpected-rule": "the trainer's advantages follow another rule than the one --expect "
    "names (the settings believed run)",
    "turn-level-counting": "every turn row counts in its group's statistics, so a long "
    "trajectory weighs as many times as it has turns (verl's GRPO at turn level)",
    "near-zero-std-blowup": "a group whose scores differ by float residue gets advantages of "
    "order 1 or more (NeMo-RL PR #4161: one advantage of 7,428)",
    "low-precision-advantages": "the advantages are the rule's in bfloat16 precision only "
    "(OpenRLHF PR #1334: bf16 rounded the group baseline away)",
    "penalty-over-epsilon": "an advantage of 1,000 or more where the rule gives less: a value "
    "divided by epsilon alone (verl-agent: a tied group's per-row penalty, A = -1e5)",
    "batch-as-one-group": "five or more groups, or the whole batch, share one baseline "
    "(slime #1414: groups of uneven size normalized as one batch)",
    "merged-groups": "two to four groups share one baseline (NeMo-RL PR #3882: prompts with "
    "identical tokens merged into one group)",
    "equal-rewards-nonzero-advantage": "a group whose scores are all equal gets non-zero "
    "advantages (verl PR #4598: equal float rewards of 0.2)",
    "zero-earlier-steps": "every step of a trajectory but the last gets 0 (SkyRL #1492, PR "
    "#1507: (N-1)/N of step samples trained wrong)",
    "sign-flip": "the advantages have the opposite sign of the rule's (TRL PR #5026: a baseline "
    "divided by a negative group mean)",
    "per-token-advantages": "a row's response tokens carry different advantages: a per-token "
    "estimator (GAE, say), which no outcome rule makes; these rows are not audited",
    "unexplained": "no rule of the table and no known bug",
}
# Scores that differ by at most this much of their size differ by float residue: one float32
# rounding step (2^-23). A real difference of rewards is larger: 1 in 2e6 is 4 such steps.
RESIDUE = 2.0**-23
# The kinds that are no bug: what the rule says of the trainer, and rows no outcome rule makes.
# ``--fail-on any`` trips on every other kind.
INFORMATIONAL = ("turn-level-counting", "per-token-advantages")
# An advantage at least this large where the rule's is not: divided by epsilon alone.
BLOWUP = 1e3
# A group's advantages "of order 1 or more", where its scores differ by float residue only.
RESIDUE_BLOWUP = 1.0
# Two groups share a baseline where the (baseline, divisor) their rows imply agree to these
# significant digits.
SHARED_DIGITS = 5
# Tied groups tested against the lines of the groups that vary, at most (pairs of them).
MAX_PAIRS = 10_000_000
# Groups sharing one baseline from which on they are the whole batch's.
BATCH_GROUPS = 5
# Rows listed in a finding's example.
EXAMPLE_ROWS = 8


class Finding(TypedDict):
    kind: str
    groups: int
    rows: int
    report: str
    example: dict[str, Any]


def audit_findings(
    fit: RuleFit,
    projection: pl.DataFrame,
    trajectories: Trajectories,
    expected: ExpectedRule | None = None,
) -> list[Finding]:
    """The findings of ``fit``, made of ``projection`` (the key projection with the trainer's
    advantages, TRAINER_*) and its trajectories, in the order of :data:`KINDS`; ``expected``:
    the rule ``--expect`` names, whose advantages ``fit`` set beside the trainer's."""
    per_token = _per_token_rows(projection)
    multi_turn = _multi_turn_rows(projection, trajectories)
    checked = fit.checked.with_columns(matches(pl.col("expected"), pl.col("found")).alias("ok"))
    named = fit.config is not None
    groups = _group_figures(checked)
    kinds = _classify(checked, groups)
    findings: list[Finding] = []
    if fit.config is not None and fit.config.level is Level.TURN and not multi_turn.is_empty():
        turn_groups = multi_turn[GROUP].unique(maintain_order=True)
        findings.append(
            _finding(
                "turn-level-counting",
                turn_groups.len(),
                multi_turn.height,
                _example(checked.filter(pl.col(GROUP) == turn_groups[0]), True),
            )
        )
    for kind in KINDS:
        of_kind = kinds.filter(pl.col("kind") == kind)
        if of_kind.is_empty():
            continue
        rows = int(of_kind["flagged"].sum())
        first = of_kind.row(0, named=True)
        example = _example(checked.filter(pl.col(GROUP) == first[GROUP]), named)
        example.update(first["extra"] or {})
        # Another rule of the table that gives this group's missed rows whole: the trainer's
        # rule may have changed within the dump (audit --by shows each step's).
        other = fit.explained_by.of(first[GROUP]) if fit.explained_by is not None else None
        if other is not None:
            example["explained_by"] = {
                name: value for name, value in other.items() if value is not None
            }
        finding = _finding(kind, of_kind.height, rows, example)
        if other is not None:
            finding["report"] += f"; {EXPLAINED_BY}"
        findings.append(finding)
    if not per_token.is_empty():
        first_group = per_token[GROUP][0]
        example = {
            "group": first_group,
            "rows": per_token.filter(pl.col(GROUP) == first_group).head(EXAMPLE_ROWS).to_dicts(),
        }
        findings.append(
            _finding("per-token-advantages", per_token[GROUP].n_unique(), per_token.height, example)
        )
    if expected is not None:
        unexpected = _unexpected(fit, expected)
        if unexpected is not None:
            findings.append(unexpected)
    order = list(KINDS)
    return sorted(findings, key=lambda finding: order.index(finding["kind"]))


def _unexpected(fit: RuleFit, expected: ExpectedRule) -> Finding | None:
    """``unexpected-rule``: the rows the rule found explains and the rule ``--expect`` names
    does not, where the two differ in a setting it states (and the dump tells that setting);
    None where there are none: rules spelled otherwise that give the same numbers (grpo at
    scale none is drgrpo) do not differ, and rows neither explains are another finding's."""
    if fit.expected is None:
        raise ValueError("the fit was made without the expected rule")
    stated = list(dict.fromkeys(STATED_AS.get(name, name) for name in expected.stated))
    believed = {name: fit.settings(expected.config)[name] for name in stated}
    found = fit.settings(fit.config) if fit.config is not None else {}
    differ = [
        name
        for name in stated
        if found.get(name) != believed[name]
        and believed[name] not in fit.alike.get(name, ([], ""))[0]
    ]
    explained = fit.checked.filter(matches(pl.col("expected"), pl.col("found")))[ROW]
    missed = fit.expected.filter(
        ~matches(pl.col("expected"), pl.col("found")) & pl.col(ROW).is_in(explained.implode())
    )
    if fit.config is None or not differ or missed.is_empty():
        return None
    example = _example(fit.expected.filter(pl.col(GROUP) == missed[GROUP][0]), True)
    example.update(
        {
            "expected_rule": believed,
            "found_rule": {name: found.get(name) for name in stated},
            "differs": differ,
        }
    )
    return _finding("unexpected-rule", missed[GROUP].n_unique(), missed.height, example)


# What a finding adds where another rule of the table gives its example group's missed rows.
EXPLAINED_BY = (
    "another rule of the table gives this group's advantages (explained_by): the trainer's "
    "rule may have changed within the dump, which audit --by shows step by step"
)


# The rule's names of the settings --expect states by their keyword names: GiGPO's step
# term's are held together, as the rule's ``step``.
STATED_AS = {
    "std": "std_ddof",
    "gamma": "step",
    "step_weight": "step",
    "gigpo_norm": "step",
    "anchor_scope": "step",
}


def _per_token_rows(projection: pl.DataFrame) -> pl.DataFrame:
    """The rows whose response tokens carry different advantages, in input order (``row``,
    ``group``, ``score``, ``found_low``, ``found_high``)."""
    return projection.filter(
        pl.col(TRAINER_FIRST).is_not_null() & ~matches(pl.col(TRAINER_LOW), pl.col(TRAINER_HIGH))
    ).select(
        ROW,
        GROUP,
        SCORE,
        pl.col(TRAINER_LOW).alias("found_low"),
        pl.col(TRAINER_HIGH).alias("found_high"),
    )


def _multi_turn_rows(projection: pl.DataFrame, trajectories: Trajectories) -> pl.DataFrame:
    """The rows with a trainer advantage of trajectories of more than one row, in input order
    (``row``, ``group``)."""
    turns = trajectories.table["turns"].gather(pl.Series(trajectories.of_row))
    return projection.select(ROW, GROUP).filter(
        (turns > 1) & projection[TRAINER_FIRST].is_not_null()
    )


def _finding(kind: str, groups: int, rows: int, example: dict[str, Any]) -> Finding:
    return Finding(kind=kind, groups=groups, rows=rows, report=KINDS[kind], example=example)


def _group_figures(checked: pl.DataFrame) -> pl.DataFrame:
    """One row per group of the audited rows, in the order of their first rows: its scores'
    spread, and what its rows say of each kind."""
    unmatched = ~pl.col("ok")
    # The rule's sign reversed on every row the rule misses (none of them a 0 of the rule's).
    flipped = pl.col("ok") | (pl.col("expected") * pl.col("found") < 0)
    # A row the rule misses is 0 and not its trajectory's last.
    zeroed = pl.col("ok") | (
        (pl.col("found").abs() <= 1e-5) & (pl.col("expected") != 0) & ~pl.col("last_of_unit")
    )
    low_precision = matches_bfloat16(pl.col("expected_bfloat16"), pl.col("found"))
    coarse = matches_bfloat16(pl.col("expected"), pl.col("found"))
    in_order = checked.sort(SCORE, maintain_order=True)
    return (
        in_order.group_by(GROUP, maintain_order=False)
        .agg(
            pl.col(ROW).min().alias("first_row"),
            unmatched.sum().alias("flagged"),
            pl.col(SCORE).min().alias("score_min"),
            pl.col(SCORE).max().alias("score_max"),
            pl.col(SCORE).filter("counted").mean().alias("score_mean"),
            pl.col("found").abs().max().alias("found_max"),
            pl.col("expected").abs().max().alias("expected_max"),
            flipped.all().alias("flipped"),
            zeroed.all().alias("zeroed"),
            # Units of equal scores (more than one) whose missed rows are not 0.
            (pl.col("unit").n_unique() > 1).alias("several_units"),
            (pl.col("ok") | (pl.col("found").abs() > MATCH_ABSOLUTE)).all().alias("nonzero"),
            (pl.col("ok") | low_precision | coarse).all().alias("low_precision"),
            pl.col("found").min().alias("found_least"),
            pl.col("found").max().alias("found_most"),
            pl.col("found").first().alias("found_low"),
            pl.col("found").last().alias("found_high"),
        )
        .sort("first_row")
    )


def _classify(checked: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """Each group with a finding (``group``, ``kind``, ``flagged`` rows, ``extra`` for its
    example), in the order of their first rows."""
    spread = pl.col("score_max") - pl.col("score_min")
    scale = pl.max_horizontal(pl.col("score_max").abs(), pl.col("score_min").abs())
    residue = (spread > 0) & (spread <= RESIDUE * scale)
    missed = pl.col("flagged") > 0
    kind = (
        pl.when(residue & (pl.col("found_max") >= RESIDUE_BLOWUP))
        .then(pl.lit("near-zero-std-blowup"))
        .when(missed & pl.col("low_precision"))
        .then(pl.lit("low-precision-advantages"))
        .when(missed & (pl.col("found_max") >= BLOWUP) & (pl.col("expected_max") < BLOWUP))
        .then(pl.lit("penalty-over-epsilon"))
    )
    classed = groups.with_columns(kind.alias("kind"))
    shared = _shared_baselines(checked, classed.filter(missed & pl.col("kind").is_null()))
    classed = classed.join(shared, on=GROUP, how="left", maintain_order="left").with_columns(
        pl.coalesce("kind", "shared_kind")
        .fill_null(
            pl.when(missed & (spread == 0) & pl.col("several_units") & pl.col("nonzero"))
            .then(pl.lit("equal-rewards-nonzero-advantage"))
            .when(missed & pl.col("zeroed"))
            .then(pl.lit("zero-earlier-steps"))
            .when(missed & pl.col("flipped"))
            .then(pl.lit("sign-flip"))
            .when(missed)
            .then(pl.lit("unexplained"))
        )
        .alias("kind")
    )
    # A residue group's blown-up rows may be the rule's own: each of its rows counts.
    rows = checked.group_by(GROUP).len("rows")
    return (
        classed.filter(pl.col("kind").is_not_null())
        .join(rows, on=GROUP, how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("kind") == "near-zero-std-blowup")
            .then(pl.col("rows"))
            .otherwise(pl.col("flagged"))
            .alias("flagged")
        )
        .select(GROUP, "kind", "flagged", "extra")
    )


def _shared_baselines(checked: pl.DataFrame, candidates: pl.DataFrame) -> pl.DataFrame:
    """The groups among ``candidates`` whose advantages one baseline and divisor, shared with
    other groups, explain: ``group``, ``shared_kind`` (merged-groups or batch-as-one-group) and
    ``extra`` (the shared baseline, divisor and groups, for the example).

    A group's two rows of the least and the greatest score imply the line A = (s − b) / d its
    advantages lie on; groups whose (b, d) agree to SHARED_DIGITS significant digits share it.
    A line centred on the group's own mean is its own (groups of the same scores have the same
    one): only a baseline that is not the group's mean is shared. A group whose scores are all
    equal implies none: it joins a line its rows lie on, shared or of one other group (three
    points or more on a line). Two such groups alone imply a line whatever their advantages,
    so they name no baseline: they are equal-rewards-nonzero-advantage."""
    empty = pl.DataFrame(
        schema={
            GROUP: checked.schema[GROUP],
            "shared_kind": pl.String,
            "extra": pl.Struct(
                {"baseline": pl.Float64, "divisor": pl.Float64, "groups": pl.UInt32}
            ),
        }
    )
    lines = candidates.filter(
        (pl.col("score_max") > pl.col("score_min")) & (pl.col("found_high") != pl.col("found_low"))
    ).select(
        GROUP,
        (
            (pl.col("score_max") - pl.col("score_min"))
            / (pl.col("found_high") - pl.col("found_low"))
        ).alias("divisor"),
    )
    if lines.is_empty():
        return empty
    own = candidates.select(GROUP, "score_max", "found_high", "score_mean")
    lines = (
        lines.join(own, on=GROUP)
        .with_columns(
            (pl.col("score_max") - pl.col("found_high") * pl.col("divisor")).alias("baseline")
        )
        .filter(~matches(pl.col("baseline"), pl.col("score_mean")))
    )
    keyed = lines.with_columns(
        pl.col("baseline").round_sig_figs(SHARED_DIGITS).alias("b"),
        pl.col("divisor").round_sig_figs(SHARED_DIGITS).alias("d"),
    )
    lines = (
        keyed.group_by("b", "d", maintain_order=True)
        .agg(pl.col(GROUP).alias("varying"), pl.col("baseline").first(), pl.col("divisor").first())
        .with_row_index("line")
    )
    # A group of one score and one advantage is a point: it joins a line it lies on (three
    # points or more on one line, with the group that varies), its first.
    points = candidates.filter(
        (pl.col("score_max") == pl.col("score_min"))
        & (pl.col("found_least") == pl.col("found_most"))
    ).select(GROUP, pl.col("score_max").alias("s"), pl.col("found_least").alias("a"))
    if points.height * lines.height > MAX_PAIRS:
        points = points.clear()
    tied = (
        points.join(lines.select("line", "baseline", "divisor"), how="cross")
        .filter(matches((pl.col("s") - pl.col("baseline")) / pl.col("divisor"), pl.col("a")))
        .unique(GROUP, keep="first", maintain_order=True)
        .group_by("line")
        .agg(pl.col(GROUP).alias("tied"))
    )
    members = (
        pl.when(pl.col("tied").is_null())
        .then("varying")
        .otherwise(pl.concat_list("varying", "tied"))
    )
    shared = (
        lines.join(tied, on="line", how="left", maintain_order="left")
        .select(members.alias(GROUP), "baseline", "divisor")
        .filter(pl.col(GROUP).list.len() > 1)
        .with_columns(pl.col(GROUP).list.len().cast(pl.UInt32).alias("groups"))
    )
    if shared.is_empty():
        return empty
    together = shared.explode(GROUP).unique(GROUP, keep="first", maintain_order=True)
    all_groups = checked[GROUP].n_unique()
    batch = (pl.col("groups") >= BATCH_GROUPS) | (pl.col("groups") == all_groups)
    return together.select(
        GROUP,
        pl.when(batch)
        .then(pl.lit("batch-as-one-group"))
        .otherwise(pl.lit("merged-groups"))
        .alias("shared_kind"),
        pl.struct("baseline", "divisor", "groups").alias("extra"),
    )


def _example(rows: pl.DataFrame, named: bool) -> dict[str, Any]:
    """A group's worked example: its key, and its first rows' scores, the rule's advantages
    (null where no rule is named) and the trainer's."""
    expected = pl.col("expected") if named else pl.lit(None, dtype=pl.Float64).alias("expected")
    return {
        "group": rows[GROUP][0],
        "rows": rows.head(EXAMPLE_ROWS).select(ROW, SCORE, expected, "found").to_dicts(),
    }


def audit_report(
    fit: RuleFit,
    projection: pl.DataFrame,
    trajectories: Trajectories,
    *,
    reading: dict[str, Any],
    inputs: list[str],
    version: str,
    expected: ExpectedRule | None = None,
    left_out: tuple[int, str] = (0, ""),
) -> dict[str, Any]:
    """The audit as one JSON-ready document: the rule found (:func:`rule_document`), the
    findings (:func:`audit_findings`), the rows audited, how the dump was read (``reading``,
    its columns' roles) and the verdict. ``left_out``: the rows the trainer leaves out of its
    groups (the dump's padding rows, not audited) and what they are."""
    rule = rule_document(fit)
    findings = audit_findings(fit, projection, trajectories, expected)
    left_out_rows, left_out_what = left_out
    return {
        "advcli_version": version,
        "inputs": inputs,
        "reading": reading,
        "rows": {
            "total": projection.height + left_out_rows,
            "audited": fit.rows,
            "without_advantage": projection[TRAINER_FIRST].null_count(),
            "left_out": left_out_rows,
            "left_out_what": left_out_what if left_out_rows else None,
        },
        "rule": rule,
        "not_fitted": fit.unfitted,
        "findings": findings,
        "verdict": verdict(rule, findings),
    }


def step_audit(
    label: Any, fit: RuleFit | None, findings: list[Finding], why_none: str | None = None
) -> dict[str, Any]:
    """One step's own audit (``--by``): its rows, its rule's settings and the rows that rule
    explains, and each finding's rows by kind; without a fit, none of them, and ``note`` says
    why (``why_none``: no row to audit)."""
    if fit is None:
        return {
            "step": label,
            "rows": 0,
            "rule": None,
            "rows_matched": 0,
            "findings": {},
            "note": why_none,
        }
    return {
        "step": label,
        "rows": fit.rows,
        "rule": fit.settings(fit.config) if fit.config is not None else None,
        "rows_matched": fit.rows_matched,
        "findings": {finding["kind"]: finding["rows"] for finding in findings},
        "note": why_none,
    }


def step_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """``--by``'s steps, a row each (:func:`step_row`)."""
    return [step_row(entry) for entry in report["by_step"]["steps"]]


def step_row(entry: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """One step's audit (:func:`step_audit`) as a row: step, rows, the step's rule, rows it
    explains, findings."""
    rule = entry["rule"]
    named = (
        "-"
        if rule is None
        else ", ".join(
            f"{name}={example_detail(value)}" for name, value in rule.items() if value is not None
        )
    )
    findings = ", ".join(f"{kind} {rows:,}" for kind, rows in entry["findings"].items())
    return (
        id_text(entry["step"]),
        f"{entry['rows']:,}",
        named,
        f"{entry['rows_matched']:,}",
        findings or entry["note"] or "-",
    )


def tripped(kinds: list[str], fail_on: str | None) -> str | None:
    """Why ``--fail-on`` trips on an audit of findings of ``kinds``: a finding of a bug
    (``any``: a kind not INFORMATIONAL), or one of its kind; None where it does not."""
    if fail_on is None:
        return None
    bugs = [kind for kind in kinds if kind not in INFORMATIONAL]
    if fail_on == "any" and bugs:
        return f"findings ({', '.join(bugs)}): --fail-on any"
    if fail_on in kinds:
        return f"a finding of kind {fail_on}: --fail-on {fail_on}"
    return None


STEP_AUDIT_HEADERS = ("step", "rows", "rule", "explained", "findings")


def audit_metrics(report: dict[str, Any], prefix: str) -> dict[str, float]:
    """An audit as a training step's metrics: ``rule_matched`` (1 where a rule explains every
    audited row, else 0), ``rows`` audited, ``rows_off`` (those the rule does not explain; all
    of them where no rule is named) and ``findings/KIND``, the rows of each kind (0 for a kind
    not found, so that each is a series over the steps)."""
    rule = report["rule"]
    audited = report["rows"]["audited"]
    matched = rule["rows_matched"] if rule is not None else 0
    rows = {finding["kind"]: finding["rows"] for finding in report["findings"]}
    return {
        f"{prefix}rule_matched": float(rule is not None and matched == audited),
        f"{prefix}rows": float(audited),
        f"{prefix}rows_off": float(audited - matched),
        **{f"{prefix}findings/{kind}": float(rows.get(kind, 0)) for kind in KINDS},
    }


def rule_document(fit: RuleFit) -> dict[str, Any] | None:
    """The rule found, as the reports give it: its settings, ``max_abs_diff``,
    ``rows_matched``, ``rows`` and what fits alike; None where no rule explains a row."""
    if fit.config is None:
        return None
    return {
        **fit.settings(fit.config),
        "max_abs_diff": fit.max_abs_diff,
        "rows_matched": fit.rows_matched,
        "rows": fit.rows,
        "alike": {
            name: {"values": values, "why": why} for name, (values, why) in fit.alike.items()
        },
    }


def verdict(rule: dict[str, Any] | None, findings: list[Finding]) -> str:
    """The audit in one sentence."""
    if rule is None:
        return "no rule of the table explains any of the trainer's advantages"
    kinds = [finding["kind"] for finding in findings]
    followed = (
        f"the trainer's advantages follow {rule['estimator']} at {rule['level']} level on "
        f"{rule['rows_matched']:,} of {rule['rows']:,} audited rows"
    )
    if not kinds:
        return f"clean: {followed}"
    return f"{followed}; findings: {', '.join(kinds)}"


def rule_rows(rule: dict[str, Any]) -> list[tuple[str, str]]:
    """The rule found, a (setting, value) row each, with what fits alike and why."""
    std = rule["std_ddof"]
    values = {
        "level": rule["level"],
        "estimator": rule["estimator"],
        "scale": rule["scale"],
        "singleton": rule["singleton"],
        "epsilon": "-" if rule["epsilon"] is None else f"{rule['epsilon']:g}",
        "std_ddof": "-" if std is None else f"{std} ({'sample' if std == 1 else 'population'})",
    }
    if rule["step"] is not None:
        values["step"] = step_text(rule["step"])
    rows = []
    for name, value in values.items():
        alike = rule["alike"].get(name)
        if alike is not None:
            others = ", ".join(_settingmarkdown_text(other) for other in alike["values"][1:])
            value = f"{value}; fits alike: {others} ({alike['why']})"
        rows.append((name.replace("_", " "), value))
    rows.append(
        (
            "matched",
            f"{rule['rows_matched']:,} of {rule['rows']:,} rows (largest difference "
            f"{rule['max_abs_diff']:.3g})",
        )
    )
    return rows


def step_text(step: dict[str, Any]) -> str:
    """GiGPO's step term as the options that set it: ``recipe verl-agent, gamma 1, ...``."""
    gamma = "the dump's step returns" if step["gamma"] is None else f"{step['gamma']:g}"
    return (
        f"recipe {step['recipe'] or '-'}, gamma {gamma}, step weight {step['step_weight']:g}, "
        f"norm {step['gigpo_norm']}, anchors within each {step['anchor_scope']}"
    )


def _settingmarkdown_text(value: Any) -> str:
    if isinstance(value, dict):
        return step_text(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def example_detail(value: Any) -> str:
    """A finding's detail beside its example's rows (a shared baseline, the rules' settings) as
    text: ``name=value`` pairs of a mapping, the items of a list, a number to 6 digits."""
    if isinstance(value, dict):
        return ", ".join(f"{name}={example_detail(item)}" for name, item in value.items())
    if isinstance(value, list):
        return ", ".join(map(example_detail, value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def example_rows(finding: Finding) -> list[tuple[str, str, str, str]]:
    """A finding's worked example: row, score, the rule's advantage, the trainer's."""
    return [
        (
            f"{row['row']:,}",
            f"{row['score']:.6g}",
            "-" if row.get("expected") is None else f"{row['expected']:.6g}",
            f"{row['found']:.6g}"
            if "found" in row
            else f"{row['found_low']:.6g} .. {row['found_high']:.6g}",
        )
        for row in finding["example"]["rows"]
    ]


def render_audit_markdown(report: dict[str, Any]) -> str:
    """The audit as one Markdown document: the verdict, how the dump was read, the rule and
    each finding with its example."""
    reading = report["reading"]
    inputs = ", ".join(markdown_code(name) for name in report["inputs"])
    parts = [
        "# advcli audit",
        f"**Verdict.** {markdown_text(report['verdict'])}",
        f"Inputs: {inputs}, read as {markdown_text(reading['read_as'])}. advcli "
        f"{markdown_text(report['advcli_version'])}.",
        "## Reading",
        markdown_table(("role", "column", "why"), _reading_rows(report)),
        "## Rule",
        markdown_table(("setting", "value"), rule_rows(report["rule"]))
        if report["rule"] is not None
        else "No rule of the table explains the trainer's advantages.",
        "## Findings",
    ]
    if not report["findings"]:
        parts.append("None.")
    for finding in report["findings"]:
        parts += [
            f"### {finding['kind']}: {finding['groups']:,} groups, {finding['rows']:,} rows",
            markdown_text(finding["report"]) + ".",
            markdown_table(("example", "value"), _detail_rows(finding)),
            markdown_table(("row", "score", "expected", "found"), example_rows(finding)),
        ]
    if "by_step" in report:
        parts += ["## By step", markdown_table(STEP_AUDIT_HEADERS, step_rows(report))]
    return "\n\n".join(parts) + "\n"


def render_audit_html(report: dict[str, Any]) -> str:
    """The audit as one self-contained page (nothing fetched): the verdict, how the dump was
    read, the rule and each finding with its example, as :func:`render_audit_markdown`."""
    reading = report["reading"]
    sections = [
        "<h1>advcli audit</h1>",
        f'<p class="verdict"><strong>Verdict.</strong> {escape(report["verdict"])}</p>',
        f"<p>Inputs: {escape(visible(', '.join(report['inputs'])))}, read as "
        f"{escape(visible(reading['read_as']))}. advcli {escape(report['advcli_version'])}.</p>",
        "<h2>Reading</h2>",
        html_table(("role", "column", "why"), _reading_rows(report)),
        "<h2>Rule</h2>",
        html_table(("setting", "value"), rule_rows(report["rule"]))
        if report["rule"] is not None
        else "<p>No rule of the table explains the trainer's advantages.</p>",
        "<h2>Findings</h2>",
    ]
    if not report["findings"]:
        sections.append("<p>None.</p>")
    for finding in report["findings"]:
        sections += [
            f"<h3>{escape(finding['kind'])}: {finding['groups']:,} groups, "
            f"{finding['rows']:,} rows</h3>",
            f"<p>{escape(finding['report'])}.</p>",
            html_table(("example", "value"), _detail_rows(finding)),
            html_table(("row", "score", "expected", "found"), example_rows(finding)),
        ]
    if "by_step" in report:
        sections += ["<h2>By step</h2>", html_table(STEP_AUDIT_HEADERS, step_rows(report))]
    return html_page(sections, title="advcli audit")


def _reading_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """How the dump was read, a row each: each role's column and why, the notes, the rows
    left out, the levels not fitted."""
    reading, rows = report["reading"], report["rows"]
    return [
        *((role, entry["column"] or "-", entry["why"]) for role, entry in reading["roles"].items()),
        *(("note", "", note) for note in reading["notes"]),
        *(
            [("left out", "", f"{rows['left_out']:,} rows: {rows['left_out_what']}")]
            if rows["left_out"]
            else []
        ),
        *((f"not fitted: {level}", "", why) for level, why in report["not_fitted"].items()),
    ]


def _detail_rows(finding: Finding) -> list[tuple[str, str]]:
    """A finding's example's group and details (a shared baseline, the rules' settings)."""
    return [
        ("group", id_text(finding["example"]["group"])),
        *(
            (name.replace("_", " "), example_detail(value))
            for name, value in finding["example"].items()
            if name not in ("group", "rows")
        ),
    ]

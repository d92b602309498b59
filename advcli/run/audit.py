"""``audit`` as a library call: stage 1 with the trainer's own advantages, every candidate rule
fitted at once, and the findings (:mod:`advcli.report.audit`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from advcli import __version__
from advcli.advantages.fit import fit_rule, matches
from advcli.keys import GROUP, ROW, SCORE, TRAINER_FIRST, TRAINER_HIGH, TRAINER_LOW
from advcli.report.audit import audit_findings, rule_document, verdict
from advcli.run.loading import Inputs, LoadedDump, load_dump, opened
from advcli.settings.config import ColumnNames
from advcli.write.documents import write_text
from advcli.write.outputs import check_outputs, check_standard_output


def audit(
    inputs: Inputs,
    names: ColumnNames = ColumnNames(),
    *,
    json_path: Path | None = None,
    force: bool = False,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Which rule the advantages a trainer computed follow, and what no rule explains: the
    audit report, also written as JSON to ``json_path`` when given (``-``: standard output).
    ``names``: the columns' roles, ``names.advantage`` the trainer's advantages' column.

    Examples
    --------
    >>> import tempfile
    >>> from advcli.run.commands import compute
    >>> from advcli.settings.config import AdvantageConfig, Level
    >>> dump = Path(tempfile.mkdtemp()) / "turn_level.parquet"
    >>> _ = compute(["sample_data/rollouts.parquet"], dump, AdvantageConfig(level=Level.TURN))
    >>> report = audit([dump])
    >>> report["rule"]["level"], report["rule"]["estimator"], report["rule"]["epsilon"]
    ('turn', 'grpo', 1e-06)
    >>> [finding["kind"] for finding in report["findings"]]
    ['turn-level-counting']
    """
    stage = on_stage or (lambda name: None)
    with opened(inputs) as dataset:
        check_standard_output({"--json": json_path})
        check_outputs([json_path], dataset, force=force)
        stage("reading keys")
        dump = load_dump(dataset, names, trainer_advantage=True)
        stage("fitting rules")
        fit = fit_rule(dump.projection, dump.naming, dump.trajectories, dump.batch)
        findings = audit_findings(fit, _per_token_rows(dump), _multi_turn_rows(dump))
        dataset.check_unchanged()
        rule = rule_document(fit)
        report = {
            "advcli_version": __version__,
            "inputs": [dataset.label(i) for i in range(len(dataset.files))],
            "reading": dump.columns.reading(),
            "rows": {
                "total": dump.projection.height,
                "audited": fit.rows,
                "without_advantage": dump.projection[TRAINER_FIRST].null_count(),
            },
            "rule": rule,
            "not_fitted": fit.unfitted,
            "findings": findings,
            "verdict": verdict(rule, findings),
        }
    if json_path is not None:
        write_text(json_path, render_audit_json(report), force=force)
    return report


def render_audit_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def _per_token_rows(dump: LoadedDump) -> pl.DataFrame:
    """The rows whose response tokens carry different advantages, in input order."""
    return dump.projection.filter(
        pl.col(TRAINER_FIRST).is_not_null() & ~matches(pl.col(TRAINER_LOW), pl.col(TRAINER_HIGH))
    ).select(
        ROW,
        GROUP,
        SCORE,
        pl.col(TRAINER_LOW).alias("found_low"),
        pl.col(TRAINER_HIGH).alias("found_high"),
    )


def _multi_turn_rows(dump: LoadedDump) -> pl.DataFrame:
    """The rows with a trainer advantage of trajectories of more than one row, in input order."""
    trajectories = dump.trajectories
    turns = trajectories.table["turns"].gather(pl.Series(trajectories.of_row))
    return dump.projection.select(ROW, GROUP, TRAINER_FIRST).filter(
        (turns > 1) & pl.col(TRAINER_FIRST).is_not_null()
    )

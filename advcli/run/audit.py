"""``audit`` as a library call: stage 1 with the trainer's own advantages, every candidate rule
fitted at once, and the findings (:mod:`advcli.report.audit`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from advcli import __version__
from advcli.advantages.fit import fit_rule
from advcli.advantages.units import Trajectories, index_trajectories
from advcli.errors import AdvcliError
from advcli.keys import GROUP
from advcli.read.alike import ReadAlike
from advcli.read.dataset import Dataset
from advcli.report.audit import (
    audit_findings,
    audit_report,
    render_audit_html,
    render_audit_markdown,
    step_audit,
)
from advcli.run.follow import StepReader
from advcli.run.loading import Inputs, LoadedDump, check_by, load_dump, opened
from advcli.run.parts import step_order
from advcli.settings.config import ColumnNames
from advcli.settings.resolve import ExpectedRule
from advcli.write.documents import write_reports, write_text
from advcli.write.outputs import check_outputs, check_standard_output


def audit(  # noqa: PLR0913
    inputs: Inputs,
    names: ColumnNames = ColumnNames(),
    *,
    expect: ExpectedRule | None = None,
    json_path: Path | None = None,
    markdown: Path | None = None,
    html: Path | None = None,
    force: bool = False,
    by: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Which rule the advantages a trainer computed follow, and what no rule explains: the
    audit report, also written as JSON to ``json_path``, as Markdown to ``markdown`` and as a
    self-contained HTML page to ``html`` where given (``-``: standard output, for one of them).
    ``names``: the columns' roles, ``names.advantage`` the trainer's advantages' column;
    ``expect``: the rule the trainer is believed to run
    (:func:`~advcli.settings.resolve.expected_rule`), whose mismatch is a finding; ``by``
    (``"file"`` or a column): each part its own batch, its groups keyed by ``(step, group)``,
    and audited on its own too (the report's ``by_step``).

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
        check_standard_output({"--json": json_path, "--markdown": markdown, "--html": html})
        check_outputs([json_path, markdown, html], dataset, force=force)
        check_by(dataset, by)
        stage("reading keys")
        dump = _load_scored(dataset, names, by)
        stage("fitting rules")
        fit = fit_rule(
            dump.projection,
            dump.naming,
            dump.trajectories,
            dump.batch,
            expected=expect.config if expect is not None else None,
        )
        dataset.check_unchanged()
        report = audit_report(
            fit,
            dump.projection,
            dump.trajectories,
            reading=dump.columns.reading(),
            inputs=[dataset.label(i) for i in range(len(dataset.files))],
            version=__version__,
            expected=expect,
            left_out=(dump.padding.height, dump.columns.padding_label),
        )
        if by is not None:
            report["by_step"] = {"by": by, "steps": _by_step(dump, by, expect)}
    write_reports(
        [
            (json_path, lambda path: write_text(path, render_audit_json(report), force=force)),
            (markdown, lambda path: write_text(path, render_audit_markdown(report), force=force)),
            (html, lambda path: write_text(path, render_audit_html(report), force=force)),
        ]
    )
    return report


def _load_scored(dataset: Dataset, names: ColumnNames, by: str | None) -> LoadedDump:
    """Stage 1 with the trainer's advantages, and GiGPO's anchors and step rewards or returns
    where the dump has both (GiGPO's rules are then candidates too); a dump whose trainer
    removed the rewards is an error: without the scores there is no rule to hold the
    advantages to."""
    dump = load_dump(dataset, names, trainer_advantage=True, by=by, step_roles="if_complete")
    if dump.columns.reward_removed is not None:
        raise AdvcliError(f"{dataset.describe()}: {dump.columns.reward_removed}")
    return dump


def render_audit_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def _by_step(dump: LoadedDump, by: str, expect: ExpectedRule | None) -> list[dict[str, Any]]:
    """Each step (file, or value of ``by``) audited on its own, in the steps' order: its rule
    and its findings' rows by kind."""
    values, labels = step_order(dump, by)
    step = pl.col(GROUP).struct.field(dump.batch or "")
    entries = []
    for value, label in zip(values, labels, strict=True):
        part = dump.projection.filter(step == value)
        entries.append(_step_entry(label, part, index_trajectories(part), dump, expect))
    return entries


def _step_entry(
    label: Any,
    projection: pl.DataFrame,
    trajectories: Trajectories,
    dump: LoadedDump,
    expect: ExpectedRule | None,
) -> dict[str, Any]:
    """One step's rows (``projection``, of ``dump``) audited on their own, as its ``by_step``
    entry; a step with no row to audit has a note saying so."""
    try:
        fit = fit_rule(
            projection,
            dump.naming,
            trajectories,
            dump.batch,
            expected=expect.config if expect is not None else None,
        )
    except AdvcliError as error:
        return step_audit(label, None, [], str(error))
    return step_audit(label, fit, audit_findings(fit, projection, trajectories, expect))


def audit_step(
    names: ColumnNames = ColumnNames(), expect: ExpectedRule | None = None
) -> StepReader:
    """``watch --audit``'s reading of a step file: the file audited alone, read as ``audit
    --by file`` reads it, as its entry there (its rows, rule, rows explained and findings' rows
    by kind), with how it was read; a file without rows, or without a row to audit, keeps its
    place with a note saying so."""

    def read(dataset: Dataset, label: Any, reading: ReadAlike) -> dict[str, Any]:
        if dataset.num_rows == 0:
            return {**step_audit(label, None, [], "the file has no rows"), "reading": None}

        check_by(dataset, "file")

        def load(run_names: ColumnNames) -> LoadedDump:
            return _load_scored(dataset, run_names, "file")

        dump = reading.as_run(str(label), load(names), lambda loaded: loaded.columns, names, load)
        entry = _step_entry(label, dump.projection, dump.trajectories, dump, expect)
        return {**entry, "reading": dump.columns.reading()}

    return read

"""``audit`` as a library call: stage 1 with the trainer's own advantages, every candidate rule
fitted at once, and the findings (:mod:`advcli.report.audit`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advcli import __version__
from advcli.advantages.fit import fit_rule
from advcli.errors import AdvcliError
from advcli.report.audit import audit_report, render_audit_markdown
from advcli.run.loading import Inputs, load_dump, opened
from advcli.settings.config import ColumnNames
from advcli.settings.resolve import ExpectedRule
from advcli.write.documents import write_reports, write_text
from advcli.write.outputs import check_outputs, check_standard_output


def audit(
    inputs: Inputs,
    names: ColumnNames = ColumnNames(),
    *,
    expect: ExpectedRule | None = None,
    json_path: Path | None = None,
    markdown: Path | None = None,
    force: bool = False,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Which rule the advantages a trainer computed follow, and what no rule explains: the
    audit report, also written as JSON to ``json_path`` and as Markdown to ``markdown`` where
    given (``-``: standard output, for one of them).
    ``names``: the columns' roles, ``names.advantage`` the trainer's advantages' column;
    ``expect``: the rule the trainer is believed to run
    (:func:`~advcli.settings.resolve.expected_rule`), whose mismatch is a finding.

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
        check_standard_output({"--json": json_path, "--markdown": markdown})
        check_outputs([json_path, markdown], dataset, force=force)
        stage("reading keys")
        dump = load_dump(dataset, names, trainer_advantage=True)
        if dump.columns.reward_removed is not None:
            # Without the scores there is no rule to hold the trainer's advantages to.
            raise AdvcliError(f"{dataset.describe()}: {dump.columns.reward_removed}")
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
        )
    write_reports(
        [
            (json_path, lambda path: write_text(path, render_audit_json(report), force=force)),
            (markdown, lambda path: write_text(path, render_audit_markdown(report), force=force)),
        ]
    )
    return report


def render_audit_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"

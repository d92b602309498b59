"""``advcli audit`` on the command line (issue 47): the terminal report, --json, --fail-on's
exit 3, and errors as one line."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, dump_frame

from advcli.run.commands import compute
from advcli.settings.config import AdvantageConfig, Level


@pytest.fixture(scope="module")
def turn_level(tmp_path_factory):
    """The sample dump with advantages at turn level (verl's GRPO), standing in for a
    trainer's."""
    path = tmp_path_factory.mktemp("audit") / "turn_level.parquet"
    compute([ROOT / "sample_data" / "rollouts.parquet"], path, AdvantageConfig(level=Level.TURN))
    return path


def test_the_terminal_report_names_the_rule_and_the_findings(run, turn_level) -> None:
    result = run("audit", turn_level)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "The trainer's advantages: 'advantages'" in out
    assert "Rows: 1,553 audited of 1,553" in out
    assert "estimator │ grpo" in out and "level     │ turn" in out
    assert "turn-level-counting: 64 groups, 1,474 rows" in out
    assert "the trainer's advantages follow grpo at turn level on 1,553 of 1,553" in out


def test_json_on_stdout_and_the_terminal_report_on_stderr(run, turn_level) -> None:
    result = run("audit", turn_level, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {key: report["rule"][key] for key in ("level", "estimator", "scale", "std_ddof")} == {
        "level": "turn",
        "estimator": "grpo",
        "scale": "group",
        "std_ddof": 1,
    }
    assert [finding["kind"] for finding in report["findings"]] == ["turn-level-counting"]
    assert set(report["findings"][0]) == {"kind", "groups", "rows", "report", "example"}
    assert "turn-level-counting" in result.stderr


def test_a_json_file_is_not_replaced_without_force(run, tmp_path, turn_level) -> None:
    path = tmp_path / "audit.json"
    assert run("audit", turn_level, "--json", path, "-q").exit_code == 0
    assert json.loads(path.read_text())["rule"]["rows_matched"] == 1553
    again = run("audit", turn_level, "--json", path, "-q")
    assert again.exit_code == 1
    assert again.stderr.startswith("Error: ") and "--force" in again.stderr
    assert run("audit", turn_level, "--json", path, "-q", "--force").exit_code == 0


def test_fail_on(run, turn_level) -> None:
    # Turn-level counting is the trainer's rule, no bug: 'any' passes it, its name does not.
    assert run("audit", turn_level, "--fail-on", "any", "-q").exit_code == 0
    tripped = run("audit", turn_level, "--fail-on", "any", "--expect", "level=trajectory", "-q")
    assert tripped.exit_code == 3
    assert tripped.stderr == (
        "advcli audit: the audit has findings (unexpected-rule): --fail-on any\n"
    )
    assert run("audit", turn_level, "--fail-on", "turn-level-counting", "-q").exit_code == 3
    assert run("audit", turn_level, "--fail-on", "merged-groups", "-q").exit_code == 0
    usage = run("audit", turn_level, "--fail-on", "bogus", "-q")
    assert usage.exit_code == 2
    assert "--fail-on takes 'any' or a finding's kind" in usage.stderr


def test_a_dump_without_advantages_is_one_error_line(run, tmp_path) -> None:
    path = tmp_path / "plain.parquet"
    dump_frame([("A", 0, 0, 1.0, 2), ("A", 1, 0, 0.0, 2)]).write_parquet(path)
    result = run("audit", path)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: no column of the trainer's")


def test_expect(run, turn_level) -> None:
    result = run("audit", turn_level, "--expect", "estimator=grpo,level=trajectory", "--json", "-")
    assert result.exit_code == 0, result.stderr
    finding = json.loads(result.stdout)["findings"][0]
    assert (finding["kind"], finding["example"]["differs"]) == ("unexpected-rule", ["level"])
    assert "unexpected-rule" in result.stderr
    usage = run("audit", turn_level, "--expect", "epsilon=x")
    assert usage.exit_code == 2 and "--expect epsilon=x: not a number" in usage.stderr


def test_markdown(run, tmp_path, turn_level) -> None:
    result = run("audit", turn_level, "--markdown", "-", "-q")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert text.startswith("# advcli audit\n\n**Verdict.** the trainer's advantages follow grpo")
    assert "| estimator | grpo |" in text and "| std ddof | 1 (sample) |" in text
    assert "### turn-level-counting: 64 groups, 1,474 rows" in text
    both = run("audit", turn_level, "--markdown", "-", "--json", "-")
    assert both.exit_code == 2
    assert "--json and --markdown both write to standard output" in both.stderr
    path = tmp_path / "audit.md"
    json_path = tmp_path / "audit.json"
    written = run("audit", turn_level, "--markdown", path, "--json", json_path, "-q")
    assert written.exit_code == 0, written.stderr
    assert path.read_text() == text
    assert json.loads(json_path.read_text())["verdict"] in text

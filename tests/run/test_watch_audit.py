"""``advcli watch DIR --audit`` (issue 47): each step file audited alone as the trainer writes
it, its line the step's entry of ``audit DIR --by file``; ``--fail-on`` ends it at the first
step with a finding; what only a comparison reads is refused beside it."""

from __future__ import annotations

import json

import pytest
from audit_dumps import audited_frame
from conftest import watched
from reference import reference_advantages

# Two groups of one-row trajectories and one of two-turn trajectories: trajectory level and
# turn level differ.
ROWS = [
    *(("A", t, 0, float(t % 2), 2) for t in range(4)),
    *(("B", t, 0, float(t), 2) for t in range(3)),
    *(("C", t, turn, float(t), 2) for t in range(2) for turn in range(2)),
]


def write_step(folder, number: int, level: str) -> None:
    """Step ``number``: ROWS with the advantages a trainer computed with grpo at ``level``."""
    found = reference_advantages(ROWS, level=level, estimator="grpo")
    audited_frame(ROWS, found).write_parquet(folder / f"step_{number}.parquet")


def whole_run(run, folder) -> list[dict]:
    result = run("audit", folder, "--by", "file", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    return [{**step, "reading": report["reading"]} for step in report["by_step"]["steps"]]


@pytest.mark.process
def test_each_step_is_audited_as_it_comes(run, tmp_path):
    """The trainer moved from trajectory to turn level at step 2: each line names its step's
    rule, and is the step's entry of the whole run's audit --by file."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_step(folder, 1, "trajectory")
    lines = watched(folder, 2, lambda: write_step(folder, 2, "turn"), "--audit")
    steps = [json.loads(line) for line in lines]
    assert [(step["step"], step["rule"]["level"]) for step in steps] == [
        (1, "trajectory"),
        (2, "turn"),
    ]
    # Group C's rows, of two-turn trajectories, are counted at turn level.
    assert steps[1]["findings"] == {"turn-level-counting": 4}
    assert steps == whole_run(run, folder)


def test_fail_on_ends_the_watch_at_the_first_step_with_a_finding(run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_step(folder, 1, "trajectory")
    bad = reference_advantages(ROWS, level="trajectory", estimator="grpo")
    bad[:4] = [0.0] * 4  # group A's advantages lost
    audited_frame(ROWS, bad).write_parquet(folder / "step_2.parquet")
    write_step(folder, 3, "trajectory")
    result = run(
        "watch", folder, "--audit", "--settle", 0, "--jsonl", "-", "-q", "--fail-on", "any"
    )
    assert result.exit_code == 3, result.stderr
    # The step that trips it is reported, and none after it.
    assert [json.loads(line)["step"] for line in result.stdout.splitlines()] == [1, 2]
    assert result.stderr.startswith("advcli watch: step 2's audit has findings (")
    assert result.stderr.endswith("): --fail-on any\n")


def test_the_terminal_shows_each_steps_rule(run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_step(folder, 1, "turn")
    result = run("watch", folder, "--audit", "--settle", 0, "--fail-on", "turn-level-counting")
    assert result.exit_code == 3, result.stderr
    text = " ".join(result.stdout.split())
    assert "How the dump was read" in text
    assert "step rows rule explained findings" in text
    assert "level=turn, estimator=grpo" in text
    assert "turn-level-counting 4" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--audit", "--estimator", "rloo"), "--estimator does not go with --audit"),
        (("--audit", "--fail-above", "0.1"), "--fail-above does not go with --audit"),
        (("--audit", "--fail-on", "severe"), "--fail-on takes 'any' or a finding's kind"),
        (("--fail-on", "merged-groups"), "--fail-on takes material or severe, not"),
        (("--expect", "estimator=grpo"), "--expect goes with --audit"),
        (("--advantage-col", "adv"), "--advantage-col goes with --audit"),
        (("--audit", "--expect", "grpo"), "--expect takes key=value pairs"),
    ],
)
def test_watch_audit_misused_is_a_usage_error(options, message, run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    result = run("watch", folder, *options)
    assert result.exit_code == 2, result.stderr
    assert message in " ".join(result.stderr.replace("│", " ").split())


def test_a_step_file_without_rows_keeps_its_place(run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    found = reference_advantages(ROWS, level="turn", estimator="grpo")
    audited_frame(ROWS, found).head(0).write_parquet(folder / "step_1.parquet")
    write_step(folder, 2, "turn")
    gate = ("--fail-on", "turn-level-counting")
    result = run("watch", folder, "--audit", "--settle", 0, "--jsonl", "-", "-q", *gate)
    assert result.exit_code == 3, result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first == {
        "step": 1,
        "rows": 0,
        "rule": None,
        "rows_matched": 0,
        "findings": {},
        "note": "the file has no rows",
        "reading": None,
    }
    assert second["findings"] == {"turn-level-counting": 4}

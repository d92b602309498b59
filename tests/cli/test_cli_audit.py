"""``advcli audit`` on the command line (issue 47): the terminal report, --json, --fail-on's
exit 3, and errors as one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import polars as pl
import pytest
from audit_dumps import audited_frame
from conftest import ROOT, dump_frame
from PIL import Image
from reference import reference_advantages

from advcli.run.commands import compute
from advcli.settings.config import AdvantageConfig, Estimator, Level


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
    usage = run("audit", turn_level, "--expect", "recipe=verl-agent,gamma=high")
    assert usage.exit_code == 2 and "--expect gamma=high: not a number" in usage.stderr
    usage = run("audit", turn_level, "--expect", "recipe=lightrft")
    assert usage.exit_code == 2
    assert "--expect: audit's rules are the outcome estimators' and GiGPO's, not" in usage.stderr


def test_expecting_reinforce_plus_plus(run, tmp_path) -> None:
    """REINFORCE++'s baseline is a candidate: expected, and run, it is no finding."""
    trained = tmp_path / "reinforce.parquet"
    compute(
        [ROOT / "sample_data" / "rollouts.parquet"],
        trained,
        AdvantageConfig(level=Level.TURN, estimator=Estimator.REINFORCE_PP_BASELINE),
    )
    expect = "estimator=reinforce_pp_baseline,level=turn"
    result = run("audit", trained, "--expect", expect, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rule"]["estimator"] == "reinforce_pp_baseline"
    assert [finding["kind"] for finding in report["findings"]] == ["turn-level-counting"]


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


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (.ci/run installs it)")
def test_the_html_page_renders_in_a_headless_browser(run, tmp_path, turn_level) -> None:
    page = tmp_path / "audit.html"
    result = run("audit", turn_level, "--expect", "level=trajectory", "--html", page, "-q")
    assert result.exit_code == 0, result.stderr
    html = page.read_text()
    # Self-contained: nothing is fetched.
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    words = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
    assert "<title>advcli audit</title>" in dom
    assert "Verdict. the trainer's advantages follow grpo at turn level on 1,553 of 1,553" in words
    assert "trainer_advantage advantages the column named 'advantages'" in words
    assert "estimator grpo" in words and "std ddof 1 (sample)" in words
    assert "unexpected-rule: 58 groups, 1,403 rows" in words
    assert "differs level" in words
    assert "turn-level-counting: 64 groups, 1,474 rows" in words
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("L"))
    # Not blank: dark text and the tables' borders on a light page.
    assert pixels.min() < 60 and (pixels < 200).mean() > 0.01


def test_by_audits_each_step_on_its_own(run, tmp_path) -> None:
    """A trainer that moved from trajectory level to turn level between two steps whose group
    ids repeat: each step is its own batch (its groups apart from the other's) and its own
    audit, which names each step's rule."""
    rows = [
        (g, f"{g}-{t}", turn, float((g + t) % 2), 2)
        for g in range(3)
        for t in range(4)
        for turn in range(1 + t % 3)
    ]
    folder = tmp_path / "steps"
    folder.mkdir()
    for step, level in ((0, "trajectory"), (1, "turn")):
        found = reference_advantages(rows, level=level, estimator="grpo")
        frame = audited_frame(rows, found).with_columns(pl.lit(10 * step).alias("step"))
        frame.write_parquet(folder / f"step-{step}.parquet")
    for by, steps in (("file", [0, 1]), ("step", [0, 10])):
        result = run("audit", folder, "--by", by, "--json", "-", "-q")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        entries = report["by_step"]["steps"]
        assert report["by_step"]["by"] == by
        assert [entry["step"] for entry in entries] == steps
        assert [entry["rule"]["level"] for entry in entries] == ["trajectory", "turn"]
        assert [(entry["rows"], entry["rows_matched"]) for entry in entries] == [(21, 21)] * 2
        assert [entry["findings"] for entry in entries] == [{}, {"turn-level-counting": 15}]
        # The run as one: the first step's rule, the second's rows not explained by it.
        assert (report["rule"]["level"], report["rule"]["rows_matched"]) == ("trajectory", 21)
    table = run("audit", folder, "--by", "file").stdout
    assert "By step" in table and "turn-level-counting 15" in table

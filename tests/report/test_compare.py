"""advcli compare and compute --report: report figures worked out by hand, outputs, exit codes."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from test_cli_compute import BAD_FRAMES

pytest.importorskip("matplotlib")

# Group "A": t1 (1 turn, score 1.0, 2 tokens), t2 (1 turn, 0.4, 2 tokens), t3 (4 turns, 0.0,
# 1 token each). Group "B": one trajectory "s" of 3 turns scoring 3.0, 5 tokens each.
ROWS = [
    ("A", "t3", 0, 0.0, 1),
    ("B", "s", 0, 3.0, 5),
    ("A", "t1", 0, 1.0, 2),
    ("A", "t3", 1, 0.0, 1),
    ("B", "s", 1, 3.0, 5),
    ("A", "t2", 0, 0.4, 2),
    ("A", "t3", 2, 0.0, 1),
    ("B", "s", 2, 3.0, 5),
    ("A", "t3", 3, 0.0, 1),
]

# By hand, drgrpo (a = s - baseline, divisor 1):
# Turn level. A: rows [1, .4, 0, 0, 0, 0], baseline 1.4/6 = 7/30; a(t1) = 23/30, a(t2) = 5/30,
#   a(t3) = -7/30. B: three equal rows -> zero std, baseline 3, a(s) = 0.
# Trajectory level. A: units [1, .4, 0], baseline 1.4/3 = 14/30; a(t1) = 16/30, a(t2) = -2/30,
#   a(t3) = -14/30. B: a singleton -> baseline 0, a(s) = 3.
# diff = a_traj - a_turn: -7/30 for t1, t2, t3; 3 for s. Sign flip: t2 only (5/30 vs -2/30).
# |diff|: max 3, mean (3 * 7/30 + 3) / 4 = 0.925. Baseline shift: A 7/30, B 3; signed
#   (trajectory - turn): A falls by 7/30 when every turn counts, B rises by 3.
# corr(turns [1, 1, 4, 3], diff): mean turns 2.25, mean diff 0.575; cov sum 2.425;
#   squared deviations: turns 6.75, diff 7.840833;
#   2.425 / sqrt(6.75 * 7.840833) = 2.425 / 7.275 = 1/3.
EXPECTED_DRGRPO = {
    "counts": {
        "rows": 9,
        "groups": 2,
        "trajectories": 4,
        "tokens": 23,
        "singleton_groups": 1,
        "zero_std_groups_turn": 1,
        "zero_std_groups_trajectory": 0,
    },
    "groups": {
        "baseline_shift_max": 3.0,
        "baseline_shift_mean": (7 / 30 + 3) / 2,
        "std_shift_max": 0.0,
        "std_shift_mean": 0.0,
        "baseline_drop_mean": (7 / 30 - 3) / 2,
        "baseline_fall_groups": 1,
        "baseline_fall_max": 7 / 30,
        "baseline_rise_groups": 1,
        "baseline_rise_max": 3.0,
    },
    "trajectories": {
        "sign_flips": 1,
        "advantage_diff_max": 3.0,
        "advantage_diff_mean": 0.925,
        "corr_turns_diff": 1 / 3,
    },
    "by_turns": [
        {
            "turns": 1,
            "trajectories": 2,
            "mean_advantage_turn": 14 / 30,
            "mean_advantage_trajectory": 7 / 30,
            "token_mass_turn": 2 * 23 / 30 + 2 * 5 / 30,
            "token_mass_trajectory": 2 * 16 / 30 - 2 * 2 / 30,
        },
        {
            "turns": 3,
            "trajectories": 1,
            "mean_advantage_turn": 0.0,
            "mean_advantage_trajectory": 3.0,
            "token_mass_turn": 0.0,
            "token_mass_trajectory": 45.0,
        },
        {
            "turns": 4,
            "trajectories": 1,
            "mean_advantage_turn": -7 / 30,
            "mean_advantage_trajectory": -14 / 30,
            "token_mass_turn": -4 * 7 / 30,
            "token_mass_trajectory": -4 * 14 / 30,
        },
    ],
}


def assert_close(actual, expected, path=""):
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert_close(actual[key], value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{path}[{index}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, abs=1e-9), path
    else:
        assert actual == expected, path


def test_report_figures_by_hand(write_dump, run):
    source = write_dump(ROWS)
    result = run("compare", source, "--estimator", "drgrpo", "--json", "-", "--top", "1")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert_close(report, EXPECTED_DRGRPO)
    assert report["turns_per_trajectory"] == {
        "min": 1,
        "median": 2.0,
        "max": 4,
        "histogram": {"1": 2, "3": 1, "4": 1},
    }
    assert report["top_groups"] == [
        {
            "group": "B",
            "rows": 3,
            "trajectories": 1,
            "baseline_turn": 3.0,
            "baseline_trajectory": 0.0,
            "std_turn": 1.0,
            "std_trajectory": 1.0,
            "baseline_shift": 3.0,
        },
    ]
    settings = report["settings"]
    assert settings["estimator"] == "drgrpo" and settings["epsilon"] == 1e-6
    assert settings["columns"]["group"] == "data_id"
    assert settings["inputs"] == [str(source)]
    assert settings["advcli_version"]
    # The terminal report moved to stderr because stdout carries the JSON.
    assert "Verdict" in result.stderr


def test_grpo_std_figures_by_hand(write_dump, run):
    # grpo on the same dump. Group A, turn level: rows [1, .4, 0, 0, 0, 0], mean 7/30,
    # squared deviations (23/30)^2 + (5/30)^2 + 4 (7/30)^2 = (529 + 25 + 196) / 900 = 750/900,
    # variance 750/900/5 = 1/6. Trajectory level: [1, .4, 0], mean 14/30, squared deviations
    # (256 + 4 + 196) / 900 = 456/900, variance 456/900/2 = 0.2533...
    # Group B: zero std at turn level (divisor 0), a singleton at trajectory level (divisor 1).
    result = run("compare", write_dump(ROWS), "--json", "-", "--top", "2")
    report = json.loads(result.stdout)
    groups = {g["group"]: g for g in report["top_groups"]}
    assert groups["A"]["std_turn"] == pytest.approx((1 / 6) ** 0.5)
    assert groups["A"]["std_trajectory"] == pytest.approx((456 / 1800) ** 0.5)
    assert groups["B"]["std_turn"] == 0.0 and groups["B"]["std_trajectory"] == 1.0
    assert report["groups"]["std_shift_max"] == pytest.approx(1.0)
    assert report["trajectories"]["sign_flips"] == 1


def test_terminal_report_and_verdict(write_dump, run):
    result = run("compare", write_dump(ROWS), "--estimator", "drgrpo")
    assert result.exit_code == 0
    text = result.stdout
    for heading in (
        "Turn level vs trajectory level",
        "Turns per trajectory",
        "By turn count",
        "Most affected groups",
        "Verdict",
    ):
        assert heading in text
    assert "1 of 4" in text  # sign flips
    assert "25.0% of trajectories (1) change sign" in " ".join(text.split())
    # A's baseline falls by 7/30, B's rises by 3: each way apart, then the mean (7/30 - 3) / 2.
    assert (
        "When every turn counts, the baselines of 1 group fall (by up to 0.233) and of 1 rise "
        "(by up to 3.000): 1.383 higher on average."
    ) in " ".join(text.split())


def test_markdown_and_plot(write_dump, run, tmp_path):
    markdown, plot = tmp_path / "report.md", tmp_path / "bias.png"
    result = run("compare", write_dump(ROWS), "--markdown", markdown, "--plot", plot, "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    text = markdown.read_text()
    assert text.startswith("# advcli compare")
    assert "| turns | trajs | adv turn | adv traj | diff | mass turn | mass traj |" in text
    assert "**Verdict.**" in text
    # A real PNG of the figure's size (16 × 9 inches at 100 dpi), with something drawn on it:
    # a fair share of its pixels are not the white background.
    pixels = pytest.importorskip("matplotlib.image").imread(plot)
    assert pixels.shape[:2] == (900, 1600)
    drawn = (pixels[..., :3] < 0.95).any(axis=-1).mean()
    assert drawn > 0.05, f"only {drawn:.1%} of the pixels are drawn"


@pytest.mark.parametrize(("threshold", "code"), [("2.9", 3), ("3.0", 0), ("10", 0)])
def test_fail_above(threshold, code, write_dump, run):
    result = run(
        "compare", write_dump(ROWS), "--estimator", "drgrpo", "-q", "--fail-above", threshold
    )
    assert result.exit_code == code
    if code == 3:
        assert "exceeds --fail-above" in result.stderr


def test_compute_report_matches_compare(write_dump, run, tmp_path):
    source = write_dump(ROWS)
    report_path = tmp_path / "report.json"
    result = run(
        "compute",
        source,
        "-o",
        tmp_path / "out.parquet",
        "--report",
        report_path,
        "--estimator",
        "drgrpo",
        "--level",
        "turn",
    )
    assert result.exit_code == 0, result.stderr
    compared = run("compare", source, "--estimator", "drgrpo", "--json", "-")
    assert json.loads(report_path.read_text()) == json.loads(compared.stdout)
    markdown_path = tmp_path / "report.md"
    assert (
        run("compute", source, "-o", tmp_path / "out2.parquet", "--report", markdown_path).exit_code
        == 0
    )
    assert markdown_path.read_text().startswith("# advcli compare")


def test_compute_report_needs_json_or_md(write_dump, run, tmp_path):
    result = run(
        "compute", write_dump(ROWS), "-o", tmp_path / "o.parquet", "--report", tmp_path / "r.txt"
    )
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path / 'r.txt'}: a report is .json or .md\n"
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    "case", ["missing group", "null trajectory", "nan score", "inconsistent trajectory"]
)
def test_bad_input_same_contract_as_compute(case, write_dump, run, tmp_path):
    frame, options, message = BAD_FRAMES[case]
    result = run("compare", write_dump(frame), *options, "--json", tmp_path / "r.json")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert not (tmp_path / "r.json").exists()


def test_sample_data_report(run):
    sample = ROOT / "sample_data" / "rollouts.parquet"
    result = run("compare", sample, "--json", "-", "-q")
    report = json.loads(result.stdout)
    assert report["counts"]["trajectories"] == 512
    # The sample's long trajectories fail more often, so counting every turn lowers baselines.
    assert report["groups"]["baseline_drop_mean"] > 0.05

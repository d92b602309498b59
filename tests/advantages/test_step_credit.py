"""compare --estimator gigpo's step-credit report (and inspect's step groups): the issue's worked
case, tied returns, anchors shared across groups under both scopes, verl-agent's 1e5 hazard, a
dump without an anchor, the verdict's levels, every output format, and a real-shaped verl-agent
dump read by its own names.

Every expected value is computed here by hand from the definitions in docs/compare.md ("Step
credit")."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from PIL import Image
from test_gigpo import WORKED

EPS = 1e-6

WORKED_OPTIONS = ("--estimator", "gigpo", "--gamma", "0.9", "--gigpo-norm", "mean_std")


def compare_json(run, tmp_path: Path, frame: pl.DataFrame, *options: str) -> dict:
    source = tmp_path / "in.parquet"
    frame.write_parquet(source)
    result = run("compare", source, "--json", "-", "-q", *options)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_worked_case(run, tmp_path):
    """Step groups s0 (2 rows, 2 trajectories), s1, s2, s3 (one row each). At trajectory level
    the scores 1 and 0 have mean 0.5 and std √0.5: |A_episode| = 0.5 / (√0.5 + ε) on every row.
    γ 0.9: returns 0.9 and 0 in s0 (mean 0.45, std 0.45·√2): |A_step| = 0.45 / (0.45·√2 + ε)
    on its two rows (turn 0), 0 elsewhere."""
    summary = compare_json(run, tmp_path, WORKED, *WORKED_OPTIONS)
    credit = summary["step_credit"]
    groups = credit["step_groups"]
    assert groups["histogram"] == {
        "1": {"step_groups": 3, "rows": 3},
        "2": {"step_groups": 1, "rows": 2},
    }
    assert groups["step_groups"] == 4 and groups["rows"] == 5
    assert groups["singleton_rows"] == 3 and groups["singleton_share"] == 3 / 5
    assert groups["hit_rows"] == 2 and groups["hit_ratio"] == 2 / 5
    assert groups["tied_groups"] == 0 and groups["tied_rows"] == 0
    assert groups["shared_anchors"] == {"anchors": 0, "rows": 0, "group_step_groups": 0}
    assert credit["zero_rows"] == 3 and credit["zero_share"] == 3 / 5
    episode = 0.5 / (math.sqrt(0.5) + EPS)
    step = 0.45 / (0.45 * math.sqrt(2) + EPS)
    assert credit["mean_abs_episode"] == pytest.approx(episode, abs=1e-9)
    assert credit["mean_abs_step"] == pytest.approx(2 * step / 5, abs=1e-9)
    assert credit["step_to_episode"] == pytest.approx(2 * step / 5 / episode, abs=1e-9)
    assert [(e["turn"], e["rows"]) for e in credit["by_turn"]] == [(0, 2), (1, 2), (2, 1)]
    assert [e["mean_abs_step"] for e in credit["by_turn"]] == pytest.approx([step, 0, 0])
    assert [e["mean_abs_episode"] for e in credit["by_turn"]] == pytest.approx([episode] * 3)
    assert credit["settings"] == {
        "level": "trajectory",
        "episode_rule": "each trajectory once in its group's statistics, with its score",
        "gamma": 0.9,
        "step_weight": 1.0,
        "norm": "mean_std",
        "std_floor": None,
        "anchor_scope": "group",
        "turn_order": "the turn column 'turn_index'",
        "returns": "the step rewards in 'step_reward', discounted by gamma",
    }
    assert credit["assessment"]["level"] == "carries"
    assert "moves advantages by 40% of the episode term" in credit["verdict"]
    # The episode term's bias verdict stays, the step term's follows it.
    assert summary["verdict"].endswith(credit["verdict"])
    assert summary["verdict"].startswith("When every turn counts")


def test_tied_returns_and_a_dead_step_term(run, tmp_path):
    """Both trajectories reach s0 and then earn 1: returns 1, 1 in s0 (a tie, A_step 0), s1
    and s2 are groups of one: every row's A_step is 0."""
    frame = pl.DataFrame(
        {
            "data_id": [0] * 4,
            "rollout_id": [1, 1, 2, 2],
            "turn_index": [0, 1, 0, 1],
            "score": [1.0, 1.0, 0.0, 0.0],
            "anchor": ["s0", "s1", "s0", "s2"],
            "step_reward": [0.0, 1.0, 0.0, 1.0],
        }
    )
    credit = compare_json(run, tmp_path, frame, "--estimator", "gigpo")["step_credit"]
    groups = credit["step_groups"]
    assert groups["tied_groups"] == 1 and groups["tied_rows"] == 2
    assert groups["singleton_rows"] == 2
    assert credit["zero_rows"] == 4 and credit["zero_share"] == 1.0
    assert credit["mean_abs_step"] == 0
    assert credit["assessment"]["level"] == "dead"
    assert credit["verdict"] == (
        "The step term is dead on this dump: 100% of rows get A_step = 0 (2 in step groups of "
        "one, 2 in step groups whose returns tie)."
    )


def test_a_small_step_weight_is_weak(run, tmp_path):
    """ω 0.01 on the worked case: the step term is 0.01 · 2/5 of the episode term's size."""
    credit = compare_json(run, tmp_path, WORKED, *WORKED_OPTIONS, "--step-weight", "0.01")[
        "step_credit"
    ]
    assert credit["step_to_episode"] == pytest.approx(0.004, abs=1e-6)
    assert credit["assessment"]["level"] == "weak"
    assert "it carries little signal" in credit["verdict"]


SHARED = pl.DataFrame(
    {
        "data_id": [0, 0, 1, 1, 1],
        "rollout_id": [1, 2, 1, 2, 3],
        "score": [1.0, 0.0, 1.0, 0.0, 0.5],
        "anchor": ["s0", "s0", "s0", "s0", "s1"],
        "step_reward": [1.0, 0.0, 1.0, 0.0, 0.5],
    }
)


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_anchors_shared_across_groups(run, tmp_path, scope):
    """s0 is in groups 0 and 1 (4 rows, 2 group-scope step groups); batch scope merges them into
    one step group of 4, the shared anchors are reported under either scope."""
    credit = compare_json(run, tmp_path, SHARED, "--estimator", "gigpo", "--anchor-scope", scope)[
        "step_credit"
    ]
    groups = credit["step_groups"]
    assert groups["shared_anchors"] == {"anchors": 1, "rows": 4, "group_step_groups": 2}
    assert groups["anchor_scope"] == scope
    if scope == "group":
        assert groups["histogram"] == {
            "1": {"step_groups": 1, "rows": 1},
            "2": {"step_groups": 2, "rows": 4},
        }
    else:
        assert groups["histogram"] == {
            "1": {"step_groups": 1, "rows": 1},
            "4": {"step_groups": 1, "rows": 4},
        }
    assert groups["hit_rows"] == 4


HAZARD = pl.DataFrame(
    {
        # Group 0: the first rows tie (1, 1) and rollout 1's second row is penalized (0.9):
        # the hazard. Group 1: the first rows differ (1, 0). Group 2: one trajectory.
        "data_id": [0, 0, 0, 1, 1, 1, 2, 2],
        "rollout_id": [1, 1, 2, 1, 1, 2, 1, 1],
        "turn_index": [0, 1, 0, 0, 1, 0, 0, 1],
        "score": [1.0, 0.9, 1.0, 1.0, 0.9, 0.0, 1.0, 0.9],
        "anchor": ["a", "b", "a", "a", "b", "a", "a", "b"],
        "step_reward": [0.0, 0.9, 1.0, 0.0, 0.9, 0.0, 0.0, 0.9],
    }
)


def test_verl_agents_penalty_hazard(run, tmp_path):
    """Only group 0 has two trajectories whose first rows tie with a row that disagrees: there
    verl-agent's trajectory counting divides 0.9 − 1 by ε."""
    summary = compare_json(run, tmp_path, HAZARD, "--estimator", "gigpo", "--traj-score", "mean")
    hazard = summary["step_credit"]["penalty_hazard"]
    assert hazard == {"groups": 1, "rows": 1, "examples": [0]}
    assert "1 penalized row in 1 group whose first rows tie" in summary["verdict"]


def test_a_dump_without_an_anchor_says_the_step_term_was_not_measured(run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.drop("anchor", "step_reward").write_parquet(source)
    markdown, html = tmp_path / "r.md", tmp_path / "r.html"
    result = run(
        "compare",
        source,
        "--estimator",
        "gigpo",
        "--json",
        "-",
        "--markdown",
        markdown,
        "--html",
        html,
    )
    assert result.exit_code == 0, result.stderr
    credit = json.loads(result.stdout)["step_credit"]
    reason = "the dump has no anchor column (name one with --anchor-col)"
    assert credit["measured"] is False and credit["reason"] == reason
    assert credit["step_groups"] is None and credit["assessment"]["level"] == "not_measured"
    assert credit["verdict"] == f"The step term was not measured: {reason}."
    for text in (result.stderr, markdown.read_text(), html.read_text()):
        assert "Step credit (gigpo)" in text
        assert "not measured" in text


def test_other_estimators_have_no_step_credit(run, tmp_path):
    summary = compare_json(run, tmp_path, WORKED)
    assert "step_credit" not in summary
    assert "Step credit" not in run("compare", tmp_path / "in.parquet").stdout


def png_size(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        return image.size


def test_every_format_shows_the_step_credit(run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.write_parquet(source)
    files = {name: tmp_path / f"r.{name}" for name in ("json", "md", "png", "html")}
    result = run(
        "compare",
        source,
        *WORKED_OPTIONS,
        "--json",
        files["json"],
        "--markdown",
        files["md"],
        "--plot",
        files["png"],
        "--html",
        files["html"],
    )
    assert result.exit_code == 0, result.stderr
    credit = json.loads(files["json"].read_text())["step_credit"]
    assert set(credit) == {
        "measured", "reason", "settings", "step_groups", "zero_rows", "zero_share",
        "mean_abs_episode", "mean_abs_step", "step_to_episode", "by_turn", "penalty_hazard",
        "assessment", "verdict",
    }  # fmt: skip
    markdown = files["md"].read_text()
    assert "## Step credit (gigpo)" in markdown
    assert "| 2 | 1 | 2 |" in markdown  # the step group sizes: 2 rows in 1 group
    assert "<h2>Step credit (gigpo)</h2>" in files["html"].read_text()
    for text in (result.stdout, markdown):
        assert "Step group sizes" in text or "step group size" in text
        assert "hit ratio" in text
    # The step panels are a third row of the figure: 1350 pixels high, not 900.
    assert png_size(files["png"]) == (1600, 1350)
    plain = tmp_path / "plain.png"
    assert run("compare", source, "--plot", plain, "-q").exit_code == 0
    assert png_size(plain) == (1600, 900)


@pytest.mark.browser
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (.ci/run installs it)")
def test_the_gigpo_page_renders_in_a_headless_browser(run, tmp_path):
    source, page = tmp_path / "in.parquet", tmp_path / "r.html"
    WORKED.write_parquet(source)
    assert run("compare", source, *WORKED_OPTIONS, "--html", page, "-q").exit_code == 0
    browser = [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu"]
    dom = subprocess.run(
        [*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    words = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
    assert "Step credit (gigpo)" in words and "step group size step groups rows" in words
    assert "<img" in dom


def verl_agent_dump() -> pl.DataFrame:
    """A verl-agent batch as its trainer holds it: uid, traj_uid, anchor_obs, the step reward
    'rewards', is_action_valid, token_level_scores (the episode reward on the last token, less
    the 0.1 invalid-action penalty) and response_mask; no turn column, rows by step.

    u0: t0 A B C (rewards 0 0 1, succeeds), t1 A B (0, −0.1: its second action invalid,
    fails), t2 A (1). u1: t0 X Y (0, −0.1), t1 X Z (0, 0), both fail: their first rows tie.
    u2: t0 X (1), t1 X (0): X is in u1 too."""
    steps = [
        # (uid, traj_uid, anchor, step reward, valid, score)
        ("u0", "u0-t0", "A", 0.0, True, 1.0),
        ("u0", "u0-t1", "A", 0.0, True, 0.0),
        ("u0", "u0-t2", "A", 1.0, True, 1.0),
        ("u1", "u1-t0", "X", 0.0, True, 0.0),
        ("u1", "u1-t1", "X", 0.0, True, 0.0),
        ("u2", "u2-t0", "X", 1.0, True, 1.0),
        ("u2", "u2-t1", "X", 0.0, True, 0.0),
        ("u0", "u0-t0", "B", 0.0, True, 1.0),
        ("u0", "u0-t1", "B", -0.1, False, -0.1),
        ("u1", "u1-t0", "Y", -0.1, False, -0.1),
        ("u1", "u1-t1", "Z", 0.0, True, 0.0),
        ("u0", "u0-t0", "C", 1.0, True, 1.0),
    ]
    lengths = [3, 2, 4, 2, 3, 2, 5, 3, 2, 4, 2, 3]
    return pl.DataFrame(
        {
            "uid": [s[0] for s in steps],
            "traj_uid": [s[1] for s in steps],
            "anchor_obs": [s[2] for s in steps],
            "rewards": [s[3] for s in steps],
            "is_action_valid": [s[4] for s in steps],
            "token_level_scores": [
                [0.0] * (n - 1) + [s[5]] for s, n in zip(steps, lengths, strict=True)
            ],
            "response_mask": [[1] * n for n in lengths],
        },
        schema_overrides={"response_mask": pl.List(pl.Int8)},
    )


def test_a_real_shaped_verl_agent_dump(run, tmp_path):
    """Read by verl-agent's names. The penalized rows disagree with their trajectory's other
    rows, so the episode term's trajectory score is named (the mean, as verl-agent's remedy
    has it): u0's scores 1, −0.05, 1 (mean 0.65), u1's −0.05, 0, u2's 1, 0. γ 1: returns u0
    t0 1 1 1, t1 −0.1 −0.1, t2 1; u1 t0 −0.1 −0.1, t1 0 0; u2 1 and 0. Under --gigpo-norm mean
    each term is its deviation / (1 + ε)."""
    summary = compare_json(
        run, tmp_path, verl_agent_dump(), "--estimator", "gigpo", "--traj-score", "mean"
    )
    roles = summary["settings"]["reading"]["roles"]
    assert summary["settings"]["reading"]["trainer"] == "verl-agent"
    assert roles["anchor"]["column"] == "anchor_obs"
    assert roles["step_reward"]["column"] == "rewards"
    credit = summary["step_credit"]
    groups = credit["step_groups"]
    # A (3 rows), B, X in u1, X in u2 (2 each), C, Y, Z (1 each).
    assert groups["histogram"] == {
        "1": {"step_groups": 3, "rows": 3},
        "2": {"step_groups": 3, "rows": 6},
        "3": {"step_groups": 1, "rows": 3},
    }
    assert groups["singleton_share"] == 3 / 12 and groups["hit_ratio"] == 9 / 12
    assert groups["shared_anchors"] == {"anchors": 1, "rows": 4, "group_step_groups": 2}
    # |A_episode| per row: u0 t0 0.35 ×3, t1 0.7 ×2, t2 0.35; u1 0.025 ×4; u2 0.5 ×2.
    episode = [0.35] * 3 + [0.7] * 2 + [0.35] + [0.025] * 4 + [0.5] * 2
    # |A_step|: A {1, −0.1, 1} about 0.6333; B {1, −0.1} about 0.45; X in u1 {−0.1, 0}; X in
    # u2 {1, 0}; C, Y, Z 0.
    a_mean = 1.9 / 3
    step = [1 - a_mean, 0.1 + a_mean, 1 - a_mean, 0.55, 0.55, 0.05, 0.05, 0.5, 0.5, 0, 0, 0]
    scale = 1 + EPS
    assert credit["mean_abs_episode"] == pytest.approx(sum(episode) / 12 / scale, abs=1e-9)
    assert credit["mean_abs_step"] == pytest.approx(sum(step) / 12 / scale, abs=1e-9)
    assert credit["settings"]["turn_order"] == "row order (no turn column)"
    # Turn 0: A ×3, u1's X ×2, u2's X ×2; turn 1: B ×2, Y, Z; turn 2: C.
    by_turn = credit["by_turn"]
    assert [(e["turn"], e["rows"]) for e in by_turn] == [(0, 7), (1, 4), (2, 1)]
    turn_0 = [1 - a_mean, 0.1 + a_mean, 1 - a_mean, 0.05, 0.05, 0.5, 0.5]
    assert by_turn[0]["mean_abs_step"] == pytest.approx(sum(turn_0) / 7 / scale)
    assert by_turn[1]["mean_abs_step"] == pytest.approx(1.1 / 4 / scale)
    assert by_turn[2]["mean_abs_episode"] == pytest.approx(0.35 / scale)
    # u1's first rows tie at 0 and its t0's penalized row scores −0.1.
    assert credit["penalty_hazard"] == {"groups": 1, "rows": 1, "examples": ["u1"]}
    assert credit["assessment"]["level"] == "carries"


def test_inspect_shows_the_step_groups(run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.write_parquet(source)
    result = run("inspect", source, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    groups = summary["step_groups"]
    assert groups["histogram"] == {
        "1": {"step_groups": 3, "rows": 3},
        "2": {"step_groups": 1, "rows": 2},
    }
    assert groups["singleton_share"] == 3 / 5 and groups["hit_ratio"] == 2 / 5
    assert "tied_groups" not in groups  # the returns are not inspect's
    assert summary["columns"]["anchor"]["column"] == "anchor"
    tables = run("inspect", source).stdout
    assert "Step groups (gigpo)" in tables and "rows in step groups of one" in tables
    plain = tmp_path / "plain.parquet"
    WORKED.drop("anchor").write_parquet(plain)
    assert "step_groups" not in json.loads(run("inspect", plain, "--json").stdout)


def test_compute_report_has_the_step_credit(run, tmp_path):
    source, report = tmp_path / "in.parquet", tmp_path / "r.json"
    WORKED.write_parquet(source)
    result = run(
        "compute", source, "-o", tmp_path / "out.parquet", "--no-tokens", *WORKED_OPTIONS,
        "--report", report, "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    credit = json.loads(report.read_text())["step_credit"]
    assert credit["step_groups"]["singleton_share"] == 3 / 5
    assert credit["mean_abs_step"] == pytest.approx(2 * 0.45 / (0.45 * math.sqrt(2) + EPS) / 5)


def test_by_step_keeps_each_steps_anchors_apart(run, tmp_path):
    """Step 0's group 0 and step 1's group 0 both see s0: with --by step they are two batches,
    so no anchor is shared across task groups, and batch scope keeps two step groups."""
    frame = pl.concat(
        [
            SHARED.filter(pl.col("data_id") == 0).with_columns(step=pl.lit(0)),
            SHARED.filter(pl.col("data_id") == 0).with_columns(step=pl.lit(1)),
        ]
    )
    credit = compare_json(
        run, tmp_path, frame, "--estimator", "gigpo", "--by", "step", "--anchor-scope", "batch"
    )["step_credit"]
    groups = credit["step_groups"]
    assert groups["shared_anchors"] == {"anchors": 0, "rows": 0, "group_step_groups": 0}
    assert groups["histogram"] == {"2": {"step_groups": 2, "rows": 4}}


@pytest.mark.parametrize(
    ("options", "tied"),
    [((), 0), (("--recipe", "roll"), 1), (("--recipe", "roll", "--gigpo-norm", "mean"), 0)],
)
def test_rolls_std_floor_counts_as_a_tie(run, tmp_path, options, tied):
    """Returns 1 and 1 + 1e-7 in s0 (std 7.1e-8): a tie under ROLL's 1e-6 floor only, which
    ROLL applies under mean_std alone (its mean subtracts and floors nothing)."""
    frame = pl.DataFrame(
        {
            "data_id": [0, 0],
            "rollout_id": [1, 2],
            "score": [1.0, 0.0],
            "anchor": ["s0", "s0"],
            "step_reward": [1.0, 1.0 + 1e-7],
        }
    )
    credit = compare_json(run, tmp_path, frame, "--estimator", "gigpo", *options)["step_credit"]
    assert credit["step_groups"]["tied_groups"] == tied
    assert credit["zero_rows"] == 2 * tied


def test_an_anchor_without_step_rewards_is_refused_as_compute_refuses_it(run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.drop("step_reward").write_parquet(source)
    result = run("compare", source, "--estimator", "gigpo", "-q")
    assert result.exit_code == 1
    assert "gigpo's step returns need one" in result.stderr
    assert "Traceback" not in result.stderr


# One group: trajectory 1's second row carries verl-agent's invalid-action penalty (0.9 after
# 1.0), trajectory 2 scores 0 on its one row.
PENALIZED = pl.DataFrame(
    {
        "data_id": [0, 0, 0],
        "rollout_id": [1, 1, 2],
        "turn_index": [0, 1, 0],
        "score": [1.0, 0.9, 0.0],
        "anchor": ["s0", "s1", "s0"],
        "step_reward": [0.0, 1.0, 0.0],
    }
)


def test_the_own_row_recipe_gives_the_bias_of_verl_agents_episode_term(run, tmp_path):
    """--recipe verl-agent-trajectory (mean_norm, ε 0). Trajectory level: the first rows 1 and 0
    have mean 0.5; rows 1, 0.9 get 0.5, 0.4 (trajectory 1: their mean 0.45), trajectory 2
    -0.5. Turn level (every row counted): mean 1.9/3; trajectory 1's rows 1 - 1.9/3 and
    0.9 - 1.9/3 (mean 0.95 - 1.9/3), trajectory 2 -1.9/3. Both diffs are 1.9/3 - 0.5, and so is
    the baseline shift."""
    summary = compare_json(
        run, tmp_path, PENALIZED, "--estimator", "gigpo", "--recipe", "verl-agent-trajectory"
    )
    shift = 1.9 / 3 - 0.5
    assert summary["groups"]["baseline_shift_mean"] == pytest.approx(shift, abs=1e-12)
    by_trajectory = {t["trajectory"]: t for t in summary["top_trajectories"]}
    assert by_trajectory[1]["advantage_trajectory"] == pytest.approx(0.45, abs=1e-12)
    assert by_trajectory[1]["advantage_turn"] == pytest.approx(0.95 - 1.9 / 3, abs=1e-12)
    assert by_trajectory[2]["advantage_trajectory"] == pytest.approx(-0.5, abs=1e-12)
    assert by_trajectory[2]["diff"] == pytest.approx(shift, abs=1e-12)


def test_without_the_own_rule_the_error_offers_it(run, tmp_path):
    source = tmp_path / "in.parquet"
    PENALIZED.write_parquet(source)
    result = run("compare", source, "--estimator", "gigpo", "--json", "-", "-q")
    assert result.exit_code == 1
    assert "--traj-score own (each trajectory's first row in the statistics" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_trinitys_bias_compares_its_own_episode_score(run, tmp_path):
    """--recipe trinity: the episode score is R(τ), the sum of the step rewards (1 and 0 in the
    worked case), on every row. Trajectory level: mean 0.5, (x − μ)/(1 + ε): ±0.5/(1 + ε).
    Turn level: rows 1, 1, 0, 0, 0, mean 0.4: trajectory 1 0.6/(1 + ε), trajectory 2
    -0.4/(1 + ε). The outcome score column (also 1 and 0 here) is not what is read: it is set
    to 7 and 3 to show it."""
    frame = WORKED.with_columns(pl.Series("score", [7.0, 7.0, 3.0, 3.0, 3.0]))
    summary = compare_json(run, tmp_path, frame, "--estimator", "gigpo", "--recipe", "trinity")
    by_trajectory = {t["trajectory"]: t for t in summary["top_trajectories"]}
    assert by_trajectory[1]["advantage_trajectory"] == pytest.approx(0.5 / (1 + EPS), abs=1e-12)
    assert by_trajectory[1]["advantage_turn"] == pytest.approx(0.6 / (1 + EPS), abs=1e-12)
    assert by_trajectory[2]["advantage_turn"] == pytest.approx(-0.4 / (1 + EPS), abs=1e-12)
    assert summary["groups"]["baseline_shift_mean"] == pytest.approx(0.1, abs=1e-12)


def test_the_settings_say_which_episode_term_and_step_term_were_measured(run, tmp_path):
    credit = compare_json(run, tmp_path, WORKED, "--recipe", "roll")["step_credit"]
    settings = credit["settings"]
    assert settings["level"] == "turn"
    assert settings["episode_rule"] == "every row in its group's statistics, with its score"
    assert settings["std_floor"] == 1e-6 and settings["gamma"] == 0.95
    returns = WORKED.with_columns(pl.col("step_reward").alias("step_return")).drop("step_reward")
    settings = compare_json(run, tmp_path, returns, "--recipe", "verl-agent-trajectory")[
        "step_credit"
    ]["settings"]
    assert settings["gamma"] is None and settings["std_floor"] is None
    assert settings["episode_rule"].startswith("each trajectory's first row in the statistics")


def test_a_step_weight_of_zero_is_said_to_be_the_cause(run, tmp_path):
    summary = compare_json(run, tmp_path, WORKED, *WORKED_OPTIONS, "--step-weight", "0")
    assert "The step weight ω is 0: the step term adds nothing" in summary["verdict"]


def test_batch_scope_over_anchors_shared_by_tasks_is_called_out(run, tmp_path):
    """ROLL's step_{idx} hashes: 4 of the 5 rows are at step_0 in groups a and b."""
    frame = pl.DataFrame(
        {
            "traj_group_id": ["a", "a", "a", "b", "b"],
            "traj_id": ["a1", "a1", "a2", "b1", "b2"],
            "step": [0, 1, 0, 0, 0],
            "episode_scores": [1.0, 1.0, 0.0, 1.0, 0.0],
            "step_scores": [0.0, 1.0, 0.0, 1.0, 0.0],
            "state_hash": ["step_0", "step_1", "step_0", "step_0", "step_0"],
        }
    )
    summary = compare_json(run, tmp_path, frame, "--recipe", "roll")
    assert "But 80% of rows have an anchor shared by task groups (1 anchor)" in summary["verdict"]
    result = run("compare", tmp_path / "in.parquet", "--recipe", "roll", "--by", "step", "-q")
    assert result.exit_code == 1
    assert "'step' is the turn column of ROLL's dumps, so --by step" in result.stderr


def test_trinity_without_an_anchor_asks_for_the_anchor(run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.drop("anchor").write_parquet(source)
    result = run("compare", source, "--recipe", "trinity", "--step-reward-col", "step_reward")
    assert result.exit_code == 1
    assert "no anchor column (gigpo's step groups need one)" in result.stderr


def test_inspect_takes_the_anchor_scope(run, tmp_path):
    """ROLL's step_{idx} hashes: within each task group, group a's step_0 rows form one step
    group (2 rows) and step_1 and group b's step_0 rows are their own; batch-wide, the 4 step_0
    rows are one step group and only step_1 is alone."""
    frame = pl.DataFrame(
        {
            "data_id": [0, 0, 0, 1],
            "rollout_id": [1, 1, 2, 3],
            "turn_index": [0, 1, 0, 0],
            "score": [1.0, 1.0, 0.0, 1.0],
            "anchor": ["step_0", "step_1", "step_0", "step_0"],
        }
    )
    source = tmp_path / "in.parquet"
    frame.write_parquet(source)
    for scope, singletons in (("group", 2), ("batch", 1)):
        result = run("inspect", source, "--json", "--anchor-scope", scope)
        assert result.exit_code == 0, result.stderr
        groups = json.loads(result.stdout)["step_groups"]
        assert groups["anchor_scope"] == scope and groups["singleton_rows"] == singletons

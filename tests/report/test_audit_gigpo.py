"""``audit`` on GiGPO's dumps (issue 47): where a dump has the anchors and the step rewards or
returns, each peer's GiGPO is a candidate. The trainer's advantages are the plain-Python
reference's (tests/gigpo_reference.py), written from each peer's code; the rule expected is
the one the reference ran, given by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import error_line
from gigpo_reference import GigpoRow, gigpo_recipe, step_returns
from gigpo_rows import agent_rows

from advcli.advantages.fit import gigpo_rules
from advcli.advantages.step_groups import SharedParts, gigpo_advantages
from advcli.run.audit import _load_scored, audit
from advcli.run.loading import opened
from advcli.settings.config import ColumnNames, Level
from advcli.settings.resolve import expected_rule


def write_dump(
    path: Path, rows: list[GigpoRow], found: list[float], returns: list[float] | None = None
) -> Path:
    """A dump of ``rows`` under verl-agent's names as ``write_batch`` writes them, with the
    trainer's advantage ``found`` on each of a row's two response tokens; the step returns
    (``step_return``) instead of the step rewards where given."""
    steps = (
        {"step_return": returns}
        if returns is not None
        else {"step_reward": [row.step_reward for row in rows]}
    )
    pl.DataFrame(
        {
            "uid": [f"u{row.group}" for row in rows],
            "traj_uid": [f"t{row.trajectory}" for row in rows],
            "turn": [row.turn for row in rows],
            "reward": [row.score for row in rows],
            "anchor": [f"state {row.anchor}" for row in rows],
            **steps,
            "response_mask": [[1, 1, 0]] * len(rows),
            "advantages": pl.Series(
                [[value, value, 0.0] for value in found], dtype=pl.List(pl.Float32)
            ),
        }
    ).write_parquet(path)
    return path


# (the reference's recipe, its norm, γ; advcli's recipe, level and the reference's norm in
# advcli's words)
RUNS = [
    ("verl-agent upstream", "mean", 1.0, "verl-agent", "turn", "mean"),
    ("verl-agent upstream", "mean_std", 0.95, "verl-agent", "turn", "mean_std"),
    ("verl-agent keyword", "mean_std", 0.9, "verl-agent-trajectory", "trajectory", "mean_std"),
    ("verl-agent keyword", "mean", 0.99, "verl-agent-trajectory", "trajectory", "mean"),
    ("Trinity-RFT", "mean_one", 1.0, "trinity", "trajectory", "mean"),
    ("Trinity-RFT", "mean_std", 0.95, "trinity", "trajectory", "mean_std"),
    ("ROLL", "mean_std", 0.95, "roll", "turn", "mean_std"),
    ("ROLL", "mean", 1.0, "roll", "turn", "mean"),
]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(("reference", "norm", "gamma", "recipe", "level", "named"), RUNS)
def test_each_peers_gigpo_is_found_with_no_bug(
    tmp_path, seed, reference, norm, gamma, recipe, level, named
) -> None:
    rows = agent_rows(seed, n=4)
    found = gigpo_recipe(rows, reference, norm=norm, gamma=gamma)
    report = audit([write_dump(tmp_path / "gigpo.parquet", rows, found)])
    rule = report["rule"]
    assert (rule["estimator"], rule["level"]) == ("gigpo", level)
    assert rule["step"] == {
        "recipe": recipe,
        "gamma": gamma,
        "step_weight": 1.0,
        "gigpo_norm": named,
        "anchor_scope": "batch" if recipe in ("trinity", "roll") else "group",
    }
    assert rule["rows_matched"] == rule["rows"] == len(rows)
    # The turn-level recipes count every turn row in the episode statistics: a rule, reported.
    multi_turn = [row for row in rows if sum(r.trajectory == row.trajectory for r in rows) > 1]
    expected = [("turn-level-counting", len(multi_turn))] if level == "turn" else []
    assert [(f["kind"], f["rows"]) for f in report["findings"]] == expected
    assert set(report["reading"]["roles"]) >= {"anchor", "step_reward"}


def test_step_returns_are_read_as_they_are(tmp_path) -> None:
    """verl-agent's batch holds the discounted returns (``step_rewards``, written as
    ``step_return``): no γ is applied, and none is named."""
    rows = agent_rows(3, n=4)
    returns = step_returns(rows, 0.8)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.8)
    report = audit([write_dump(tmp_path / "gigpo.parquet", rows, found, returns)])
    assert report["rule"]["step"]["gamma"] is None
    assert report["rule"]["step"]["recipe"] == "verl-agent"
    assert report["rule"]["rows_matched"] == len(rows)


def test_a_trainer_that_drops_the_step_term_of_a_group_is_a_finding(tmp_path) -> None:
    rows = agent_rows(4, n=4)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0)
    # Group 1's rows get the episode term alone (ω = 0 there).
    episode = gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0, omega=0.0)
    buggy = [e if row.group == 1 else a for row, a, e in zip(rows, found, episode, strict=True)]
    dropped = sum(
        row.group == 1 and abs(a - e) > 1e-4 for row, a, e in zip(rows, found, episode, strict=True)
    )
    assert dropped > 0
    report = audit([write_dump(tmp_path / "gigpo.parquet", rows, buggy)])
    assert report["rule"]["step"]["recipe"] == "verl-agent"
    assert report["rule"]["rows_matched"] == len(rows) - dropped
    off = sum(f["rows"] for f in report["findings"] if f["kind"] != "turn-level-counting")
    assert off == dropped


def test_anchors_without_step_rewards_leave_gigpo_out(tmp_path) -> None:
    """A dump with an anchor and no step reward is audited with the outcome rules: GiGPO needs
    both, and its reading says neither was read."""
    rows = agent_rows(5, n=4)
    path = write_dump(tmp_path / "gigpo.parquet", rows, [0.0] * len(rows))
    pl.read_parquet(path).drop("step_reward").write_parquet(path)
    report = audit([path])
    assert "anchor" not in report["reading"]["roles"]
    assert report["rule"]["step"] is None


def test_the_terminal_report_names_the_step_term(tmp_path, run) -> None:
    rows = agent_rows(1, n=4)
    found = gigpo_recipe(rows, "ROLL", norm="mean_std", gamma=0.95)
    result = run("audit", write_dump(tmp_path / "gigpo.parquet", rows, found))
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert (
        "recipe roll, gamma 0.95, step weight 1, norm mean_std, anchors within each batch" in text
    )


def test_expecting_the_recipe_run_is_no_finding(tmp_path) -> None:
    rows = agent_rows(6, n=4)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0)
    path = write_dump(tmp_path / "gigpo.parquet", rows, found)
    report = audit([path], expect=expected_rule("recipe=verl-agent"))
    assert [finding["kind"] for finding in report["findings"]] == ["turn-level-counting"]


def test_expecting_another_norm_and_gamma_is_a_finding(tmp_path) -> None:
    """The trainer ran verl-agent's mean_std_norm with γ 0.95; the user believes its yaml's
    defaults (mean_norm, γ 1): the rows the two rules give otherwise are the finding, the
    step term among the settings that differ."""
    rows = agent_rows(6, n=4)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.95)
    path = write_dump(tmp_path / "gigpo.parquet", rows, found)
    report = audit([path], expect=expected_rule("recipe=verl-agent"))
    (unexpected,) = [f for f in report["findings"] if f["kind"] == "unexpected-rule"]
    assert "step" in unexpected["example"]["differs"]
    assert unexpected["example"]["expected_rule"]["step"]["gamma"] == 1.0
    assert unexpected["example"]["found_rule"]["step"]["gamma"] == 0.95
    believed = gigpo_recipe(rows, "verl-agent upstream", norm="mean", gamma=1.0)
    differ = sum(abs(a - b) > 1e-5 + 1e-5 * abs(a) for a, b in zip(found, believed, strict=True))
    assert unexpected["rows"] == differ


def test_expecting_a_gamma_no_candidate_has(tmp_path) -> None:
    """γ 0.8 is no candidate: the rule --expect names is computed for the dump all the same,
    and where it is the trainer's, its rows are no unexpected-rule finding."""
    rows = agent_rows(7, n=4)
    found = gigpo_recipe(rows, "ROLL", norm="mean_std", gamma=0.8)
    path = write_dump(tmp_path / "gigpo.parquet", rows, found)
    report = audit([path], expect=expected_rule("recipe=roll,gamma=0.8"))
    assert "unexpected-rule" not in [finding["kind"] for finding in report["findings"]]


def test_expecting_gigpo_of_a_dump_without_anchors_is_an_error(tmp_path, run) -> None:
    rows = agent_rows(5, n=4)
    path = write_dump(tmp_path / "gigpo.parquet", rows, [0.0] * len(rows))
    pl.read_parquet(path).drop("anchor").write_parquet(path)
    line = error_line(run("audit", path, "--expect", "recipe=roll"))
    assert line == (
        "Error: the rule --expect names is GiGPO's, whose step groups need the dump's anchors "
        "and step rewards or returns (--anchor-col, --step-reward-col, --step-return-col); "
        "this dump was read without them"
    )


@pytest.mark.parametrize("returns", [False, True])
def test_the_candidates_shared_parts_give_each_rules_own_numbers(tmp_path, returns) -> None:
    """The audit makes each GiGPO candidate's episode term, returns and step groups once for
    all the candidates that share them: every candidate's advantages are the ones its rule
    alone gives, to the bit."""
    rows = agent_rows(8, n=4)
    path = write_dump(
        tmp_path / "gigpo.parquet",
        rows,
        [0.0] * len(rows),
        step_returns(rows, 0.9) if returns else None,
    )
    with opened([path]) as dataset:
        dump = _load_scored(dataset, ColumnNames(), None)
    projection, naming, trajectories = dump.projection, dump.naming, dump.trajectories
    rules = gigpo_rules(projection, [Level.TRAJECTORY, Level.TURN])
    assert len(rules) == (6 if returns else 32)
    shared = SharedParts()
    for config in rules:
        alone = gigpo_advantages(projection, config, naming, trajectories)
        together = gigpo_advantages(projection, config, naming, trajectories, None, shared)
        assert together.row_advantage.equals(alone.row_advantage), config
        assert together.steps.equals(alone.steps), config

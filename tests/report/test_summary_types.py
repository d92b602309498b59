"""The summary's types (advcli/report/summary.py) are the documents compare writes: every key of
every typed section, no key the types do not name, on real reports (a folder of verl-agent step
files read as one dump, by file and by a column's value; gigpo's, with its step term; and a
dump without a mask column, where the token figures are null)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from advcli.report import summary as types
from advcli.write.sample import verl_agent_table

SECTIONS = {
    "counts": types.Counts,
    "turns_per_trajectory": types.TurnsPerTrajectory,
    "groups": types.GroupFigures,
    "trajectories": types.TrajectoryFigures,
    "assessment": types.Assessment,
}
LISTS = {
    "by_turns": types.ByTurns,
    "top_groups": types.TopGroup,
    "top_trajectories": types.TopTrajectory,
}


def keys(kind: Any) -> set[str]:
    """A TypedDict's keys, those it requires and those it does not."""
    return set(kind.__required_keys__ | kind.__optional_keys__)


def assert_typed(summary: dict[str, Any]) -> None:
    optional = {"by_step", "duplicate_rows", "step_credit"}
    assert set(summary) - optional == keys(types.BiasSummary) - optional
    assert set(summary) <= keys(types.BiasSummary)
    for name, kind in SECTIONS.items():
        assert set(summary[name]) == keys(kind), name
    for name, kind in LISTS.items():
        assert summary[name], name
        for entry in summary[name]:
            assert set(entry) == keys(kind), name
    if summary["assessment"]["remedy"] is not None:
        assert set(summary["assessment"]["remedy"]) == keys(types.RemedyAdvice)
    if summary["loss_weights"] is not None:
        for weights in summary["loss_weights"].values():
            assert set(weights) == keys(types.ModeWeights)
            for entry in weights["by_turns"]:
                assert set(entry) == keys(types.ModeByTurns)
    if "by_step" in summary:
        assert set(summary["by_step"]) == keys(types.BySteps)
        for entry in summary["by_step"]["steps"]:
            assert set(entry) == keys(types.StepEntry)


@pytest.fixture
def steps(tmp_path: Path) -> Path:
    """Three steps of a verl-agent dump (anchors and step rewards, the invalid-action penalty),
    one file a step, each with its number in a column."""
    folder = tmp_path / "steps"
    folder.mkdir()
    for step in range(3):
        frame = pl.from_arrow(verl_agent_table(groups=6, rollouts=4, seed=step))
        assert isinstance(frame, pl.DataFrame)
        frame.with_columns(iteration=pl.lit(step)).write_parquet(folder / f"step_{step}.parquet")
    return folder


@pytest.mark.parametrize(
    "options",
    [
        ("--traj-score", "mean"),
        ("--traj-score", "mean", "--by", "file"),
        ("--traj-score", "mean", "--by", "iteration"),
        ("--recipe", "verl-agent-trajectory"),
    ],
)
def test_the_types_name_every_key_of_the_report(options, steps, run, tmp_path):
    report = tmp_path / "report.json"
    result = run("compare", steps, "--json", report, "-q", *options)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(report.read_text())
    assert ("by_step" in summary) == ("--by" in options)
    assert ("step_credit" in summary) == ("--recipe" in options)
    assert_typed(summary)


def test_the_types_name_every_key_without_a_mask(run, tmp_path):
    dump = tmp_path / "scalar.parquet"
    pl.DataFrame(
        {
            "uid": ["a", "a", "b", "b", "b"],
            "traj_uid": ["x", "y", "z", "w", "w"],
            "reward": [1.0, 0.0, 1.0, 0.0, 0.0],
        }
    ).write_parquet(dump)
    report = tmp_path / "report.json"
    result = run(
        "compare", dump, "--group-col", "uid", "--traj-col", "traj_uid", "--reward-col",
        "reward", "--json", report, "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = json.loads(report.read_text())
    assert summary["loss_weights"] is None
    assert_typed(summary)

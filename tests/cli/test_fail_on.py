"""``compare --fail-on material|severe``: exit 3 when the assessment's level reaches it, once the
reports are written; beside ``--fail-above`` (either trips the gate) and with ``--by`` (any
step). The dumps are made by hand and their levels computed by hand under drgrpo (advantage =
score − the group's mean), against the thresholds of advcli/report/verdict.py: material from a
mean |diff| of 0.01 or any sign flip, severe from 0.1 or 1% of trajectories flipping."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import dump_frame

# Every trajectory one turn: both levels count the same units, every diff is 0.
NEGLIGIBLE = [("p", "a", 0, 1.0, 2), ("p", "b", 0, 0.0, 2)]
# a: 2 turns of score 0.25, b: 1 turn of 0. Turn level: rows' mean 0.5 / 3 = 1/6, advantages
# a 1/12, b −1/6. Trajectory level: mean 1/8, a 1/8, b −1/8. |diff| 1/24 each: mean 0.0417,
# no sign flips.
MATERIAL = [("p", "a", 0, 0.25, 2), ("p", "a", 1, 0.25, 2), ("p", "b", 0, 0.0, 2)]
# a: 2 turns of score 1, b: 1 turn of 0. Turn level: mean 2/3, a 1/3, b −2/3. Trajectory
# level: mean 1/2, a 1/2, b −1/2. |diff| 1/6 each: mean 0.1667, no sign flips.
SEVERE = [("p", "a", 0, 1.0, 2), ("p", "a", 1, 1.0, 2), ("p", "b", 0, 0.0, 2)]
DUMPS = {"negligible": NEGLIGIBLE, "material": MATERIAL, "severe": SEVERE}
MEAN_DIFF = {"negligible": 0.0, "material": 1 / 24, "severe": 1 / 6}


def compare(run, path, *options):
    return run("compare", path, "--estimator", "drgrpo", "-q", *options)


@pytest.mark.parametrize(
    ("dump", "fail_on", "code"),
    [
        ("negligible", "material", 0),
        ("negligible", "severe", 0),
        ("material", "material", 3),
        ("material", "severe", 0),
        ("severe", "material", 3),
        ("severe", "severe", 3),
    ],
)
def test_fail_on_exits_3_when_the_level_reaches_it(dump, fail_on, code, write_dump, run, tmp_path):
    report = tmp_path / "report.json"
    result = compare(run, write_dump(DUMPS[dump]), "--fail-on", fail_on, "--json", report)
    assert result.exit_code == code, result.stderr
    # The report is written whether or not the gate trips, and says the level it tripped on.
    assessment = json.loads(report.read_text())["assessment"]
    assert assessment["level"] == dump
    assert assessment["advantage_diff_mean"] == pytest.approx(MEAN_DIFF[dump], abs=1e-12)
    expected = (
        f"advcli compare: the bias is {dump}, which reaches --fail-on {fail_on}\n"
        if code == 3
        else ""
    )
    assert result.stderr == expected


def test_fail_on_takes_only_the_levels_that_can_gate(write_dump, run):
    result = compare(run, write_dump(SEVERE), "--fail-on", "negligible")
    assert result.exit_code == 2
    assert "'negligible' is not one of 'material', 'severe'" in result.stderr


def test_fail_above_gates_on_one_trajectorys_diff_and_fail_on_on_the_mean(write_dump, run):
    """The material dump's largest |diff| is 1/24 = 0.0417: --fail-above 0.04 trips on it though
    the level is below severe, and --fail-on severe alone does not."""
    path = write_dump(MATERIAL)
    above = "advcli compare: the largest advantage difference 0.04167 exceeds --fail-above 0.04\n"
    reached = "advcli compare: the bias is material, which reaches --fail-on material\n"

    alone = compare(run, path, "--fail-on", "severe")
    assert (alone.exit_code, alone.stderr) == (0, "")
    either = compare(run, path, "--fail-on", "severe", "--fail-above", "0.04")
    assert (either.exit_code, either.stderr) == (3, above)
    both = compare(run, path, "--fail-on", "material", "--fail-above", "0.04")
    assert (both.exit_code, both.stderr) == (3, above + reached)
    neither = compare(run, path, "--fail-on", "severe", "--fail-above", "0.05")
    assert (neither.exit_code, neither.stderr) == (0, "")


def test_with_by_any_step_that_reaches_the_level_trips_the_gate(write_dump, run):
    """Step 1 is negligible, step 2 severe: the whole run's mean |diff| is (0 + 0 + 1/6 + 1/6) / 4
    = 1/12, material, while step 2 alone is severe, and --fail-on severe trips on it."""
    frame = pl.concat(
        [
            dump_frame(NEGLIGIBLE).with_columns(step=pl.lit(1)),
            dump_frame(SEVERE).with_columns(step=pl.lit(2)),
        ]
    )
    path = write_dump(frame)
    result = compare(run, path, "--by", "step", "--json", "-", "--fail-on", "severe")
    assert result.exit_code == 3
    assert result.stderr == "advcli compare: step 2 (severe) reaches --fail-on severe\n"
    summary = json.loads(result.stdout)
    assert summary["assessment"]["level"] == "material"
    assert [step["level"] for step in summary["by_step"]["steps"]] == ["negligible", "severe"]

    every = compare(run, path, "--by", "step", "--fail-on", "material")
    assert every.stderr == "advcli compare: step 2 (severe) reaches --fail-on material\n"
    twice = write_dump(
        pl.concat([dump_frame(SEVERE).with_columns(step=pl.lit(s)) for s in (2, 3)]),
        "twice.parquet",
    )
    both = compare(run, twice, "--by", "step", "--fail-on", "severe")
    assert both.stderr == "advcli compare: steps 2 (severe), 3 (severe) reach --fail-on severe\n"

    only_step_one = write_dump(frame.filter(pl.col("step") == 1), "one.parquet")
    calm = compare(run, only_step_one, "--by", "step", "--fail-on", "material")
    assert (calm.exit_code, calm.stderr) == (0, "")

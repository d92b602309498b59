"""Bounds on what an option may ask for: compare --by over many steps, option values whose
results would not be finite, SkyRL rows out of step order, and Ray's session folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

STEP_FIGURES = (
    "rows",
    "trajectories",
    "baseline_shift_mean",
    "advantage_diff_mean",
    "advantage_diff_max",
    "sign_flips",
    "token_mean_longest_vs_shortest",
    "level",
)


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its sha256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def one_error_line(result) -> str:
    """The run's only stderr line, an ``Error:`` line, with no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


def step_dump(steps: int, seed: int = 0) -> pl.DataFrame:
    """``steps`` steps whose string group ids repeat in every step, trajectories of one to
    three turns with non-round scores (their rows agree), token counts one to five."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        for group in range(3):
            for rollout in range(int(rng.integers(1, 5))):
                score = float(rng.normal()) * 0.37
                for turn in range(int(rng.integers(1, 4))):
                    rows.append((step * 7 % steps, f"q{group}", rollout, turn, score))
    tokens = rng.integers(1, 6, size=len(rows))
    return pl.DataFrame(
        {
            "step": [r[0] for r in rows],
            "data_id": [r[1] for r in rows],
            "rollout_id": [r[2] for r in rows],
            "turn_index": [r[3] for r in rows],
            "token_level_rewards": [
                [0.0] * (int(n) - 1) + [r[4]] for r, n in zip(rows, tokens, strict=True)
            ],
            "response_mask": [[1] * int(n) for n in tokens],
        },
        schema_overrides={"response_mask": pl.List(pl.Int8)},
    )


@pytest.mark.parametrize(
    "options",
    [
        (),
        ("--scale", "batch"),
        ("--estimator", "reinforce_pp_baseline"),
        ("--estimator", "rloo", "--singleton", "zero"),
    ],
    ids=["grpo", "grpo-batch", "reinforce_pp", "rloo"],
)
def test_by_step_figures_equal_each_step_compared_alone(run, tmp_path, options):
    """One grouped pass gives each step the figures of its rows compared alone, exactly, also
    for the batch-wide quantities (each step is its own batch)."""
    frame = step_dump(5)
    path = tmp_path / "run.parquet"
    frame.write_parquet(path)
    result = run(
        "compare", path, "--by", "step", "--json", "-", "-q", "--traj-score", "mean", *options
    )
    assert result.exit_code == 0, result.stderr
    series = json.loads(result.stdout)["by_step"]["steps"]
    assert [entry["step"] for entry in series] == list(range(5))
    for entry in series:
        alone_path = tmp_path / f"step-{entry['step']}.parquet"
        frame.filter(pl.col("step") == entry["step"]).write_parquet(alone_path)
        alone = run("compare", alone_path, "--json", "-", "-q", "--traj-score", "mean", *options)
        summary = json.loads(alone.stdout)
        expected = {
            "rows": summary["counts"]["rows"],
            "trajectories": summary["counts"]["trajectories"],
            "baseline_shift_mean": summary["groups"]["baseline_shift_mean"],
            "advantage_diff_mean": summary["trajectories"]["advantage_diff_mean"],
            "advantage_diff_max": summary["trajectories"]["advantage_diff_max"],
            "sign_flips": summary["trajectories"]["sign_flips"],
            "token_mean_longest_vs_shortest": summary["loss_weights"]["token-mean"][
                "longest_vs_shortest"
            ],
            "level": summary["assessment"]["level"],
        }
        assert {key: entry[key] for key in STEP_FIGURES} == expected, entry["step"]


def test_by_refuses_more_steps_than_it_reports(run, tmp_path):
    """A --by column of 100,001 distinct values (an id, not a step) is refused, naming the
    count and the limit, and nothing is written."""
    count = 100_001
    frame = pl.DataFrame(
        {
            "row_id": np.arange(count),
            "data_id": np.arange(count) % 50,
            "rollout_id": np.arange(count) // 50,
            "score": np.linspace(0.0, 1.0, count),
            "response_length": np.full(count, 3),
        }
    )
    folder = tmp_path / "in"
    folder.mkdir()
    frame.write_parquet(folder / "run.parquet")
    before = folder_digest(tmp_path)
    result = run("compare", folder / "run.parquet", "--by", "row_id", "--json", tmp_path / "r.json")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "column 'row_id' (--by) has 100,001 distinct values" in line
    assert "at most 100,000 steps" in line and "run.parquet" in line
    assert folder_digest(tmp_path) == before


def test_views_list_at_most_40_steps_and_the_json_every_one(run, tmp_path):
    frame = step_dump(45)
    path = tmp_path / "run.parquet"
    frame.write_parquet(path)
    markdown = tmp_path / "r.md"
    result = run(
        "compare", path, "--by", "step", "--json", tmp_path / "r.json", "--markdown", markdown
    )
    assert result.exit_code == 0, result.stderr
    assert len(json.loads((tmp_path / "r.json").read_text())["by_step"]["steps"]) == 45
    table = markdown.read_text().split("## By step")[1]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]
    # 20 first steps, the note, 20 last: steps 0-19 and 25-44.
    assert len(rows) == 41 and "… 5 more (by_step in the JSON)" in rows[20]
    assert rows[19].startswith("| 19 |") and rows[21].startswith("| 25 |")
    assert "… 5 more (by_step in the JSON)" in result.stdout


def usage_error_line(result) -> str:
    """A usage error's one ``Error:`` line (after click's usage text), exit 2, no traceback."""
    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


TWO_ROWS = [(0, "a", 0, 1.0, 2), (0, "b", 0, 0.0, 2)]


@pytest.mark.parametrize(
    ("factor", "kind"),
    [
        ("1e-310", "(rows × 1e-310) = inf overflows to infinity"),
        ("1e308", "underflows float64's range"),
        ("2e307", "underflows float64's range"),  # 1 / (3 × 2e307): a subnormal, digits lost
    ],
)
def test_loss_scale_factors_whose_weights_do_not_fit_are_refused(
    run, write_dump, tmp_path, factor, kind
):
    source = write_dump([*TWO_ROWS, (0, "c", 0, 0.5, 2)])
    before = folder_digest(tmp_path)
    result = run(
        "compute", source, "-o", tmp_path / "out.parquet", "--loss-weight",
        "seq-mean-token-sum-norm", "--loss-scale-factor", factor,
    )  # fmt: skip
    line = usage_error_line(result)
    assert f"--loss-scale-factor {float(factor):g}" in line and kind in line
    assert folder_digest(tmp_path) == before


def test_a_small_loss_scale_factor_that_fits_is_written(run, write_dump, tmp_path):
    out = tmp_path / "out.parquet"
    result = run(
        "compute", write_dump(TWO_ROWS), "-o", out, "--loss-weight",
        "seq-mean-token-sum-norm", "--loss-scale-factor", "1e-30", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    # 1 / (B · H) with B = 2 rows with tokens: 5e29, in the float64 column.
    written = pl.read_parquet(out)["loss_weight"]
    assert written.dtype == pl.Float64 and written.to_list() == [1 / (2 * 1e-30)] * 2


@pytest.mark.parametrize("epsilon", ["nan", "inf", "-inf"])
def test_epsilons_that_are_not_finite_are_refused(run, write_dump, tmp_path, epsilon):
    source = write_dump(TWO_ROWS)
    before = folder_digest(tmp_path)
    result = run("compute", source, "-o", tmp_path / "o.parquet", "--epsilon", epsilon)
    line = usage_error_line(result)
    assert "epsilon" in line
    assert folder_digest(tmp_path) == before


@pytest.mark.parametrize("epsilon", ["0", "-0.0", "1e-320"])
def test_zero_negative_zero_and_subnormal_epsilons_divide_by_the_std(
    run, write_dump, tmp_path, epsilon
):
    """Scores 1 and 0: mean 0.5, std sqrt(0.5); a subnormal epsilon is lost in the sum, so each
    advantage is ±0.5 / sqrt(0.5) = ±1/sqrt(2)."""
    out = tmp_path / "out.parquet"
    result = run("compute", write_dump(TWO_ROWS), "-o", out, "--epsilon", epsilon, "-q")
    assert result.exit_code == 0, result.stderr
    half = np.float32(0.5 / np.sqrt(0.5))
    assert pl.read_parquet(out)["advantage"].to_list() == [half, -half]


def skyrl_rows(steps: list[tuple[str, float, bool]]) -> pl.DataFrame:
    """SkyRL step-wise rows of one group '7', in the order given: (trajectory id, the step's
    reward, is_last_step); the reward on the last of two trainable tokens."""
    return pl.DataFrame(
        {
            "uids": ["7"] * len(steps),
            "trajectory_ids": [f"7_{t}" for t, _, _ in steps],
            "rewards": [[0.0, reward] for _, reward, _ in steps],
            "loss_mask": [[1.0, 1.0]] * len(steps),
            "response_mask": [[1, 1]] * len(steps),
            "is_last_step": [last for _, _, last in steps],
        }
    )


# Trajectory 0's last step (reward 1.0, flagged) sits between its other two steps.
OUT_OF_ORDER = [("0", 0.25, False), ("0", 1.0, True), ("0", 0.0, False), ("1", 0.0, False)]
OUT_OF_ORDER.append(("1", 0.0, True))


def test_traj_score_last_takes_the_flagged_step_whatever_the_row_order(run, tmp_path):
    """Scores 1.0 (the flagged step, not the last row's 0.0) and 0.0: ±0.5 / (sqrt(0.5) + 1e-6)."""
    source, out = tmp_path / "steps.parquet", tmp_path / "out.parquet"
    skyrl_rows(OUT_OF_ORDER).write_parquet(source)
    result = run("compute", source, "-o", out, "--traj-score", "last", "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    advantage = np.float32(0.5 / (np.sqrt(0.5) + 1e-6))
    assert pl.read_parquet(out)["advantage"].to_list() == [advantage] * 3 + [-advantage] * 2


@pytest.mark.parametrize(
    ("steps", "options", "expected"),
    [
        (
            OUT_OF_ORDER,
            ("--traj-score", "first"),
            "row 1: trajectory (uids='7', trajectory_ids='7_0') has a row flagged 'is_last_step' "
            "before its last row",
        ),
        (
            [("0", 0.0, True), ("0", 1.0, True), ("1", 0.0, True)],
            ("--traj-score", "last"),
            "row 1: trajectory (uids='7', trajectory_ids='7_0') has 2 rows flagged 'is_last_step'",
        ),
        (
            [("0", 0.0, False), ("0", 1.0, False), ("1", 0.0, True)],
            ("--traj-score", "last"),
            "row 1: trajectory (uids='7', trajectory_ids='7_0') has 0 rows flagged 'is_last_step'",
        ),
    ],
    ids=["first-out-of-order", "last-two-flags", "last-no-flag"],
)
def test_skyrl_rules_that_rely_on_the_step_order_check_it(run, tmp_path, steps, options, expected):
    folder = tmp_path / "in"
    folder.mkdir()
    skyrl_rows(steps).write_parquet(folder / "steps.parquet")
    before = folder_digest(tmp_path)
    for command in ("compute", "compare"):
        output = (
            ("-o", tmp_path / "out.parquet")
            if command == "compute"
            else ("--json", tmp_path / "r.json")
        )
        result = run(command, folder / "steps.parquet", *output, *options)
        assert result.exit_code == 1, result.stderr
        line = one_error_line(result)
        assert f"steps.parquet {expected}" in line
        if options[1] == "first":
            assert (
                "--traj-score first takes its first row, which needs its steps in row order" in line
            )
    assert folder_digest(tmp_path) == before


def test_traj_score_first_on_skyrl_rows_in_step_order(run, tmp_path):
    """Rows in order: first steps' rewards 0.25 and 0.0, ±0.125 / (sqrt(0.03125) + 1e-6)."""
    in_order = [OUT_OF_ORDER[i] for i in (0, 2, 1, 3, 4)]
    source, out = tmp_path / "steps.parquet", tmp_path / "out.parquet"
    skyrl_rows(in_order).write_parquet(source)
    result = run("compute", source, "-o", out, "--traj-score", "first", "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    advantage = np.float32(0.125 / (np.sqrt(0.03125) + 1e-6))
    assert pl.read_parquet(out)["advantage"].to_list() == [advantage] * 3 + [-advantage] * 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_local_ray_cluster_leaves_no_session_folder(tmp_path):
    """advcli's own local cluster keeps its session files in a folder advcli made under TMPDIR
    (short: Ray's socket paths are limited), which is gone after a run that succeeds and after
    one that fails once the cluster is up. The two runs go side by side, each with a TMPDIR of
    its own: most of a cluster's start is waiting."""
    pytest.importorskip("ray")
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"data_id": 0, "rollout_id": "a", "score": 1.0, "response_length": 2}\n'
        '{"data_id": 0, "rollout_id": "b", "score": 0.0, "response_length": 2}\n'
    )
    source = tmp_path / "good.parquet"
    pl.read_ndjson(good).write_parquet(source)
    runs = [
        ((source, "-o", tmp_path / "out", "--no-tokens", "-q"), 0),
        # Refused once the cluster is up: the engine reads Parquet only.
        ((good, "-o", tmp_path / "out2", "--no-tokens", "-q"), 1),
    ]
    temporaries = [Path(tempfile.mkdtemp(prefix="advcli-t-", dir="/tmp")) for _ in runs]
    try:
        processes = []
        for (arguments, _), temporary in zip(runs, temporaries, strict=True):
            environment = {**os.environ, "TMPDIR": str(temporary)}
            environment.pop("RAY_ADDRESS", None)
            command = [sys.executable, "-m", "advcli", "compute", *map(str, arguments)]
            processes.append(
                subprocess.Popen(
                    [*command, "--engine", "ray"],
                    env=environment,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for process, (_, code), temporary in zip(processes, runs, temporaries, strict=True):
            _, stderr = process.communicate(timeout=300)
            assert process.returncode == code, stderr
            assert list(temporary.iterdir()) == [], list(temporary.rglob("*"))[:5]
        assert "--engine ray reads Parquet inputs" in stderr
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
        for temporary in temporaries:
            shutil.rmtree(temporary, ignore_errors=True)

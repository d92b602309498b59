"""TRL's own ``completions/completions_{step:05d}.parquet``, read with no options.

Written here as TRL writes it (huggingface/trl at f2cd577, ``trl/trainer/grpo_trainer.py``):
with ``log_completions=True``, ``log()`` (l.3293-3327) builds ``{"step", "prompt", "completion",
one column per reward function, the log_extra columns, "advantage"}`` and writes it with pandas'
``to_parquet``. A reward function's None is NaN (pandas writes it as null). The rows are the
last generation batch, each prompt's ``num_generations`` completions consecutive
(RepeatSampler), and TRL's groups are blocks of that many rows (``rewards.view(-1,
num_generations)``, l.2685); the file does not hold the number.

The ``advantage`` column is TRL's formula (l.2676-2707) in plain Python: the rewards summed with
NaN left out, the group's NaN-mean, its Bessel std, ``(r - mean) / (std + 1e-4)``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import error_line
from reference import reference_advantages

pd = pytest.importorskip("pandas")

STEP = 40


def trl_rows(seed: int, prompts: list[str], generations: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for prompt in prompts:
        for number in range(generations):
            rows.append(
                {
                    "prompt": prompt,
                    "completion": f"completion {number}",
                    "accuracy_reward": float(rng.randint(0, 1)),
                    "format_reward": rng.choice([1.0, 0.5, math.nan]),
                }
            )
    return rows


def trl_advantages(rewards: list[float], generations: int) -> list[float]:
    """TRL's sum_then_normalize with scale_rewards="group", in plain Python: an unscored
    completion (NaN) is left out of its group's mean and Bessel std (nanmean, nanstd) and gets
    0, as does every completion of a group with one scored completion, whose std is NaN
    (nan_to_num)."""
    advantages = []
    for start in range(0, len(rewards), generations):
        group = rewards[start : start + generations]
        scored = [r for r in group if not math.isnan(r)]
        if len(scored) < 2:
            advantages += [0.0] * len(group)
            continue
        mean = sum(scored) / len(scored)
        std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1))
        advantages += [0.0 if math.isnan(r) else (r - mean) / (std + 1e-4) for r in group]
    return advantages


def summed(row: dict) -> float:
    """The row's reward as TRL sums it (nansum); NaN where no reward function scored it."""
    known = [
        row[name] for name in ("accuracy_reward", "format_reward") if not math.isnan(row[name])
    ]
    return sum(known) if known else math.nan


def write_completions(
    folder: Path, rows: list[dict], generations: int | None, step: int = STEP
) -> Path:
    """``log()``'s table, written with pandas as TRL writes it: the reward columns the rows
    hold, and TRL's advantages over groups of ``generations`` rows (None: 0, for rows TRL's
    formula here is not for)."""
    rewards = [name for name in ("accuracy_reward", "format_reward") if name in rows[0]]
    advantages = (
        trl_advantages([summed(row) for row in rows], generations)
        if generations is not None
        else [0.0] * len(rows)
    )
    table = {
        "step": [step] * len(rows),
        "prompt": [row["prompt"] for row in rows],
        "completion": [row["completion"] for row in rows],
        **{name: [row[name] for row in rows] for name in rewards},
        "advantage": advantages,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"completions_{step:05d}.parquet"
    pd.DataFrame(table).to_parquet(path)
    return path


# The second prompt is drawn twice in a row: one run of 8 rows, two of TRL's groups.
PROMPTS = ["2+2?", "capital of France?", "capital of France?", "3*3?"]


def test_groups_are_blocks_of_num_generations(run, tmp_path):
    rows = trl_rows(1, PROMPTS, generations=4)
    dump = write_completions(tmp_path / "completions", rows, generations=4)
    result = run("compare", dump, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (4, 16)
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "TRL"
    assert "blocks of 4 consecutive rows of one 'prompt'" in reading["roles"]["group"]["why"]
    assert reading["roles"]["reward"]["column"] == "rewards:sum"
    assert "'accuracy_reward', 'format_reward'" in reading["roles"]["reward"]["why"]
    assert reading["roles"]["trainer_advantage"]["column"] == "advantage"


@pytest.mark.parametrize("rule", [("--epsilon", "1e-4"), ("--recipe", "trl")])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_advantages_are_trls_with_its_epsilon(run, tmp_path, seed, rule):
    rows = trl_rows(seed, PROMPTS, generations=4)
    dump = write_completions(tmp_path / "completions", rows, generations=4)
    trls = pl.read_parquet(dump)["advantage"].to_list()
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", *rule, "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    assert written["advantage"].to_list() == pytest.approx(trls, abs=1e-5)
    reference = reference_advantages(
        [(row // 4, row, 0, summed(r), 0) for row, r in enumerate(rows)],
        level="trajectory",
        estimator="grpo",
        epsilon=1e-4,
    )
    assert written["advantage"].to_list() == pytest.approx(reference, abs=1e-5)


def test_group_size_given_stands(run, tmp_path):
    rows = trl_rows(4, PROMPTS, generations=4)
    dump = write_completions(tmp_path / "completions", rows, generations=4)
    report = json.loads(run("compare", dump, "--group-size", "2", "--json", "-").stdout)
    assert report["counts"]["groups"] == 8
    assert report["settings"]["reading"]["roles"]["group"]["why"].startswith("--group-size 2")


def unscored_rows() -> list[dict]:
    """Three prompts of four completions: row 4 of the second and two rows of the third no
    reward function scored; the third's scored completions are one."""
    rows = trl_rows(1, ["a", "b", "c"], generations=4)
    for row in (4, 8, 9, 11):
        rows[row]["accuracy_reward"] = rows[row]["format_reward"] = math.nan
    rows[10]["format_reward"] = 0.5
    return rows


def test_an_unscored_completion_is_left_out_with_advantage_0(run, tmp_path):
    """TRL's nanmean and nanstd leave a completion no reward function scored out of its group,
    and nan_to_num gives it 0, as it gives every completion of a group with one scored
    completion (group c: its std is NaN)."""
    rows = unscored_rows()
    dump = write_completions(tmp_path / "completions", rows, generations=4)
    trls = pl.read_parquet(dump)["advantage"].to_list()
    assert [trls[row] for row in (4, 8, 9, 10, 11)] == [0.0] * 5
    assert trls[5] != 0.0
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", "--recipe", "trl", "-q")
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(trls, abs=1e-5)
    report = json.loads(run("compare", dump, "--recipe", "trl", "--json", "-", "-q").stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (3, 8)
    assert report["settings"]["padding_rows"] == 4
    assert report["settings"]["padding_label"].startswith("completions no reward function scored")


def test_an_unscored_completion_is_audited_clean(run, tmp_path):
    """TRL's own advantages on a step with unscored completions: its rule (ε 1e-4, a lone
    scored completion 0), no finding."""
    dump = write_completions(tmp_path / "completions", unscored_rows(), generations=4)
    result = run("audit", dump, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    rule = report["rule"]
    assert (rule["estimator"], rule["epsilon"], rule["singleton"]) == ("grpo", 1e-4, "zero")
    assert rule["rows_matched"] == rule["rows"] == 8
    assert report["findings"] == []
    assert report["rows"]["total"] == 12
    assert report["rows"]["left_out"] == 4
    assert report["rows"]["left_out_what"].startswith("completions no reward function scored")
    text = " ".join(run("audit", dump).stdout.split())
    assert "Rows: 8 audited of 12 (0 without an advantage; 4 left out: completions no" in text
    markdown = tmp_path / "audit.md"
    assert run("audit", dump, "--markdown", markdown, "-q").exit_code == 0
    assert "| left out |  | 4 rows: completions no reward function scored" in markdown.read_text()


def test_runs_with_no_common_length_are_refused(run, tmp_path):
    rows = trl_rows(1, ["a", "b"], generations=3)[:5]  # runs of 3 and 2
    for row in rows:
        del row["format_reward"]
    dump = write_completions(tmp_path, rows, generations=None)
    line = error_line(run("compare", dump))
    assert "the runs of rows of one 'prompt' are 3, 2 rows long" in line
    assert "pass --group-size" in line


def test_a_folder_of_steps_by_file(run, tmp_path):
    folder = tmp_path / "completions"
    for step in (10, 20, 30):
        write_completions(folder, trl_rows(step, PROMPTS, generations=4), 4, step=step)
    result = run("compare", folder, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    series = json.loads(result.stdout)["by_step"]["steps"]
    assert [(entry["step"], entry["rows"]) for entry in series] == [(10, 16), (20, 16), (30, 16)]


def test_every_prompt_drawn_twice_is_told_by_trls_own_advantages(run, tmp_path):
    """Runs of 8 rows of one prompt everywhere: blocks of 8 or of 4? TRL's 'advantage' column
    is its formula's over blocks of 4 only."""
    rows = trl_rows(7, ["a", "a", "b", "b"], generations=4)
    for row in rows:  # rewards that differ within each block of 4
        row["format_reward"] = 0.5
    rows[0]["accuracy_reward"], rows[1]["accuracy_reward"] = 1.0, 0.0
    dump = write_completions(tmp_path, rows, generations=4)
    report = json.loads(run("compare", dump, "--json", "-").stdout)
    assert report["counts"]["groups"] == 4
    assert (
        "the size at which TRL's own 'advantage' column is its formula's"
        in (report["settings"]["reading"]["roles"]["group"]["why"])
    )
    out = tmp_path / "out.parquet"
    assert run("compute", dump, "-o", out, "--no-tokens", "--epsilon", "1e-4", "-q").exit_code == 0
    trls = pl.read_parquet(dump)["advantage"].to_list()
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(trls, abs=1e-5)

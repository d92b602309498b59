"""NeMo-RL's own ``train_data_step{N}.jsonl``, read with no options.

Written here as NeMo-RL writes it (NVIDIA-NeMo/RL at 7ea279a): ``grpo_train``
(``nemo_rl/algorithms/grpo.py`` l.3632-3654) logs the step's batch with
``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py`` l.1071-1098), which writes each
row as a one-row slice of the batch (every field a list of one value, a 2-D field ``[[...]]``)
plus ``idx``, the row's number. The batch repeats each prompt ``num_generations_per_prompt``
times (``repeat_interleave``, grpo.py l.2845-2852); its ``token_ids`` are prompt and response
right-padded to the batch's longest, ``token_loss_mask`` 1 on the generated tokens only. The
groups are the rows of one prompt's token ids (``algorithms/utils.py`` l.132-147): the file has
no group id.

Expected advantages come from tests/reference.py over those groups.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import error_line, watched
from reference import reference_advantages

PAD = 0


def nemo_batch(seed: int, prompts: list[list[int]], generations: int) -> list[dict]:
    """The rows of one step's batch: (prompt ids, response ids, reward) per row, each prompt's
    generations consecutive; a prompt may repeat (NeMo-RL then makes one group of both)."""
    rng = random.Random(seed)
    rows = []
    for prompt in prompts:
        for _ in range(generations):
            response = [rng.randint(10, 999) for _ in range(rng.randint(1, 6))]
            rows.append({"prompt": prompt, "response": response, "reward": rng.choice([0.0, 1.0])})
    return rows


def write_train_data(
    path: Path, rows: list[dict], filtered: bool = False, advantages: list[float] | None = None
) -> Path:
    """``log_batched_dict_as_jsonl`` of the batch grpo_train logs: each field a one-row slice.
    ``advantages``: each row's, on every token of it as NeMo-RL expands it (its prompt's and
    padding's too); else 0.25."""
    width = max(len(row["prompt"]) + len(row["response"]) for row in rows)
    lines = []
    for index, row in enumerate(rows):
        advantage = 0.25 if advantages is None else advantages[index]
        ids = row["prompt"] + row["response"]
        pad = [PAD] * (width - len(ids))
        mask = [0] * len(row["prompt"]) + [1] * len(row["response"]) + [0] * len(pad)
        fields = {
            "content": [["user: question", "assistant: answer"]],
            "rewards": [row["reward"]],
            **({"filtered_rewards": [row["reward"]]} if filtered else {}),
            "input_lengths": [len(ids)],
            "token_ids": [ids + pad],
            "token_loss_mask": [mask],
            "sample_loss_mask": [1.0],
            "advantages": [[advantage] * width],
            "generation_logprobs": [[0.0] * width],
            "prev_logprobs": [[0.0] * width],
        }
        lines.append(json.dumps({**fields, "idx": index}, default=str))
    path.write_text("\n".join(lines) + "\n")
    return path


def reference_rows(rows: list[dict]) -> list[tuple]:
    """The reference's rows: a group per distinct prompt, each row a trajectory."""
    return [
        (tuple(row["prompt"]), number, 0, row["reward"], len(row["response"]))
        for number, row in enumerate(rows)
    ]


def test_groups_are_the_rows_of_one_prompt(run, tmp_path):
    rows = nemo_batch(1, [[5, 6, 7], [5, 6], [8], [5, 6, 7, 9]], generations=4)
    dump = write_train_data(tmp_path / "train_data_step3.jsonl", rows)
    result = run("compare", dump, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (4, 16)
    assert report["counts"]["tokens"] == sum(len(row["response"]) for row in rows)
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "NeMo-RL"
    assert reading["read_as"].startswith("NeMo-RL's train_data_step{N}.jsonl")
    assert reading["roles"]["group"]["column"] == "token_ids:prompt"
    assert "before the first generated token" in reading["roles"]["group"]["why"]
    assert reading["roles"]["trajectory"]["column"] is None
    assert reading["roles"]["reward"]["column"] == "rewards:0"
    # The advantages NeMo-RL wrote are its own, named for what they are, never the reward.
    assert reading["roles"]["trainer_advantage"]["column"] == "advantages:0"
    assert "never read as a reward" in reading["roles"]["trainer_advantage"]["why"]


@pytest.mark.parametrize("seed", [1, 2])
def test_advantages_over_nemos_groups(run, tmp_path, seed):
    # The first prompt twice: NeMo-RL groups its 6 rows as one.
    prompts = [[11, 12], [13], [11, 12], [14, 15, 16]]
    rows = nemo_batch(seed, prompts, generations=3)
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", rows)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    assert "token_loss_mask:0" not in written.columns and "token_ids:prompt" not in written.columns
    assert written["idx"].to_list() == list(range(len(rows)))
    expected = reference_advantages(reference_rows(rows), level="trajectory", estimator="grpo")
    assert written["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    # Each generated token carries its row's advantage, the prompt and padding none.
    for row, advantages, value in zip(rows, written["advantages"].to_list(), expected, strict=True):
        start = len(row["prompt"])
        generated = advantages[start : start + len(row["response"])]
        assert generated == pytest.approx([value] * len(row["response"]), abs=1e-5)
        assert all(a == 0 for a in advantages[:start] + advantages[start + len(row["response"]) :])


def test_filtered_rewards_are_the_reward_when_written(run, tmp_path):
    rows = nemo_batch(3, [[1], [2]], generations=2)
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", rows, filtered=True)
    report = json.loads(run("compare", dump, "--json", "-").stdout)
    assert report["settings"]["reading"]["roles"]["reward"]["column"] == "filtered_rewards:0"


def test_a_field_of_two_values_is_refused_at_its_row(run, tmp_path):
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", nemo_batch(1, [[1]], 2))
    lines = dump.read_text().splitlines()
    second = json.loads(lines[1])
    second["rewards"] = [1.0, 0.0]
    lines[1] = json.dumps(second)
    dump.write_text("\n".join(lines) + "\n")
    line = error_line(run("compare", dump))
    assert "train_data_step1.jsonl row 1: column 'rewards' is not a list of one value" in line


def test_a_row_with_no_generated_token_is_refused(run, tmp_path):
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", nemo_batch(1, [[1]], 2))
    lines = dump.read_text().splitlines()
    first = json.loads(lines[0])
    first["token_loss_mask"] = [[0] * len(first["token_loss_mask"][0])]
    lines[0] = json.dumps(first)
    dump.write_text("\n".join(lines) + "\n")
    line = error_line(run("compare", dump))
    assert "row 0: column 'token_loss_mask' marks no generated token" in line


def test_a_folder_of_steps_by_file(run, tmp_path):
    folder = tmp_path / "logs" / "exp_001"
    folder.mkdir(parents=True)
    steps = {step: nemo_batch(step, [[1, 2], [3]], generations=3) for step in (1, 2, 12)}
    for step, rows in steps.items():
        write_train_data(folder / f"train_data_step{step}.jsonl", rows)
    # The validation data NeMo-RL logs beside them (grpo.py l.4021): content and rewards only.
    validation = {"content": [["q", "a"]], "rewards": [1.0], "idx": 0}
    (folder / "val_data_step1.jsonl").write_text(json.dumps(validation) + "\n")
    result = run("compare", folder, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    series = report["by_step"]["steps"]
    assert [(entry["step"], entry["rows"]) for entry in series] == [(1, 6), (2, 6), (12, 6)]
    notes = report["settings"]["reading"]["notes"]
    assert any(
        "1 file not read (only its NeMo-RL train_data_step{N}.jsonl files are): "
        "val_data_step1.jsonl" in note
        for note in notes
    )


@pytest.mark.process
def test_watch_takes_each_train_data_file(tmp_path):
    folder = tmp_path / "logs" / "exp_001"
    folder.mkdir(parents=True)
    write_train_data(folder / "train_data_step1.jsonl", nemo_batch(1, [[1, 2], [3]], 3))
    (folder / "val_data_step1.jsonl").write_text(
        '{"content": [["q"]], "rewards": [1.0], "idx": 0}\n'
    )
    second = nemo_batch(2, [[1, 2], [3]], 2)
    lines = watched(folder, 2, lambda: write_train_data(folder / "train_data_step2.jsonl", second))
    assert [(json.loads(line)["step"], json.loads(line)["rows"]) for line in lines] == [
        (1, 6),
        (2, 4),
    ]


def test_a_reward_beyond_float64s_integers_is_refused_at_its_line(run, tmp_path):
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", nemo_batch(1, [[1]], 2))
    lines = dump.read_text().splitlines()
    second = json.loads(lines[1])
    second["rewards"] = [2**53 + 1]  # float64 reads it as 2**53
    lines[1] = json.dumps(second)
    dump.write_text("\n".join(lines) + "\n")
    line = error_line(run("compare", dump))
    said = "train_data_step1.jsonl line 2: column 'rewards' holds the integer 9007199254740993"
    assert said in line


def nemo_grpo(rows: list[dict]) -> list[float]:
    """NeMo-RL's default GRPO advantages (``GRPOAdvantageEstimator`` with
    ``use_leave_one_out_baseline`` and ``normalize_rewards`` true, over
    ``calculate_baseline_and_std_per_prompt``, nemo_rl/algorithms/utils.py), written out in plain
    Python from its formula: per prompt of n samples, each sample's baseline is the mean of the
    n − 1 others, its std sqrt((mean of the others' squares − baseline²) · m / (m − 1)) with
    m = n − 1 (NaN, so 0, where m = 1); the advantage is (r − baseline) / (std + 1e-6) where
    std > 0, else r − baseline; a prompt of one sample has its reward as baseline (0)."""
    by_prompt: dict[tuple, list[int]] = {}
    for number, row in enumerate(rows):
        by_prompt.setdefault(tuple(row["prompt"]), []).append(number)
    advantages = [0.0] * len(rows)
    for members in by_prompt.values():
        if len(members) == 1:
            continue
        m = len(members) - 1
        for i in members:
            others = [rows[j]["reward"] for j in members if j != i]
            baseline = sum(others) / m
            square = sum(r * r for r in others) / m
            std = math.sqrt(max(square - baseline**2, 0.0) * m / (m - 1)) if m > 1 else 0.0
            centred = rows[i]["reward"] - baseline
            advantages[i] = centred / (std + 1e-6) if std > 0 else centred
    return advantages


def nemo_rule_batch(seed: int) -> list[dict]:
    """Groups of 4 with rewards 0, 0.5 or 1, one of 4 solved once (the solver's others tie:
    its advantage is 1 undivided), one of 2 and one of 1 sample, rewarded 1 (so that the
    singleton rule shows)."""
    rng = random.Random(seed)
    rows = nemo_batch(seed, [[11, 12], [13], [14, 15, 16], [17]], 4)
    for row in rows:
        row["reward"] = rng.choice([0.0, 0.5, 1.0])
    solved_once = nemo_batch(seed + 3, [[23]], 4)
    for row, reward in zip(solved_once, [0.0, 1.0, 0.0, 0.0], strict=True):
        row["reward"] = reward
    alone = nemo_batch(seed + 2, [[22]], 1)
    alone[0]["reward"] = 1.0
    return rows + solved_once + nemo_batch(seed + 1, [[21]], 2) + alone


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_nemo_rl_recipe_computes_nemo_rls_grpo(run, tmp_path, seed):
    rows = nemo_rule_batch(seed)
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", rows)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "-q", "--recipe", "nemo-rl")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)["advantage"].to_list()
    expected = nemo_grpo(rows)
    assert written == pytest.approx(expected, abs=1e-5)
    # The sample solved alone in its group: 1 less its others' mean 0, undivided.
    assert expected[17] == 1.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_audit_names_nemo_rls_grpo_with_no_finding(run, tmp_path, seed):
    """A clean NeMo-RL dump: its advantages, as its default GRPO computes them, are grpo_loo
    (the singleton rule 0, epsilon 1e-6, the sample std), and nothing is found."""
    rows = nemo_rule_batch(seed)
    dump = write_train_data(tmp_path / "train_data_step1.jsonl", rows, advantages=nemo_grpo(rows))
    result = run("audit", dump, "--json", "-", "--expect", "recipe=nemo-rl")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    rule = report["rule"]
    assert rule["rows_matched"] == rule["rows"] == len(rows)
    assert (rule["level"], rule["estimator"], rule["singleton"]) == (
        "trajectory",
        "grpo_loo",
        "zero",
    )
    assert (rule["epsilon"], rule["std_ddof"]) == (1e-6, 1)
    assert report["findings"] == []

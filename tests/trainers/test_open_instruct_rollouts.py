"""open-instruct's own ``--save_traces`` files, read with no options.

Written here as open-instruct writes them (allenai/open-instruct at e6c3044,
``open_instruct/rl_utils.py``): ``_save_rollouts`` (l.88-128) appends one ``asdict(RolloutRecord)``
a line (l.30-43: step, sample_idx, prompt_idx, prompt_tokens, response_tokens, reward,
advantage, finish_reason, dataset, ground_truth, request_info, logprobs) to
``{run}_rollouts_{shard:06d}.jsonl``, a shard holding many steps. ``prompt_idx`` is ``i //
num_samples_per_prompt``, restarted every step, and a group is ``(step, prompt_idx)``
(``data_loader.py`` l.881-895).

The ``advantage`` column is open-instruct's default rule, "centered" (``data_loader.py``
l.1472-1484): the reward less its group's mean.
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

SAMPLES = 3  # num_samples_per_prompt_rollout


def records(seed: int, steps: list[int], prompts: int) -> list[dict]:
    rng = random.Random(seed)
    lines = []
    for step in steps:
        rewards = [rng.choice([0.0, 10.0]) for _ in range(prompts * SAMPLES)]
        for i, reward in enumerate(rewards):
            group = rewards[(i // SAMPLES) * SAMPLES : (i // SAMPLES + 1) * SAMPLES]
            lines.append(
                {
                    "step": step,
                    "sample_idx": i,
                    "prompt_idx": i // SAMPLES,
                    "prompt_tokens": [1, 2, 3 + i // SAMPLES],
                    "response_tokens": [rng.randint(4, 99) for _ in range(rng.randint(1, 7))],
                    "reward": reward,
                    "advantage": reward - sum(group) / len(group),
                    "finish_reason": "stop",
                    "dataset": "math",
                    "ground_truth": "4",
                    "request_info": None,
                    "logprobs": [-0.5],
                }
            )
    return lines


def write_shard(path: Path, lines: list[dict]) -> Path:
    with path.open("a") as shard:
        for line in lines:
            shard.write(json.dumps(line) + "\n")
    return path


def test_groups_are_each_steps_prompts(run, tmp_path):
    lines = records(1, steps=[4, 5], prompts=3)
    dump = write_shard(tmp_path / "run__1__17_rollouts_000000.jsonl", lines)
    result = run("compare", dump, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    # prompt_idx restarts each step: 3 groups a step, never merged across steps.
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (6, 18)
    assert report["counts"]["tokens"] == sum(len(line["response_tokens"]) for line in lines)
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "open-instruct"
    assert reading["roles"]["group"]["column"] == "step:prompt_idx"
    assert reading["roles"]["mask"]["column"] == "response_tokens:length"
    assert reading["roles"]["trainer_advantage"]["column"] == "advantage"


def standard_advantages(lines: list[dict]) -> list[float]:
    """open-instruct's advantage_normalization_type "standard" (data_loader.py): each group's
    (scores - mean) / (np.std + 1e-8), np.std dividing by n, in plain Python."""
    out = []
    for line in lines:
        group = [
            other["reward"]
            for other in lines
            if (other["step"], other["prompt_idx"]) == (line["step"], line["prompt_idx"])
        ]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / len(group))
        out.append((line["reward"] - mean) / (std + 1e-8))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_open_instruct_recipe_gives_both_its_normalizations(run, tmp_path, seed):
    lines = records(seed, steps=[0, 1], prompts=4)
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", lines)
    for extra, expected in (
        ((), [line["advantage"] for line in lines]),
        (("--estimator", "grpo"), standard_advantages(lines)),
    ):
        out = tmp_path / "out.parquet"
        result = run(
            "compute", dump, "-o", out, "--recipe", "open-instruct", *extra, "-q", "--force"
        )
        assert result.exit_code == 0, result.stderr
        assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("seed", [1, 2])
def test_centered_advantages_are_open_instructs(run, tmp_path, seed):
    lines = records(seed, steps=[0, 1], prompts=4)
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--scale", "none", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    assert "response_tokens:length" not in written.columns
    open_instructs = [line["advantage"] for line in lines]
    assert written["advantage"].to_list() == pytest.approx(open_instructs, abs=1e-5)
    reference = reference_advantages(
        [
            ((line["step"], line["prompt_idx"]), row, 0, line["reward"], 1)
            for row, line in enumerate(lines)
        ],
        level="trajectory",
        estimator="grpo",
        scale="none",
    )
    assert written["advantage"].to_list() == pytest.approx(reference, abs=1e-5)
    lengths = [len(tokens) for tokens in written["advantages"].to_list()]
    assert lengths == [len(line["response_tokens"]) for line in lines]


def test_by_step_reads_each_step_of_a_shard(run, tmp_path):
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", records(3, [7, 8, 9], prompts=2))
    result = run("compare", dump, "--by", "step", "--json", "-")
    assert result.exit_code == 0, result.stderr
    series = json.loads(result.stdout)["by_step"]["steps"]
    assert [(entry["step"], entry["rows"]) for entry in series] == [(7, 6), (8, 6), (9, 6)]


def test_a_nan_logprob_is_refused_at_its_line(run, tmp_path):
    """json.dumps writes a NaN log-probability as the bare word NaN, which is not JSON."""
    lines = records(1, steps=[0], prompts=1)
    lines[1]["logprobs"] = [float("nan")]
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", lines)
    result = run("compare", dump)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {dump} line 2: column 'logprobs' holds NaN")


def test_a_shard_is_no_step(run, tmp_path):
    """A shard holds many steps: --by file (and watch) would make it one."""
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", records(3, [7, 8], prompts=2))
    line = error_line(run("compare", dump, "--by", "file"))
    assert line.endswith(
        "each of open-instruct's files holds many training steps (its 'step' column), so --by "
        "file and watch would take a file for a step: --by step reads each step as its own batch"
    )


def test_a_group_key_of_another_type_is_refused(run, tmp_path):
    lines = records(1, steps=[0], prompts=2)
    lines[2]["prompt_idx"] = 0.5
    dump = write_shard(tmp_path / "run_rollouts_000000.jsonl", lines)
    assert error_line(run("compare", dump)) == (
        f"Error: {dump}: column 'prompt_idx' holds Float64, where open-instruct writes "
        "integers: its groups are (step, prompt_idx)"
    )


def test_a_folder_reads_the_shards_alone(run, tmp_path):
    write_shard(tmp_path / "run__1__17_rollouts_000000.jsonl", records(1, [0, 1], prompts=2))
    write_shard(tmp_path / "run__1__17_rollouts_000001.jsonl", records(2, [2], prompts=2))
    metadata = {"run_name": "run__1__17", "git_commit": "abc", "model_name": "m", "timestamp": "t"}
    (tmp_path / "run__1__17_metadata.jsonl").write_text(json.dumps(metadata) + "\n")
    result = run("compare", tmp_path, "--by", "step", "--json", "-")
    assert result.exit_code == 0, result.stderr
    assert [entry["step"] for entry in json.loads(result.stdout)["by_step"]["steps"]] == [0, 1, 2]
    notes = json.loads(run("compare", tmp_path, "--json", "-").stdout)["settings"]["reading"]
    assert any("run__1__17_metadata.jsonl" in note for note in notes["notes"])

"""slime's own ``--dump-details DIR`` files, read with no options.

Written here as slime writes them (THUDM/slime at 624b824): ``--dump-details DIR`` sets the
rollout dump to ``DIR/rollout_data/{rollout_id}.pt`` and the train dump to
``DIR/train_data/{rollout_id}.pt`` (``slime/utils/arguments.py`` l.1290-1295, 1890-1892).
``save_debug_rollout_data`` (``slime/observability/rollout_data_utils.py`` l.140-153)
``torch.save``s ``{"rollout_id", "samples": [Sample.to_dict()]}`` as generated and scored, before
any normalization; ``save_debug_train_data`` (``train_data_utils.py`` l.112-242) the samples as
trained on, format_version 2, each with its ``rollout_position`` and ``rewards``, the
group-normalized reward.

slime's GRPO (``RolloutManager._post_process_rewards``, ``slime/ray/rollout.py`` l.608-633):
the rewards in blocks of n_samples_per_prompt (the samples are ordered by group), less the
block's mean, divided by its unbiased std + 1e-6.
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

torch = pytest.importorskip("torch")


def sample_dict(group: int, k: int, n: int, reward: float, length: int) -> dict:
    """``Sample.to_dict()`` (``slime/utils/types.py`` l.93-227): its fields, status as text."""
    return {
        "group_index": group,
        "index": group * n + k,
        "rollout_id": None,
        "prompt": "2+2?",
        "tokens": [151644, 872] + [19] * length,
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {},
        "response": "4" * length,
        "response_length": length,
        "label": "4",
        "reward": reward,
        "loss_mask": None if k % 2 else [1] * (length - 1) + [0],
        "weight_versions": ["3"],
        "rollout_log_probs": [-0.25] * length,
        "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None,
        "rollout_routed_experts": None,
        "remove_sample": False,
        "teacher_log_probs": None,
        "status": "completed",
        "metadata": {},
        "generate_function_path": None,
        "custom_rm_path": None,
        "train_metadata": None,
        "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": length,
        },
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 2},
    }


def step_samples(seed: int, groups: int = 4, n: int = 4) -> list[dict]:
    rng = random.Random(seed)
    return [
        sample_dict(g, k, n, float(rng.randint(0, 2)), rng.randint(2, 9))
        for g in range(groups)
        for k in range(n)
    ]


def slime_normalized(rewards: list[float], n: int) -> list[float]:
    """slime's GRPO in plain Python: blocks of n, less the mean, over the unbiased std + 1e-6."""
    out = []
    for start in range(0, len(rewards), n):
        block = rewards[start : start + n]
        mean = sum(block) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in block) / (n - 1))
        out += [(r - mean) / (std + 1e-6) for r in block]
    return out


def write_dump(folder: Path, rollout_id: int, samples: list[dict], n: int, train: bool = True):
    """The rollout file, and the train file as the DP source rank writes it (one DP shard)."""
    (folder / "rollout_data").mkdir(parents=True, exist_ok=True)
    torch.save(
        {"rollout_id": rollout_id, "samples": samples}, folder / f"rollout_data/{rollout_id}.pt"
    )
    if not train:
        return
    raw = [s["reward"] for s in samples]
    normalized = slime_normalized(raw, n)
    trained = []
    for position, (s, reward) in enumerate(zip(samples, normalized, strict=True)):
        length = s["response_length"]
        trained.append(
            {
                "data_parallel_rank": 0,
                "sample_index": s["index"],
                "rollout_position": position,
                "tokens": torch.tensor(s["tokens"]),
                "response_lengths": length,
                "rewards": reward,
                "truncated": 0,
                "loss_masks": torch.ones(length, dtype=torch.int32),
                "rollout_ids": 0,
                "rollout_mask_sums": torch.tensor(float(length)),
                "total_lengths": len(s["tokens"]),
                "local_raw_reward": s["reward"],
                "advantages": torch.full((length,), reward),
                "returns": torch.full((length,), reward),
            }
        )
    (folder / "train_data").mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": trained,
        "dp_shards": [
            {
                "rank": 0,
                "data_parallel_rank": 0,
                "sample_indices": [s["index"] for s in samples],
                "partition": list(range(len(samples))),
            }
        ],
        "raw_reward": raw,
    }
    torch.save(payload, folder / f"train_data/{rollout_id}.pt")


def tokens_of(s: dict) -> int:
    return s["response_length"] if s["loss_mask"] is None else sum(s["loss_mask"])


def test_a_dump_folder_is_read_with_slimes_groups(run, tmp_path):
    samples = step_samples(1)
    write_dump(tmp_path / "dump", 3, samples, 4)
    result = run("compare", tmp_path / "dump", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (4, 16)
    assert report["counts"]["tokens"] == sum(tokens_of(s) for s in samples)
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "slime"
    assert (
        reading["read_as"]
        == "slime's rollout_data/{id}.pt with its train_data/{id}.pt where there is one (a row a "
        "sample)"
    )
    assert reading["roles"]["trainer_advantage"]["column"] == "train_data.rewards"


@pytest.mark.parametrize("seed", [1, 2])
def test_advantages_are_slimes_and_the_reference(run, tmp_path, seed):
    samples = step_samples(seed)
    write_dump(tmp_path / "dump", 7, samples, 4)
    out = tmp_path / "out.parquet"
    result = run("compute", tmp_path / "dump/rollout_data/7.pt", "-o", out, "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    rows = [(s["group_index"], row, 0, s["reward"], 0) for row, s in enumerate(samples)]
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    assert written["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    # slime's own, from its train file, are the same numbers.
    assert written["train_data.rewards"].to_list() == pytest.approx(expected, abs=1e-5)


def test_a_step_without_its_train_file_has_no_trainer_advantage(run, tmp_path):
    write_dump(tmp_path / "dump", 1, step_samples(3), 4, train=False)
    write_dump(tmp_path / "dump", 2, step_samples(4), 4)
    result = run("inspect", tmp_path / "dump", "--by", "file", "--json")
    assert result.exit_code == 0, result.stderr
    advantages = json.loads(result.stdout)["trainer_advantages"]
    assert (advantages["rows"], advantages["rows_without"]) == (16, 16)


def test_steps_by_file_leave_out_evaluations(run, tmp_path):
    for rollout_id in (0, 1, 2):
        write_dump(tmp_path / "dump", rollout_id, step_samples(rollout_id), 4)
    torch.save(
        {"rollout_id": 2, "samples": step_samples(9)}, tmp_path / "dump/rollout_data/eval_2.pt"
    )
    result = run("compare", tmp_path / "dump", "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [entry["step"] for entry in report["by_step"]["steps"]] == [0, 1, 2]
    assert any("eval_2.pt" in note for note in report["settings"]["reading"]["notes"])


def test_a_train_file_without_its_rollout_file_is_one_error(run, tmp_path):
    write_dump(tmp_path / "dump", 4, step_samples(4), 4)
    (tmp_path / "dump/rollout_data/4.pt").unlink()
    line = error_line(run("compare", tmp_path / "dump/train_data/4.pt"))
    assert line.startswith(f"Error: {tmp_path / 'dump/rollout_data/4.pt'}: no such file")


class Payload:
    """What a pickle may name to run code when it is loaded."""

    def __reduce__(self):
        return (print, ("a dump ran code",))


def test_a_torch_file_naming_a_class_is_refused_unrun(run, tmp_path, capfd):
    (tmp_path / "dump/rollout_data").mkdir(parents=True)
    path = tmp_path / "dump/rollout_data/5.pt"
    torch.save({"rollout_id": 5, "samples": [Payload()]}, path)
    line = error_line(run("compare", path))
    assert line == (
        f"Error: {path}: it names print, which torch.load(weights_only=True) "
        "does not load; advcli reads only tensors, plain containers and numpy values from a "
        "torch file, and never runs a dump's code"
    )
    assert "a dump ran code" not in capfd.readouterr().out


def test_a_torch_file_of_another_shape_is_one_error(run, tmp_path):
    (tmp_path / "dump/rollout_data").mkdir(parents=True)
    path = tmp_path / "dump/rollout_data/6.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    line = error_line(run("compare", path))
    assert line == (
        f"Error: {path}: not slime's rollout dump (a dict of 'rollout_id' and 'samples', the "
        "samples' dicts)"
    )


def test_several_rewards_are_one_error(run, tmp_path):
    samples = step_samples(1)
    samples[2]["reward"] = {"accuracy": 1.0, "format": 0.5}
    write_dump(tmp_path / "dump", 2, samples, 4, train=False)
    line = error_line(run("compare", tmp_path / "dump"))
    assert "samples[2]: 'reward' holds several rewards (accuracy, format)" in line


def test_groups_of_several_sizes_are_said(run, tmp_path):
    samples = [s for s in step_samples(2) if s["index"] != 5]
    write_dump(tmp_path / "dump", 2, samples, 4, train=False)
    report = json.loads(run("compare", tmp_path / "dump", "--json", "-").stdout)
    assert any(
        "slime normalizes a step's rewards as one group" in note
        for note in report["settings"]["reading"]["notes"]
    )


def test_a_removed_sample_trains_on_no_token_but_stays_in_its_group(run, tmp_path):
    samples = step_samples(5)
    samples[6]["remove_sample"] = True
    write_dump(tmp_path / "dump", 2, samples, 4)
    report = json.loads(run("compare", tmp_path / "dump", "--json", "-").stdout)
    kept = [s for s in samples if not s["remove_sample"]]
    assert report["counts"]["tokens"] == sum(tokens_of(s) for s in kept)
    assert report["counts"]["trajectories"] == 16
    out = tmp_path / "out.parquet"
    assert run("compute", tmp_path / "dump", "-o", out, "--no-tokens", "-q").exit_code == 0
    written = pl.read_parquet(out)
    assert written["advantage"].to_list() == pytest.approx(
        written["train_data.rewards"].to_list(), abs=1e-5
    )


def test_a_compact_rollout_is_one_error(run, tmp_path):
    samples = step_samples(1)
    samples[4]["rollout_id"], samples[5]["rollout_id"] = 17, 17
    write_dump(tmp_path / "dump", 3, samples, 4, train=False)
    line = error_line(run("compare", tmp_path / "dump"))
    assert line == (
        f"Error: {tmp_path / 'dump/rollout_data/3.pt'}: samples[5]: its 'rollout_id' 17 is "
        "samples[4]'s too: a compact rollout, several samples slime counts as one trajectory, "
        "which advcli does not read (it reads a sample a trajectory)"
    )


@pytest.mark.parametrize("uneven", [1, 2])
def test_one_steps_uneven_groups_are_said_by_step(run, tmp_path, uneven):
    for step in (1, 2):
        samples = step_samples(step)
        if step == uneven:
            samples = [s for s in samples if s["index"] != 5]
        write_dump(tmp_path / "dump", step, samples, 4, False)
    notes = compare_json_notes(run, tmp_path / "dump", "--by", "file")
    assert [note for note in notes if "differ in size" in note] == [
        f"{uneven}: the groups differ in size (3, 4 samples): slime normalizes a step's rewards "
        "as one group, not per prompt, when its samples are not n_samples_per_prompt x "
        "rollout_batch_size (RolloutManager._post_process_rewards), so its own advantages were "
        "over the whole step"
    ]


def compare_json_notes(run, *args) -> list[str]:
    result = run("compare", *args, "--json", "-")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["settings"]["reading"]["notes"]


def test_per_token_advantages_cover_the_response(run, tmp_path):
    samples = step_samples(3)
    samples[5]["remove_sample"] = True
    write_dump(tmp_path / "dump", 1, samples, 4)
    out = tmp_path / "out.parquet"
    assert run("compute", tmp_path / "dump", "-o", out, "-q").exit_code == 0
    written = pl.read_parquet(out)
    for s, row in zip(samples, written.iter_rows(named=True), strict=True):
        mask = [0] * s["response_length"] if s["remove_sample"] else s["loss_mask"]
        mask = [1] * s["response_length"] if mask is None else mask
        assert row["advantages"] == pytest.approx([row["advantage"] * m for m in mask])


def test_numpy_and_tensor_values_are_read_as_numbers(run, tmp_path):
    import numpy as np

    samples = step_samples(4)
    for s in samples:
        s["reward"] = np.float32(s["reward"]) if s["index"] % 2 else np.float64(s["reward"])
    samples[0]["group_index"] = torch.tensor(0)
    write_dump(tmp_path / "dump", 1, samples, 4)
    out = tmp_path / "out.parquet"
    assert run("compute", tmp_path / "dump", "-o", out, "--no-tokens", "-q").exit_code == 0
    written = pl.read_parquet(out)
    assert written["advantage"].to_list() == pytest.approx(
        written["train_data.rewards"].to_list(), abs=1e-5
    )


@pytest.mark.parametrize(
    ("breaks", "expected"),
    [
        (
            lambda rollout, train: train["samples"][3].update(rewards=torch.ones(4)),
            "train_data/1.pt: samples[3]: 'rewards' is tensor([1., 1., 1., 1.]), not a number",
        ),
        (
            lambda rollout, train: train["samples"][3].update(rollout_position=2),
            "train_data/1.pt: samples[3]: 'rollout_position' 2 is an earlier sample's too: each "
            "sample of the rollout file is trained once",
        ),
        (
            lambda rollout, train: rollout["samples"][1].pop("group_index"),
            "rollout_data/1.pt: samples[1]: no 'group_index', which advcli reads",
        ),
    ],
)
def test_broken_samples_are_one_error(run, tmp_path, breaks, expected):
    write_dump(tmp_path / "dump", 1, step_samples(1), 4)
    paths = [tmp_path / "dump/rollout_data/1.pt", tmp_path / "dump/train_data/1.pt"]
    rollout, train = (torch.load(path, weights_only=False) for path in paths)
    breaks(rollout, train)
    for path, payload in zip(paths, (rollout, train), strict=True):
        torch.save(payload, path)
    assert error_line(run("compare", tmp_path / "dump")) == f"Error: {tmp_path / 'dump'}/{expected}"


def test_an_empty_torch_file_is_one_error(run, tmp_path):
    path = tmp_path / "dump/rollout_data/3.pt"
    path.parent.mkdir(parents=True)
    path.touch()
    assert error_line(run("compare", path)) == (
        f"Error: {path}: the file is empty (0 bytes), not a torch file"
    )


@pytest.mark.process
def test_a_watch_takes_each_steps_rollout_file(tmp_path):
    folder = tmp_path / "dump"
    write_dump(folder, 1, step_samples(1), 4)
    lines = watched(folder, 2, lambda: write_dump(folder, 2, step_samples(2), 4))
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_a_numpy_object_array_is_refused(run, tmp_path):
    """An object array rebuilt from a file's bytes would read them as pointers."""
    import numpy as np

    samples = step_samples(1)
    samples[0]["metadata"] = {"routed": np.array([1, "a"], dtype=object)}
    write_dump(tmp_path / "dump", 1, samples, 4, train=False)
    assert error_line(run("compare", tmp_path / "dump")) == (
        f"Error: {tmp_path / 'dump/rollout_data/1.pt'}: it names numpy.dtypes.ObjectDType, which "
        "torch.load(weights_only=True) does not load; advcli reads only tensors, plain "
        "containers and numpy values from a torch file, and never runs a dump's code"
    )


def test_a_rollout_id_of_another_type_is_one_error(run, tmp_path):
    write_dump(tmp_path / "dump", 1, step_samples(1), 4, train=False)
    path = tmp_path / "dump/rollout_data/1.pt"
    payload = torch.load(path, weights_only=False)
    payload["rollout_id"] = True
    torch.save(payload, path)
    assert (
        error_line(run("compare", path)) == f"Error: {path}: 'rollout_id' is true, not an integer"
    )

"""rLLM's own ``episodes/{mode}_step_{N}_epoch_{E}/episode_*.json``, read with no options.

Written here as rLLM writes them (rllm-org/rllm at 9beb6e0): ``EpisodeLogger``
(``rllm/utils/episode_logger.py``) puts each step's episodes in a folder
``{mode}_step_{step}_epoch_{epoch}`` (l.56), one file per episode named
``episode_hash{sha256 of the task, 8 hex digits}_id{episode id}.json`` (l.72-76), each one
pretty-printed JSON object (``json.dumps(..., indent=2, default=str)``, l.133-134) with the
episode's fields and its trajectories' steps (l.88-124), and a ``batch_summary.json`` beside
them (l.191).

rLLM's transform (``rllm/trainer/algorithms/transform.py`` l.87-97, 105-146) groups the
trajectories by ``{task_id}:{trajectory name}``, the task id the episode id's part before its
first ':' (``rllm/types.py`` l.333-334), leaves out a trajectory with no step, and scores a
trajectory by its ``reward``, or where every trajectory of its group has none, by its last
step's. Its advantage is the trajectory's, broadcast to every step (``advantage.py``
l.171-232).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import error_line
from reference import reference_advantages


def episode(task: str, k: int, trajectories: list[dict], step: int = 1) -> dict:
    task_hash = hashlib.sha256(json.dumps({"id": task}, sort_keys=True).encode()).hexdigest()[:8]
    return {
        "training_step": step,
        "epoch": 0,
        "episode_id": f"{task}:{k}",
        "session_id": None,
        "task": {"id": task, "question": "2+2?"},
        "task_hash": task_hash,
        "is_correct": k == 0,
        "termination_reason": "env_done",
        "metrics": {},
        "metadata": {},
        "timing": {"total": 1.5},
        "trajectories": trajectories,
    }


def trajectory(name: str, uid: str, reward: float | None, step_rewards: list[float]) -> dict:
    steps = [
        {
            "observation": {"text": "state"},
            "thought": "",
            "action": {"tool": "calc", "args": [2, 2]},
            "reward": r,
            "done": i == len(step_rewards) - 1,
            "model_response": "4",
            "chat_completions": [{"role": "assistant", "content": "4"}],
            "timing": {},
        }
        for i, r in enumerate(step_rewards)
    ]
    return {
        "name": name,
        "uid": uid,
        "reward": reward,
        "num_steps": len(steps),
        "timing": {},
        "steps": steps,
    }


def step_episodes(seed: int, step: int = 1, tasks: int = 3, size: int = 4) -> list[dict]:
    """Episodes of a solver and a judge for each task (two groups a task), of 1 to 4 steps."""
    rng = random.Random(seed)
    episodes = []
    for t in range(tasks):
        task = f"task-{t}"
        for k in range(size):
            turns = rng.randint(1, 4)
            solver = trajectory(
                "solver",
                f"s-{step}-{t}-{k}",
                float(rng.randint(0, 3)),
                [0.0] * turns,
            )
            judge = trajectory("judge", f"j-{step}-{t}-{k}", rng.choice([0.0, 1.0]), [0.5])
            episodes.append(episode(task, k, [solver, judge], step))
    return episodes


def episode_file(record: dict) -> str:
    """The name EpisodeLogger gives an episode's file."""
    safe = record["episode_id"].replace(":", "_").replace("/", "_")
    return f"episode_hash{record['task_hash']}_id{safe}.json"


def write_step(episodes_folder: Path, episodes: list[dict], mode: str = "train") -> Path:
    """One step's folder as EpisodeLogger writes it."""
    first = episodes[0]
    folder = episodes_folder / f"{mode}_step_{first['training_step']}_epoch_{first['epoch']}"
    folder.mkdir(parents=True, exist_ok=True)
    for record in episodes:
        text = json.dumps(record, indent=2, default=str) + "\n"
        (folder / episode_file(record)).write_text(text)
    summary = {"training_step": first["training_step"], "num_episodes": len(episodes)}
    (folder / "batch_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return folder


def file_order(episodes: list[dict]) -> list[dict]:
    """The episodes in the order of their files' names (advcli's reading order)."""
    return sorted(episodes, key=lambda record: record["episode_id"])


def rllm_rows(episodes: list[dict]) -> list[tuple[str, str, int, float, int]]:
    """(group, trajectory, turn, score, tokens) of every step rLLM trains on, by rLLM's
    transform: a trajectory's reward, or its last step's where its group has none."""
    groups: dict[str, list[dict]] = {}
    for record in episodes:
        task_id = record["episode_id"].split(":")[0]
        for traj in record["trajectories"]:
            if traj["steps"]:
                groups.setdefault(f"{task_id}:{traj['name']}", []).append(traj)
    rows = []
    for record in file_order(episodes):
        task_id = record["episode_id"].split(":")[0]
        for traj in record["trajectories"]:
            group = f"{task_id}:{traj['name']}"
            if not traj["steps"]:
                continue
            if all(other["reward"] is None for other in groups[group]):
                score = traj["steps"][-1]["reward"]
            else:
                score = traj["reward"]
            rows += [(group, traj["uid"], i, score, 0) for i in range(len(traj["steps"]))]
    return rows


def test_a_step_folder_is_read_with_rllms_groups(run, tmp_path):
    episodes = step_episodes(1)
    folder = write_step(tmp_path / "episodes", episodes)
    result = run("compare", folder, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    # Three tasks, each a solver group and a judge group of four trajectories.
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (6, 24)
    assert report["counts"]["rows"] == len(rllm_rows(episodes))
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "rLLM"
    assert reading["read_as"].startswith("rLLM's episodes/")
    assert reading["roles"]["group"]["column"] == "episode_id:group"
    assert reading["roles"]["trajectory"]["column"] == "trajectories.uid"
    assert any("batch_summary.json" in note for note in reading["notes"])
    assert report["settings"]["inputs"] == [str(folder)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_advantages_are_the_reference_over_rllms_groups(run, tmp_path, seed):
    episodes = step_episodes(seed)
    folder = write_step(tmp_path / "episodes", episodes)
    out = tmp_path / "out.parquet"
    result = run("compute", folder, "-o", out, "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    rows = rllm_rows(episodes)
    assert written["trajectories.uid"].to_list() == [row[1] for row in rows]
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    assert written["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_rllms_unnormalized_grpo_is_scale_none(run, tmp_path):
    """With norm_adv_by_std_in_grpo=False rLLM's advantage is the score less its group's mean
    (advantage.py l.171-232): --scale none."""
    episodes = step_episodes(4)
    folder = write_step(tmp_path / "episodes", episodes)
    out = tmp_path / "out.parquet"
    assert run("compute", folder, "-o", out, "--scale", "none", "--no-tokens", "-q").exit_code == 0
    rows = rllm_rows(episodes)
    scores: dict[str, dict[str, float]] = {}
    for group, uid, _, score, _ in rows:
        scores.setdefault(group, {})[uid] = score
    means = {group: sum(s.values()) / len(s) for group, s in scores.items()}
    expected = [score - means[group] for group, _, _, score, _ in rows]
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-6)


def test_a_group_without_trajectory_rewards_is_scored_by_last_steps(run, tmp_path):
    episodes = step_episodes(5, tasks=2)
    for record in episodes:
        if record["episode_id"].startswith("task-1"):
            solver = record["trajectories"][0]
            solver["reward"] = None
            solver["steps"][-1]["reward"] = float(len(solver["steps"]))
    folder = write_step(tmp_path / "episodes", episodes)
    out = tmp_path / "out.parquet"
    assert run("compute", folder, "-o", out, "--no-tokens", "-q").exit_code == 0
    rows = rllm_rows(episodes)
    assert {row[3] for row in rows if row[0] == "task-1:solver"} <= {1.0, 2.0, 3.0, 4.0}
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_a_group_of_rewards_and_nulls_is_one_error(run, tmp_path):
    episodes = step_episodes(6, tasks=1)
    episodes[2]["trajectories"][0]["reward"] = None
    folder = write_step(tmp_path / "episodes", episodes)
    line = error_line(run("compare", folder))
    # Every row of the group breaks the rule: the first is the group's first episode's.
    assert line.startswith(f"Error: {folder}/{episode_file(episodes[0])} (row 0 of the folder's): ")
    assert "have a reward and no reward (null) both, which rLLM's transform refuses" in line


def test_a_trajectory_with_no_step_is_counted_apart(run, tmp_path):
    episodes = step_episodes(7, tasks=2)
    episodes[1]["trajectories"][0]["steps"] = []
    folder = write_step(tmp_path / "episodes", episodes)
    report = json.loads(run("compare", folder, "--json", "-").stdout)
    assert report["settings"]["padding_rows"] == 1
    assert report["counts"]["trajectories"] == 15
    out = tmp_path / "out.parquet"
    assert run("compute", folder, "-o", out, "--no-tokens", "-q").exit_code == 0
    written = pl.read_parquet(out).filter(pl.col("steps:index").is_not_null())
    expected = reference_advantages(rllm_rows(episodes), level="trajectory", estimator="grpo")
    assert written["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_the_episodes_folder_by_file_is_each_training_step(run, tmp_path):
    episodes_folder = tmp_path / "episodes"
    for step in (2, 10, 3):
        write_step(episodes_folder, step_episodes(step, step=step))
    write_step(episodes_folder, step_episodes(9, step=10), mode="val")
    result = run("compare", episodes_folder, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    series = report["by_step"]["steps"]
    assert [(entry["step"], entry["trajectories"]) for entry in series] == [
        (2, 24),
        (3, 24),
        (10, 24),
    ]
    assert any("val_step_10_epoch_0" in note for note in report["settings"]["reading"]["notes"])
    jobs = run("compare", episodes_folder, "--by", "file", "--jobs", "2", "--json", "-")
    assert json.loads(jobs.stdout)["by_step"] == report["by_step"]
    # Read as one batch, a task of two steps would be one group: refused.
    line = error_line(run("compare", episodes_folder))
    assert "pass --by training_step" in line


def test_episode_files_given_by_a_pattern_are_their_folder(run, tmp_path):
    folder = write_step(tmp_path / "episodes", step_episodes(1))
    by_folder = json.loads(run("compare", folder, "--json", "-").stdout)
    by_files = run("compare", folder / "episode_*.json", "--json", "-")
    assert by_files.exit_code == 0, by_files.stderr
    assert json.loads(by_files.stdout)["counts"] == by_folder["counts"]


def test_a_truncated_episode_file_is_one_error(run, tmp_path):
    folder = write_step(tmp_path / "episodes", step_episodes(1))
    broken = sorted(folder.glob("episode_*.json"))[3]
    broken.write_text(broken.read_text()[:200])
    line = error_line(run("compare", folder))
    assert line.startswith(f"Error: {broken}: not an rLLM episode file (not JSON: ")
    assert " at line " in line


def test_a_reward_of_another_type_is_one_error(run, tmp_path):
    episodes = step_episodes(1, tasks=1)
    episodes[0]["trajectories"][1]["steps"][0]["reward"] = "0.5"
    folder = write_step(tmp_path / "episodes", episodes)
    line = error_line(run("compare", folder))
    name = next(folder.glob("episode_*_idtask-0_0.json"))
    assert line == f"Error: {name}: trajectories[1].steps[0]: 'reward' is \"0.5\", not a number"


def test_episodes_beside_another_trainers_dump_are_one_error(run, tmp_path):
    folder = write_step(tmp_path / "episodes", step_episodes(1))
    other = tmp_path / "train_data_step1.jsonl"
    other.write_text(json.dumps({"idx": [0], "rewards": [1.0]}) + "\n")
    line = error_line(run("compare", folder, other))
    assert line == (
        f"Error: {folder}: inputs mix formats (JSON-lines, rLLM episode files); give one format"
    )


def test_compute_never_writes_into_the_episodes_folder(run, tmp_path):
    folder = write_step(tmp_path / "episodes", step_episodes(1))
    line = error_line(run("compute", folder, "-o", folder, "--format", "parquet", "--force"))
    assert line == f"Error: {folder}: the output is also an input; choose another path"
    assert len(list(folder.glob("episode_*.json"))) == 12


def test_a_watch_of_episode_folders_is_refused(run, tmp_path):
    episodes_folder = tmp_path / "episodes"
    write_step(episodes_folder, step_episodes(1))
    line = error_line(run("watch", episodes_folder, "--settle", "0"))
    assert line == (
        f"Error: {episodes_folder}: holds rLLM's episode files, a folder of them a step, which a "
        "watch does not take (it takes a step a file); compare the episodes folder with --by file"
    )


def test_inspect_names_what_it_read(run, tmp_path):
    folder = write_step(tmp_path / "episodes", step_episodes(1))
    result = run("inspect", folder, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["inputs"]["format"] == "rLLM episode files"
    assert (summary["counts"]["groups"], summary["counts"]["trajectories"]) == (6, 24)


def test_a_repeated_trajectory_uid_names_its_episode(run, tmp_path):
    episodes = step_episodes(8, tasks=1)
    episodes[3]["trajectories"][0]["uid"] = episodes[1]["trajectories"][0]["uid"]
    folder = write_step(tmp_path / "episodes", episodes)
    line = error_line(run("compare", folder))
    assert line.startswith(f"Error: {folder}/{episode_file(episodes[3])} (row ")
    assert "duplicate turn" in line and "ROLL" not in line


def test_the_unread_files_are_said_by_every_reading(run, tmp_path):
    episodes_folder = tmp_path / "episodes"
    write_step(episodes_folder, step_episodes(1))
    write_step(episodes_folder, step_episodes(2, step=2), mode="val")
    inspected = run("inspect", episodes_folder, "--by", "file", "--json")
    assert inspected.exit_code == 0, inspected.stderr
    notes = json.loads(inspected.stdout)["inputs"]["notes"]
    assert any("val_step_2_epoch_0/" in note for note in notes)
    terminal = run("inspect", episodes_folder)
    assert "not read" in terminal.stdout


def test_steps_of_several_epochs_are_named_by_their_step(run, tmp_path):
    episodes_folder = tmp_path / "episodes"
    for step, epoch in ((3, 0), (4, 1)):
        episodes = step_episodes(step, step=step)
        for record in episodes:
            record["epoch"] = epoch
        write_step(episodes_folder, episodes)
    report = json.loads(run("compare", episodes_folder, "--by", "file", "--json", "-").stdout)
    assert [entry["step"] for entry in report["by_step"]["steps"]] == [3, 4]


def test_a_step_number_beyond_64_bits_is_one_error(run, tmp_path):
    episodes = step_episodes(1, tasks=1)
    episodes[0]["training_step"] = 10**30
    folder = write_step(tmp_path / "episodes", episodes)
    name = folder / episode_file(episodes[0])
    assert error_line(run("compare", folder)) == (
        f"Error: {name}: 'training_step' is {10**30}, beyond a 64-bit integer"
    )

"""prime-rl's own ``rollouts/step_N/train/{all,effective}/traces.jsonl``, read with no options.

Written here as prime-rl writes them (PrimeIntellect-ai/prime-rl at 559b447 with verifiers at
a60a606): ``FileMonitor.log_episodes`` (``src/prime_rl/monitors/file.py`` l.43-59) appends one
``Episode.to_record()`` a line with orjson (compact), a record being the Episode's
``model_dump(mode="json", exclude_none=True)`` (``verifiers/v1/episode.py`` l.149-155). ``all``
holds every finished episode, errored ones too, before any advantage; ``effective`` the traces
shipped for training, each with ``info.advantage``, less those whose advantages are all zero
(``orchestrator/train_sink.py`` l.36-61, 361-381).

prime-rl's GRPO (``orchestrator/algo/grpo.py`` l.25-45): a group is the episodes of one
``group.id``; only traces without errors, of a trainable agent and with a sampled token count;
a trace's reward is Σ score × weight over its rewards that are not null (``verifiers/v1/
trace.py`` l.135-141); its advantage the reward less the group's mean, no std.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import error_line
from reference import reference_advantages


def episode(group: str, number: int, reward: dict, tokens: int, *, ok: bool = True) -> dict:
    """One Episode record with one trace: a user node and a sampled assistant node."""
    nodes = [
        {
            "message": {"role": "user", "content": "2+2?"},
            "sampled": False,
            "timestamp": 1.7e9,
            "token_ids": [151644, 872, 17],
            "mask": [False, False, False],
            "is_content": [True, True, True],
            "logprobs": [],
        },
        {
            "parent": 0,
            "message": {"role": "assistant", "content": "4"},
            "sampled": True,
            "timestamp": 1.7e9,
            "token_ids": [198] * (tokens + 1),
            "mask": [False] + [True] * tokens,
            "is_content": [True] * (tokens + 1),
            "logprobs": [-0.25] * tokens,
        },
    ]
    errors = [] if ok else [{"type": "RuntimeError", "message": "sandbox died"}]
    trace = {
        "version": 1,
        "id": f"trace-{group}-{number}",
        "verifiers": {"version": "0.2"},
        "agent": {"config": {}, "name": "agent", "trainable": True},
        "tools": [],
        "nodes": nodes,
        "calls": [{"node": 1, "finish_reason": "stop", "time": {}}],
        "request_rewrites": [],
        "response_rewrites": [],
        "rewards": reward,
        "metrics": {},
        "info": {},
        "extra_usage": [],
        "is_completed": True,
        "ok": ok,
        "errors": errors,
        "timing": {},
    }
    return {
        "id": f"episode-{group}-{number}",
        "env": {"id": "gsm8k", "name": "gsm8k"},
        "task": {"type": "math", "data": {"idx": 3}, "key": "k", "hash": "h"},
        "group": {"id": group},
        "run": {"type": "train", "id": "run", "work": {"type": "train", "step": 12}},
        "ok": ok,
        "errors": errors,
        "traces": [trace],
    }


def step_episodes(seed: int, groups: int = 4, size: int = 4) -> list[dict]:
    """Episodes of ``groups`` groups: a 'correct' reward and a weighted 'format' one (null on
    some), and in group 1 an errored episode."""
    rng = random.Random(seed)
    episodes = []
    for g in range(groups):
        for k in range(size):
            reward = {
                "correct": {"score": float(rng.randint(0, 1)), "weight": 1.0},
                "format": {"score": rng.choice([0.0, 1.0]), "weight": 0.5} if k % 2 else None,
            }
            errored = g == 1 and k == 2
            episodes.append(episode(f"g{g}", k, reward, rng.randint(1, 9), ok=not errored))
    return episodes


def reward_of(record: dict) -> float:
    rewards = record["traces"][0]["rewards"].values()
    return sum(r["score"] * r["weight"] for r in rewards if r is not None)


def counted(record: dict) -> bool:
    return bool(record["traces"]) and record["traces"][0]["ok"]


def prime_rl_advantages(episodes: list[dict]) -> list[float | None]:
    """prime-rl's GRPO in plain Python: None for a trace it leaves out."""
    groups: dict[str, list[float]] = {}
    for record in episodes:
        if counted(record):
            groups.setdefault(record["group"]["id"], []).append(reward_of(record))
    means = {group: sum(rewards) / len(rewards) for group, rewards in groups.items()}
    return [
        reward_of(record) - means[record["group"]["id"]] if counted(record) else None
        for record in episodes
    ]


def write_traces(path: Path, episodes: list[dict]) -> Path:
    """Appended as FileMonitor does, each record compact as orjson writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as traces:
        for record in episodes:
            traces.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


def effective(episodes: list[dict]) -> list[dict]:
    """The effective file: the counted traces with a non-zero advantage, each with it."""
    shipped = []
    for record, advantage in zip(episodes, prime_rl_advantages(episodes), strict=True):
        if advantage:
            record = json.loads(json.dumps(record))
            record["traces"][0]["info"] = {"advantage": advantage}
            shipped.append(record)
    return shipped


def test_all_file_leaves_out_the_errored_traces(run, tmp_path):
    episodes = step_episodes(1)
    dump = write_traces(tmp_path / "rollouts/step_12/train/all/traces.jsonl", episodes)
    result = run("compare", dump, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (4, 15)
    settings = report["settings"]
    assert (settings["padding_rows"], settings["padding_label"]) == (
        1,
        "traces prime-rl leaves out",
    )
    reading = settings["reading"]
    assert reading["trainer"] == "prime-rl"
    assert reading["roles"]["group"]["column"] == "group.id"
    assert "'correct', 'format'" in reading["roles"]["reward"]["why"]
    assert any("traces with errors" in note for note in reading["notes"])
    assert "trainer_advantage" not in reading["roles"]  # all/ holds none


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_advantages_are_prime_rls_grpo(run, tmp_path, seed):
    episodes = step_episodes(seed)
    dump = write_traces(tmp_path / "traces.jsonl", episodes)
    # The records' empty objects have no Parquet type: Arrow holds them.
    out = tmp_path / "out.arrow"
    result = run("compute", dump, "-o", out, "--scale", "none", "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_ipc(out)["advantage"].to_list()
    # A trace prime-rl leaves out gets no advantage; advcli writes it 0.
    expected = [0.0 if a is None else a for a in prime_rl_advantages(episodes)]
    assert written == pytest.approx(expected, abs=1e-5)
    rows = [
        (record["group"]["id"], row, 0, reward_of(record), 0)
        for row, record in enumerate(episodes)
        if counted(record)
    ]
    reference = reference_advantages(rows, level="trajectory", estimator="grpo", scale="none")
    assert [w for w, r in zip(written, episodes, strict=True) if counted(r)] == pytest.approx(
        reference, abs=1e-5
    )


def test_the_prime_rl_recipe_is_prime_rls_grpo_with_its_lone_trace(run, tmp_path):
    """--recipe prime-rl: each trace's reward less its group's mean, and a group of one trace
    (g9) its reward less itself, 0 (advcli's default keeps a lone unit's score)."""
    episodes = [*step_episodes(4), episode("g9", 0, {"correct": {"score": 1.0, "weight": 1.0}}, 3)]
    dump = write_traces(tmp_path / "traces.jsonl", episodes)
    out = tmp_path / "out.arrow"
    result = run("compute", dump, "-o", out, "--recipe", "prime-rl", "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_ipc(out)["advantage"].to_list()
    expected = [0.0 if a is None else a for a in prime_rl_advantages(episodes)]
    assert expected[-1] == 0.0
    assert written == pytest.approx(expected, abs=1e-5)


def test_effective_file_has_the_trainers_advantage_and_says_what_it_lacks(run, tmp_path):
    shipped = effective(step_episodes(2))
    dump = write_traces(tmp_path / "rollouts/step_12/train/effective/traces.jsonl", shipped)
    report = json.loads(run("compare", dump, "--json", "-").stdout)
    reading = report["settings"]["reading"]
    assert reading["roles"]["trainer_advantage"]["column"] == "traces:advantage"
    assert any("statistics here are over the traces left" in note for note in reading["notes"])
    out = tmp_path / "out.parquet"
    keys = ("--columns", "keys", "--scale", "none", "--no-tokens", "-q")
    result = run("compute", dump, "-o", out, *keys)
    assert result.exit_code == 0, result.stderr
    # A trace left out with advantage 0 had its group's mean: the survivors' mean is the same.
    trainers = [record["traces"][0]["info"]["advantage"] for record in shipped]
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(trainers, abs=1e-5)


def test_records_parquet_cannot_hold_are_refused_before_writing(run, tmp_path):
    dump = write_traces(tmp_path / "traces.jsonl", step_episodes(1))
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens")
    assert result.exit_code == 1 and not out.exists()
    assert result.stderr == (
        f"Error: {out}: column 'traces' holds an empty JSON object (a struct of no field), which "
        "Parquet cannot hold; write .arrow, or keep only the key columns with --columns keys\n"
    )


def test_an_episode_of_two_traces_is_refused(run, tmp_path):
    episodes = step_episodes(1, groups=1)
    episodes[1]["traces"].append(episodes[0]["traces"][0])
    dump = write_traces(tmp_path / "traces.jsonl", episodes)
    result = run("compare", dump)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {dump} row 1: the episode holds several traces")
    assert result.stderr.count("\n") == 1


def test_an_episode_without_traces_is_left_out(run, tmp_path):
    episodes = step_episodes(1, groups=2)
    episodes[3]["ok"], episodes[3]["traces"] = False, []
    dump = write_traces(tmp_path / "traces.jsonl", episodes)
    report = json.loads(run("compare", dump, "--json", "-").stdout)
    # Group 1's errored trace and the episode with none.
    assert report["settings"]["padding_rows"] == 2
    assert report["counts"]["trajectories"] == 6


def test_steps_by_file(run, tmp_path):
    for step in (3, 4, 11):
        episodes = step_episodes(step)
        if step == 4:  # no errors in this step: its 'errors' lists are all empty
            episodes = [record for record in episodes if record["ok"]]
        write_traces(tmp_path / f"rollouts/step_{step}/train/all/traces.jsonl", episodes)
    pattern = tmp_path / "rollouts/step_*/train/all/traces.jsonl"
    result = run("compare", pattern, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    series = json.loads(result.stdout)["by_step"]["steps"]
    assert [(entry["step"], entry["rows"]) for entry in series] == [(3, 15), (4, 15), (11, 15)]
    jobs = run("compare", pattern, "--by", "file", "--jobs", "2", "--json", "-")
    assert json.loads(jobs.stdout)["by_step"] == json.loads(result.stdout)["by_step"]


def test_a_reward_of_another_type_is_one_error(run, tmp_path):
    episodes = step_episodes(1, groups=1)
    episodes[0]["traces"][0]["rewards"]["correct"]["score"] = "1"
    dump = write_traces(tmp_path / "traces.jsonl", episodes)
    line = error_line(run("compare", dump))
    assert line == (
        f"Error: {dump}: its fields are not of the types prime-rl writes, so advcli cannot read "
        "it as prime-rl's traces.jsonl (a verifiers Episode a line, each one trace) (arithmetic "
        "on dtypes str and f64 is not allowed)"
    )


def test_a_rollouts_folder_reads_each_steps_all_file(run, tmp_path):
    rollouts = tmp_path / "rollouts"
    for step in (1, 2):
        episodes = step_episodes(step)
        write_traces(rollouts / f"step_{step}/train/all/traces.jsonl", episodes)
        write_traces(rollouts / f"step_{step}/train/effective/traces.jsonl", effective(episodes))
    result = run("compare", rollouts, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(entry["step"], entry["rows"]) for entry in report["by_step"]["steps"]] == [
        (1, 15),
        (2, 15),
    ]
    assert "effective" not in report["settings"]["reading"]["read_as"]

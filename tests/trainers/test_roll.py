"""ROLL: its batch keys read as its dialect with no flags, its GiGPO (``--recipe roll``) held to
the independent reference and to hand-computed cases (one normalization for both terms: under
mean_std a group of std at most 1e-6 gets 0, the episode term's too), and the in-trainer route
its remedy gives.

The dumps are built the way ROLL's StepEnvManager writes its rows
(roll/pipeline/agentic/env_manager/step_env_manager.py and traj_env_manager.py at alibaba/ROLL
8eb27cc): ``traj_group_id`` ``{tag}_{group_id}_{episode_id}_{group_seed}``, ``traj_id``
``{traj_group_id}_{env_id}``, ``step`` the step's index, ``episode_scores`` the sum of the
episode's rewards on each of its rows, ``step_scores`` the step's reward, ``state_hash`` a
SHA-256 hex digest of the observation, the token-level ``scores`` with the step's reward on its
last token.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from gigpo_reference import GigpoRow, gigpo_recipe, step_returns
from reference import reference_advantages

from advcli.dump import write_batch

EPS = 1e-6
TOKENS = 3


def _state_hash(observation: str) -> str:
    return hashlib.sha256(observation.encode()).hexdigest()


def roll_rows(seed: int, groups: int = 3, envs: int = 4) -> list[dict]:
    """StepEnvManager rows: each env of a group walks a few states of a small grid, its reward
    1 on reaching the goal; the group's envs start from one state (one seed per group)."""
    rng = random.Random(seed)
    rows = []
    for group_id in range(groups):
        traj_group_id = f"FrozenLake_{group_id}_0_{1000 + group_id}"
        for env_id in range(group_id * envs, (group_id + 1) * envs):
            steps = rng.randint(1, 4)
            states = ["start"] + [f"cell{rng.randint(0, 3)}" for _ in range(steps - 1)]
            rewards = [0.0] * (steps - 1) + [float(rng.random() < 0.5)]
            for step, (state, reward) in enumerate(zip(states, rewards, strict=True)):
                rows.append(
                    {
                        "traj_group_id": traj_group_id,
                        "traj_id": f"{traj_group_id}_{env_id}",
                        "step": step,
                        "episode_scores": sum(rewards),
                        "step_scores": reward,
                        "state_hash": _state_hash(f"{group_id}:{state}"),
                        "scores": [0.0] * (TOKENS - 1) + [reward],
                        "response_mask": [False] + [True] * (TOKENS - 1),
                        "tags": "FrozenLake",
                    }
                )
    # ROLL's batch comes from its env workers in no trajectory order.
    rng.shuffle(rows)
    return rows


def _compute(run, tmp_path: Path, frame: pl.DataFrame, *options: str):
    source, output = tmp_path / "roll.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    result = run("compute", source, "-o", output, "--no-tokens", "--force", *options)
    assert result.exit_code == 0, result.stderr
    return result, pl.read_parquet(output)["advantage"].to_list()


def _reference_rows(frame: pl.DataFrame) -> list[GigpoRow]:
    return [
        GigpoRow(r["traj_group_id"], r["traj_id"], r["step"], r["episode_scores"],
                 r["state_hash"], r["step_scores"])
        for r in frame.iter_rows(named=True)
    ]  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_roll_dump_is_read_with_no_flags_and_gives_rolls_gigpo(run, tmp_path, seed):
    frame = pl.DataFrame(roll_rows(seed))
    result, got = _compute(run, tmp_path, frame, "--recipe", "roll")
    assert "ROLL's layout" in result.stderr
    said = " ".join(result.stderr.split())
    read = [("group", "traj_group_id"), ("turn", "step"), ("reward", "episode_scores")]
    for role, column in read:
        assert f"'{column}' is the {role} column of ROLL's dumps" in said
    expected = gigpo_recipe(_reference_rows(frame), "ROLL", norm="mean_std", gamma=0.95)
    assert got == pytest.approx(expected, abs=1e-5)


def test_roll_floors_an_episode_group_of_tiny_std_as_a_step_group():
    """Hand-computed on the reference: checked by the CLI below."""
    rows = [
        GigpoRow("g0", "a", 0, 1.0, "s0", 0.0),
        GigpoRow("g0", "b", 0, 0.0, "s1", 0.0),
        GigpoRow("g1", "c", 0, 1.0, "s2", 0.0),
        GigpoRow("g1", "d", 0, 1.0 + 1e-7, "s3", 0.0),
    ]
    # g0: (1 − 0.5) / (std 0.5·√2 + ε); g1's std 1e-7/√2 ≤ 1e-6: 0; every step group alone: 0.
    half = 0.5 / (0.5 * math.sqrt(2) + EPS)
    expected = [half, -half, 0.0, 0.0]
    assert gigpo_recipe(rows, "ROLL", norm="mean_std", gamma=0.95) == pytest.approx(expected)


def test_roll_episode_term_floors_its_std_on_the_command_line(run, tmp_path):
    frame = pl.DataFrame(
        {
            "traj_group_id": ["g0", "g0", "g1", "g1"],
            "traj_id": ["a", "b", "c", "d"],
            "step": [0, 0, 0, 0],
            "episode_scores": [1.0, 0.0, 1.0, 1.0 + 1e-7],
            "step_scores": [0.0, 0.0, 0.0, 0.0],
            "state_hash": ["s0", "s1", "s2", "s3"],
        }
    )
    half = 0.5 / (0.5 * math.sqrt(2) + EPS)
    _, got = _compute(run, tmp_path, frame, "--recipe", "roll", "-q")
    assert got == pytest.approx([half, -half, 0.0, 0.0], abs=1e-7)
    assert got[2:] == [0.0, 0.0]
    # Without the recipe's floor (plain gigpo, mean_std, singleton raw): g1 is divided by its
    # tiny std, ±0.5e-7 / (0.707e-7 + 1e-6) = ±0.0661.
    _, plain = _compute(
        run, tmp_path, frame, "--estimator", "gigpo", "--gigpo-norm", "mean_std", "-q",
        "--level", "turn", "--anchor-scope", "batch",
    )  # fmt: skip
    tiny = 0.5e-7 / (1e-7 / math.sqrt(2) + EPS)
    assert plain[2:] == pytest.approx([-tiny, tiny], rel=1e-3)


def test_roll_mean_subtracts_the_mean_only_and_floors_nothing(run, tmp_path):
    """ROLL's ``mean``: x − μ in both terms, no ε and no floor."""
    frame = pl.DataFrame(
        {
            "traj_group_id": ["g0", "g0", "g0"],
            "traj_id": ["a", "b", "c"],
            "step": [0, 0, 0],
            "episode_scores": [300.0, 100.0, 200.0],
            "step_scores": [0.0, 0.0, 0.0],
            "state_hash": ["s", "t", "u"],
        }
    )
    # Mean 200: 100, −100, 0 exactly (divided by 1 + ε they would be 99.9999).
    _, got = _compute(run, tmp_path, frame, "--recipe", "roll", "--gigpo-norm", "mean", "-q")
    assert got == [100.0, -100.0, 0.0]
    # One episode score; the step group s {0.5, 0.5 + 1e-7} keeps its ±0.5e-7, t alone 0.
    frame = frame.with_columns(
        episode_scores=pl.lit(2.0),
        step_scores=pl.Series([0.5, 0.5 + 1e-7, 0.25]),
        state_hash=pl.Series(["s", "s", "t"]),
    )
    _, got = _compute(run, tmp_path, frame, "--recipe", "roll", "--gigpo-norm", "mean", "-q")
    assert got == pytest.approx([-0.5e-7, 0.5e-7, 0.0], rel=1e-3)
    assert got[0] != 0.0


def test_the_remedys_torch_route_counts_each_trajectory_once():
    """The remedy's call: episode_scores as a (bs, 1) reward with a mask of ones, ROLL's
    object-array keys as the ids; column 0 is the trajectory-level episode term. Group A: a
    2-step success and a 3-step failure, counted once each: ±1 / √2 (grpo), ±0.5 (drgrpo);
    group B, one trajectory: 0 (singleton zero, as ROLL)."""
    torch = pytest.importorskip("torch")
    from advcli.torch import compute_advantage

    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0])[:, None]
    groups = np.array(["A", "A", "A", "A", "A", "B"], dtype=object)
    trajectories = np.array(["A_0", "A_0", "A_1", "A_1", "A_1", "B_0"], dtype=object)
    grpo, _ = compute_advantage(
        scores, torch.ones_like(scores), index=groups, traj_index=trajectories,
        estimator="grpo", singleton="zero",
    )  # fmt: skip
    unit = 0.5 / (0.5 * math.sqrt(2) + EPS)
    assert grpo[:, 0].tolist() == pytest.approx([unit, unit, -unit, -unit, -unit, 0.0], abs=1e-6)
    drgrpo, _ = compute_advantage(
        scores, torch.ones_like(scores), index=groups, traj_index=trajectories,
        estimator="drgrpo", singleton="zero",
    )  # fmt: skip
    assert drgrpo[:, 0].tolist() == [0.5, 0.5, -0.5, -0.5, -0.5, 0.0]


def _padded(frame: pl.DataFrame, copied: list[int]) -> pl.DataFrame:
    """The batch as ROLL's adjust_batch(mode="copy") leaves it: copies of the rows ``copied``
    appended at the end (whole rows, each repeating its step)."""
    return pl.concat([frame, frame[copied]])


def _report(run, path: Path, *options: str) -> dict:
    result = run("compare", path, "--json", "-", "-q", *options)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("token_ids", [False, True], ids=["no token ids", "token ids"])
def test_rolls_padding_copies_are_read_with_no_flags_and_counted_as_roll_counts_them(
    run, tmp_path, token_ids
):
    """A copy repeats its step: ROLL repeats a step no other way, so with or without token ids
    the copies are read as ROLL's padding, counted as ROLL counted them (the reading says so),
    and --drop-duplicates counts each once (the report of the dump without them)."""
    frame = pl.DataFrame(roll_rows(0))
    if token_ids:
        frame = frame.with_row_index("responses").with_columns(
            pl.concat_list(pl.col("responses").cast(pl.Int64))
        )
    frame.write_parquet(tmp_path / "plain.parquet")
    _padded(frame, [0, 5, 0]).write_parquet(tmp_path / "padded.parquet")
    counted = _report(run, tmp_path / "padded.parquet")
    assert counted["duplicate_rows"]["count"] == 3
    assert counted["duplicate_rows"]["confirmed_by"] == (
        "token ids" if token_ids else "ROLL repeats a turn only in its padding copies"
    )
    notes = counted["settings"]["reading"]["notes"]
    assert any(note.startswith("3 rows repeat an earlier row's group") for note in notes)
    assert counted["counts"]["rows"] == frame.height + 3
    # Each copy counts at turn level, as ROLL's group normalization counts it.
    rows = [
        (r["traj_group_id"], r["traj_id"], r["step"], r["episode_scores"], 2)
        for r in _padded(frame, [0, 5, 0]).iter_rows(named=True)
    ]
    out = tmp_path / "out.parquet"
    assert run("compute", tmp_path / "padded.parquet", "-o", out, "--level", "turn").exit_code == 0
    expected = reference_advantages(rows, level="turn", estimator="grpo")
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)
    plain = _report(run, tmp_path / "plain.parquet", "--recipe", "roll")
    dropped = _report(run, tmp_path / "padded.parquet", "--recipe", "roll", "--drop-duplicates")
    for key in ("counts", "groups", "trajectories", "step_credit"):
        assert dropped[key] == plain[key]


def test_a_roll_batch_written_by_write_batch_keeps_rolls_copy_rule(run, tmp_path):
    """write_batch writes ROLL's batch in advcli's layout, naming the trainer in the file: its
    padding copies are read as ROLL's there too, with no flags and no token ids, and
    --drop-duplicates counts each once (as on the batch's own columns)."""
    frame = _padded(pl.DataFrame(roll_rows(0)), [0, 5, 0])
    batch = {name: frame[name].to_list() for name in ("traj_group_id", "traj_id", "step")}
    batch |= {"episode_scores": frame["episode_scores"].to_list()}
    batch["response_mask"] = np.array(frame["response_mask"].to_list())
    write_batch(batch, tmp_path / "run", step=3)
    frame.write_parquet(tmp_path / "padded.parquet")
    written = _report(run, tmp_path / "run")
    assert written["settings"]["reading"]["trainer"] == "ROLL"
    assert written["duplicate_rows"]["count"] == 3
    assert written["duplicate_rows"]["confirmed_by"] == (
        "ROLL repeats a turn only in its padding copies"
    )
    own = _report(run, tmp_path / "padded.parquet")
    for key in ("counts", "groups", "trajectories"):
        assert written[key] == own[key]
    dropped = _report(run, tmp_path / "run", "--drop-duplicates")
    assert dropped["counts"]["rows"] == frame.height - 3


def test_rolls_gigpo_counts_its_copies_with_their_originals_step_returns(run, tmp_path):
    """ROLL discounts the step rewards (compute_discounted_returns) before it pads the batch:
    a copy carries its original's return, and the normalization counts it."""
    frame = pl.DataFrame(roll_rows(1))
    copied = [2, 7]
    padded = _padded(frame, copied)
    _, got = _compute(run, tmp_path, padded, "--recipe", "roll")
    before = step_returns(_reference_rows(frame), 0.95)
    returns = before + [before[index] for index in copied]
    expected = gigpo_recipe(
        _reference_rows(padded), "ROLL", norm="mean_std", gamma=0.95, step_returns_given=returns
    )
    assert got == pytest.approx(expected, abs=1e-5)


def test_a_repeated_step_that_is_no_copy_is_still_refused(run, tmp_path):
    frame = pl.DataFrame(roll_rows(0))
    other = frame[:1].with_columns(pl.col("episode_scores") + 1.0)
    pl.concat([frame, other]).write_parquet(tmp_path / "odd.parquet")
    result = run("compare", tmp_path / "odd.parquet", "-q")
    assert result.exit_code == 1
    assert "duplicate turn" in result.stderr


def test_per_turn_rewards_on_rolls_copies_ask_to_count_each_once(run, tmp_path):
    frame = pl.DataFrame(roll_rows(0))
    _padded(frame, [3]).write_parquet(tmp_path / "padded.parquet")
    refused = run("compare", tmp_path / "padded.parquet", "--reward-mode", "per-turn", "-q")
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {tmp_path / 'padded.parquet'}: per-turn rewards take each turn once, and the "
        "dump holds 1 of ROLL's padding copies, which repeat a turn: pass --drop-duplicates "
        "to count each once\n"
    )
    frame.write_parquet(tmp_path / "plain.parquet")
    options = ("--reward-mode", "per-turn")
    dropped = _report(run, tmp_path / "padded.parquet", *options, "--drop-duplicates")
    plain = _report(run, tmp_path / "plain.parquet", *options)
    assert dropped["groupings"].keys() == plain["groupings"].keys()
    for name, figures in plain["groupings"].items():
        for key, value in figures.items():
            if isinstance(value, float):
                assert dropped["groupings"][name][key] == pytest.approx(value, rel=1e-9), key

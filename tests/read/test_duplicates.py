"""Duplicated rows: a trainer's padding copies found, reported, and counted as the trainer did or,
with --drop-duplicates, once.

verl-agent (agent_system/multi_turn_rollout/utils.py, `adjust_batch(mode="copy")`) and ROLL
(`batch_adjust_mode: copy`) pad a batch to the data-parallel size by appending copies of random
rows before the advantages are computed (docs/reference/trainer-sources.md, sections 2 and 8).
Expected values come from tests/reference.py over the rows the trainer counted, never from advcli.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages
from test_trainer_dumps import SEED, WIDTH, append, at, ids, mask_of, new_uuid, plan, stored
from test_trainer_dumps import write_batch as write_torch_batch

torch = pytest.importorskip("torch")

# The data-parallel size the batch is padded to a multiple of.
DIVISOR = 16


def verl_agent_batch(rng: np.random.Generator) -> tuple[dict[str, Any], list[tuple]]:
    """verl-agent's per-step rows (trainers.md section 2): uid / traj_uid object arrays, the
    episode reward on every step's last valid token, response_mask, and each step's own
    `responses` and `prompts` token ids; with the reference rows (group, trajectory, turn,
    score, tokens)."""
    group_ids = [str(new_uuid(rng)) for _ in range(5)]
    cols: dict[str, list] = {}
    rows = []
    for traj in plan(rng):
        traj_id = str(new_uuid(rng))
        for turn, (llm, _) in enumerate(traj.segments):
            mask, last = mask_of([(llm, 0)])
            append(cols, uid=group_ids[traj.group], traj=traj_id, scores=at(traj.reward, last))
            append(cols, mask=mask, responses=torch.from_numpy(rng.integers(5, 30000, WIDTH)))
            append(cols, prompts=torch.from_numpy(rng.integers(5, 30000, WIDTH)))
            rows.append((traj.group, traj_id, turn, stored(traj.reward), llm))
    scores = torch.stack(cols["scores"])
    batch = {
        "uid": ids(cols["uid"]),
        "traj_uid": ids(cols["traj"]),
        "prompts": torch.stack(cols["prompts"]),
        "responses": torch.stack(cols["responses"]),
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "response_mask": torch.stack(cols["mask"]),
    }
    return batch, rows


def copy_padded(batch: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """verl-agent's `adjust_batch(mode="copy")`: append copies of `DIVISOR - B % DIVISOR` random
    distinct rows (`DataProto.concat([data, data.select_idxs(dup_indices)])`); returns the
    copied rows' indices, in the order their copies were appended."""
    size = len(batch["uid"])
    copied = rng.choice(size, DIVISOR - size % DIVISOR, replace=False)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            batch[name] = torch.cat([value, value[torch.from_numpy(copied)]])
        else:
            batch[name] = np.concatenate([value, value[copied]])
    return copied


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> tuple[Path, list[tuple], np.ndarray]:
    """The padded dump, the reference rows the trainer counted (copies included) and the
    copied rows."""
    rng = np.random.default_rng(SEED)
    batch, rows = verl_agent_batch(rng)
    copied = copy_padded(batch, rng)
    assert len(copied) > EXAMPLES_SHOWN  # the report lists only the first few
    path = write_torch_batch(tmp_path_factory.mktemp("padded") / "dump.parquet", batch)
    return path, rows + [rows[i] for i in copied], copied


EXAMPLES_SHOWN = 5


def expected_first(path: Path, rows: list[tuple], copied: np.ndarray) -> list[dict[str, Any]]:
    """The report's first copies: appended after the batch's own rows, in order."""
    batch_rows = len(rows) - len(copied)
    uids = pl.read_parquet(path, columns=["uid"])["uid"]
    return [
        {
            "row": f"{path} row {batch_rows + position}",
            "group": uids[int(original)],
            "trajectory": rows[int(original)][1],
            "turn": None,
            "copy_of_row": f"{path} row {original}",
        }
        for position, original in enumerate(copied[:EXAMPLES_SHOWN])
    ]


def plain(text: str) -> str:
    """A rich table's words in order, without its column rules."""
    return " ".join(text.replace("│", " ").split())


def test_inspect_counts_the_copies_and_names_the_first(run, padded):
    path, rows, copied = padded
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    duplicates = json.loads(result.stdout)["duplicate_rows"]
    assert duplicates == {
        "count": len(copied),
        "compared": ["token_level_rewards", "response_mask", "responses", "prompts"],
        "token_ids_compared": True,
        "confirmed_by": "token ids",
        "first": expected_first(path, rows, copied),
    }

    terminal = run("inspect", path)
    assert terminal.exit_code == 0, terminal.stderr
    text = plain(terminal.stdout)
    first_copy = f"{path} row {len(rows) - len(copied)} = {path} row {copied[0]}"
    assert f"duplicated rows (a copy of an earlier row) {len(copied)} {first_copy}" in text


def per_trajectory(rows: list[tuple]) -> dict[Any, tuple[int, float, float]]:
    """Each trajectory's (turns, turn-level advantage: the mean of its rows', trajectory-level
    advantage) under grpo, from the reference over ``rows``."""
    turn = reference_advantages(rows, level="turn", estimator="grpo")
    trajectory = reference_advantages(rows, level="trajectory", estimator="grpo")
    found: dict[Any, list[int]] = {}
    for position, row in enumerate(rows):
        found.setdefault(row[1], []).append(position)
    return {
        key: (
            len(positions),
            sum(turn[p] for p in positions) / len(positions),
            trajectory[positions[0]],
        )
        for key, positions in found.items()
    }


@pytest.mark.parametrize("drop", [False, True], ids=["as-the-trainer-did", "drop-duplicates"])
def test_compare_counts_the_copies_as_asked(run, padded, tmp_path, drop):
    path, rows, copied = padded
    flags = ["--drop-duplicates"] if drop else []
    report_path, markdown = tmp_path / "report.json", tmp_path / "report.md"
    result = run(
        "compare", path, "--json", report_path, "--markdown", markdown, "--top", 1000, *flags
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["duplicate_rows"] == {
        "count": len(copied),
        "compared": ["token_level_rewards", "response_mask", "responses", "prompts"],
        "token_ids_compared": True,
        "confirmed_by": "token ids",
        "first": expected_first(path, rows, copied),
    }
    assert report["settings"]["drop_duplicates"] is drop

    counted = rows[: len(rows) - len(copied)] if drop else rows
    expected = per_trajectory(counted)
    assert report["counts"]["rows"] == len(counted)
    listed = report["top_trajectories"]
    assert len(listed) == len(expected)
    for entry in listed:
        turns, advantage_turn, advantage_trajectory = expected[entry["trajectory"]]
        assert entry["turns"] == turns
        assert entry["advantage_turn"] == pytest.approx(advantage_turn, abs=1e-9)
        assert entry["advantage_trajectory"] == pytest.approx(advantage_trajectory, abs=1e-9)

    note = (
        f"{len(copied)}, each set counted once (--drop-duplicates)"
        if drop
        else f"{len(copied)} counted as the trainer did; --drop-duplicates to count each once"
    )
    assert f"| duplicated rows | {note} |" in markdown.read_text()
    assert note in result.stdout


def test_compute_counts_the_copies_as_the_trainer_did(run, padded, tmp_path):
    path, rows, copied = padded
    out = tmp_path / "out.parquet"
    result = run("compute", path, "-o", out, "--level", "turn")
    assert result.exit_code == 0, result.stderr
    expected = reference_advantages(rows, level="turn", estimator="grpo")
    advantage = pl.read_parquet(out)["advantage"].to_numpy()
    np.testing.assert_allclose(advantage, expected, rtol=0, atol=1e-5)
    assert (
        f"{len(copied)} duplicated rows counted as the trainer did; --drop-duplicates to count "
        "each once"
    ) in result.stderr
    assert f"duplicate rows {len(copied)} " in plain(result.stderr)


def test_compute_drop_duplicates_writes_each_copy_with_its_original(run, padded, tmp_path):
    path, rows, copied = padded
    out = tmp_path / "out.parquet"
    result = run("compute", path, "-o", out, "--level", "turn", "--drop-duplicates")
    assert result.exit_code == 0, result.stderr
    batch_rows = len(rows) - len(copied)
    counted = reference_advantages(rows[:batch_rows], level="turn", estimator="grpo")
    written = pl.read_parquet(out)
    assert written.height == len(rows)  # every input row is written
    advantage = written["advantage"].to_numpy()
    np.testing.assert_allclose(advantage[:batch_rows], counted, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(advantage[batch_rows:], advantage[copied])
    tokens = np.stack(written["advantages"].to_numpy())
    np.testing.assert_array_equal(tokens[batch_rows:], tokens[copied])
    assert "counted as the trainer did" not in result.stderr
    assert f"duplicate rows {len(copied)} (left out of the statistics" in plain(result.stderr)


def turn_rows(**extra: list) -> pl.DataFrame:
    """Three verl-agent steps: two of trajectory t1 with the same token rewards and mask, one of
    t2."""
    return pl.DataFrame(
        {
            "uid": ["p", "p", "p"],
            "traj_uid": ["t1", "t1", "t2"],
            "token_level_rewards": [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]],
            "response_mask": [[1, 1], [1, 1], [1, 1]],
            **extra,
        }
    )


def inspected_duplicates(run, path: Path) -> dict[str, Any]:
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["duplicate_rows"]


def test_turns_alike_but_for_their_responses_are_not_duplicates(run, write_dump):
    path = write_dump(turn_rows(responses=[[11, 12], [13, 14], [11, 12]]))
    assert inspected_duplicates(run, path) == {
        "count": 0,
        "compared": ["token_level_rewards", "response_mask", "responses"],
        "token_ids_compared": True,
        "confirmed_by": "token ids",
        "first": [],
    }


def test_without_token_columns_the_keys_reward_and_mask_decide(run, write_dump):
    path = write_dump(turn_rows())
    assert inspected_duplicates(run, path) == {
        "count": 1,
        "compared": [],
        "token_ids_compared": False,
        "confirmed_by": None,
        "first": [
            {
                "row": f"{path} row 1",
                "group": "p",
                "trajectory": "t1",
                "turn": None,
                "copy_of_row": f"{path} row 0",
            }
        ],
    }
    terminal = plain(run("inspect", path).stdout)
    assert "possible duplicated rows (alike in keys, score and tokens: no token ids) 1" in terminal


def test_possible_copies_are_not_dropped(run, write_dump, tmp_path):
    """Without token ids two turns alike in reward and mask may be two real turns: the report
    says possible, and --drop-duplicates refuses rather than drop a real turn."""
    path = write_dump(turn_rows())
    result = run("compare", path, "--drop-duplicates")
    assert result.exit_code == 1
    assert "--drop-duplicates needs the rows' token ids" in result.stderr
    computed = run("compute", path, "-o", tmp_path / "out.parquet")
    assert computed.exit_code == 0, computed.stderr
    assert "1 row alike in keys, score and tokens: possible copies" in computed.stderr


def test_a_row_copied_twice_is_two_duplicates_of_one_row(run, write_dump):
    """ROLL copies with replacement when the padding outnumbers the batch."""
    frame = turn_rows(responses=[[11, 12], [13, 14], [15, 16]])
    path = write_dump(pl.concat([frame, frame[2], frame[2]]))
    duplicates = inspected_duplicates(run, path)
    assert duplicates["count"] == 2
    assert [copy["copy_of_row"] for copy in duplicates["first"]] == [f"{path} row 2"] * 2


def test_rewards_alike_in_sum_but_not_element_by_element_are_not_duplicates(run, write_dump):
    """Same score, token count and response (candidates), different token rewards."""
    path = write_dump(
        turn_rows(responses=[[11, 12], [11, 12], [13, 14]]).with_columns(
            pl.Series("token_level_rewards", [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
        )
    )
    assert inspected_duplicates(run, path)["count"] == 0


def test_copies_with_a_turn_column_stop_compute_and_inspect_finds_them(run, write_dump, tmp_path):
    """A repeated turn is an error for compute; inspect lists which repeated turns are copies."""
    rows = [("p", "a", 0, 1.0, 3), ("p", "a", 1, 1.0, 3), ("p", "b", 0, 0.0, 2)]
    path = write_dump([*rows, rows[1], ("p", "b", 0, 0.5, 2)])
    result = run("compute", path, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert "duplicate turn" in result.stderr
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["duplicate_turns"]["count"] == 2
    assert summary["duplicate_rows"] == {
        "count": 1,
        "compared": [],
        "token_ids_compared": False,
        "confirmed_by": None,
        "first": [
            {
                "row": f"{path} row 3",
                "group": "p",
                "trajectory": "a",
                "turn": 1,
                "copy_of_row": f"{path} row 1",
            }
        ],
    }

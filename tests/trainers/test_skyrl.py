"""SkyRL's step-wise batches as its trainers build them (docs/reference/trainer-sources.md
section 4), read with no flags: its own score rule (the `is_last_step` row's reward), its padding
rows, and skyrl 0.4.0's trajectories recovered from `is_last_step` alone. Expected advantages come
from tests/reference.py.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages
from test_trainer_dumps import SEED, WIDTH, append, error_line, skyrl_steps, write_batch

from advcli.dump import write_batch as write_dump_of_batch
from advcli.errors import AdvcliError

torch = pytest.importorskip("torch")

PADS = 3


def skyrl_batch(version: str, pads: int = PADS) -> tuple[dict[str, Any], list[tuple], np.ndarray]:
    """A step-wise training batch: (batch, reference rows of the real steps, loss mask).

    skyrl-train 0.3.1 (skyrl_train/trainer.py convert_to_training_input): uids str(dataset
    index), trajectory_ids "{instance_id}_{repetition_id}", per-step rewards (the outcome on the
    last step only), loss_mask float32, response_mask over every response token, is_last_step a
    torch.bool tensor. skyrl 0.4.0 (skyrl/train/trainer.py): no trajectory_ids, is_last_step a
    metadata list of bools. Then pad_batch's rows: ids "pad0", "pad1", ..., is_last_step True,
    loss_mask 0, the other tensors copies of the first rows'.
    """
    cols, rows = skyrl_steps(np.random.default_rng(SEED))
    for i in range(pads):
        append(cols, uids=f"pad{i}", trajectory_ids=f"pad{i}", rewards=cols["rewards"][i].clone())
        append(cols, loss_mask=torch.zeros(WIDTH), response_mask=cols["response_mask"][i].clone())
        append(cols, is_last_step=True)
    batch: dict[str, Any] = {
        "uids": np.array(cols["uids"]),
        "rewards": torch.stack(cols["rewards"]),
        "loss_mask": torch.stack(cols["loss_mask"]),
        "response_mask": torch.stack(cols["response_mask"]),
    }
    if version == "0.3.1":
        batch["trajectory_ids"] = np.array(cols["trajectory_ids"])
        batch["is_last_step"] = torch.tensor(cols["is_last_step"])
    else:
        batch["is_last_step"] = np.array(cols["is_last_step"])
    return batch, rows, batch["loss_mask"].numpy()


def table_row(text: str, label: str) -> list[str]:
    """The other cells of the one row of a rich table that starts with ``label``."""
    (line,) = [line for line in text.splitlines() if label in line]
    cells = line.strip(" │").split(label, 1)[1]
    return [cell.strip() for cell in cells.split("│") if cell.strip()]


def trajectory_count(rows: list[tuple]) -> int:
    return len({(row[0], row[1]) for row in rows})


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
@pytest.mark.parametrize("level", ["trajectory", "turn"])
def test_compute_reads_skyrl_with_no_flags(version, level, run, tmp_path):
    """The last step's reward is the trajectory's score with no --traj-score (reference: rule
    "last"); padding rows keep their reward sum as score and get advantage 0 on every token."""
    batch, rows, mask = skyrl_batch(version)
    dump = write_batch(tmp_path / "dump.parquet", batch)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--level", level)
    assert result.exit_code == 0, result.stderr
    assert table_row(result.stderr, "padding rows (advantage 0)") == [str(PADS)]

    expected = reference_advantages(rows, level=level, estimator="grpo", traj_score="last")
    expected = np.array([*expected, *[0.0] * PADS])
    frame = pl.read_parquet(out)
    assert frame.height == len(rows) + PADS
    np.testing.assert_allclose(frame["advantage"].to_numpy(), expected, rtol=0, atol=1e-5)
    tokens = frame["advantages"].to_numpy()
    np.testing.assert_allclose(tokens, mask * expected[:, None], rtol=0, atol=1e-5)
    # A padding row copies the first rows' rewards: its score is its own reward sum.
    pad_scores = frame["score"].to_numpy()[len(rows) :]
    np.testing.assert_allclose(pad_scores, [row[3] for row in rows[:PADS]], rtol=0, atol=1e-6)
    assert frame["uids"].to_list() == batch["uids"].tolist()


def test_padding_rows_have_no_loss_weight(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1")
    dump = write_batch(tmp_path / "dump.parquet", batch)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--loss-weight", "token-mean", "--no-tokens")
    assert result.exit_code == 0, result.stderr
    weights = pl.read_parquet(out)["loss_weight"].to_numpy()
    total = sum(row[4] for row in rows)
    np.testing.assert_allclose(weights, [1 / total] * len(rows) + [0.0] * PADS, rtol=1e-6)


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
def test_inspect_and_compare_leave_padding_out(version, run, tmp_path):
    batch, rows, mask = skyrl_batch(version)
    dump = write_batch(tmp_path / "dump.parquet", batch)
    inspected = run("inspect", dump, "--json")
    assert inspected.exit_code == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["padding_rows"] == PADS
    rule = report["inconsistent_trajectories"]["rule"]
    assert (
        rule == f"scored by its last step's reward, SkyRL{' 0.4.0' * (version == '0.4.0')}'s rule"
    )
    assert report["counts"]["rows"] == len(rows)
    assert report["counts"]["groups"] == len({row[0] for row in rows})
    assert report["counts"]["trajectories"] == trajectory_count(rows)
    assert report["counts"]["tokens"] == int(mask.sum())
    assert report["singleton_groups"]["count"] == 1  # the plan's one singleton, no padding
    # Each trajectory counted once, by its last step's reward.
    last_rewards = {(row[0], row[1]): row[3] for row in rows}
    assert report["trajectory_scores"]["max"] == pytest.approx(max(last_rewards.values()))
    columns = report["columns"]
    assert "row flagged 'is_last_step'" in columns["reward"]["why"]
    if version == "0.4.0":
        assert columns["trajectory"] == {
            "column": None,
            "why": "SkyRL 0.4.0's dumps have no trajectory column: a trajectory is a run of rows "
            "ending at a row flagged 'is_last_step', in row order",
        }
    else:
        assert columns["trajectory"]["column"] == "trajectory_ids"

    text = run("inspect", dump)
    assert text.exit_code == 0, text.stderr
    assert table_row(text.stdout, "padding rows (not counted above)") == [str(PADS)]

    report_path = tmp_path / "r.json"
    compared = run("compare", dump, "--json", report_path)
    assert compared.exit_code == 0, compared.stderr
    assert table_row(compared.stdout, "padding rows (not counted)") == [str(PADS)]
    summary = json.loads(report_path.read_text())
    assert summary["settings"]["padding_rows"] == PADS
    assert summary["counts"]["rows"] == len(rows)
    assert summary["counts"]["trajectories"] == trajectory_count(rows)


def test_skyrl_0_4_0_trajectories_run_across_files(run, tmp_path):
    """A trajectory's rows split between two files are one run: row order is over every input."""
    batch, rows, _ = skyrl_batch("0.4.0", pads=0)
    frame = pl.read_parquet(write_batch(tmp_path / "whole.parquet", batch))
    cut = next(i for i, last in enumerate(batch["is_last_step"]) if not last) + 1
    frame.head(cut).write_parquet(tmp_path / "a.parquet")
    frame.slice(cut).write_parquet(tmp_path / "b.parquet")
    out = tmp_path / "out.parquet"
    result = run("compute", tmp_path / "a.parquet", tmp_path / "b.parquet", "-o", out)
    assert result.exit_code == 0, result.stderr
    expected = reference_advantages(rows, level="trajectory", estimator="grpo", traj_score="last")
    np.testing.assert_allclose(pl.read_parquet(out)["advantage"], expected, rtol=0, atol=1e-5)


def test_traj_score_still_chooses_another_rule(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1")
    dump = write_batch(tmp_path / "dump.parquet", batch)
    out = tmp_path / "out.parquet"
    assert run("compute", dump, "-o", out, "--traj-score", "mean").exit_code == 0
    expected = reference_advantages(rows, level="trajectory", estimator="grpo", traj_score="mean")
    advantage = pl.read_parquet(out)["advantage"].to_numpy()
    np.testing.assert_allclose(advantage, [*expected, *[0.0] * PADS], rtol=0, atol=1e-5)


def first_trajectory_end(batch: dict[str, Any]) -> int:
    return int(np.flatnonzero(np.asarray(batch["is_last_step"]))[0])


def test_skyrl_0_4_0_run_across_groups_is_an_error(run, tmp_path):
    """A last step left unflagged makes its trajectory run on into the next one; where the next
    has other uids, that is an error naming the row."""
    batch, rows, _ = skyrl_batch("0.4.0")
    # The first group's last trajectory ends where the second group starts.
    end = max(i for i, row in enumerate(rows) if row[0] == rows[0][0])
    batch["is_last_step"][end] = False
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("compute", dump, "-o", tmp_path / "out.parquet"))
    assert line == (
        f"Error: {dump} row {end + 1}: column 'uids' is {rows[end + 1][0]!r} here but "
        f"{rows[end][0]!r} on the row before, which is not flagged 'is_last_step': a trajectory "
        "is the run of rows up to a row flagged 'is_last_step', and this one would span two groups"
    )


def test_skyrl_0_4_0_rows_after_the_last_flag_are_an_error(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.4.0", pads=0)
    batch["is_last_step"][-1] = False
    start = len(rows) - 1
    while start and not batch["is_last_step"][start - 1]:
        start -= 1
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("inspect", dump))
    assert line == (
        f"Error: {dump} row {len(rows) - 1}: the rows from {dump} row {start} on end "
        "without a row flagged 'is_last_step': a trajectory is the run of rows up to a row so "
        "flagged"
    )


def test_skyrl_trajectory_without_its_last_step_flag_is_an_error(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1")
    end = first_trajectory_end(batch)
    batch["is_last_step"][end] = False
    dump = write_batch(tmp_path / "dump.parquet", batch)
    for command in (("compute", dump, "-o", tmp_path / "out.parquet"), ("inspect", dump)):
        line = error_line(run(*command))
        assert line == (
            f"Error: {dump} row {end}: trajectory (uids={rows[0][0]!r}, "
            f"trajectory_ids={rows[0][1]!r}) ends at this row, which is not flagged "
            "'is_last_step'; SkyRL flags a trajectory's last step, whose reward is the "
            "trajectory's score (or choose a rule with --traj-score first|last|mean|max|sum)"
        )


def test_skyrl_last_step_flag_before_the_last_row_is_an_error(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1")
    # A trajectory of several steps, its first step flagged too.
    start = next(i for i, row in enumerate(rows) if row[2] == 0 and rows[i + 1][2] == 1)
    batch["is_last_step"][start] = True
    end = start + max(row[2] for row in rows if row[:2] == rows[start][:2])
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("compute", dump, "-o", tmp_path / "out.parquet"))
    assert line == (
        f"Error: {dump} row {start}: trajectory (uids={rows[start][0]!r}, "
        f"trajectory_ids={rows[start][1]!r}) has a row flagged 'is_last_step' before its last "
        f"row ({dump} row {end}); SkyRL flags only a trajectory's last step, whose reward "
        "is the trajectory's score"
    )


def test_a_pad_id_with_loss_tokens_is_a_real_row(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1", pads=2)
    batch["loss_mask"][-1, :3] = 1  # pad1 now has trainable tokens
    dump = write_batch(tmp_path / "dump.parquet", batch)
    report = json.loads(run("inspect", dump, "--json").stdout)
    assert report["padding_rows"] == 1
    assert report["counts"]["groups"] == len({row[0] for row in rows}) + 1
    assert report["singleton_groups"]["examples"][-1] == "pad1"


def test_padding_ids_shared_with_a_real_trajectory_are_an_error(run, tmp_path):
    batch, rows, _ = skyrl_batch("0.3.1", pads=2)
    batch["loss_mask"][-1, :3] = 1
    batch["uids"][-1], batch["trajectory_ids"][-1] = "pad0", "pad0"
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("compute", dump, "-o", tmp_path / "out.parquet"))
    assert line == (
        f"Error: {dump} row {len(rows) + 1}: trajectory (uids='pad0', "
        "trajectory_ids='pad0') has 'loss_mask' tokens, but its ids are those of padding rows "
        "(no tokens) too; padding ids must not name a real trajectory"
    )


def test_skyrl_last_step_flag_must_be_boolean(run, tmp_path):
    batch, _, _ = skyrl_batch("0.3.1")
    batch["is_last_step"] = batch["is_last_step"].long()
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("inspect", dump))
    assert line == (
        f"Error: {dump}: column 'is_last_step' (last-step flag) has type Int64; expected booleans"
    )


def test_a_dump_of_padding_only_is_an_error(run, tmp_path):
    batch, _, _ = skyrl_batch("0.3.1")
    for name in ("uids", "trajectory_ids"):
        batch[name] = np.array([f"pad{i}" for i in range(len(batch[name]))])
    batch["loss_mask"][:] = 0
    dump = write_batch(tmp_path / "dump.parquet", batch)
    line = error_line(run("compare", dump, "--json", tmp_path / "r.json"))
    assert line == (
        f"Error: {dump}: every row is a padding row (ids like 'pad0' and no 'loss_mask' tokens); "
        "there is nothing to compute"
    )


def test_write_batch_refuses_a_skyrl_step_wise_batch(tmp_path):
    batch, _, _ = skyrl_batch("0.4.0")
    with pytest.raises(AdvcliError, match=r"SkyRL step-wise batch \('is_last_step'\)"):
        write_dump_of_batch(batch, tmp_path / "dumps")
    assert not (tmp_path / "dumps").exists()


def test_steps_alike_in_reward_and_mask_are_no_possible_copies(run, tmp_path):
    """SkyRL pads with rows of its own (pad0, …), never with copies: a trajectory's steps with
    the same reward (0 before the last) and the same mask are steps, not possible copies."""
    rows = [
        {"uids": "0", "is_last_step": last, "rewards": [0.0, float(last)], "loss_mask": [1, 1]}
        for last in (False, False, True, False, True)
    ]
    rows.append({"uids": "pad0", "is_last_step": True, "rewards": [0.0, 0.0], "loss_mask": [0, 0]})
    dump = tmp_path / "dump.parquet"
    pl.DataFrame(rows).write_parquet(dump)
    inspected = run("inspect", dump, "--json")
    assert inspected.exit_code == 0, inspected.stderr
    assert json.loads(inspected.stdout)["duplicate_rows"]["count"] == 0
    compared = run("compare", dump)
    assert compared.exit_code == 0, compared.stderr
    assert "duplicated rows" not in compared.stdout
    assert table_row(compared.stdout, "padding rows (not counted)") == ["1"]


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
def test_audit_of_skyrls_step_wise_advantages(version, run, tmp_path):
    """SkyRL's step-wise GRPO after PR #1507: each trajectory's advantage (its last step's
    reward in its group's statistics) on every step's trainable tokens, padding rows 0: the
    audit names grpo at trajectory level and finds nothing. Before the fix (SkyRL #1492) every
    step but the last got 0: zero-earlier-steps, on the earlier steps' rows."""
    batch, rows, mask = skyrl_batch(version)
    per_row = reference_advantages(rows, level="trajectory", estimator="grpo", traj_score="last")
    advantages = np.array([*per_row, *[0.0] * PADS])
    batch["advantages"] = torch.tensor(mask * advantages[:, None], dtype=torch.float32)
    fixed = json.loads(
        run("audit", write_batch(tmp_path / "fixed.parquet", batch), "--json", "-").stdout
    )
    rule = fixed["rule"]
    assert (rule["level"], rule["estimator"], rule["rows_matched"]) == (
        "trajectory",
        "grpo",
        len(rows),
    )
    assert fixed["findings"] == []
    last = np.array([*batch_last_steps(batch, len(rows)), *[True] * PADS])
    batch["advantages"] = batch["advantages"] * torch.tensor(last, dtype=torch.float32)[:, None]
    broken = json.loads(
        run("audit", write_batch(tmp_path / "broken.parquet", batch), "--json", "-").stdout
    )
    # The earlier steps whose trajectory's advantage is not 0 (in a tied group it is 0 anyway).
    earlier = sum(1 for flag, value in zip(last, per_row, strict=False) if not flag and value)
    assert [(f["kind"], f["rows"]) for f in broken["findings"]] == [("zero-earlier-steps", earlier)]


def batch_last_steps(batch: dict[str, Any], rows: int) -> list[bool]:
    """Each real row's last-step flag, whichever way the version holds it."""
    flags = batch["is_last_step"]
    return [bool(flag) for flag in (flags.tolist() if hasattr(flags, "tolist") else flags)][:rows]

"""advcli.dump.write_batch on real verl DataProto batches (verl 0.9.1), and the dumps it writes
read by compute, compare and inspect with no flags."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages

from advcli.dump import write_batch
from advcli.errors import AdvcliError

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402

LENGTH = 6


def _padded(lengths: list[int], rewards: list[float], dtype: torch.dtype):
    """Right-padded (B, LENGTH) rewards and mask: each row's reward on its last valid token."""
    mask = torch.zeros(len(lengths), LENGTH, dtype=torch.int64)
    scores = torch.zeros(len(lengths), LENGTH, dtype=dtype)
    for row, (length, reward) in enumerate(zip(lengths, rewards, strict=True)):
        mask[row, :length] = 1
        scores[row, length - 1] = reward
    return scores, mask


def _agent_lightning_batch() -> tuple[DataProto, list[tuple]]:
    """As agent-lightning 1.0.2 builds it (agentlightning/verl/daemon.py): ids in numpy unicode
    arrays with `_list` keys, `uid` a copy of the group ids, bf16 `token_level_scores` with the
    rollout's final reward on every row's last valid token; and the rows as reference tuples."""
    groups = ["p0", "p0", "p0", "p0", "p1", "p1", "p2"]
    rollouts = ["r0", "r0", "r0", "r1", "r2", "r3", "r4"]
    turns = [0, 1, 2, 0, 0, 0, 0]
    rewards = [0.1, 0.1, 0.1, 0.7, 1.0, 0.0, 0.3]
    lengths = [3, 6, 2, 4, 5, 1, 6]
    scores, mask = _padded(lengths, rewards, torch.bfloat16)
    batch = DataProto.from_dict(
        tensors={"token_level_scores": scores, "response_mask": mask},
        non_tensors={
            "data_id_list": np.array(groups),
            "rollout_id_list": np.array(rollouts),
            "turn_index_list": np.array(turns),
            "uid": np.array(groups),
        },
    )
    # The reference reads the bf16 values as the trainer holds them.
    held = scores.float().sum(-1).tolist()
    rows = [
        (g, r, t, float(s), n)
        for g, r, t, s, n in zip(groups, rollouts, turns, held, lengths, strict=True)
    ]
    return batch, rows


def test_agent_lightning_batch_needs_no_flags(tmp_path, run):
    batch, rows = _agent_lightning_batch()
    path = write_batch(batch, tmp_path / "dumps", step=3).path
    assert path.name == "step-00000003.parquet"
    written = pl.read_parquet(path)
    assert written.columns == [
        "data_id",
        "rollout_id",
        "turn_index",
        "token_level_rewards",
        "response_mask",
        "step",
    ]
    # bf16 widened to float32 exactly: 0.1 is held as 0.10009765625.
    assert written["token_level_rewards"].dtype == pl.Array(pl.Float32, LENGTH)
    assert written["token_level_rewards"].arr.sum()[0] == pytest.approx(0.10009765625, abs=0)

    output = tmp_path / "out.parquet"
    result = run("compute", tmp_path / "dumps", "-o", output)
    assert result.exit_code == 0, result.output
    got = pl.read_parquet(output)
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(got["advantage"].to_numpy(), expected, atol=1e-5)
    # The per-token column keeps the (B, LENGTH) shape, 0 on padding.
    assert got["advantages"].dtype == pl.Array(pl.Float32, LENGTH)
    per_token = np.stack(got["advantages"].to_numpy())
    np.testing.assert_array_equal(per_token[batch.batch["response_mask"].numpy() == 0], 0)

    report = tmp_path / "report.json"
    assert run("compare", tmp_path / "dumps", "--json", report).exit_code == 0
    assert json.loads(report.read_text())["counts"]["trajectories"] == 5
    inspected = run("inspect", tmp_path / "dumps", "--json")
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(inspected.stdout)["counts"]["tokens"] == sum(r[4] for r in rows)


@pytest.mark.peers
def test_verl_batch_rows_are_trajectories_as_verls_own_grpo(tmp_path, run):
    """A classic verl batch has only `uid` (verl/trainer/ppo/ray_trainer.py): each row is a whole
    trajectory, and advcli's numbers are verl's own compute_grpo_outcome_advantage's."""
    uids = np.array(["a", "a", "a", "b", "b", "c", "a", "b"], dtype=object)
    rewards = [1.0, 0.0, 0.5, 0.2, 0.9, 0.4, 0.0, 0.2]
    scores, mask = _padded([2, 3, 6, 1, 4, 5, 2, 3], rewards, torch.float32)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": uids},
    )
    write_batch(batch, tmp_path / "dumps")
    output = tmp_path / "out.parquet"
    result = run("compute", tmp_path / "dumps", "-o", output)
    assert result.exit_code == 0, result.output

    verl_advantages, _ = compute_grpo_outcome_advantage(scores, mask, uids)
    got = pl.read_parquet(output)
    np.testing.assert_allclose(got["advantage"].to_numpy(), verl_advantages[:, 0], atol=1e-6)
    inspected = json.loads(run("inspect", tmp_path / "dumps", "--json").stdout)
    assert inspected["counts"]["trajectories"] == len(uids)


def test_verl_v1_turns_from_row_keys(tmp_path):
    """verl's v1 path keeps a row's turn only in its key `{uid}_{session}_{index}`
    (verl/trainer/ppo/v1/utils.py): the turn is passed as values."""
    keys = ["u0_0_0", "u0_0_1", "u0_1_0", "u1_0_0"]
    scores, mask = _padded([1, 2, 3, 4], [1.0, 1.0, 0.0, 0.5], torch.float32)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={
            "uid": np.array([k.split("_")[0] for k in keys], dtype=object),
            "session_id": np.array([int(k.split("_")[1]) for k in keys]),
        },
    )
    path = write_batch(batch, tmp_path, turn=[int(k.rsplit("_", 1)[1]) for k in keys]).path
    written = pl.read_parquet(path)
    assert written["data_id"].to_list() == ["u0", "u0", "u0", "u1"]
    assert written["rollout_id"].to_list() == [0, 0, 1, 0]
    assert written["turn_index"].to_list() == [0, 1, 0, 0]


def test_verl_v1_turns_without_the_session_are_refused(tmp_path):
    """The batch of v1's `_compute_advantage` holds no session: its rows written one a
    trajectory, with the turns given, would be trajectories of one row each numbered 0 and 1,
    and compare would find no bias in them."""
    keys = ["u0_0_0", "u0_0_1", "u0_1_0", "u1_0_0"]
    scores, mask = _padded([1, 2, 3, 4], [1.0, 1.0, 0.0, 0.5], torch.float32)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array([k.split("_")[0] for k in keys], dtype=object)},
    )
    turns = [int(k.rsplit("_", 1)[1]) for k in keys]
    with pytest.raises(AdvcliError) as raised:
        write_batch(batch, tmp_path, turn=turns)
    assert str(raised.value) == (
        "the batch: verl's dumps keep a trajectory in one row, but column 'turn=' numbers turns "
        "within groups (2 distinct values) and no column says which trajectory a row belongs "
        "to; name the trajectory column with trajectory="
    )
    assert list(tmp_path.iterdir()) == []
    sessions = [k.split("_")[1] for k in keys]
    written = pl.read_parquet(write_batch(batch, tmp_path, trajectory=sessions, turn=turns).path)
    assert written["rollout_id"].to_list() == ["0", "0", "1", "0"]
    assert written["turn_index"].to_list() == [0, 1, 0, 0]


def test_unnumbered_files_take_the_next_free_name(tmp_path):
    batch = {
        "data_id": [0, 0],
        "rollout_id": [0, 1],
        "score": [1.0, 0.0],
    }
    written = [write_batch(batch, tmp_path) for _ in range(3)]
    names = [file.path.name for file in written]
    assert names == ["batch-000000.parquet", "batch-000001.parquet", "batch-000002.parquet"]
    assert {file.action for file in written} == {"written"}
    assert pl.read_parquet(tmp_path / names[0]).columns == ["data_id", "rollout_id", "score"]


def _step_batch(scores: list[float]) -> DataProto:
    rewards, mask = _padded([2, 3], scores, torch.float32)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={
            "uid": np.array(["p0", "p0"], dtype=object),
            "traj_uid": np.array(["t0", "t1"], dtype=object),
        },
    )


def _written_scores(path) -> list[float]:
    return [sum(row) for row in pl.read_parquet(path)["token_level_rewards"].to_list()]


def test_a_resumed_run_writes_its_steps_again_in_place_of_the_old_files(tmp_path):
    """The default: a run resumed from a checkpoint writes step 2 again, on new rollouts; the
    folder then holds the batch the run trained on, and the other steps are untouched."""
    first = write_batch(_step_batch([1.0, 0.0]), tmp_path, step=1)
    old = write_batch(_step_batch([0.0, 0.0]), tmp_path, step=2)
    step_one = first.path.read_bytes()

    again = write_batch(_step_batch([0.5, 1.0]), tmp_path, step=2)

    assert (old.action, again.action) == ("written", "replaced")
    assert again.path == old.path == tmp_path / "step-00000002.parquet"
    assert _written_scores(again.path) == [0.5, 1.0]
    assert first.path.read_bytes() == step_one
    # Published by a rename: no partial file is left beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000001.parquet",
        "step-00000002.parquet",
    ]


def test_if_exists_skip_keeps_the_old_file_and_says_so(tmp_path):
    write_batch(_step_batch([1.0, 0.0]), tmp_path, step=4)
    before = (tmp_path / "step-00000004.parquet").read_bytes()
    skipped = write_batch(_step_batch([0.0, 1.0]), tmp_path, step=4, if_exists="skip")
    assert (skipped.path.name, skipped.action) == ("step-00000004.parquet", "skipped")
    assert (tmp_path / "step-00000004.parquet").read_bytes() == before
    # A step not written before is written whatever if_exists says.
    assert write_batch(_step_batch([0.0, 1.0]), tmp_path, step=5, if_exists="skip").action == (
        "written"
    )


def test_a_step_that_is_no_integer_and_a_folder_that_is_a_file_are_refused(tmp_path):
    with pytest.raises(AdvcliError) as raised:
        write_batch(_step_batch([1.0, 0.0]), tmp_path, step=3.0)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "step is the training step's number, an integer from 0 on, not 3.0"
    )
    # A negative step would sort before step 0, in reverse.
    with pytest.raises(AdvcliError) as raised:
        write_batch(_step_batch([1.0, 0.0]), tmp_path, step=-2)
    assert str(raised.value) == "step is the training step's number, an integer from 0 on, not -2"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(AdvcliError) as raised:
        write_batch(_step_batch([1.0, 0.0]), tmp_path / "a-file", step=1)
    assert str(raised.value) == (
        f"{tmp_path / 'a-file'}: cannot make the folder for the batches: File exists"
    )
    assert (tmp_path / "a-file").read_text() == "mine"
    assert write_batch(_step_batch([1.0, 0.0]), tmp_path, step=np.int64(2)).path.name == (
        "step-00000002.parquet"
    )


def test_if_exists_error_refuses_in_the_librarys_words(tmp_path):
    write_batch(_step_batch([1.0, 0.0]), tmp_path, step=1)
    before = (tmp_path / "step-00000001.parquet").read_bytes()
    with pytest.raises(AdvcliError) as raised:
        write_batch(_step_batch([5.0, 5.0]), tmp_path, step=1, if_exists="error")
    assert str(raised.value) == (
        f"{tmp_path / 'step-00000001.parquet'}: the step's file exists already (a run resumed "
        "from a checkpoint writes its steps again); if_exists='replace' writes this batch in its "
        "place, 'skip' keeps it"
    )
    assert (tmp_path / "step-00000001.parquet").read_bytes() == before
    with pytest.raises(AdvcliError, match=r"^if_exists is 'error', 'replace' or 'skip', not 'k'"):
        write_batch(_step_batch([1.0, 0.0]), tmp_path, step=1, if_exists="k")  # type: ignore[arg-type]


def test_a_file_that_appears_while_writing_is_left_in_the_librarys_words(tmp_path):
    """What ``write_batch`` publishes through: a file that appears before the rename is left as
    it is, and the error says how the caller asks for a replace."""
    from advcli.write.atomic import OutputAppeared, atomic_output

    output = tmp_path / "step-00000001.parquet"
    hint = "if_exists='replace' writes it"
    with (
        pytest.raises(OutputAppeared) as raised,
        atomic_output(output, replace_hint=hint) as partial,
    ):
        partial.write_bytes(b"advcli's")
        output.write_bytes(b"the other writer's")
    assert str(raised.value).endswith("it was left as it is (if_exists='replace' writes it)")
    assert output.read_bytes() == b"the other writer's"
    assert [p.name for p in tmp_path.iterdir()] == [output.name]


def test_keys_and_errors(tmp_path):
    batch = {
        "uid": np.array(["a", "b"], dtype=object),
        "traj_uid": np.array(["x", "y"], dtype=object),
        "token_level_rewards": np.zeros((2, 3), dtype=np.float32),
        "response_mask": np.ones((2, 3), dtype=np.int64),
        "data_source": ["gsm8k", "math"],
    }
    path = write_batch(batch, tmp_path, keys=["data_source"]).path
    assert pl.read_parquet(path)["data_source"].to_list() == ["gsm8k", "math"]
    with pytest.raises(AdvcliError, match="no key 'nope'"):
        write_batch(batch, tmp_path, keys=["nope"])
    with pytest.raises(AdvcliError, match="different lengths"):
        write_batch({**batch, "traj_uid": np.array(["x"], dtype=object)}, tmp_path)
    with pytest.raises(AdvcliError, match="no group column"):
        write_batch({k: v for k, v in batch.items() if k != "uid"}, tmp_path)
    with pytest.raises(TypeError, match="DataProto or a mapping"):
        write_batch([1, 2], tmp_path)
    with pytest.raises(AdvcliError, match="cannot be written as one column"):
        write_batch({**batch, "uid": np.array([1, "x"], dtype=object)}, tmp_path)
    with pytest.raises(AdvcliError, match=r"holds a null \(None\) at row 1"):
        write_batch({**batch, "uid": np.array(["a", None], dtype=object)}, tmp_path)


@pytest.mark.process
def test_importing_dump_does_not_import_torch():
    code = "import sys, advcli.dump; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_the_anchor_and_step_reward_are_written_under_advcli_names(tmp_path):
    """Trinity-RFT's names in a plain mapping: written as 'anchor' and 'step_reward', the
    anchors' groups kept; an anchor with no step reward is no GiGPO batch, and is not written."""
    batch = {
        "uid": np.array(["p0", "p0", "p0"], dtype=object),
        "traj_uid": np.array(["t0", "t1", "t2"], dtype=object),
        "token_level_rewards": np.array([[0, 1.0], [0, 0], [0.5, 0]], dtype=np.float32),
        "response_mask": np.array([[1, 1], [1, 0], [1, 1]]),
        "env_state_hash": np.array(["h1", "h2", "h1"], dtype=object),
        "step_reward": np.array([0.0, 1.0, 0.5]),
    }
    frame = pl.read_parquet(write_batch(batch, tmp_path / "a").path)
    assert frame["anchor"].to_list() == ["h1", "h2", "h1"]
    assert frame["step_reward"].to_list() == [0.0, 1.0, 0.5]
    assert "env_state_hash" not in frame.columns
    del batch["step_reward"]
    frame = pl.read_parquet(write_batch(batch, tmp_path / "b").path)
    assert "anchor" not in frame.columns


@pytest.mark.parametrize("given", ["values", "key"])
def test_a_batch_with_its_group_given_and_no_trajectory_key_has_a_trajectory_a_row(
    run, tmp_path, given
):
    """OpenRLHF's or TRL's batch has no ids: the group given (as values or by key), each row is
    a trajectory, its row number the trajectory id, as for verl's agent loop."""
    groups = ["p0", "p0", "p1", "p1"]
    batch: dict = {
        "token_level_rewards": np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]),
        "response_mask": np.ones((4, 2)),
    }
    if given == "key":
        batch["prompt_index"] = np.array(groups, dtype=object)
    written = write_batch(batch, tmp_path, group="prompt_index" if given == "key" else groups)
    frame = pl.read_parquet(written.path)
    assert frame["data_id"].to_list() == groups
    assert frame["rollout_id"].to_list() == [0, 1, 2, 3]
    report = json.loads(run("compare", written.path, "--json", "-", "-q").stdout)
    assert report["counts"]["groups"] == 2 and report["counts"]["trajectories"] == 4


def test_a_trl_batch_without_a_group_is_told_to_give_one_by_its_keyword(tmp_path):
    # write_batch has no --group-size: the error names its keyword, not the command line's flag.
    batch = {"rewards": np.array([1.0, 0.0, 1.0, 0.0]), "completion_mask": np.ones((4, 3))}
    with pytest.raises(AdvcliError) as raised:
        write_batch(batch, tmp_path)
    message = str(raised.value)
    assert "TRL's dumps hold no group id" in message and "--group-size" not in message
    assert "give group= each row's prompt (one value per row)" in message
    written = write_batch(batch, tmp_path, group=[0, 0, 1, 1])
    assert pl.read_parquet(written.path)["data_id"].to_list() == [0, 0, 1, 1]

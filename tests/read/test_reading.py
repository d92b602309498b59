"""How a dump is read: no assumption the values contradict, every output saying how it read the
dump, one error for every missing role with a command line that works, and each step its own
batch with --by.

Expected advantages come from tests/reference.py (plain Python), never from advcli.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages

from advcli.dump import write_batch
from advcli.errors import AdvcliError
from advcli.write.sample import sample_table

ADVCLI = [sys.executable, "-m", "advcli"]


def multi_turn_rows(seed: int = 0, groups: int = 12, rollouts: int = 5) -> list[tuple]:
    """(group, trajectory, turn, score, tokens) rows of trajectories of 1 to 5 turns, the long
    ones mostly failing: a dump whose turn counting is severely biased."""
    rng = np.random.default_rng(seed)
    rows = []
    for group in range(groups):
        for rollout in range(rollouts):
            turns = int(rng.integers(1, 6))
            score = float(rng.random() < (0.8 if turns <= 2 else 0.2))
            for turn in range(turns):
                rows.append((f"p{group}", f"p{group}-r{rollout}", turn, score, 2))
    return rows


def verl_frame(rows: list[tuple], trajectory_name: str) -> pl.DataFrame:
    """verl's columns (uid, token_level_rewards, response_mask), plus a trajectory column under
    a name no trainer advcli knows uses."""
    return pl.DataFrame(
        {
            "uid": [r[0] for r in rows],
            trajectory_name: [r[1] for r in rows],
            "token_level_rewards": [[0.0] * (r[4] - 1) + [r[3]] for r in rows],
            "response_mask": [[1] * r[4] for r in rows],
        }
    )


def named_frame(
    rows: list[tuple], group: str, trajectory: str, turn: str, reward: str
) -> pl.DataFrame:
    """(group, trajectory, turn, score, ...) rows as four columns of the given names."""
    return pl.DataFrame(
        {name: [r[i] for r in rows] for i, name in enumerate((group, trajectory, turn, reward))}
    )


def error_line(result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def compare_json(run, *args) -> dict:
    result = run("compare", *args, "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "name", ["trajectory_id", "episode_idx", "rollout_uuid", "ConversationID", "session"]
)
def test_an_unfamiliar_trajectory_column_is_read_not_each_row(run, tmp_path, name):
    """A verl dump with a trajectory column advcli has no name for: read as verl's layout (each
    row a trajectory) it would compare rows with themselves and call a severe bias negligible.
    Its values repeat within groups, so it is the trajectory, and the report says why."""
    rows = multi_turn_rows()
    path = tmp_path / "dump.parquet"
    verl_frame(rows, name).write_parquet(path)
    report = compare_json(run, path)
    assert report["counts"]["trajectories"] == len({(r[0], r[1]) for r in rows}) == 60
    assert report["counts"]["rows"] == len(rows)
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "verl"
    assert reading["roles"]["trajectory"]["column"] == name
    assert "repeat within groups" in reading["roles"]["trajectory"]["why"]
    assert report["assessment"]["level"] == "severe"
    out = tmp_path / "out.parquet"
    assert run("compute", path, "-o", out, "--no-tokens", "-q").exit_code == 0
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(pl.read_parquet(out)["advantage"], expected, rtol=1e-5, atol=1e-6)


def test_a_verl_dump_with_per_row_and_constant_columns_reads_one_row_a_trajectory(run, tmp_path):
    """sample_id is unique per row and data_source constant: nothing contradicts verl's
    reading, which is taken with no flags."""
    rows = [(f"p{i // 4}", f"r{i}", 0, float(i % 3 == 0), 3) for i in range(16)]
    frame = verl_frame(rows, "sample_id").with_columns(
        data_source=pl.lit("gsm8k"), episode_id=pl.lit(0)
    )
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    report = compare_json(run, path)
    assert report["counts"]["trajectories"] == 16
    trajectory = report["settings"]["reading"]["roles"]["trajectory"]
    assert trajectory["column"] is None
    assert "each row is a trajectory" in trajectory["why"]


def test_a_step_column_in_a_one_row_a_trajectory_dump_is_named_not_ignored(run, tmp_path):
    rows = [(f"p{i // 4}", f"r{i}", 0, float(i % 3 == 0), 3) for i in range(8)]
    path = tmp_path / "dump.parquet"
    verl_frame(rows, "sample_id").with_columns(step=pl.lit(7)).write_parquet(path)
    turn = compare_json(run, path)["settings"]["reading"]["roles"]["turn"]
    assert turn == {
        "column": None,
        "why": "each row is a whole trajectory: no turn order is needed ('step' not read as one)",
    }


def test_two_repeating_trajectory_columns_are_an_error_naming_both(run, tmp_path):
    rows = multi_turn_rows()
    path = tmp_path / "dump.parquet"
    verl_frame(rows, "traj_id").with_columns(episode=pl.col("traj_id") + "x").write_parquet(path)
    line = error_line(run("compare", path))
    assert "'traj_id' and 'episode' both repeat within groups" in line
    assert "--traj-col traj_id" in line


def test_a_turn_column_without_a_trajectory_column_is_refused(run, tmp_path):
    """Rows numbered as turns, with nothing that says which trajectory each belongs to."""
    rows = multi_turn_rows()
    frame = (
        verl_frame(rows, "ignored")
        .drop("ignored")
        .with_columns(turn=pl.Series([r[2] for r in rows]))
    )
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    line = error_line(run("inspect", path))
    assert "column 'turn' numbers turns within groups (5 distinct values)" in line
    assert "--traj-col" in line


def test_a_hand_written_dump_reads_with_no_flags_in_turn_order(run, tmp_path):
    """prompt_id, traj_id, turn, reward: each read by its name, and the turn column orders the
    turns (rows shuffled: --traj-score last takes the last turn, not the last row)."""
    rows = [
        (g, f"t{g}{k}", turn, float(turn == turns - 1) * ((g + k) % 2), 1)
        for g in range(4)
        for k in range(3)
        for turns in [1 + (g + k) % 3]
        for turn in range(turns)
    ]
    order = np.random.default_rng(3).permutation(len(rows))
    rows = [rows[i] for i in order]
    frame = named_frame(rows, "prompt_id", "traj_id", "turn", "reward")
    path = tmp_path / "hand.parquet"
    frame.write_parquet(path)
    out = tmp_path / "out.parquet"
    result = run("compute", path, "-o", out, "--no-tokens", "--traj-score", "last")
    assert result.exit_code == 0, result.output
    expected = reference_advantages(rows, level="trajectory", estimator="grpo", traj_score="last")
    np.testing.assert_allclose(pl.read_parquet(out)["advantage"], expected, rtol=1e-5, atol=1e-6)
    for role, column in (("group", "prompt_id"), ("trajectory", "traj_id"), ("turn", "turn")):
        assert f"{role} column  " in result.stderr
        assert f"'{column}' is named like the {role}" in result.stderr


@pytest.mark.process
def test_every_missing_role_in_one_error_with_a_command_that_works(tmp_path):
    """Columns no name gives away: one error lists every missing role with its likeliest
    columns (the group has fewer values than the trajectory; the turn index, whose counts fall
    as it rises, goes to --turn-col), and the command line it proposes runs."""
    rows = multi_turn_rows()
    frame = named_frame(rows, "a", "b", "c", "r")
    path = tmp_path / "anon.parquet"
    frame.write_parquet(path)
    failed = subprocess.run([*ADVCLI, "compare", str(path)], capture_output=True, text=True)
    assert failed.returncode == 1
    line = failed.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("Error: ")
    assert "no group column" in line and "no trajectory column" in line
    assert "no reward column" in line
    assert "likeliest: 'a' (12 distinct values)" in line
    assert "likeliest: 'b' (60 trajectories)" in line
    command = line.split("This command reads it: ", 1)[1]
    assert command == (
        f"advcli compare {path} --group-col a --traj-col b --reward-col r --turn-col c"
    )
    pasted = shlex.split(command)[1:]
    worked = subprocess.run([*ADVCLI, *pasted, "--quiet"], capture_output=True, text=True)
    assert worked.returncode == 0, worked.stderr


def test_a_group_named_column_contradicting_group_size_is_refused(run, tmp_path):
    frame = pl.DataFrame(
        {
            "prompt_id": [0, 0, 1, 1, 1, 2],
            "rewards": [1.0, 0.0, 1.0, 0.0, 0.5, 1.0],
            "completion_mask": [[1]] * 6,
        }
    )
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    line = error_line(run("inspect", path, "--group-size", "2"))
    assert "column 'prompt_id' is named like a group id" in line
    assert "--group-col prompt_id" in line


def test_trls_layout_reads_a_prompt_id_as_its_group(run, tmp_path):
    """TRL's dumps have no group id (blocks of num_generations); a prompt_id is read as one."""
    frame = pl.DataFrame(
        {
            "prompt_id": ["x", "y", "x", "y"],
            "rewards": [1.0, 0.0, 0.0, 1.0],
            "completion_mask": [[1, 1], [1, 0], [1, 1], [1, 1]],
        }
    )
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    report = compare_json(run, path)
    group = report["settings"]["reading"]["roles"]["group"]
    assert group["column"] == "prompt_id"
    assert "TRL's dumps have no group column" in group["why"]
    assert report["counts"]["groups"] == 2


def step_files(tmp_path: Path, turn: bool = True) -> list[Path]:
    """Two training steps from advcli's own sample: the group ids are dataset indices, the same
    in every step's file."""
    paths = []
    for step in range(2):
        frame = pl.from_arrow(sample_table(groups=6, rollouts=4, seed=step))
        if not turn:
            frame = frame.drop("turn_index")
        path = tmp_path / f"step-{step}.parquet"
        frame.write_parquet(path)
        paths.append(path)
    return paths


def test_ids_repeated_across_step_files_name_by_file(run, tmp_path):
    first, second = step_files(tmp_path)
    line = error_line(run("compare", first, second))
    assert "duplicate turn" in line and "the ids repeat across files" in line
    assert "--by file" in line and "--traj-score" not in line


def test_ids_repeated_across_step_files_without_turns_name_by_file(run, tmp_path):
    """Without a turn column the rows of one trajectory id in two files disagree on the score:
    a --traj-score rule would merge two trajectories of two steps."""
    first, second = step_files(tmp_path, turn=False)
    line = error_line(run("compare", first, second))
    assert "has rows in two files" in line and "--by file" in line
    assert "--traj-score" not in line


@pytest.mark.parametrize("turn", [True, False])
def test_by_file_reads_each_step_as_its_own_batch(run, tmp_path, turn):
    """With --by file each file is its own batch: the per-step figures equal each file compared
    alone, the whole run counts both steps' groups, and compute's advantages equal each file's
    own."""
    first, second = step_files(tmp_path, turn)
    run_report = compare_json(run, first, second, "--by", "file")
    alone = [compare_json(run, path) for path in (first, second)]
    steps = run_report["by_step"]["steps"]
    for step, single in zip(steps, alone, strict=True):
        assert step["trajectories"] == single["counts"]["trajectories"]
        assert step["advantage_diff_mean"] == pytest.approx(
            single["trajectories"]["advantage_diff_mean"], rel=1e-12
        )
    assert run_report["counts"]["groups"] == sum(r["counts"]["groups"] for r in alone) == 12
    assert run_report["counts"]["trajectories"] == 48
    assert "--by file" in run_report["settings"]["reading"]["roles"]["group"]["why"]

    out = tmp_path / "out.parquet"
    assert run("compute", first, second, "-o", out, "--by", "file", "-q").exit_code == 0
    written = pl.read_parquet(out)["advantage"]
    expected = []
    for path in (first, second):
        frame = pl.read_parquet(path)
        turns = frame["turn_index"] if turn else pl.Series([0] * frame.height)
        rows = list(
            zip(
                frame["data_id"],
                frame["rollout_id"],
                turns,
                frame["token_level_rewards"].list.sum(),
                frame["response_mask"].list.sum(),
                strict=True,
            )
        )
        expected += reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-6)


def test_by_column_keys_groups_by_step(run, tmp_path):
    """--by step on one file holding two steps whose ids repeat."""
    first, second = step_files(tmp_path)
    both = pl.concat(
        [
            pl.read_parquet(first).with_columns(step=pl.lit(10)),
            pl.read_parquet(second).with_columns(step=pl.lit(11)),
        ]
    )
    path = tmp_path / "run.parquet"
    both.write_parquet(path)
    assert "duplicate turn" in error_line(run("compare", path))
    report = compare_json(run, path, "--by", "step")
    assert [s["step"] for s in report["by_step"]["steps"]] == [10, 11]
    assert report["counts"]["groups"] == 12
    top = report["top_groups"][0]["group"]
    assert set(top) == {"step", "group"}


def test_reports_say_how_the_dump_was_read(run, tmp_path):
    path = tmp_path / "dump.parquet"
    verl_frame(multi_turn_rows(), "trajectory_id").write_parquet(path)
    markdown, html = tmp_path / "r.md", tmp_path / "r.html"
    result = run("compare", path, "--markdown", markdown, "--html", html)
    assert result.exit_code == 0, result.output
    assert "How the dump was read" in result.stdout and "verl's layout" in result.stdout
    text = markdown.read_text()
    assert "## How the dump was read" in text
    assert "| trajectory | trajectory_id |" in text
    page = html.read_text()
    assert "<h2>How the dump was read</h2>" in page and "trajectory_id" in page
    inspected = json.loads(run("inspect", path, "--json").stdout)
    assert inspected["inputs"]["trainer"] == "verl"
    assert inspected["columns"]["trajectory"]["column"] == "trajectory_id"


def test_the_library_reads_a_batch_as_the_command_line_does(tmp_path):
    """write_batch and advcli.verl find the same trajectory column in a batch."""
    rows = multi_turn_rows()
    batch = {
        "uid": np.array([r[0] for r in rows], dtype=object),
        "trajectory_id": np.array([r[1] for r in rows], dtype=object),
        "token_level_rewards": np.array([[0.0, r[3]] for r in rows], dtype=np.float32),
        "response_mask": np.ones((len(rows), 2), dtype=np.int64),
    }
    written = pl.read_parquet(write_batch(batch, tmp_path).path)
    assert written["rollout_id"].to_list() == [r[1] for r in rows]

    torch = pytest.importorskip("torch")
    verl = pytest.importorskip("verl")
    from advcli.verl import compute_advantage

    data = verl.DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor(batch["token_level_rewards"]),
            "response_mask": torch.tensor(batch["response_mask"]),
        },
        non_tensors={k: batch[k] for k in ("uid", "trajectory_id")},
    )
    metrics = compute_advantage(data).meta_info["metrics"]
    assert metrics["advcli/trajectories"] == 60
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(
        data.batch["advantages"][:, 1].numpy(), expected, rtol=1e-5, atol=1e-6
    )
    with pytest.raises(AdvcliError, match="both repeat within groups"):
        write_batch({**batch, "episode_id": batch["trajectory_id"] + "x"}, tmp_path)


def sample_layout(tmp_path: Path, **extra: object) -> Path:
    """advcli's sample under names that say nothing: q (prompt), run (rollout 0..3 within its
    prompt), t (turn), r (reward), plus ``extra`` columns."""
    frame = pl.from_arrow(sample_table(groups=30, rollouts=4, seed=5)).select(
        pl.col("data_id").cast(pl.String).alias("q"),
        pl.col("rollout_id").alias("run"),
        pl.col("turn_index").alias("t"),
        pl.col("token_level_rewards").list.sum().alias("r"),
    )
    frame = frame.with_columns(**extra) if extra else frame
    path = tmp_path / "odd.parquet"
    frame.write_parquet(path)
    return path


@pytest.mark.process
def test_a_rollout_index_is_read_within_its_group(tmp_path):
    """run numbers the rollouts within each prompt: (q, run) and (run, q) hold the same
    trajectories, and the reading with more groups is the one proposed; t falls as it rises
    and is the turn. The proposed command gives the reference's numbers."""
    path = sample_layout(tmp_path)
    failed = subprocess.run(
        [*ADVCLI, "compute", str(path), "-o", str(tmp_path / "o.parquet"), "--no-tokens", "-q"],
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 1
    command = failed.stderr.strip().split("This command reads it: ", 1)[1]
    assert command.endswith("--group-col q --traj-col run --reward-col r --turn-col t")
    worked = subprocess.run([*ADVCLI, *shlex.split(command)[1:]], capture_output=True, text=True)
    assert worked.returncode == 0, worked.stderr
    frame = pl.read_parquet(path)
    rows = list(
        zip(frame["q"], frame["run"], frame["t"], frame["r"], [1] * frame.height, strict=True)
    )
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    written = pl.read_parquet(tmp_path / "o.parquet")["advantage"]
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("extra", ["rowid", "text"])
def test_per_row_and_text_columns_are_never_proposed_as_ids(run, tmp_path, extra):
    """A column unique per row would make each row a trajectory, a free-text one the same:
    neither is a candidate, and the proposed command stays the right one."""
    values = {
        "rowid": pl.int_range(0, pl.len()),
        "text": pl.concat_str(pl.lit("x" * 200), pl.col("t").cast(pl.String)),
    }
    path = sample_layout(tmp_path, **{extra: values[extra]})
    line = error_line(run("compare", path))
    assert f"'{extra}'" not in line.split(". The file has")[0]
    assert line.endswith("--group-col q --traj-col run --reward-col r --turn-col t")


def test_no_command_when_the_values_leave_a_choice(run, tmp_path):
    """Two pairs of columns fit as (group, trajectory) and no name decides: the candidates are
    listed, and no command is proposed."""
    path = sample_layout(tmp_path, run2=pl.col("run") + 10, q2=pl.col("q") + "x")
    line = error_line(run("compare", path))
    assert "likeliest:" in line and "This command reads it" not in line


def test_a_given_group_and_a_missing_trajectory(run, tmp_path):
    path = sample_layout(tmp_path)
    line = error_line(run("compare", path, "--group-col", "q", "--reward-col", "r"))
    assert "likeliest: 'run' (120 trajectories)" in line
    assert line.endswith(
        f"advcli compare {path} --group-col q --reward-col r --traj-col run --turn-col t"
    )


@pytest.mark.parametrize("dtype", [pl.Float64, pl.List(pl.Int64)])
def test_a_trajectory_named_column_of_another_type_is_refused(run, tmp_path, dtype):
    rows = multi_turn_rows()
    numbers = [float(r[1].split("-r")[1]) + 10 * int(r[0][1:]) for r in rows]
    column = pl.Series(numbers) if dtype == pl.Float64 else pl.Series([[int(n)] for n in numbers])
    path = tmp_path / "dump.parquet"
    verl_frame(rows, "x").drop("x").with_columns(trajectory_id=column).write_parquet(path)
    line = error_line(run("compare", path))
    assert "column 'trajectory_id' is named like a trajectory id" in line
    assert f"has type {dtype}" in line and "cast it" in line


def test_a_float_turn_column_is_refused_not_passed_over(run, tmp_path):
    rows = multi_turn_rows()
    frame = named_frame(rows, "prompt_id", "traj_id", "turn", "reward").with_columns(
        pl.col("turn").cast(pl.Float64)
    )
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    line = error_line(run("compare", path))
    assert "column 'turn' (turn index) (read as the turn for its name) has type Float64" in line


def test_a_verl_step_that_numbers_turns_is_refused(run, tmp_path):
    rows = multi_turn_rows()
    frame = verl_frame(rows, "x").drop("x").with_columns(step=pl.Series([r[2] for r in rows]))
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    line = error_line(run("compare", path))
    assert "column 'step' numbers turns within groups" in line and "--traj-col" in line


def test_a_column_constant_within_each_group_is_not_a_trajectory(run, tmp_path):
    """episode is the run's episode counter, one value a step file: constant within each
    group, it is no trajectory id, and verl's reading stands."""
    paths = []
    for step in range(2):
        rows = [(f"p{step}{i // 4}", f"r{i}", 0, float(i % 3 == 0), 3) for i in range(16)]
        path = tmp_path / f"step{step}.parquet"
        verl_frame(rows, "sample_id").with_columns(episode=pl.lit(step)).write_parquet(path)
        paths.append(path)
    report = compare_json(run, *paths)
    assert report["counts"]["trajectories"] == 32
    assert report["settings"]["reading"]["roles"]["trajectory"]["column"] is None


def training_steps(repeat_ids: bool) -> pl.DataFrame:
    """Two training steps in one hand-written file, a step column the same within each step;
    the group ids repeat across steps (dataset indices) or not (uuids)."""
    rows = []
    for step in range(2):
        for group in range(4):
            for k in range(4):
                group_id = group if repeat_ids else 10 * step + group
                rows.append((group_id, f"t{k}", step, float((group + k + step) % 2)))
    return named_frame(rows, "prompt_id", "traj_id", "step", "reward")


def test_a_hand_written_training_step_is_not_read_as_the_turn(run, tmp_path):
    """A step the same within every group but with two values is the training step: read as the
    turn it would make trajectories of two steps' rows; the error names --by step, which then
    reads each step as its own batch."""
    path = tmp_path / "dump.parquet"
    training_steps(repeat_ids=False).write_parquet(path)
    line = error_line(run("compare", path))
    assert "it looks like the training step; pass --by step" in line
    report = compare_json(run, path, "--by", "step")
    assert report["counts"]["trajectories"] == 32


def test_a_training_step_with_repeated_ids_is_named_in_the_score_error(run, tmp_path):
    """With dataset-index ids the steps' rows meet in one trajectory; where their scores
    disagree, the error names --by step beside --traj-score."""
    path = tmp_path / "dump.parquet"
    training_steps(repeat_ids=True).write_parquet(path)
    line = error_line(run("compare", path))
    assert "different scores" in line and "is the training step, --by step)" in line
    assert compare_json(run, path, "--by", "step")["counts"]["trajectories"] == 32


def test_groups_spanning_files_are_said_in_the_reading(run, tmp_path):
    """Step files whose ids repeat, given a --traj-score rule: nothing contradicts reading them
    as one batch, so the reading says that groups span the files, and names --by file."""
    first, second = step_files(tmp_path, turn=False)
    report = compare_json(run, first, second, "--traj-score", "last")
    assert report["settings"]["reading"]["notes"] == [
        "6 groups have rows in more than one file: the files are read as one batch (if each "
        "file is a training step whose ids repeat, pass --by file)"
    ]
    assert compare_json(run, first, second, "--by", "file")["settings"]["reading"]["notes"] == []
    assert compare_json(run, first)["settings"]["reading"]["notes"] == []


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("dump.csv", "a CSV file, which advcli does not read"),
        (
            "batch.pkl",
            "a pickle, which advcli reads only as SkyRL's global_step_{N}_training_input.pkl",
        ),
        (
            "12.pt",
            "a torch file, which advcli reads only as slime's rollout_data/{id}.pt and "
            "train_data/{id}.pt",
        ),
        ("arrays.npz", "a numpy archive, which advcli does not read"),
    ],
)
def test_a_format_advcli_does_not_read_is_named_with_the_formats_it_reads(
    run, tmp_path, name, kind
):
    path = tmp_path / name
    path.write_text("group,trajectory,score\na,0,1.0\n")
    result = run("compare", path)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {path}: {kind}: convert it (Polars reads most "
        "formats and writes Parquet); advcli reads Parquet (.parquet, .pq), JSON lines (.jsonl, "
        ".ndjson, .json) and Arrow IPC files and streams (.arrow, .arrows, .ipc, .feather)\n"
    )


@pytest.mark.parametrize("by", [[], ["--by", "file"]])
def test_a_folders_files_that_are_not_read_are_named_in_the_reading(run, tmp_path, by):
    folder = tmp_path / "run"
    (folder / "logs").mkdir(parents=True)
    for step in (1, 2):
        pl.DataFrame(
            {"data_id": [step, step], "rollout_id": [0, 1], "score": [1.0, 0.0]}
        ).write_parquet(folder / f"step-{step}.parquet")
    (folder / "config.json").write_text("{}")
    (folder / "logs" / "train.jsonl").write_text("{}\n")
    result = run("compare", folder, *by, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    notes = json.loads(result.stdout)["settings"]["reading"]["notes"]
    assert (
        f"{folder}: 2 files not read (only its Parquet files are): config.json, logs/train.jsonl"
        in notes
    )


@pytest.mark.parametrize(
    ("anchors", "step_groups"),
    [
        # Strings with nulls and escaped quotes inside lists: nothing Polars would change.
        ([["a", None], ["a", None], ['x"y'], ['x"y'], ["x\\y"]], 3),
        # Numbers only: read as numbers, no string for them to be taken for.
        ([[1], [1], [2], [2], [3, 4]], 3),
        # An object whose string field holds nulls beside strings.
        ([{"k": "1"}, {"k": None}, {"k": None}, {"k": "1"}, {"k": "2"}], 3),
    ],
    ids=["strings", "numbers", "objects"],
)
def test_nested_json_anchors_of_one_type_are_read(run, tmp_path, anchors, step_groups):
    path = tmp_path / "dump.jsonl"
    lines = [
        {"uid": "g", "traj_uid": f"t{i}", "anchor_obs": anchor, "reward": float(i % 2)}
        for i, anchor in enumerate(anchors)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step_groups"]["step_groups"] == step_groups

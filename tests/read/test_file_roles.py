"""advcli's own step files (advcli.dump.write_batch with step=): the roles their Parquet metadata
names, read by compute, compare and --by file with no flags, the training step never read as a
turn; and a run's step files in the order of their steps, each named by its step."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from cases import PENALIZED_OWN_RULE, PENALIZED_ROWS
from reference import reference_advantages

from advcli.dump import write_batch
from advcli.errors import AdvcliError
from advcli.read.step_files import number_order, numbered_steps, steps_in_folder

# A verl-agent batch's rows, as (group, trajectory, score) per turn row: several turns a
# trajectory and no turn key (verl-agent keeps none), so that a 'step' column read as the turn
# would repeat within a trajectory.
TURN_ROWS = [
    ("g0", "t0", 1.0),
    ("g0", "t0", 1.0),
    ("g0", "t0", 1.0),
    ("g0", "t1", 0.0),
    ("g0", "t2", 0.0),
    ("g0", "t2", 0.0),
    ("g1", "t3", 1.0),
    ("g1", "t4", 1.0),
    ("g1", "t4", 1.0),
    ("g1", "t5", 0.0),
]
WIDTH = 3


def _batch(rows, *, prefix: str = "") -> dict[str, np.ndarray]:
    rewards = np.zeros((len(rows), WIDTH), dtype=np.float32)
    rewards[:, -1] = [score for _, _, score in rows]
    return {
        "uid": np.array([prefix + group for group, _, _ in rows], dtype=object),
        "traj_uid": np.array([prefix + traj for _, traj, _ in rows], dtype=object),
        "token_level_rewards": rewards,
        "response_mask": np.ones((len(rows), WIDTH), dtype=np.int64),
    }


def _steps_written(folder, steps, *, same_ids: bool) -> None:
    """One file per training step; the ids repeat across steps when ``same_ids``."""
    for step in steps:
        write_batch(_batch(TURN_ROWS, prefix="" if same_ids else f"s{step}-"), folder, step=step)


def _expected(level: str) -> list[float]:
    """The reference's advantages of one step's rows (a turn's index is its place in its
    trajectory)."""
    seen: dict[str, int] = {}
    rows = []
    for group, traj, score in TURN_ROWS:
        seen[traj] = seen.get(traj, -1) + 1
        rows.append((group, traj, seen[traj], score, WIDTH))
    return reference_advantages(rows, level=level, estimator="grpo")


def test_the_metadata_names_each_columns_role_and_the_training_step(tmp_path):
    written = write_batch(_batch(TURN_ROWS), tmp_path, step=4, keys=["uid"])
    said = json.loads(pq.read_metadata(written.path).metadata[b"advcli"])
    assert said == {
        "format": 1,
        "written_by": "advcli.dump.write_batch",
        "trainer": "verl-agent",
        "columns": {
            "data_id": "group",
            "rollout_id": "trajectory",
            "token_level_rewards": "reward",
            "response_mask": "mask",
            "step": "training_step",
        },
    }


@pytest.mark.parametrize("by", [[], ["--by", "file"], ["--by", "step"]])
def test_a_folder_of_step_files_is_read_with_step_as_the_training_step(tmp_path, run, by):
    folder = tmp_path / "run"
    _steps_written(folder, [1, 2, 10], same_ids=False)
    result = run("compute", folder, *by, "-o", tmp_path / "out.parquet", "--report", "-")
    assert result.exit_code == 0, result.stderr
    reading = json.loads(result.stdout)["settings"]
    assert reading["columns"]["turn"] is None
    assert any("'step' is the training step" in note for note in reading["reading"]["notes"])
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["advantage"].to_list() == pytest.approx(_expected("trajectory") * 3, abs=1e-6)


def test_one_step_file_alone_and_its_turn_level(tmp_path, run):
    written = write_batch(_batch(TURN_ROWS), tmp_path / "run", step=3)
    out = tmp_path / "out.parquet"
    result = run("compute", written.path, "--level", "turn", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(_expected("turn"), abs=1e-6)


def test_steps_whose_ids_repeat_are_refused_as_one_batch_and_read_by_step(tmp_path, run):
    folder = tmp_path / "run"
    _steps_written(folder, [1, 2], same_ids=True)
    merged = run("compare", folder)
    assert merged.exit_code == 1
    assert merged.stderr.count("\n") == 1
    assert merged.stderr.startswith(f"Error: {folder}/step-00000002.parquet row 0: ")
    assert "training steps 1 and 2" in merged.stderr
    assert "pass --by step" in merged.stderr
    out = tmp_path / "out.parquet"
    by_step = run("compute", folder, "--by", "step", "-o", out)
    assert by_step.exit_code == 0, by_step.stderr
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(
        _expected("trajectory") * 2, abs=1e-6
    )


def test_by_file_orders_and_names_the_files_by_their_steps(tmp_path, run):
    folder = tmp_path / "run"
    _steps_written(folder, [10, 2, 1], same_ids=False)
    result = run("compare", folder, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [entry["step"] for entry in report["by_step"]["steps"]] == [1, 2, 10]
    assert report["settings"]["inputs"] == [
        f"{folder}/step-{step:08d}.parquet" for step in (1, 2, 10)
    ]


def test_a_trainers_unpadded_step_folders_are_in_number_order(tmp_path, run):
    for step in (10, 2, 1):
        folder = tmp_path / "run" / f"global_step_{step}"
        folder.mkdir(parents=True)
        pl.DataFrame(
            {"data_id": ["a", "a"], "rollout_id": [0, 1], "score": [float(step), 0.0]}
        ).write_parquet(folder / "batch.parquet")
    result = run("compare", tmp_path / "run", "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [entry["step"] for entry in report["by_step"]["steps"]] == [1, 2, 10]
    assert [name.split("/")[-2] for name in report["settings"]["inputs"]] == [
        "global_step_1",
        "global_step_2",
        "global_step_10",
    ]


def test_an_option_naming_the_training_step_for_a_role_wins(tmp_path, run):
    rows = [("g0", "t0", 1.0), ("g0", "t1", 0.0)]
    written = write_batch(_batch(rows), tmp_path, step=5)
    result = run("compare", written.path, "--turn-col", "step", "--json", "-")
    assert result.exit_code == 0, result.stderr
    settings = json.loads(result.stdout)["settings"]
    assert settings["columns"]["turn"] == "step"
    assert settings["reading"]["roles"]["turn"]["why"] == "named by --turn-col"
    assert not any("training step" in note for note in settings["reading"]["notes"])


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (b"{not json", "its 'advcli' Parquet metadata is not advcli's (not JSON)"),
        (b'{"format": 2, "columns": {}}', "(format 2; this advcli reads format 1)"),
        (b'{"format": 1, "columns": {"a": "prompt"}}', "column 'a' has the role 'prompt'"),
        (b'{"format": 1, "columns": {"gone": "group"}}', "names column 'gone' (group)"),
        (
            b'{"format": 1, "columns": {"a": "group", "b": "group"}}',
            "two columns have the role 'group'",
        ),
        (
            b'{"format": 1, "trainer": "nemo", "columns": {"a": "group"}}',
            "it names the trainer 'nemo', unknown to advcli",
        ),
    ],
)
def test_metadata_advcli_cannot_read_is_an_error_naming_the_file(tmp_path, run, value, said):
    path = tmp_path / "dump.parquet"
    frame = pl.DataFrame({"a": ["x", "x"], "b": [0, 1], "score": [1.0, 0.0]})
    frame.write_parquet(path, metadata={"advcli": value.decode()})
    result = run("compare", path)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {path}: ")
    assert said in result.stderr
    assert result.stderr.count("\n") == 1


def test_files_whose_metadata_differ_are_not_read_as_one_batch(tmp_path, run):
    folder = tmp_path / "run"
    write_batch(_batch(TURN_ROWS, prefix="a"), folder, step=1, keys=["uid"])
    plain = pl.read_parquet(folder / "step-00000001.parquet").with_columns(
        pl.col("data_id") + "b", pl.col("rollout_id") + "b", pl.lit(2, dtype=pl.Int64).alias("step")
    )
    plain.write_parquet(folder / "step-00000002.parquet")
    result = run("compare", folder)
    assert result.exit_code == 1
    assert "the files' advcli metadata name different roles" in result.stderr
    assert f"{folder}/step-00000002.parquet: none" in result.stderr


def test_a_verl_agent_batch_written_is_read_with_verl_agents_own_rule(tmp_path, run):
    """Written in advcli's schema, the file says whose batch it was: its rows that differ by
    the penalty are scored by verl-agent's own rule with no flags, and the reading says so."""
    folder = tmp_path / "run"
    for step in (1, 2):
        write_batch(_batch(PENALIZED_ROWS, prefix=f"s{step}-"), folder, step=step)
    out = tmp_path / "out.parquet"
    result = run("compute", folder, "--by", "file", "-o", out, "--report", "-")
    assert result.exit_code == 0, result.stderr
    settings = json.loads(result.stdout)["settings"]
    assert settings["traj_score"] == "own"
    assert any("verl-agent's invalid-action penalty" in n for n in settings["reading"]["notes"])
    written = pl.read_parquet(out)["advantage"].to_list()
    assert written == pytest.approx(PENALIZED_OWN_RULE * 2, abs=1e-6)
    inspected = json.loads(run("inspect", folder, "--json").stdout)
    rule = inspected["inconsistent_trajectories"]["rule"]
    assert rule == "scored by verl-agent's own rule (--traj-score own)"


def test_keys_cannot_overwrite_the_training_step(tmp_path):
    batch = {**_batch(TURN_ROWS), "step": np.arange(len(TURN_ROWS))}
    with pytest.raises(AdvcliError, match="keys= names 'step', the column that holds"):
        write_batch(batch, tmp_path, step=1, keys=["step"])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("names", "steps"),
    [
        (["run/step-00000001.parquet", "run/step-00000010.parquet"], [1, 10]),
        (["r/global_step_2/data.parquet", "r/global_step_10/data.parquet"], [2, 10]),
        (["run-3/step-7.parquet", "run-3/step-8.parquet"], [7, 8]),
        # One name, two numbers differing, text differing, a shared step, no number: no steps.
        (["run/step-7.parquet"], None),
        (["run-1/step-7.parquet", "run-2/step-8.parquet"], None),
        (["a/step-1.parquet", "b/step-2.parquet"], None),
        (["step-01.parquet", "step-1.parquet"], None),
        (["first.parquet", "second.parquet"], None),
    ],
)
def test_files_named_one_by_one_have_the_one_number_their_paths_differ_in(names, steps):
    assert numbered_steps(names) == steps


@pytest.mark.parametrize(
    ("names", "steps"),
    [
        (["step-00000001.parquet", "step-00000010.parquet"], [1, 10]),
        (["global_step_2/data.parquet", "global_step_10/data.parquet"], [2, 10]),
        (["step-7.parquet"], [7]),
        # Of two numbers, the one after "step" (rLLM's step folders).
        (["run-3/step-7.parquet", "run-3/step-8.parquet"], [7, 8]),
        (["train_step_3_epoch_0", "train_step_4_epoch_1"], [3, 4]),
        # Two numbers neither after "step", two after it, none, or two names with one step: no
        # steps.
        (["run-3/part-7.parquet", "run-3/part-8.parquet"], None),
        (["step-3/step-7.parquet", "step-3/step-8.parquet"], None),
        (["step-7.parquet", "last.parquet"], None),
        (["step-01.parquet", "step-1.parquet"], None),
    ],
)
def test_files_within_a_folder_have_the_one_number_of_their_names(names, steps):
    assert steps_in_folder(names) == steps


def test_paths_are_ordered_with_their_numbers_as_numbers():
    paths = ["s/step_10.parquet", "s/step_9.parquet", "s/step_1.parquet", "s/step_01.parquet"]
    assert sorted(paths, key=number_order) == [
        "s/step_01.parquet",
        "s/step_1.parquet",
        "s/step_9.parquet",
        "s/step_10.parquet",
    ]


WRITER = """
import sys
import numpy as np
from advcli.dump import write_batch

folder, writer = sys.argv[1], int(sys.argv[2])
for n in range(60):
    batch = {"data_id": np.array([writer, writer]), "rollout_id": np.array([n, n + 1000]),
             "score": np.array([1.0, 0.0])}
    print(write_batch(batch, folder).path.name, flush=True)
"""


@pytest.mark.process
def test_two_processes_writing_batches_without_a_step_keep_every_batch(tmp_path):
    """Each batch claims its name as it is published: none replaces another's."""
    folder = tmp_path / "run"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), str(writer)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for writer in range(2)
    ]
    said = [writer.communicate(timeout=300)[0].split() for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0]
    names = sorted(name for names in said for name in names)
    assert names == [f"batch-{n:06d}.parquet" for n in range(120)]
    assert sorted(path.name for path in folder.iterdir()) == names
    kept = pl.read_parquet(folder).select("data_id", "rollout_id").sort("data_id", "rollout_id")
    assert kept.height == 240
    assert kept.unique().height == 240


FULL_WRITER = """
import resource, signal, sys
import numpy as np
from advcli.dump import write_batch
from advcli.errors import AdvcliError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
n = 4000
batch = {"data_id": np.arange(n) // 8, "rollout_id": np.arange(n), "score": np.arange(n) / n}
for step in (1, None):
    try:
        write_batch(batch, sys.argv[1], step=step)
    except AdvcliError as error:
        print(error)
"""


@pytest.mark.process
def test_a_batch_that_cannot_be_written_is_an_error_naming_its_file(tmp_path):
    """A file-size limit (as a full disk): one AdvcliError naming the file, for a step's name
    and for the next free one, and no partial file left; not Polars' own error."""
    folder = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", FULL_WRITER, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": cannot write the batch (")[0] for line in lines] == [
        f"{folder}/step-00000001.parquet",
        f"{folder}/batch-000000.parquet",
    ]
    assert all("File too large" in line for line in lines)
    assert list(folder.iterdir()) == []


def test_per_turn_rewards_of_a_written_batch_are_its_step_rewards(tmp_path, run):
    """A verl-agent batch written with its per-step rewards (the anchor's GiGPO roles): under
    --reward-mode per-turn each turn's reward is that step's own, not the outcome the file
    names as the reward, and the reading says so; the figures are those of naming it."""
    batch = _batch(PENALIZED_ROWS)
    batch["rewards"] = np.array([0.0, -0.1, 0.0, 0.0, 1.0, 0.0, 0.9], dtype=np.float32)
    batch["anchor_obs"] = np.array([f"s{i % 3}" for i in range(len(PENALIZED_ROWS))], dtype=object)
    write_batch(batch, tmp_path / "run", step=1)
    report = json.loads(
        run("compare", tmp_path / "run", "--reward-mode", "per-turn", "--json", "-", "-q").stdout
    )
    reward = report["settings"]["reading"]["roles"]["reward"]
    assert reward["column"] == "step_reward"
    assert "as the step's own reward" in reward["why"]
    named = run(
        "compare",
        tmp_path / "run",
        "--reward-mode",
        "per-turn",
        "--reward-col",
        "step_reward",
        "--json",
        "-",
        "-q",
    )
    assert json.loads(named.stdout)["groupings"] == report["groupings"]


@pytest.mark.parametrize("by", ["step", "file"])
def test_inspect_reads_each_step_as_its_own_batch_with_by(tmp_path, run, by):
    """A run whose group ids repeat across steps: read as one batch inspect refuses it and says
    to pass --by step, which it takes, keying each group by its step."""
    folder = tmp_path / "run"
    _steps_written(folder, (1, 2), same_ids=True)
    refused = run("inspect", folder)
    assert refused.exit_code == 1
    assert refused.stderr.rstrip().endswith("pass --by step to read each step as its own batch")
    one_step = json.loads(run("inspect", folder / "step-00000001.parquet", "--json").stdout)
    result = run("inspect", folder, "--by", by, "--json")
    assert result.exit_code == 0, result.stderr
    counts = json.loads(result.stdout)["counts"]
    # Each step's groups and trajectories apart: twice one step's.
    assert one_step["counts"]["groups"] == len({group for group, _, _ in TURN_ROWS})
    for key in ("rows", "groups", "trajectories", "tokens"):
        assert counts[key] == 2 * one_step["counts"][key], key

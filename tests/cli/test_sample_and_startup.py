"""advcli sample, `python -m advcli`, and the start-up path staying free of heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from reference import reference_own_score

from advcli.write.sample import GROUPS_PER_CHUNK, INVALID_ACTION_PENALTY, sample_table


def test_sample_command_writes_the_schema(run, tmp_path):
    output = tmp_path / "s.parquet"
    result = run("sample", output, "--groups", "5", "--rollouts", "4", "--seed", "3")
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(output)
    assert frame.columns == [
        "data_id",
        "rollout_id",
        "turn_index",
        "token_level_rewards",
        "response_mask",
    ]
    assert frame.select("data_id", "rollout_id").n_unique() == 20
    again = run("sample", output, "--groups", "5")
    assert again.exit_code == 1 and "pass --force" in again.stderr


def test_sample_is_deterministic_and_realistic():
    frame = pl.from_arrow(sample_table(groups=200, rollouts=8, max_turns=6, tokens=40, seed=7))
    assert frame.equals(
        pl.from_arrow(sample_table(groups=200, rollouts=8, max_turns=6, tokens=40, seed=7))
    )
    rows = frame.with_columns(
        score=pl.col("token_level_rewards").list.sum(),
        length=pl.col("response_mask").list.len(),
        generated=pl.col("response_mask").list.sum(),
        reward_position=pl.col("token_level_rewards").list.arg_max(),
    )
    # The reward sits on the last generated token; observation tokens come after, masked out.
    rewarded = rows.filter(pl.col("score") > 0)
    assert (rewarded["reward_position"] == rewarded["generated"] - 1).all()
    mask_prefix = rows.select(
        pl.col("response_mask").list.head(pl.col("generated")).list.min()
    ).to_series()
    assert (mask_prefix == 1).all()
    # Every turn of a trajectory carries the same outcome; failures take more turns.
    per_trajectory = rows.group_by("data_id", "rollout_id").agg(
        pl.col("score").n_unique().alias("distinct"),
        pl.col("score").first(),
        pl.len().alias("turns"),
    )
    assert (per_trajectory["distinct"] == 1).all()
    turns = per_trajectory.group_by("score").agg(pl.col("turns").mean()).sort("score")["turns"]
    assert turns[0] > turns[1] + 0.5
    # Completion order: rows of one group are not contiguous.
    assert not frame["data_id"].is_sorted()
    assert int(np.diff(frame["data_id"].to_numpy()).astype(bool).sum()) > 200


UUID4 = r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"


def _verl_agent_sample(run, path, *options: str) -> pl.DataFrame:
    result = run("sample", path, "--trainer", "verl-agent", "-q", "--force", *options)
    assert result.exit_code == 0, result.output
    return (
        pl.read_parquet(path)
        .with_row_index("row")
        .with_columns(
            score=pl.col("token_level_rewards").list.sum(),
            turn=pl.int_range(pl.len()).over("traj_uid"),
            turns=pl.len().over("traj_uid"),
        )
    )


def test_the_verl_agent_sample_is_verl_agents_batch_with_gigpos_columns(run, tmp_path):
    frame = _verl_agent_sample(run, tmp_path / "a.parquet", "--groups", "40", "--seed", "5")
    assert frame.columns[1:8] == [
        "uid",
        "traj_uid",
        "anchor_obs",
        "rewards",
        "is_action_valid",
        "token_level_rewards",
        "response_mask",
    ]
    assert frame.schema["anchor_obs"] == pl.String and frame.schema["rewards"] == pl.Float32
    assert frame["uid"].str.contains(UUID4).all() and frame["traj_uid"].str.contains(UUID4).all()
    assert (frame["uid"].n_unique(), frame["traj_uid"].n_unique()) == (40, 320)
    # verl-agent's order: a prompt's rollouts together, each trajectory's steps in a run.
    runs = frame.select(pl.col("uid", "traj_uid").rle_id())
    assert runs["uid"].max() == 39 and runs["traj_uid"].max() == 319
    # The step reward: 1 on a success's last step only; the score on each row's last response
    # token: the episode's reward, less the penalty where the action was invalid, and the
    # winning step's action is valid.
    episode = pl.col("rewards").sum().over("traj_uid")
    last = pl.col("turn") == pl.col("turns") - 1
    assert frame.select(((pl.col("rewards") == 0) | last).all()).item()
    penalty = pl.when(pl.col("is_action_valid")).then(0.0).otherwise(INVALID_ACTION_PENALTY)
    expected = (episode - penalty).cast(pl.Float32)
    assert frame.select((pl.col("score").cast(pl.Float32) == expected).all()).item()
    assert frame.filter(pl.col("rewards") == 1)["is_action_valid"].all()
    assert frame.select(pl.col("score").n_unique().over("traj_uid").max()).item() == 2
    reward_at = pl.col("token_level_rewards").list.eval(pl.element() != 0).list.arg_max()
    assert (
        frame.filter(pl.col("score") != 0)
        .select((reward_at == pl.col("response_mask").list.len() - 1).all())
        .item()
    )
    assert frame.select(
        (pl.col("response_mask").list.min() == 1).all(),
        (pl.col("responses").list.len() == pl.col("response_mask").list.len()).all(),
    ).row(0) == (True, True)
    # A prompt's rollouts all start in one state; after an invalid action the state stays.
    starts = frame.filter(pl.col("turn") == 0).group_by("uid").agg(pl.col("anchor_obs").n_unique())
    assert (starts["anchor_obs"] == 1).all()
    stuck = frame.filter(pl.col("is_action_valid").not_() & ~last)
    following = frame.join(stuck.select("row"), on="row", how="semi")
    assert len(stuck) > 10
    assert (
        frame["anchor_obs"].gather(stuck["row"] + 1).to_list() == following["anchor_obs"].to_list()
    )
    # Every prompt's anchors are its own: no two prompts share one.
    assert frame.group_by("anchor_obs").agg(pl.col("uid").n_unique())["uid"].max() == 1


@pytest.mark.parametrize(
    ("share", "invalid"), [("0", "0"), ("1", "0"), ("0.5", "0.1")], ids=["own", "shared", "mixed"]
)
def test_the_verl_agent_samples_states_are_shared_at_the_rate_asked(run, tmp_path, share, invalid):
    options = ("--groups", "30", "--seed", "2", "--anchor-share", share, "--invalid-rate", invalid)
    frame = _verl_agent_sample(run, tmp_path / "a.parquet", *options)
    later = frame.filter(pl.col("turn") > 0)
    # A later state reached by more than one of its prompt's trajectories.
    reach = frame.group_by("uid", "anchor_obs").agg(pl.col("traj_uid").n_unique().alias("n"))
    shared = later.join(reach, on=["uid", "anchor_obs"]).select((pl.col("n") > 1).mean()).item()
    revisits = frame.select(pl.len() - pl.struct("traj_uid", "anchor_obs").n_unique()).item()
    if invalid == "0":
        assert frame.select(pl.col("score").n_unique().over("traj_uid").max()).item() == 1
        assert frame["is_action_valid"].all() and revisits == 0
    one_of_two = later["anchor_obs"].str.contains(r": you are in room \d+[ab]$")
    if share == "0":
        assert shared == 0.0 and not one_of_two.any()
    elif share == "1":
        # Two states per turn: only a prompt's lone trajectory at a turn keeps one to itself.
        assert one_of_two.all() and shared > 0.75
    else:
        assert 0.2 < shared < 0.8 and revisits > 0


def test_the_verl_agent_sample_is_deterministic_and_its_chunks_are_prompts_of_their_own(
    run, tmp_path
):
    one = tmp_path / "one.parquet"
    options = ("--groups", str(GROUPS_PER_CHUNK + 2), "--rollouts", "1", "--max-turns", "1")
    frame = _verl_agent_sample(run, one, *options, "--tokens", "2", "--seed", "9")
    again = tmp_path / "again.parquet"
    _verl_agent_sample(run, again, *options, "--tokens", "2", "--seed", "9")
    assert one.read_bytes() == again.read_bytes()
    other = _verl_agent_sample(run, again, *options, "--tokens", "2", "--seed", "10")
    assert not frame["uid"].equals(other["uid"])
    # The second chunk's prompts are numbered on from the first's, with uids of their own.
    assert frame["anchor_obs"].n_unique() == frame["uid"].n_unique() == GROUPS_PER_CHUNK + 2
    assert frame["anchor_obs"][-1] == f"task {GROUPS_PER_CHUNK + 1}: you are in the start"


def test_the_default_sample_is_the_advcli_trainers(run, tmp_path):
    """--trainer advcli is the sample as it was: the same bytes as no --trainer."""
    plain, named = tmp_path / "plain.parquet", tmp_path / "named.parquet"
    assert run("sample", plain, "--groups", "7", "--seed", "4", "-q").exit_code == 0
    result = run("sample", named, "--groups", "7", "--seed", "4", "-q", "--trainer", "advcli")
    assert result.exit_code == 0, result.output
    assert plain.read_bytes() == named.read_bytes()
    assert pl.read_parquet(plain).equals(
        pl.from_arrow(sample_table(groups=7, rollouts=8, max_turns=6, tokens=48, seed=4))
    )


def test_the_verl_agent_sample_is_read_with_no_flags_for_gigpo(run, tmp_path):
    source = tmp_path / "steps.parquet"
    _verl_agent_sample(run, source, "--groups", "12", "--seed", "1")
    output = tmp_path / "out.parquet"
    result = run("compute", source, "-o", output, "--recipe", "verl-agent-trajectory")
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "verl-agent's layout" in said
    assert "'anchor_obs' is the anchor column of verl-agent's dumps" in said
    assert "'rewards' is the step reward column of verl-agent's dumps" in said
    assert "duplicate rows │ 0" in said


def test_the_verl_agent_sample_under_verl_agent_s_own_rule(run, tmp_path):
    """Its rows differ by the invalid-action penalty; --traj-score own gives each row the
    reference's advantage (first rows in the statistics, each row centred on its own score)."""
    source = tmp_path / "steps.parquet"
    frame = _verl_agent_sample(run, source, "--groups", "12", "--seed", "2")
    output = tmp_path / "out.parquet"
    result = run("compute", source, "-o", output, "--traj-score", "own", "-q")
    assert result.exit_code == 0, result.stderr
    expected = reference_own_score(
        frame["score"].to_list(),
        frame["uid"].to_list(),
        frame["traj_uid"].to_list(),
        estimator="grpo",
        dedup=True,
        tie_std=1.0,
    )
    written = pl.read_parquet(output)
    assert written["score"].to_list() == pytest.approx(frame["score"].to_list(), abs=1e-6)
    np.testing.assert_allclose(written["advantage"].to_numpy(), expected, rtol=1e-5, atol=1e-5)


def _compare_json(run, *args) -> dict:
    result = run("compare", *args, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


OWN_RULE_NOTE = "a trajectory's rows may differ by verl-agent's invalid-action penalty"


def test_the_verl_agent_sample_is_compared_with_no_flags(run, tmp_path):
    """Its rows differ by the penalty: read in verl-agent's layout, the trajectory level takes
    verl-agent's own rule, the reading says so, and the figures are --traj-score own's."""
    source = tmp_path / "steps.parquet"
    _verl_agent_sample(run, source, "--groups", "12", "--seed", "3")
    plain = _compare_json(run, source)
    assert plain["settings"]["traj_score"] == "own"
    notes = plain["settings"]["reading"]["notes"]
    assert [note for note in notes if note.startswith(OWN_RULE_NOTE)] == notes
    chosen = _compare_json(run, source, "--traj-score", "own")
    # Chosen, the rule is the option's: the reading says nothing of it.
    assert chosen["settings"]["reading"].pop("notes") == []
    plain["settings"]["reading"].pop("notes")
    assert chosen == plain
    # Another rule replaces it, and the reading no longer says it.
    mean = _compare_json(run, source, "--traj-score", "mean")
    assert mean["settings"]["traj_score"] == "mean"
    assert mean["settings"]["reading"]["notes"] == []
    assert mean["trajectories"] != plain["trajectories"]


def test_the_verl_agent_sample_is_computed_with_no_flags_as_under_the_own_rule(run, tmp_path):
    source = tmp_path / "steps.parquet"
    _verl_agent_sample(run, source, "--groups", "12", "--seed", "3")
    plain, chosen = tmp_path / "plain.parquet", tmp_path / "own.parquet"
    result = run("compute", source, "-o", plain)
    assert result.exit_code == 0, result.stderr
    assert OWN_RULE_NOTE in " ".join(result.stderr.split())
    assert run("compute", source, "-o", chosen, "--traj-score", "own", "-q").exit_code == 0
    assert pl.read_parquet(plain).equals(pl.read_parquet(chosen))
    # At turn level every row is its own unit: no rule for a trajectory's score is read.
    turn = run("compute", source, "-o", tmp_path / "turn.parquet", "--level", "turn")
    assert turn.exit_code == 0, turn.stderr
    assert "invalid-action penalty" not in " ".join(turn.stderr.split())


def test_an_estimator_without_the_own_rule_still_asks_for_one(run, tmp_path):
    source = tmp_path / "steps.parquet"
    _verl_agent_sample(run, source, "--groups", "12", "--seed", "3")
    result = run("compare", source, "--estimator", "rloo")
    assert result.exit_code == 1
    assert "choose a rule with --traj-score first|last|mean|max|sum" in result.stderr
    assert "--traj-score own" not in result.stderr


@pytest.mark.parametrize("estimator", ["rloo", "opo", "grpo_passk", "reinforce_pp_baseline"])
def test_own_rule_with_another_estimator_is_a_usage_error(run, estimator, tmp_path):
    source = tmp_path / "steps.parquet"
    _verl_agent_sample(run, source, "--groups", "2")
    result = run("compare", source, "--traj-score", "own", "--estimator", estimator)
    assert result.exit_code == 2
    assert "--traj-score own takes --estimator grpo, drgrpo, gigpo" in result.stderr


@pytest.mark.process
def test_python_dash_m_and_no_heavy_imports_at_start_up():
    code = (
        "import sys, runpy; sys.argv = ['advcli', '--help']\n"
        "try:\n    runpy.run_module('advcli', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = {'torch', 'matplotlib', 'ray'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "compute" in result.stdout


@pytest.mark.process
def test_compute_does_not_import_torch(tmp_path):
    source = tmp_path / "s.parquet"
    pl.from_arrow(sample_table(groups=3, rollouts=2)).write_parquet(source)
    code = (
        "import sys\nfrom advcli.cli.app import app\n"
        f"args = ['compute', {str(source)!r}, '-o', {str(tmp_path / 'o.parquet')!r}, '-q']\n"
        "try:\n    app(args)\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_threads_option_sizes_the_polars_pool(tmp_path):
    source = tmp_path / "s.parquet"
    pl.from_arrow(sample_table(groups=3, rollouts=2)).write_parquet(source)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "advcli",
            "compute",
            str(source),
            "-o",
            str(tmp_path / "o.parquet"),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "(1 threads)" in result.stderr


@pytest.mark.process
def test_threads_option_sizes_the_arrow_pool(tmp_path):
    """Arrow decodes the Parquet input with its own pool; --threads limits it too."""
    source = tmp_path / "s.parquet"
    pl.from_arrow(sample_table(groups=3, rollouts=2)).write_parquet(source)
    code = (
        "import pyarrow, sys\n"
        "from typer.testing import CliRunner\n"
        "from advcli.cli.app import app\n"
        f"args = ['compute', {str(source)!r}, '-o', {str(tmp_path / 'o.parquet')!r}, '-q']\n"
        "result = CliRunner().invoke(app, [*args, '--threads', '1'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(pyarrow.cpu_count())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_no_progress_bar_when_stderr_is_not_a_terminal(run, tmp_path):
    source = tmp_path / "s.parquet"
    pl.from_arrow(sample_table(groups=3, rollouts=2)).write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "o.parquet")
    assert result.exit_code == 0
    assert "stage" not in result.stderr and "reading keys" not in result.stderr


def test_sample_refuses_a_directory(run, tmp_path):
    (tmp_path / "out.parquet").mkdir()
    result = run("sample", tmp_path / "out.parquet", "--force")
    assert result.exit_code == 1
    assert result.stderr.strip().endswith("out.parquet: is a directory; name a file")


@pytest.mark.process
def test_the_cli_tunes_polars_allocator_unless_the_user_did():
    # The entry point sets it before anything imports Polars; printed as the process exits.
    code = (
        "import atexit, os, sys\n"
        "sys.argv = ['advcli', '--version']\n"
        "atexit.register(lambda: print(os.environ['_RJEM_MALLOC_CONF']))\n"
        "from advcli.__main__ import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "dirty_decay_ms:500" in ours.stdout, ours.stderr
    theirs = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "_RJEM_MALLOC_CONF": "dirty_decay_ms:0"},
    )
    assert theirs.stdout.splitlines()[-1] == "dirty_decay_ms:0", theirs.stderr


@pytest.mark.process
def test_the_cli_loads_numpy_with_no_blas_thread_pool_unless_the_user_set_one():
    # OpenBLAS starts its pool as numpy loads: the threads are counted once numpy is loaded.
    code = (
        "import atexit, os, sys\n"
        "sys.argv = ['advcli', '--version']\n"
        "def threads():\n"
        "    import numpy\n"
        "    print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))\n"
        "atexit.register(threads)\n"
        "from advcli.__main__ import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}

    def started(env: dict[str, str]) -> list[int]:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        setting, threads = done.stdout.splitlines()[-1].split()
        return [int(setting), int(threads)]

    ours, theirs = started(env), started({**env, "OPENBLAS_NUM_THREADS": "2"})
    assert ours[0] == 1 and theirs[0] == 2
    # The user's pool: a thread beside the calling one (OpenBLAS starts no more than the cores).
    assert theirs[1] - ours[1] == min(2, len(os.sched_getaffinity(0))) - 1


@pytest.mark.process
def test_the_cli_leaves_what_is_alive_at_its_end_out_of_the_exits_collections(tmp_path):
    # Frozen objects are out of every collection; counted as the process exits, after a run
    # that wrote its output.
    output = tmp_path / "out.parquet"
    code = (
        "import atexit, gc, sys\n"
        f"sys.argv = ['advcli', 'sample', {str(output)!r}, '--groups', '2', '-q']\n"
        "atexit.register(lambda: print(gc.get_freeze_count()))\n"
        "from advcli.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.splitlines()[-1]) > 10_000
    assert pl.read_parquet(output).height > 0


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["compute", "IN", "-o", "OUT"], ["--threads", "100000"]),
        (["compare", "IN"], ["--threads", "0"]),
        (["inspect", "IN"], ["--threads", "1025"]),
        (["sample", "OUT"], ["--seed", "-1"]),
        (["sample", "OUT"], ["--seed", str(2**63)]),
        (["sample", "OUT"], ["--tokens", "1000001"]),
        (["sample", "OUT"], ["--max-turns", "10001"]),
        (["sample", "OUT"], ["--rollouts", "100001"]),
        (["sample", "OUT"], ["--groups", "0"]),
        (["sample", "OUT"], ["--trainer", "verl"]),
        (["sample", "OUT"], ["--trainer", "verl-agent", "--anchor-share", "1.5"]),
        (["sample", "OUT"], ["--trainer", "verl-agent", "--invalid-rate", "-0.1"]),
        (["sample", "OUT"], ["--anchor-share", "0.5"]),
        (["sample", "OUT"], ["--invalid-rate", "0.2"]),
    ],
)
def test_options_out_of_range_are_usage_errors(command, option, run, tmp_path):
    source = tmp_path / "in.parquet"
    pl.from_arrow(sample_table(groups=2, rollouts=2)).write_parquet(source)
    output = tmp_path / "out.parquet"
    args = [str(source) if a == "IN" else str(output) if a == "OUT" else a for a in command]
    result = run(*args, *option)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not output.exists()


def test_sample_refuses_a_chunk_larger_than_memory(run, tmp_path):
    output = tmp_path / "out.parquet"
    result = run(
        "sample", output, "--rollouts", "100000", "--max-turns", "10000", "--tokens", "1000000"
    )
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert line.startswith(f"Error: {output}: a chunk of 64 prompts could need ")
    assert line.endswith("GiB available); lower --rollouts, --max-turns or --tokens")
    assert not output.exists()

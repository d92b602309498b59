"""advcli sample, `python -m advcli`, and the start-up path staying free of heavy imports."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from advcli.sample import sample_table


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

"""Issue 8: stdin/stdout with real pipes between real processes, JSON-lines dumps, `inspect`,
and the docs' pipeline examples run as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from conftest import ROOT
from typer.testing import CliRunner

from advcli.cli.app import app

pytestmark = pytest.mark.docs

SAMPLE = ROOT / "sample_data" / "rollouts.parquet"
ADVCLI = [sys.executable, "-m", "advcli"]


def shell(command: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Run a shell pipeline where `advcli` is this interpreter's advcli."""
    bin_dir = cwd / ".bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "advcli"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m advcli "$@"\n')
    launcher.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "COLUMNS": "200"}
    # The advcli under test, where a source tree is put ahead of an installed one.
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env=env,
    )


def file_advantages(tmp_path: Path, *options: str) -> pl.DataFrame:
    """advcli compute on the sample Parquet file, in this process: the reference for pipes."""
    output = tmp_path / "reference.parquet"
    result = CliRunner().invoke(
        app, ["compute", str(SAMPLE), "-o", str(output), "-q", "--force", *options]
    )
    assert result.exit_code == 0, result.output
    return pl.read_parquet(output)


def test_stdin_parquet_to_stdout_arrow_stream(tmp_path):
    consumer = (
        "import sys, pyarrow as pa, polars as pl; "
        "t = pa.ipc.open_stream(sys.stdin.buffer).read_all(); "
        f"pl.from_arrow(t).write_parquet({str(tmp_path / 'piped.parquet')!r})"
    )
    result = shell(f'cat {SAMPLE} | advcli compute - -o - | python -c "{consumer}"', tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert b"advcli compute" in result.stderr  # the summary went to stderr, not into the pipe
    piped = pl.read_parquet(tmp_path / "piped.parquet")
    assert piped.equals(file_advantages(tmp_path))


def test_stdout_parquet_and_stdin_arrow_stream(tmp_path):
    result = shell(
        f"advcli compute {SAMPLE} -o - --format parquet -q --level turn "
        f"| advcli compute - -o - -q --format arrows --estimator rloo > out.arrows",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr.decode()
    with pa.OSFile(str(tmp_path / "out.arrows")) as source:
        table = pa.ipc.open_stream(source).read_all()
    assert table.num_rows == pl.read_parquet(SAMPLE).height
    np.testing.assert_array_equal(
        table["advantage"].to_numpy(),
        file_advantages(tmp_path, "--estimator", "rloo")["advantage"].to_numpy(),
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "<stdin>: standard input is empty"),
        (
            b"data_id,rollout_id\n1,2\n",
            "<stdin>: not Parquet, an Arrow IPC stream or JSON lines (checked the first bytes)",
        ),
    ],
)
def test_bad_stdin(data, message):
    result = subprocess.run([*ADVCLI, "compute", "-", "-o", "-"], input=data, capture_output=True)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().strip() == f"Error: {message}"


def test_stdin_errors_name_stdin_and_row(tmp_path):
    frame = (
        pl.read_parquet(SAMPLE)
        .head(5)
        .with_columns(pl.Series("data_id", [1, None, 1, 1, 1], dtype=pl.Int64))
    )
    path = tmp_path / "bad.parquet"
    frame.write_parquet(path)
    result = subprocess.run([*ADVCLI, "inspect", "-"], input=path.read_bytes(), capture_output=True)
    assert result.returncode == 1
    assert result.stderr.decode().strip() == (
        "Error: <stdin> row 1: column 'data_id' (group id) is null"
    )


def verl_like_records(frame: pl.DataFrame) -> list[dict]:
    """Rows shaped like verl's rollout dump: a step, ids per prompt and rollout, a score, text."""
    return [
        {
            "step": 3,
            "uid": f"prompt-{row['data_id']}",
            "traj_uid": f"rollout-{row['rollout_id']}",
            "turn_index": row["turn_index"],
            "input": f"question {row['data_id']}",
            "output": "I will call the tool." if row["turn_index"] == 0 else "Final answer.",
            "score": float(sum(row["token_level_rewards"])),
            "response_mask": row["response_mask"],
        }
        for row in frame.iter_rows(named=True)
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".ndjson", ".json"])
@pytest.mark.parametrize(
    ("level", "estimator"),
    [("trajectory", "grpo"), ("turn", "opo"), ("trajectory", "reinforce_pp_baseline")],
)
def test_json_lines_give_the_same_advantages_as_parquet(suffix, level, estimator, run, tmp_path):
    frame = pl.read_parquet(SAMPLE)
    records = verl_like_records(frame)
    # Split over two step files, read through a glob.
    for part, chunk in enumerate((records[:700], records[700:])):
        with (tmp_path / f"step-{part}{suffix}").open("w") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in chunk)
    output = tmp_path / "from-json.parquet"
    result = run(
        "compute",
        tmp_path / f"step-*{suffix}",
        "-o",
        output,
        "-q",
        "--level",
        level,
        "--estimator",
        estimator,
    )
    assert result.exit_code == 0, result.stderr
    from_json = pl.read_parquet(output)
    assert from_json["response_mask"].dtype == pl.List(pl.Int64)  # JSON lists -> list columns
    reference = file_advantages(tmp_path, "--level", level, "--estimator", estimator)
    np.testing.assert_array_equal(
        from_json["advantage"].to_numpy(), reference["advantage"].to_numpy()
    )
    assert from_json["advantages"].to_list() == reference["advantages"].to_list()


def test_json_ids_beyond_int64(run, tmp_path):
    # Polars reads ids from 2**63 up (hashed uint64 ids) as Int128, which numpy cannot hold.
    path = tmp_path / "big-ids.jsonl"
    path.write_text(
        "".join(
            json.dumps({"data_id": 2**63 + 5, "rollout_id": rollout, "reward": reward}) + "\n"
            for rollout, reward in ((0, 1.0), (1, 0.0), (1, 0.0))
        )
    )
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    counts = json.loads(result.stdout)["counts"]
    assert (counts["groups"], counts["trajectories"]) == (1, 2)
    report = tmp_path / "report.json"
    assert run("compare", path, "--json", report, "-q").exit_code == 0
    # Trajectory-level GRPO over scores 1 and 0: mean 0.5, std (ddof=1) sqrt(0.5), so
    # ±0.5 / (sqrt(0.5) + 1e-6).
    diffs = json.loads(report.read_text())["top_trajectories"]
    advantages = sorted(entry["advantage_trajectory"] for entry in diffs)
    expected = 0.5 / (0.5**0.5 + 1e-6)
    assert advantages == pytest.approx([-expected, expected], abs=1e-9)


def test_unreadable_json_lines(run, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"uid": "a", "traj_uid": 1, "score": 1.0}\n{"uid": "a", "traj_uid": \n')
    result = run("inspect", path)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {path} line 2: not valid JSON (Expecting value at column 1)\n"


def test_inspect_reports_every_item(run, tmp_path):
    rows = {
        # g1: a trajectory whose rows disagree (t1), a repeated turn (t2, turn 0 twice).
        "data_id": ["g1", "g1", "g1", "g1", "g1", "g2", "g3", "g3"],
        "rollout_id": ["t1", "t1", "t2", "t2", "t3", "s", "z1", "z2"],
        "turn_index": [0, 1, 0, 0, 0, 0, 0, 0],
        "score": [1.0, 0.0, 0.5, 0.5, 0.0, 2.0, 0.3, 0.3],
        "response_length": [3, 2, 4, 4, 0, 1, 2, 2],
    }
    source = tmp_path / "dump.parquet"
    pl.DataFrame(rows).write_parquet(source)
    result = run("inspect", source, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["columns"]["group"] == {
        "column": "data_id",
        "why": "'data_id' is the group column of advcli's dumps",
    }
    assert report["columns"]["reward"]["column"] == "score"
    assert report["columns"]["reward"]["why"] == (
        "'score' is the reward column of advcli's dumps, one number per row"
    )
    assert report["columns"]["mask"]["why"] == (
        "'response_length' is the mask column of advcli's dumps, a response length"
    )
    assert report["counts"] == {
        "rows": 8,
        "groups": 3,
        "trajectories": 6,
        "tokens": 18,
        "empty_responses": 1,
    }
    assert report["turns_per_trajectory"] == {
        "min": 1,
        "median": 1.0,
        "max": 2,
        "histogram": {"1": 4, "2": 2},
    }
    assert report["scores"]["values"] == {"0": 2, "0.3": 2, "0.5": 2, "1": 1, "2": 1}
    assert report["singleton_groups"] == {"count": 1, "examples": ["g2"]}
    assert report["zero_std_groups"] == {"count": 1, "examples": ["g3"]}
    assert report["inconsistent_trajectories"] == {
        "count": 1,
        "rule": "compute asks for a --traj-score rule",
        "examples": [{"group": "g1", "trajectory": "t1", "scores": [1.0, 0.0]}],
    }
    assert report["duplicate_turns"]["count"] == 1
    assert report["duplicate_turns"]["examples"][0]["where"] == f"{source} row 3"

    terminal = run("inspect", source)
    text = " ".join(terminal.stdout.split())
    for expected in (
        "Columns",
        "Turns per trajectory",
        "Before compute",
        "trajectories whose rows disagree on the score │ 1",
        "repeated (group, trajectory, turn) │ 1",
    ):
        assert expected in text


def test_help_everywhere_version_and_completion(run):
    for command in [*(c.name for c in app.registered_commands), None]:
        result = run(*([command] if command else []), "-h")
        assert result.exit_code == 0 and "Usage" in result.stdout
    assert "--install-completion" in run("--help").stdout
    assert run("--version").stdout.startswith("advcli ")


def pipeline_examples() -> list[str]:
    text = (ROOT / "docs" / "pipelines.md").read_text()
    section = text.split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("jq") is None, reason="needs jq (.ci/run installs it)")
def test_the_pipeline_examples_run_as_written(tmp_path):
    (tmp_path / "sample_data").mkdir()
    shutil.copy(SAMPLE, tmp_path / "sample_data" / "rollouts.parquet")
    commands = pipeline_examples()
    assert len(commands) == 4
    outputs = []
    for command in commands:
        result = shell(command, tmp_path)
        assert result.returncode == 0, (command, result.stderr.decode())
        outputs.append(result.stdout.decode().strip())
    assert pl.read_parquet(tmp_path / "advantages.parquet").height == 1553
    assert outputs[1] == "1553"
    assert float(outputs[2]) > 0
    assert outputs[3] == "32"  # 4 groups of 8 rollouts

"""verl's own ``trainer.rollout_data_dir`` files, read with no options.

The files are written here as verl 0.9.1 writes them (``verl/trainer/ppo/v1/trainer_base.py``):
``_log_rollout_data`` (l.1297-1340) sorts the outputs by their key ``{prompt uuid}_{session}_
{output index}`` (compared as (text, int, int)), sums each output's ``rm_scores`` and passes the
keys as the extra field ``uid``; ``_write_generations`` (l.1226-1258) writes
``{global_steps}.jsonl``, one JSON object a line: ``input, output, gts, score, step`` and the
extra fields. The legacy ``RayPPOTrainer`` (``ray_trainer.py``) writes the same fields without
``uid``, after ``balance_batch`` reordered the rows. Where verl installs, its own
``_write_generations`` writes the file the tests compare this one with.

Expected advantages come from tests/reference.py: verl's v1 GRPO scores a session by its final
output (``compute_advantage_for_multi_trajectories``, ``verl/trainer/ppo/v1/utils.py``), the
reference's ``traj_score="last"``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from conftest import error_line, watched
from reference import reference_advantages

STEP = 7


def v1_outputs(seed: int, prompts: int = 4) -> list[tuple[str, int, int, float]]:
    """(prompt uuid, session, output index, score) of a v1 batch: each prompt's sessions end
    after 1 to 3 outputs; only a session's final output is scored by the reward (others 0 or a
    partial score), and a uuid holds '_' and '-' as a real one may not, to test the split."""
    rng = random.Random(seed)
    outputs = []
    for prompt in range(prompts):
        uuid = f"9f1c-{prompt}_x" if prompt == 1 else f"9f1c-4e2a-{prompt:04d}"
        for session in range(rng.randint(2, 5)):
            last = rng.randint(0, 2)
            for index in range(last + 1):
                score = float(rng.randint(0, 1)) if index == last else rng.choice([0.0, 0.25])
                outputs.append((uuid, session, index, score))
    rng.shuffle(outputs)  # the order outputs come back in; verl sorts them before it writes
    return outputs


def v1_lines(outputs: list[tuple[str, int, int, float]], step: int = STEP) -> list[dict]:
    """The JSON objects ``_log_rollout_data`` hands ``_write_generations``, in its order."""
    ordered = sorted(outputs, key=lambda output: (output[0], output[1], output[2]))
    return [
        {
            "input": f"question {uuid}",
            "output": f"answer {session}.{index}",
            "gts": "42",
            "score": score,
            "step": step,
            "uid": f"{uuid}_{session}_{index}",
        }
        for uuid, session, index, score in ordered
    ]


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def rows_of(lines: list[dict]) -> list[tuple[str, str, int, float, int]]:
    """The reference's rows: verl's own split of each key (rsplit("_", 2))."""
    rows = []
    for line in lines:
        uuid, session, index = line["uid"].rsplit("_", 2)
        rows.append((uuid, session, int(index), line["score"], 0))
    return rows


def test_the_lines_are_the_ones_verls_own_writer_writes(tmp_path):
    trainer_base = pytest.importorskip("verl.trainer.ppo.v1.trainer_base")
    lines = v1_lines(v1_outputs(seed=3))
    trainer_base.PPOTrainer._write_generations(
        [line["input"] for line in lines],
        [line["output"] for line in lines],
        [line["gts"] for line in lines],
        [line["score"] for line in lines],
        {"uid": [line["uid"] for line in lines]},
        str(tmp_path / "verl"),
        STEP,
    )
    ours = write_lines(tmp_path / "ours" / f"{STEP}.jsonl", lines)
    assert (tmp_path / "verl" / f"{STEP}.jsonl").read_text() == ours.read_text()


def test_v1_dump_counts_verls_groups_and_sessions(run, tmp_path):
    lines = v1_lines(v1_outputs(seed=1))
    dump = write_lines(tmp_path / "rollouts" / f"{STEP}.jsonl", lines)
    result = run("compare", dump, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    keys = [line["uid"].rsplit("_", 2) for line in lines]
    assert report["counts"]["rows"] == len(lines)
    assert report["counts"]["groups"] == len({uuid for uuid, _, _ in keys})
    assert report["counts"]["trajectories"] == len({(uuid, s) for uuid, s, _ in keys})
    reading = report["settings"]["reading"]
    assert reading["trainer"] == "verl"
    assert reading["read_as"].startswith("verl's trainer.rollout_data_dir dump of the v1 trainer")
    assert [reading["roles"][role]["column"] for role in ("group", "trajectory", "turn")] == [
        "uid:prompt",
        "uid:session",
        "uid:output",
    ]
    assert "the prompt uuid" in reading["roles"]["group"]["why"]
    assert any("final output" in note and "--traj-score last" in note for note in reading["notes"])
    assert any("'step' is the training step" in note for note in reading["notes"])


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_v1_advantages_are_verls_final_output_rule(run, tmp_path, seed):
    lines = v1_lines(v1_outputs(seed))
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(out)
    # The file's columns and advcli's: none of those the reading makes from 'uid'.
    assert written.columns == ["input", "output", "gts", "step", "uid", "score", "advantage"]
    assert written["uid"].to_list() == [line["uid"] for line in lines]
    expected = reference_advantages(
        rows_of(lines), level="trajectory", estimator="grpo", traj_score="last"
    )
    assert written["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_v1_turn_level_reads_each_output_alone(run, tmp_path):
    lines = v1_lines(v1_outputs(seed=4))
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", "--level", "turn", "-q")
    assert result.exit_code == 0, result.stderr
    expected = reference_advantages(rows_of(lines), level="turn", estimator="grpo")
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_another_traj_score_replaces_verls_rule(run, tmp_path):
    lines = v1_lines(v1_outputs(seed=2))
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", "--traj-score", "max", "-q")
    assert result.exit_code == 0, result.stderr
    expected = reference_advantages(
        rows_of(lines), level="trajectory", estimator="grpo", traj_score="max"
    )
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


def test_inspect_scores_a_session_by_its_final_output(run, tmp_path):
    lines = v1_lines([("u", 0, 0, 0.0), ("u", 0, 1, 1.0), ("u", 1, 0, 0.0)])
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    result = run("inspect", dump, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["trajectory_scores"]["values"] == {"0": 1, "1": 1}
    assert report["inconsistent_trajectories"]["count"] == 1
    assert "final output" in report["inconsistent_trajectories"]["rule"]


def legacy_lines(seed: int) -> list[dict]:
    """A legacy trainer's dump: rollout.n = 4 rollouts of each prompt, no ids, rows reordered
    (balance_batch), extra reward fields beside them."""
    rng = random.Random(seed)
    lines = [
        {
            "input": f"question {prompt}",
            "output": f"answer {rollout}",
            "gts": ["42"],
            "score": float(rng.randint(0, 1)),
            "step": STEP,
            "acc": True,
        }
        for prompt in range(5)
        for rollout in range(4)
    ]
    rng.shuffle(lines)
    return lines


def test_legacy_dump_groups_the_rows_of_one_input(run, tmp_path):
    lines = legacy_lines(seed=1)
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    out = tmp_path / "out.parquet"
    result = run("compute", dump, "-o", out, "--no-tokens", "-q")
    assert result.exit_code == 0, result.stderr
    rows = [(line["input"], row, 0, line["score"], 0) for row, line in enumerate(lines)]
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)

    report = json.loads(run("compare", dump, "--json", "-").stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (5, 20)
    reading = report["settings"]["reading"]
    assert reading["roles"]["group"]["column"] == "input:hash"
    assert "one 'input' text" in reading["roles"]["group"]["why"]
    assert reading["roles"]["trajectory"]["column"] is None
    assert "each row is a trajectory" in reading["roles"]["trajectory"]["why"]
    assert not any("differ in size" in note for note in reading["notes"])


def test_legacy_groups_of_unequal_size_are_said(run, tmp_path):
    """Two prompts of one text make one group of 8 where verl has two of 4."""
    lines = legacy_lines(seed=2)
    for line in lines:
        if line["input"] == "question 4":
            line["input"] = "question 3"
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    report = json.loads(run("compare", dump, "--json", "-").stdout)
    notes = report["settings"]["reading"]["notes"]
    assert any("differ in size (3 of 4 rows, 1 of 8 rows)" in note for note in notes)


@pytest.mark.parametrize("key", ["nosplit", "u_0", "u_0_x", "u_0_99999999999999999999"])
def test_a_key_verl_would_not_split_is_refused_at_its_line(run, tmp_path, key):
    lines = v1_lines([("u", 0, 0, 1.0), ("u", 1, 0, 0.0)])
    lines[1]["uid"] = key
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    line = error_line(run("compare", dump))
    assert f"{STEP}.jsonl row 1: column 'uid' is not verl's output key" in line


def test_a_null_key_is_refused(run, tmp_path):
    lines = v1_lines([("u", 0, 0, 1.0), ("u", 1, 0, 0.0)])
    lines[0]["uid"] = None
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    assert "row 0: column 'uid' is null" in error_line(run("compare", dump))


def test_a_key_of_numbers_is_refused(run, tmp_path):
    lines = v1_lines([("u", 0, 0, 1.0), ("u", 1, 0, 0.0)])
    for number, line in enumerate(lines):
        line["uid"] = number
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    line = error_line(run("inspect", dump))
    assert "column 'uid' holds Int64, where verl's trainer.rollout_data_dir dump keys" in line


def test_a_truncated_line_is_refused(run, tmp_path):
    dump = write_lines(tmp_path / f"{STEP}.jsonl", v1_lines(v1_outputs(seed=1)))
    text = dump.read_text()
    dump.write_text(text[: len(text) - 30])
    line = error_line(run("compare", dump))
    assert f"{STEP}.jsonl" in line and "not valid JSON" in line


def test_a_column_named_as_a_made_one_is_refused(run, tmp_path):
    lines = v1_lines([("u", 0, 0, 1.0), ("u", 1, 0, 0.0)])
    for line in lines:
        line["uid:session"] = 0
    dump = write_lines(tmp_path / f"{STEP}.jsonl", lines)
    assert "a column is named 'uid:session'" in error_line(run("compare", dump))


def test_a_folder_of_steps_by_file(run, tmp_path):
    folder = tmp_path / "rollouts"
    steps = {step: v1_lines(v1_outputs(seed=step), step=step) for step in (1, 2, 10)}
    for step, lines in steps.items():
        write_lines(folder / f"{step}.jsonl", lines)
    result = run("compare", folder, "--by", "file", "--json", "-")
    assert result.exit_code == 0, result.stderr
    series = json.loads(result.stdout)["by_step"]["steps"]
    assert [entry["step"] for entry in series] == [1, 2, 10]
    for entry, lines in zip(series, steps.values(), strict=True):
        assert entry["rows"] == len(lines)
    jobs = run("compare", folder, "--by", "file", "--jobs", "2", "--json", "-")
    assert jobs.exit_code == 0, jobs.stderr
    assert json.loads(jobs.stdout)["by_step"] == json.loads(result.stdout)["by_step"]

    out = tmp_path / "out.parquet"
    computed = run("compute", folder, "--by", "file", "-o", out, "--no-tokens", "-q")
    assert computed.exit_code == 0, computed.stderr
    expected = [
        value
        for lines in steps.values()
        for value in reference_advantages(
            rows_of(lines), level="trajectory", estimator="grpo", traj_score="last"
        )
    ]
    assert pl.read_parquet(out)["advantage"].to_list() == pytest.approx(expected, abs=1e-5)


@pytest.mark.process
def test_watch_takes_each_step_file_as_verl_writes_it(tmp_path):
    folder = tmp_path / "rollouts"
    steps = {step: v1_lines(v1_outputs(seed=step), step=step) for step in (1, 2)}
    write_lines(folder / "1.jsonl", steps[1])
    lines = watched(folder, 2, lambda: write_lines(folder / "2.jsonl", steps[2]))
    reports = [json.loads(line) for line in lines]
    assert [(report["step"], report["rows"]) for report in reports] == [
        (step, len(lines)) for step, lines in steps.items()
    ]
    assert reports[0]["reading"]["read_as"].startswith("verl's trainer.rollout_data_dir dump")


def test_a_folder_mixing_two_layouts_names_both(run, tmp_path):
    """A v1 step file beside a legacy one (or another trainer's dump) in one folder."""
    folder = tmp_path / "rollouts"
    write_lines(folder / "1.jsonl", v1_lines(v1_outputs(seed=1), step=1))
    legacy = [
        {key: value for key, value in line.items() if key != "uid"}
        for line in v1_lines(v1_outputs(seed=2), step=2)
    ]
    write_lines(folder / "2.jsonl", legacy)
    line = error_line(run("compare", folder, "--by", "file"))
    assert line == (
        f"Error: {folder / '2.jsonl'}: verl's trainer.rollout_data_dir dump (no ids: each row a "
        f"trajectory), but {folder / '1.jsonl'}: verl's trainer.rollout_data_dir dump of the v1 "
        "trainer (each output keyed in 'uid'); read one layout's files at a time"
    )


def test_options_naming_the_ids_read_the_file_by_them(run, tmp_path):
    """A dump of one's own with verl's text fields and a 'uid' of its own: the options win."""
    lines = [
        {
            "input": "q",
            "output": "a",
            "score": float(row % 2),
            "uid": f"p{row // 4}",
            "rollout": row,
        }
        for row in range(8)
    ]
    dump = write_lines(tmp_path / "mine.jsonl", lines)
    result = run("compare", dump, "--group-col", "uid", "--traj-col", "rollout", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counts"]["groups"], report["counts"]["trajectories"]) == (2, 8)
    reading = report["settings"]["reading"]
    assert reading["read_as"] == "verl's layout"
    assert any(
        "the options name the ids, so the file is read by them" in n for n in reading["notes"]
    )

"""``advcli watch DIR`` (and ``compare DIR --by file --follow``, where it began): each step file
reported as it appears, in a real process
while files are written beside it (by ``write_batch``, and by a plain writer in place), its
lines equal to ``compare --by file``'s steps; Ctrl-C, ``--fail-on`` and a bad file end it.

The dumps' levels are computed by hand in tests/cli/test_fail_on.py (drgrpo): NEGLIGIBLE, MATERIAL
and SEVERE."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, dump_frame, write_read_otherwise
from test_fail_on import MATERIAL, NEGLIGIBLE, SEVERE

from advcli.dump import write_batch
from advcli.write.atomic import published_whole

TIMEOUT = 60


def batch(rows):
    """A mapping batch for ``write_batch`` from (group, trajectory, turn, score, tokens) rows of
    two tokens each, the score on the last."""
    return {
        "uid": np.array([r[0] for r in rows], dtype=object),
        "traj_uid": np.array([r[1] for r in rows], dtype=object),
        "turn_index": np.array([r[2] for r in rows]),
        "token_level_rewards": np.array([[0.0, r[3]] for r in rows], dtype=np.float32),
        "response_mask": np.ones((len(rows), 2), dtype=np.int64),
    }


class Follower:
    """``advcli watch FOLDER`` (or with ``alias``, ``advcli compare FOLDER --by file --follow``)
    in its own process, its standard output read line by line as it comes."""

    def __init__(self, folder: Path, *options: object, alias: bool = False) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
        command = ("compare", folder, "--by", "file", "--follow") if alias else ("watch", folder)
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "advcli", *command),
                *("--estimator", "drgrpo", *map(str, options)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def line(self) -> str:
        return self.lines.get(timeout=TIMEOUT)

    def end(self) -> tuple[int, str, list[str]]:
        """Wait for the process to end: its exit code, standard error and the lines not read."""
        code = self.process.wait(timeout=TIMEOUT)
        self.reader.join(TIMEOUT)
        assert self.process.stderr is not None
        stderr = self.process.stderr.read()
        self.close()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return code, stderr, rest

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(TIMEOUT)
        for stream in (self.process.stdout, self.process.stderr):
            assert stream is not None
            stream.close()


@pytest.fixture
def follower():
    started: list[Follower] = []

    def start(folder: Path, *options: object, alias: bool = False) -> Follower:
        started.append(Follower(folder, *options, alias=alias))
        return started[-1]

    yield start
    for one in started:
        one.close()


def steps_of_whole_run(run, folder: Path) -> list[dict]:
    """``compare FOLDER --by file``'s steps, the run not followed, each with the run's reading
    (a file without rows with none): a line of --follow names how its step was read."""
    result = run("compare", folder, "--by", "file", "--estimator", "drgrpo", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    reading = report["settings"]["reading"]
    steps = report["by_step"]["steps"]
    return [{**step, "reading": reading if step["rows"] else None} for step in steps]


@pytest.mark.process
def test_published_files_are_reported_at_once_and_ctrl_c_ends_it(follower, run, tmp_path):
    folder = tmp_path / "run"
    write_batch(batch(MATERIAL), folder, step=2)
    write_batch(batch(NEGLIGIBLE), folder, step=1)
    # A settle time no test waits for: the new step arrives because write_batch published it.
    follow = follower(folder, "--jsonl", "-", "--settle", 600, "-q")
    first, second = json.loads(follow.line()), json.loads(follow.line())
    # The ones there first, in --by file's order (by step), each named by its step.
    assert [first["step"], second["step"]] == [1, 2]
    write_batch(batch(SEVERE), folder, step=3)
    third = json.loads(follow.line())
    assert [first, second, third] == steps_of_whole_run(run, folder)
    assert [step["level"] for step in (first, second, third)] == [
        "negligible",
        "material",
        "severe",
    ]
    follow.process.send_signal(signal.SIGINT)
    code, stderr, rest = follow.end()
    assert (code, rest) == (130, [])
    assert stderr == "Interrupted; no partial output was left behind.\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "run",
        "step-00000001.parquet",
        "step-00000002.parquet",
        "step-00000003.parquet",
    ]


@pytest.mark.process
def test_a_file_written_in_place_is_read_once_it_settles(follower, run, tmp_path):
    folder, lines = tmp_path / "run", tmp_path / "steps.jsonl"
    folder.mkdir()
    settle = 1.0
    # The folder is empty when the watch starts: it waits for the run's first step.
    follow = follower(folder, "--jsonl", lines, "--settle", settle)
    source = tmp_path / "source.parquet"
    pl.DataFrame(batch(SEVERE)).write_parquet(source)
    data = source.read_bytes()
    source.unlink()
    step = folder / "step-1.parquet"
    with open(step, "wb") as handle:
        # Pauses shorter than the settle time: the half-written file is never read.
        for start in range(0, len(data), len(data) // 4 + 1):
            handle.write(data[start : start + len(data) // 4 + 1])
            handle.flush()
            time.sleep(0.3)
    written = time.monotonic()
    deadline = written + TIMEOUT
    while not lines.exists() or not lines.read_text():
        assert time.monotonic() < deadline, "the step was not reported"
        time.sleep(0.02)
    assert time.monotonic() - written >= settle - 0.3  # the last pause counts toward it
    assert [json.loads(line) for line in lines.read_text().splitlines()] == steps_of_whole_run(
        run, folder
    )
    follow.process.send_signal(signal.SIGINT)
    code, _, _ = follow.end()
    assert code == 130
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["run", "step-1.parquet", "steps.jsonl"]


@pytest.mark.process
@pytest.mark.parametrize(
    ("gate", "reason"),
    [
        (("--fail-on", "material"), " (severe) reaches --fail-on material"),
        # SEVERE's largest |diff| is 1/6.
        (
            ("--fail-above", "0.1"),
            ": the largest advantage difference 0.1667 exceeds --fail-above 0.1",
        ),
    ],
)
def test_the_first_step_that_trips_the_gate_ends_it_with_exit_3(
    gate, reason, follower, write_dump, tmp_path
):
    folder = tmp_path / "run"
    folder.mkdir()
    for number, rows in enumerate([NEGLIGIBLE, SEVERE, SEVERE, NEGLIGIBLE]):
        write_dump(rows, f"run/step-{number}.parquet")
    code, stderr, lines = follower(folder, "--jsonl", "-", "--settle", 0, "-q", *gate).end()
    assert code == 3, stderr
    # The step that trips it is reported, and none after it.
    assert [json.loads(line)["level"] for line in lines] == ["negligible", "severe"]
    assert stderr == f"advcli watch: step 1{reason}\n"


@pytest.mark.process
def test_the_terminal_shows_a_row_per_step(follower, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(NEGLIGIBLE, "run/step-0.parquet")
    write_dump(SEVERE, "run/step-1.parquet")
    code, stderr, lines = follower(folder, "--settle", 0, "--fail-on", "severe").end()
    assert code == 3, stderr
    # How the steps are read, once, above the first row.
    split = [line.split() for line in lines]
    starts = [index for index, words in enumerate(split) if words[:3] == ["step", "rows", "trajs"]]
    assert len(starts) == 1, lines
    reading, (_, *rows) = lines[: starts[0]], split[starts[0] :]
    assert reading[0].strip() == "How the dump was read"
    # Its cells stand between rich's column rules: the role, then its column.
    assert any(line.split()[::2][:2] == ["group", "data_id"] for line in reading), reading
    assert [(row[0], row[1], row[2], row[-1]) for row in rows] == [
        ("0", "2", "2", "negligible"),
        ("1", "3", "2", "severe"),
    ]


@pytest.mark.process
def test_a_bad_step_file_ends_it_with_one_error_naming_the_file(follower, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(NEGLIGIBLE, "run/step-0.parquet")
    (folder / "step-1.parquet").write_bytes(b"not a parquet file")
    code, stderr, lines = follower(folder, "--jsonl", "-", "--settle", 0, "-q").end()
    assert code == 1
    assert [json.loads(line)["step"] for line in lines] == [0]
    assert stderr.startswith(f"Error: {folder / 'step-1.parquet'}")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    # Taken once it settled, not published whole: it may have been still being written.
    assert stderr.endswith(
        "(the file was taken once unchanged for --settle 0 s: if it was still being written, a "
        "longer --settle waits for it)\n"
    )


def test_a_settled_file_written_again_is_watched_again(tmp_path):
    """A writer that paused longer than --settle: the file taken (its read then failing) has
    changed since, so it is watched again, not reported as broken; one unchanged is not."""
    from advcli.run.follow import _Watch

    folder = tmp_path / "run"
    folder.mkdir()
    half = folder / "step-1.parquet"
    half.write_bytes(b"PAR1 half")
    watch = _Watch(settle=0.0)
    assert watch.complete(folder) == [half]
    assert not watch.written_since(half)
    with half.open("ab") as handle:
        handle.write(b" and the rest")
    assert watch.written_since(half)
    assert watch.complete(folder) == [half]


@pytest.mark.process
def test_a_step_read_otherwise_than_the_first_ends_it(follower, tmp_path):
    """Each line says how its step was read, and every step is read as the first was: a step
    whose values read its columns otherwise ends the watch, naming both files."""
    first, second = write_read_otherwise(tmp_path / "run")
    code, stderr, lines = follower(first.parent, "--jsonl", "-", "--settle", 0, "-q").end()
    assert code == 1
    (line,) = lines
    step = json.loads(line)
    assert step["step"] == 0
    assert step["reading"]["roles"]["trajectory"]["column"] is None
    assert stderr == (
        f"Error: {second}: read otherwise than {first} (trajectory: 'traj_id' here, none there); "
        "name the columns (--group-col, --traj-col, --turn-col, --reward-col, --mask-col) so "
        "that every file is read alike\n"
    )


@pytest.mark.process
def test_a_step_whose_values_say_nothing_is_read_as_the_first(follower, tmp_path):
    """The first step reads 'traj_id' as the trajectory; the second's ids are unique per row,
    which says nothing: it is read with the column named as the first step read it, and its
    line says so."""
    first, _ = write_read_otherwise(tmp_path / "run", repeating_first=True)
    follow = follower(first.parent, "--jsonl", "-", "--settle", 0, "-q")
    one, two = (json.loads(follow.line()) for _ in range(2))
    assert [one["trajectories"], two["trajectories"]] == [4, 6]
    assert two["reading"]["roles"]["trajectory"] == {
        "column": "traj_id",
        "why": f"named by the run's first part, {first}",
    }
    follow.process.send_signal(signal.SIGINT)
    assert follow.end()[0] == 130


@pytest.mark.process
def test_steps_padded_to_their_own_widths_are_read_alike(follower, tmp_path):
    """write_batch keeps a padded (batch, length) tensor as fixed-size arrays of that step's
    own width: steps of two widths are read alike."""
    folder = tmp_path / "run"
    write_batch(batch(MATERIAL), folder, step=1)
    wide = {**batch(SEVERE), "token_level_rewards": np.array([[0.0, 0.0, r[3]] for r in SEVERE])}
    wide["response_mask"] = np.ones((len(SEVERE), 3), dtype=np.int64)
    write_batch(wide, folder, step=2)
    follow = follower(folder, "--jsonl", "-", "--settle", 600, "-q")
    levels = [json.loads(follow.line())["level"] for _ in range(2)]
    assert levels == ["material", "severe"]
    follow.process.send_signal(signal.SIGINT)
    assert follow.end()[0] == 130


@pytest.mark.process
def test_a_step_of_another_layout_ends_it(follower, tmp_path):
    """The rewards a list of token rewards in one step and a scalar in the next: no column to
    name makes them alike, and the message says what differs."""
    folder = tmp_path / "run"
    folder.mkdir()
    common = {"uid": ["a", "a", "b", "b"], "traj_id": [0, 1, 2, 3]}
    rewards = [[1.0], [0.0], [1.0], [0.5]]
    pl.DataFrame({**common, "token_level_rewards": rewards}).write_parquet(folder / "s0.parquet")
    scalars = [reward[0] for reward in rewards]
    pl.DataFrame({**common, "token_level_rewards": scalars}).write_parquet(folder / "s1.parquet")
    code, stderr, lines = follower(folder, "--jsonl", "-", "--settle", 0, "-q").end()
    assert code == 1 and len(lines) == 1
    assert stderr == (
        f"Error: {folder / 's1.parquet'}: read otherwise than {folder / 's0.parquet'} (reward "
        "kind: a scalar here, token rewards there): every file must be of one layout\n"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--follow",), "--follow reports each step file as it appears: pass --by file"),
        (("--follow", "--by", "step"), "pass --by file"),
        (("--by", "file", "--settle", "1"), "--settle goes with --follow"),
        (("--by", "file", "--jsonl", "-"), "--jsonl goes with --follow"),
        (("--by", "file", "--follow", "--json", "r.json"), "--follow does not take --json"),
        (("--by", "file", "--follow", "--engine", "ray"), "--follow does not take --engine ray"),
        (
            ("--by", "file", "--follow", "--jobs", "2"),
            "--follow does not take --engine ray or --jobs",
        ),
        (("--by", "file", "--follow", "EXTRA"), "--follow watches one folder"),
        (("--by", "file", "--follow", "--settle", "-1"), "greater than or equal to 0"),
        (
            ("--by", "file", "--follow", "--jsonl", "INSIDE"),
            "is inside the watched folder",
        ),
    ],
)
def test_follow_misused_is_a_usage_error(options, message, run, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    stand_ins = {"EXTRA": tmp_path / "other", "INSIDE": folder / "steps.jsonl"}
    args = [stand_ins.get(option, option) for option in options]
    result = run("compare", folder, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.replace("│", " ").split())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ((), "Missing argument 'DIR'"),
        (("FOLDER", "EXTRA"), "Got unexpected extra argument"),
        (("FOLDER", "--jsonl", "INSIDE"), "is inside the watched folder"),
        (("FOLDER", "--settle", "-1"), "greater than or equal to 0"),
        (("FOLDER", "--fail-above", "-1"), "must be a finite number, 0 or more"),
        (("FOLDER", "--json", "r.json"), "No such option: --json"),
        (("FOLDER", "--by", "file"), "No such option: --by"),
        (("FOLDER", "--engine", "ray"), "No such option: --engine"),
    ],
)
def test_watch_misused_is_a_usage_error(options, message, run, tmp_path):
    """watch takes one folder and only the options that apply to a run that never ends."""
    folder = tmp_path / "run"
    folder.mkdir()
    stand_ins = {"FOLDER": folder, "EXTRA": tmp_path / "other", "INSIDE": folder / "s.jsonl"}
    result = run("watch", *[stand_ins.get(option, option) for option in options])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.replace("│", " ").split())


def test_watch_of_a_file_or_of_no_folder_is_an_error(write_dump, run, tmp_path):
    path = write_dump(NEGLIGIBLE)
    result = run("watch", path)
    assert result.exit_code == 1
    assert (
        result.stderr == f"Error: {path}: a watch takes a folder of step files; this is not one\n"
    )
    missing = tmp_path / "not-yet"
    result = run("watch", missing)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {missing}: no such folder (a watch takes a folder of step files)\n"
    )


@pytest.mark.process
def test_compare_follow_runs_the_watch_and_says_where_it_moved(follower, write_dump, tmp_path):
    """The alias reports the steps watch reports, after one line on standard error, and its
    gate names the command that was run."""
    folder = tmp_path / "run"
    folder.mkdir()
    for number, rows in enumerate([NEGLIGIBLE, SEVERE]):
        write_dump(rows, f"run/step-{number}.parquet")
    options = ("--jsonl", "-", "--settle", 0, "-q", "--fail-on", "severe")
    code, stderr, lines = follower(folder, *options, alias=True).end()
    watched = follower(folder, *options).end()
    assert (code, lines) == (3, watched[2]) and watched[0] == 3
    assert stderr == (
        "advcli compare --follow is now advcli watch DIR (the same options, without --by file)\n"
        "advcli compare: step 1 (severe) reaches --fail-on severe\n"
    )


@pytest.mark.process
def test_a_step_file_without_rows_keeps_its_place(follower, run, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    write_dump(dump_frame(SEVERE).head(0), "run/step-1.parquet")
    write_dump(MATERIAL, "run/step-2.parquet")
    follow = follower(folder, "--jsonl", "-", "--settle", 0, "-q")
    lines = [json.loads(follow.line()) for _ in range(3)]
    assert lines[1] == {
        "step": 1,
        "rows": 0,
        "trajectories": 0,
        "baseline_shift_mean": None,
        "advantage_diff_mean": None,
        "advantage_diff_max": None,
        "sign_flips": 0,
        "token_mean_longest_vs_shortest": None,
        "level": None,
        "reading": None,
    }
    assert lines == steps_of_whole_run(run, folder)


def test_the_published_mark_vouches_only_for_the_file_as_published(tmp_path):
    path = write_batch(batch(SEVERE), tmp_path, step=1).path
    assert published_whole(path)
    # The same bytes written again in place: the file may have been half-written meanwhile.
    data = path.read_bytes()
    time.sleep(0.01)
    with open(path, "r+b") as handle:
        handle.write(data)
    assert not published_whole(path)
    plain = tmp_path / "plain.parquet"
    plain.write_bytes(data)
    assert not published_whole(plain)


@pytest.mark.process
def test_the_jsonl_file_is_not_replaced_without_force(follower, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    lines = tmp_path / "steps.jsonl"
    lines.write_text("kept\n")
    code, stderr, _ = follower(folder, "--jsonl", lines, "--settle", 0).end()
    assert (code, stderr) == (1, f"Error: {lines}: the file exists; pass --force to replace it\n")
    assert lines.read_text() == "kept\n"
    follow = follower(folder, "--jsonl", lines, "--settle", 0, "--force", "--fail-on", "severe")
    code, stderr, _ = follow.end()
    assert code == 3, stderr
    assert [json.loads(line)["level"] for line in lines.read_text().splitlines()] == ["severe"]


@pytest.mark.process
def test_force_replaces_the_jsonl_files_name_never_the_bytes_of_another_name(
    follower, write_dump, tmp_path
):
    """--force renames a new file over the path: a file the path is a hard link to keeps its
    bytes, and a symbolic link is replaced, its target kept."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    kept, linked = tmp_path / "kept.txt", tmp_path / "steps.jsonl"
    kept.write_text("mine\n")
    os.link(kept, linked)
    symlinked = tmp_path / "steps-via-link.jsonl"
    symlinked.symlink_to(kept)
    for lines in (linked, symlinked):
        follow = follower(folder, "--jsonl", lines, "--settle", 0, "--force", "--fail-on", "severe")
        code, stderr, _ = follow.end()
        assert code == 3, stderr
        assert [json.loads(line)["level"] for line in lines.read_text().splitlines()] == ["severe"]
        assert not lines.is_symlink()
    assert kept.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_jsonl_path_that_is_a_step_file_under_another_name_is_refused(
    run, write_dump, tmp_path, link
):
    folder = tmp_path / "run"
    folder.mkdir()
    step = write_dump(SEVERE, "run/step-0.parquet")
    before = step.read_bytes()
    lines = tmp_path / "steps.jsonl"
    if link == "hard":
        os.link(step, lines)
    else:
        lines.symlink_to(step)
    result = run("watch", folder, "--jsonl", lines, "--force", "--settle", 0)
    if link == "hard":
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: {lines}: it is {step} of the watched folder under another name (the same "
            "file); write the lines elsewhere\n"
        )
    else:
        assert result.exit_code == 2
        assert "is inside the watched folder" in result.stderr
    assert step.read_bytes() == before


@pytest.mark.process
def test_lines_go_to_a_device_as_they_come(follower, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    code, stderr, _ = follower(
        folder, "--jsonl", "/dev/null", "--settle", 0, "--fail-on", "severe"
    ).end()
    assert code == 3, stderr


@pytest.mark.process
def test_a_watched_folder_removed_ends_the_watch_with_an_error(follower, write_dump, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    follow = follower(folder, "--jsonl", "-", "--settle", 0, "-q")
    assert json.loads(follow.line())["step"] == 0
    shutil.rmtree(folder)
    code, stderr, rest = follow.end()
    assert (code, rest) == (1, [])
    assert stderr == (
        f"Error: {folder}: the watched folder was removed (or replaced by a file); the watch ends\n"
    )


@pytest.mark.process
def test_subfolders_that_come_and_go_while_listed_do_not_end_the_watch(
    follower, write_dump, tmp_path
):
    folder = tmp_path / "run"
    folder.mkdir()
    write_dump(SEVERE, "run/step-0.parquet")
    follow = follower(folder, "--jsonl", "-", "--settle", 0, "-q")
    assert json.loads(follow.line())["step"] == 0
    # A trainer's scratch folders, made and removed many times while the watch lists.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        scratch = folder / "scratch" / "a" / "b"
        scratch.mkdir(parents=True)
        (scratch / "x.tmp").write_text("x")
        shutil.rmtree(folder / "scratch")
    write_dump(SEVERE, "run/step-1.parquet")
    assert json.loads(follow.line())["step"] == 1
    assert follow.process.poll() is None

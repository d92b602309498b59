"""Issue 13, part 1: advcli never deletes or overwrites a file it did not create.

Publishing is no-replace unless --force (whatever the filesystem offers), the stale-partial
cleanup removes only what advcli provably made, and names close to the filesystem's limit work.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import dump_frame, fifo_reader

from advcli.errors import AdvcliError
from advcli.names import native_name
from advcli.write import atomic
from advcli.write.atomic import MARKER, PARTIAL_SUFFIX, atomic_output

ROWS = [(0, "a", 0, 1.0, 2), (0, "a", 1, 1.0, 2), (0, "b", 0, 0.0, 2), (1, "a", 0, 0.5, 2)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def partials(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{PARTIAL_SUFFIX}*"))


def dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(finished.stdout)


# ---------------------------------------------------------------------------------------------
# The stale-partial cleanup


@pytest.mark.process
def test_an_input_named_like_a_partial_is_read_and_never_deleted(run, write_dump, tmp_path):
    output = tmp_path / "out.parquet"
    # The name a killed run's partial of out.parquet would have, with a PID that is gone.
    prefix = atomic._partial_prefix(output)
    lookalike = tmp_path / f"{prefix}{dead_pid()}.1a2b3c4d{PARTIAL_SUFFIX}"
    write_dump(ROWS, name=lookalike.name)
    before = sha256(lookalike)

    result = run("compute", lookalike, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert sha256(lookalike) == before
    assert pl.read_parquet(output).height == len(ROWS)


@pytest.mark.process
def test_unmarked_and_copied_partials_are_left_alone(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    output = tmp_path / "out.parquet"
    pid, prefix, machine = dead_pid(), atomic._partial_prefix(output), atomic._machine()
    unmarked = tmp_path / f"{prefix}{pid}.00000000{PARTIAL_SUFFIX}"
    unmarked.write_bytes(b"a user's file with an unlucky name")
    # A copy of a dead run's partial, marker and all: the marker names another inode.
    copied = tmp_path / f"{prefix}{pid}.11111111{PARTIAL_SUFFIX}"
    copied.write_bytes(b"copied")
    os.setxattr(copied, MARKER, f"{pid} {os.stat(unmarked).st_ino} {machine}".encode())
    # A partial written in another PID namespace (a container sharing the folder): its PID
    # means nothing here, so it is not taken for dead.
    elsewhere = tmp_path / f"{prefix}{pid}.22222222{PARTIAL_SUFFIX}"
    elsewhere.write_bytes(b"another namespace's run")
    other = machine.rsplit("/", 1)[0] + "/1"
    os.setxattr(elsewhere, MARKER, f"{pid} {os.stat(elsewhere).st_ino} {other}".encode())

    result = run("compute", source, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert unmarked.read_bytes() == b"a user's file with an unlucky name"
    assert copied.read_bytes() == b"copied"
    assert elsewhere.read_bytes() == b"another namespace's run"


def kill_while_publishing(output: Path) -> None:
    """A real process that starts publishing ``output`` and is killed half-way."""
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from pathlib import Path\n"
            "from advcli.write.atomic import atomic_output\n"
            "with atomic_output(Path(sys.argv[1])) as partial:\n"
            "    partial.write_bytes(b'half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n",
            str(output),
        ],
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL


@pytest.mark.process
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("a", "a.b"), ("n" * 240 + "1.parquet", "n" * 240 + "2.parquet")],
    ids=["prefix", "long-names"],
)
def test_only_the_same_outputs_partials_are_cleaned(ours, theirs, run, write_dump, tmp_path):
    kill_while_publishing(tmp_path / theirs)
    [leftover] = partials(tmp_path)
    result = run("compute", write_dump(ROWS), "-o", tmp_path / ours, "--format", "parquet", "-q")
    assert result.exit_code == 0, result.stderr
    assert leftover.exists()


def test_devices_are_written_directly_and_never_replaced(run, write_dump, tmp_path):
    """/dev/null (here through a link), with or without --force: written into, not renamed
    over, and named twice in one run."""
    output = tmp_path / "out.parquet"
    output.symlink_to("/dev/null")
    for force in ([], ["--force"]):
        result = run("compute", write_dump(ROWS), "-o", output, "-q", *force)
        assert result.exit_code == 0, result.stderr
        assert output.is_symlink() and os.readlink(output) == "/dev/null"
    result = run("compare", write_dump(ROWS), "--json", "/dev/null", "--markdown", "/dev/null")
    assert result.exit_code == 0, result.stderr
    assert partials(tmp_path) == []


def test_a_named_pipe_gets_the_output_as_it_is_written(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    regular = tmp_path / "regular.parquet"
    assert run("compute", source, "-o", regular, "-q").exit_code == 0
    fifo = tmp_path / "out.parquet"
    with fifo_reader(fifo) as received:
        result = run("compute", source, "-o", fifo, "--format", "parquet", "-q")
    assert result.exit_code == 0, result.stderr
    assert fifo.is_fifo()
    assert pl.read_parquet(io.BytesIO(received[0])).equals(pl.read_parquet(regular))


def test_a_named_pipe_is_held_open_while_polars_opens_it_twice(tmp_path):
    """Polars opens its output twice (to create it, then to write it). A reader that took the
    first close for the end of the data would be gone, and the second open would wait for a
    reader forever: held open through the block, the pipe ends once, when the block does."""
    fifo = tmp_path / "out.parquet"
    with fifo_reader(fifo) as received, native_name(fifo) as name:
        for part in (b"created", b"written"):
            # An open that does not wait: ENXIO, were the reader gone.
            writer = os.open(name, os.O_WRONLY | os.O_NONBLOCK)
            os.write(writer, part)
            os.close(writer)
            time.sleep(0.2)  # time for a reader to see the end of the data, were it the end
    assert received == [b"createdwritten"]


@pytest.mark.process
def test_dev_stdout_writes_to_the_file_standard_output_holds(write_dump, tmp_path):
    """/dev/stdout is a link into /proc: renamed over, it would replace the link; written into,
    it fills the file the shell redirected standard output to."""
    source = write_dump(ROWS)
    target = tmp_path / "via-stdout.parquet"
    with target.open("wb") as handle:
        finished = subprocess.run(
            [
                sys.executable,
                "-m",
                "advcli",
                "compute",
                str(source),
                "-o",
                "/dev/stdout",
                "--format",
                "parquet",
                "-q",
            ],
            stdout=handle,
            stderr=subprocess.PIPE,
        )
    assert finished.returncode == 0, finished.stderr
    assert pl.read_parquet(target).height == len(ROWS)
    assert os.path.islink("/dev/stdout")


@pytest.mark.process
def test_a_killed_runs_partial_is_removed_by_the_next_run(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    output = tmp_path / "out.parquet"
    kill_while_publishing(output)
    [leftover] = partials(tmp_path)

    result = run("compute", source, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert not leftover.exists()
    assert partials(tmp_path) == []


@pytest.mark.process
def test_a_live_runs_partial_is_left_alone(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    output = tmp_path / "out.parquet"
    # Another advcli process, alive and writing the same output.
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from advcli.write.atomic import atomic_output\n"
            "with atomic_output(Path(sys.argv[1])) as partial:\n"
            "    print(partial, flush=True)\n"
            "    time.sleep(60)\n",
            str(output),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = Path(writer.stdout.readline().strip())
        result = run("compute", source, "-o", output, "-q")
        assert result.exit_code == 0, result.stderr
        assert theirs.exists()
    finally:
        writer.kill()
        writer.communicate()


# ---------------------------------------------------------------------------------------------
# No-replace publishing


@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
def test_an_output_that_appears_during_the_run_is_kept(folder, tmp_path):
    output = tmp_path / "out.parquet"
    with pytest.raises(AdvcliError) as raised, atomic_output(output, folder=folder) as partial:
        if folder:
            (partial / "part-000000.parquet").write_bytes(b"ours")
        else:
            partial.write_bytes(b"ours")
        output.write_bytes(b"theirs: written by another process meanwhile")

    assert str(raised.value) == (
        f"{output}: the file appeared while advcli was writing; it was left as it is "
        "(pass --force to replace it)"
    )
    assert output.read_bytes() == b"theirs: written by another process meanwhile"
    assert partials(tmp_path) == []


def test_force_replaces_an_output_that_appears_during_the_run(tmp_path):
    output = tmp_path / "out.parquet"
    with atomic_output(output, force=True) as partial:
        partial.write_bytes(b"ours")
        output.write_bytes(b"theirs")
    assert output.read_bytes() == b"ours"
    assert partials(tmp_path) == []


class NoRenameat2:
    """A C library without renameat2 (older glibc, musl, other systems)."""


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "placeholder"])
def test_no_replace_fallbacks(links, monkeypatch, tmp_path):
    # The fallbacks run on this real filesystem; only the absence of renameat2 (and, for the
    # last one, of hard links) is simulated.
    monkeypatch.setattr(atomic, "_libc", NoRenameat2)
    if not links:

        def no_links(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
    output = tmp_path / "out.txt"
    with atomic_output(output) as partial:
        partial.write_text("first")
    assert output.read_text() == "first"

    with (
        pytest.raises(AdvcliError, match="appeared while advcli was writing"),
        atomic_output(output) as partial,
    ):
        partial.write_text("second")
    assert output.read_text() == "first"
    assert partials(tmp_path) == []


def test_a_dangling_link_at_the_output_is_replaced_only_with_force(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    output = tmp_path / "out.parquet"
    output.symlink_to(tmp_path / "missing" / "target.parquet")

    refused = run("compute", source, "-o", output, "-q")
    assert refused.exit_code == 1
    assert refused.stderr == f"Error: {output}: the file exists; pass --force to replace it\n"
    assert output.is_symlink()

    forced = run("compute", source, "-o", output, "-q", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert not output.is_symlink()
    assert pl.read_parquet(output).height == len(ROWS)
    assert not (tmp_path / "missing").exists()


def test_an_output_name_at_the_filesystem_limit_works(run, write_dump, tmp_path):
    source = write_dump(ROWS)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    output = tmp_path / ("n" * (limit - len(".parquet")) + ".parquet")
    assert len(output.name) == limit

    result = run("compute", source, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(output).height == len(ROWS)
    assert partials(tmp_path) == []


def test_a_multibyte_name_at_the_limit_works(run, write_dump, tmp_path):
    # The partial's copy of the name is cut on a character boundary, not inside one.
    source = write_dump(ROWS)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    stem = "é" * ((limit - len(".json")) // 2)
    output = tmp_path / f"{stem}.json"

    result = run("compare", source, "--json", output, "-q")

    assert result.exit_code == 0, result.stderr
    assert output.read_text().startswith("{")


# ---------------------------------------------------------------------------------------------
# An existing name is a file, not a pattern; an input is never replaced or removed


@pytest.mark.parametrize(
    ("name", "decoys"),
    [
        ("x[1].parquet", ["x1.parquet"]),
        ("y*.parquet", ["y1.parquet", "y2.parquet"]),
        ("z?.parquet", ["za.parquet"]),
    ],
)
def test_an_existing_name_with_glob_characters_is_that_file(name, decoys, run, tmp_path):
    named = [(0, "a", 0, 1.0, 2), (0, "b", 0, 0.0, 2)]
    decoy = [(7, "c", 0, 0.5, 2), (7, "d", 0, 0.25, 2), (8, "e", 0, 1.0, 2)]
    source = tmp_path / name
    dump_frame(named).write_parquet(source)
    for other in decoys:
        dump_frame(decoy).write_parquet(tmp_path / other)
    output = tmp_path / "out" / "advantages.parquet"
    output.parent.mkdir()

    result = run("compute", source, "-o", output, "-q", "--no-tokens")

    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(output)
    assert written["data_id"].to_list() == [0, 0]
    # GRPO over one group of scores 1 and 0: (score - 0.5) / (Bessel std sqrt(0.5) + 1e-6).
    expected = 0.5 / (0.5**0.5 + 1e-6)
    assert written["advantage"].to_list() == pytest.approx([expected, -expected], rel=1e-6)


def test_a_name_that_does_not_exist_is_still_a_glob(run, tmp_path):
    dump_frame([(0, "a", 0, 1.0, 2), (0, "b", 0, 0.0, 2)]).write_parquet(tmp_path / "x[1].parquet")
    dump_frame([(5, "a", 0, 1.0, 2), (5, "b", 0, 0.0, 2)]).write_parquet(tmp_path / "x1.parquet")
    output = tmp_path / "out" / "advantages.parquet"
    output.parent.mkdir()

    result = run("compute", tmp_path / "x[12].parquet", "-o", output, "-q", "--no-tokens")

    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(output)["data_id"].to_list() == [5, 5]


def test_replacing_a_dataset_folder_never_removes_an_input(tmp_path):
    # The output checks refuse such a folder first; the publishing step holds on its own.
    folder = tmp_path / "dump"
    folder.mkdir()
    source = folder / "part-00000.parquet"
    dump_frame(ROWS).write_parquet(source)
    before = sha256(source)

    with (
        pytest.raises(AdvcliError) as refused,
        atomic_output(folder, force=True, folder=True, keep=[source]) as partial,
    ):
        (partial / "part-000000.parquet").write_bytes(b"a new result")

    assert str(refused.value) == (
        f"{folder}: the output folder holds the input {source}; choose another path"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.parquet"]
    assert sha256(source) == before
    assert partials(tmp_path) == []

"""Edges found by a hostile probe, each refused in one line or read as asked."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from advcli.write.sample import sample_table


def test_top_beyond_the_largest_list_is_a_usage_error(run, write_dump):
    path = write_dump([("p", "a", 0, 1.0, 2), ("p", "b", 0, 0.0, 2)])
    result = run("compare", path, "--top", 2**33)
    assert result.exit_code == 2
    assert "--top" in result.stderr and "Traceback" not in result.stderr


def test_a_categorical_by_column_is_read_as_its_text(run, tmp_path):
    frame = pl.from_arrow(sample_table(groups=4, rollouts=2, seed=1)).with_columns(
        step=pl.when(pl.col("data_id") < 2).then(pl.lit("b")).otherwise(pl.lit("a"))
    )
    plain, categorical = tmp_path / "plain.parquet", tmp_path / "categorical.parquet"
    frame.write_parquet(plain)
    frame.with_columns(pl.col("step").cast(pl.Categorical)).write_parquet(categorical)
    reports = []
    for path in (plain, categorical):
        result = run("compare", path, "--by", "step", "--json", "-", "--quiet")
        assert result.exit_code == 0, result.stderr
        reports.append(json.loads(result.stdout)["by_step"])
    assert [s["step"] for s in reports[1]["steps"]] == ["a", "b"]
    assert reports[0] == reports[1]


def test_compute_advantage_refuses_what_is_not_a_batch_before_computing():
    pytest.importorskip("torch")
    from advcli.verl import compute_advantage

    batch = {
        "uid": np.array(["p", "p"], dtype=object),
        "token_level_rewards": np.array([[0.0, 1.0], [0.0, 0.0]], dtype=np.float32),
        "response_mask": np.ones((2, 2), dtype=np.int64),
    }
    with pytest.raises(TypeError, match=r"takes a verl DataProto .* not dict"):
        compute_advantage(batch)


def test_write_batch_refuses_an_empty_batch_and_leaves_the_folder_readable(run, tmp_path):
    from advcli.dump import write_batch
    from advcli.errors import AdvcliError

    batch = {
        "uid": np.array(["p", "p"], dtype=object),
        "traj_uid": np.array(["a", "b"], dtype=object),
        "token_level_rewards": np.array([[0.0, 1.0], [0.0, 0.0]], dtype=np.float32),
        "response_mask": np.ones((2, 2), dtype=np.int64),
    }
    write_batch(batch, tmp_path, step=1)
    empty = {key: value[:0] for key, value in batch.items()}
    with pytest.raises(AdvcliError, match="the batch has no rows"):
        write_batch(empty, tmp_path, step=2)
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001.parquet"]
    assert run("inspect", tmp_path).exit_code == 0


# ---------------------------------------------------------------------------------------------
# Issue 26: names that are not UTF-8, Arrow IPC streams by path, JSON names with glob characters,
# every format through a pipe.

# The bytes b"-\xff" as Python holds them in a name, and as advcli shows them.
NOT_UTF8 = os.fsdecode(b"-\xff")
SHOWN = "-\\xff"


def ipc_stream_bytes(frame: pl.DataFrame) -> bytes:
    """``frame`` as an Arrow IPC stream of two batches."""
    table = frame.to_arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for half in (table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)):
            writer.write_table(half)
    return sink.getvalue().to_pybytes()


def write_as(frame: pl.DataFrame, path: Path, kind: str) -> None:
    """``frame`` written at ``path`` (any name: through a Python file) as ``kind``."""
    with path.open("wb") as file:
        if kind == "parquet":
            frame.write_parquet(file)
        elif kind == "jsonl":
            frame.write_ndjson(file)
        elif kind == "arrow":
            frame.write_ipc(file)
        else:
            file.write(ipc_stream_bytes(frame))


def sample_frame(groups: int = 6) -> pl.DataFrame:
    return pl.from_arrow(sample_table(groups=groups, rollouts=2, seed=3))


def json_report(run, *args) -> dict:
    result = run("compare", *args, "--json", "-", "--quiet")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "arrow", "arrows"])
def test_a_file_named_in_bytes_is_read_and_shown_escaped(kind, run, tmp_path):
    frame = sample_frame()
    folder = tmp_path / f"runs{NOT_UTF8}"
    folder.mkdir()
    source, plain = folder / f"dump{NOT_UTF8}.{kind}", tmp_path / f"plain.{kind}"
    write_as(frame, source, kind)
    write_as(frame, plain, kind)
    shown = f"{tmp_path}/runs{SHOWN}/dump{SHOWN}.{kind}"

    output, plain_output = folder / f"out{NOT_UTF8}.parquet", tmp_path / "plain-out.parquet"
    result = run("compute", source, "-o", output)
    assert result.exit_code == 0, result.stderr
    assert run("compute", plain, "-o", plain_output, "-q").exit_code == 0
    with output.open("rb") as written:
        assert pl.read_parquet(written).equals(pl.read_parquet(plain_output))
    assert f"out{SHOWN}.parquet (parquet)" in result.stderr
    inspected = run("inspect", source, "--json")
    assert inspected.exit_code == 0, inspected.stderr
    assert json.loads(inspected.stdout)["inputs"]["files"] == [shown]
    report, plain_report = json_report(run, source), json_report(run, plain)
    assert report["settings"].pop("inputs") == [shown]
    plain_report["settings"].pop("inputs")
    assert report == plain_report
    # Each file's row of the series is named by its path.
    terminal = run("compare", source, "--by", "file")
    assert terminal.exit_code == 0, terminal.stderr
    assert f"runs{SHOWN}/dump{SHOWN}.{kind}" in terminal.stdout


@pytest.mark.parametrize("output_format", ["parquet", "arrow", "arrows", "npz"])
def test_outputs_and_reports_in_a_folder_named_in_bytes(output_format, run, tmp_path):
    source = tmp_path / "dump.parquet"
    sample_frame().write_parquet(source)
    folder = tmp_path / f"out{NOT_UTF8}"
    folder.mkdir()
    output, report = folder / f"adv{NOT_UTF8}.{output_format}", folder / f"r{NOT_UTF8}.md"
    plain, plain_report = tmp_path / f"plain.{output_format}", tmp_path / "plain.md"

    result = run("compute", source, "-o", output, "--report", report)
    assert result.exit_code == 0, result.stderr
    assert f"report: {tmp_path}/out{SHOWN}/r{SHOWN}.md" in result.stderr
    assert run("compute", source, "-o", plain, "--report", plain_report, "-q").exit_code == 0
    if output_format == "npz":
        # Closed when read: an open archive found by the collector in a later test fails it.
        with np.load(output) as written, np.load(plain) as expected:
            assert sorted(written) == sorted(expected)
            for name in expected:
                np.testing.assert_array_equal(written[name], expected[name])
    else:
        assert output.read_bytes() == plain.read_bytes()
    assert report.read_text() == plain_report.read_text()
    assert sorted(os.listdir(folder)) == sorted([output.name, report.name])


def test_compare_writes_every_report_into_a_folder_named_in_bytes(run, tmp_path):
    source = tmp_path / "dump.parquet"
    sample_frame().write_parquet(source)
    folder = tmp_path / f"out{NOT_UTF8}"
    folder.mkdir()
    names = {"--json": "r.json", "--markdown": "r.md", "--html": "r.html"}
    options = [part for option, name in names.items() for part in (option, folder / name)]
    result = run("compare", source, *options, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert json.loads((folder / "r.json").read_text()) == json_report(run, source)
    assert sorted(os.listdir(folder)) == sorted(names.values())


def test_a_glob_matching_names_in_bytes(run, tmp_path):
    frame = sample_frame()
    folder = tmp_path / f"runs{NOT_UTF8}"
    folder.mkdir()
    for step in (1, 2):
        write_as(
            frame.with_columns(pl.col("data_id") + 100 * step),
            folder / f"s{step}{NOT_UTF8}.parquet",
            "parquet",
        )
    inspected = run("inspect", f"{folder}/s*.parquet", "--json")
    assert inspected.exit_code == 0, inspected.stderr
    summary = json.loads(inspected.stdout)
    assert summary["inputs"]["files"] == [
        f"{tmp_path}/runs{SHOWN}/s{n}{SHOWN}.parquet" for n in (1, 2)
    ]
    assert summary["counts"]["rows"] == 2 * frame.height
    by_file = json_report(run, folder, "--by", "file")
    steps = [step["step"] for step in by_file["by_step"]["steps"]]
    # Named alike but for one number: each file's step is that number.
    assert steps == [1, 2]
    assert by_file["settings"]["inputs"] == [
        f"{tmp_path}/runs{SHOWN}/s{n}{SHOWN}.parquet" for n in (1, 2)
    ]


def test_an_arrows_stream_advcli_wrote_reads_back_by_its_path(run, tmp_path):
    source = tmp_path / "dump.parquet"
    sample_frame().write_parquet(source)
    stream, parquet = tmp_path / "adv.arrows", tmp_path / "adv.parquet"
    assert run("compute", source, "-o", stream, "-q").exit_code == 0
    assert run("compute", source, "-o", parquet, "-q").exit_code == 0
    with pa.memory_map(str(stream)) as mapped:
        assert mapped.read(4) == b"\xff\xff\xff\xff"  # a stream, not an IPC file

    again = tmp_path / "again.parquet"
    result = run("compute", stream, "-o", again, "-q")
    assert result.exit_code == 0, result.stderr
    # Its score and advantage columns are replaced by the same values.
    assert pl.read_parquet(again).equals(pl.read_parquet(parquet))
    report, expected = json_report(run, stream), json_report(run, parquet)
    assert report["settings"].pop("inputs") == [str(stream)]
    expected["settings"].pop("inputs")
    assert report == expected
    inspected = run("inspect", stream, "--json")
    assert inspected.exit_code == 0, inspected.stderr
    summary = json.loads(inspected.stdout)
    assert summary["inputs"]["format"] == "arrow_stream"
    assert summary["counts"] == json.loads(run("inspect", parquet, "--json").stdout)["counts"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("stream.arrow", "arrows"),
        ("file.arrows", "arrow"),
        ("v2.feather", "arrow"),
        ("s.ipc", "arrows"),
    ],
)
def test_arrow_files_and_streams_are_told_by_their_first_bytes(name, kind, run, tmp_path):
    frame = sample_frame()
    path, plain = tmp_path / name, tmp_path / "plain.parquet"
    write_as(frame, path, kind)
    frame.write_parquet(plain)
    report, expected = json_report(run, path), json_report(run, plain)
    report["settings"].pop("inputs")
    expected["settings"].pop("inputs")
    assert report == expected


def test_json_names_with_glob_characters_are_read_as_that_file(run, tmp_path):
    frame = sample_frame()
    for name in ("q*1.jsonl", "qx1.jsonl", "step[1].jsonl"):
        frame.write_ndjson(tmp_path / name)
    for name in ("q*1.jsonl", "step[1].jsonl"):
        inspected = run("inspect", tmp_path / name, "--json")
        assert inspected.exit_code == 0, inspected.stderr
        assert json.loads(inspected.stdout)["counts"]["rows"] == frame.height
        output = tmp_path / "out.parquet"
        assert run("compute", tmp_path / name, "-o", output, "-q", "--force").exit_code == 0
        assert pl.read_parquet(output).height == frame.height


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run by bash with pipefail: the pipeline's status is advcli's when it fails."""
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"], cwd=cwd, capture_output=True, text=True
    )


ADVCLI = f"{shlex.quote(sys.executable)} -m advcli"


@pytest.mark.process
@pytest.mark.parametrize("output_format", ["arrows", "arrow", "parquet", "npz"])
def test_every_format_through_dev_stdout_into_a_pipe(output_format, run, tmp_path):
    source = tmp_path / "dump.parquet"
    # Every output is larger than a pipe holds (64 KiB), so that `head` leaves before the end.
    pl.from_arrow(sample_table(groups=400, rollouts=8, seed=0)).write_parquet(source)
    piped = shell(
        f"{ADVCLI} compute dump.parquet -o /dev/stdout --format {output_format} -q | cat > piped",
        tmp_path,
    )
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    # The same output written to a file, the reference (in-process: no pipe involved).
    written = run("compute", source, "-o", tmp_path / f"file.{output_format}", "-q")
    assert written.exit_code == 0, written.stderr
    if output_format == "npz":  # a zip written to a pipe marks its sizes after each member
        with np.load(tmp_path / "piped") as piped_arrays, np.load(tmp_path / "file.npz") as arrays:
            for name in arrays:
                np.testing.assert_array_equal(piped_arrays[name], arrays[name])
    else:
        assert (tmp_path / "piped").read_bytes() == (
            tmp_path / f"file.{output_format}"
        ).read_bytes()

    to_head = f"-o /dev/stdout --format {output_format} -q | head -c 10 > /dev/null"
    closed = shell(f"{ADVCLI} compute dump.parquet {to_head}", tmp_path)
    assert closed.returncode == 141 and closed.stderr == "", closed.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["dump.parquet", "piped", f"file.{output_format}"]
    )


def test_a_stream_that_changed_after_it_was_opened_is_refused(tmp_path):
    from advcli.errors import AdvcliError
    from advcli.read.inputs import open_dataset

    frame = sample_frame()
    path = tmp_path / "dump.arrows"
    write_as(frame, path, "arrows")
    dataset = open_dataset([str(path)])
    write_as(pl.concat([frame, frame]), path, "arrows")
    changed = r"dump.arrows: the stream holds 76 rows but held 38 when it was opened"
    with pytest.raises(AdvcliError, match=changed):
        dataset.read_columns(["data_id"])


@pytest.mark.process
def test_a_stream_on_standard_input_is_read_as_a_stream_file_is(tmp_path):
    sample_frame().write_parquet(tmp_path / "dump.parquet")
    piped = shell(
        f"{ADVCLI} compute dump.parquet -o - -q | {ADVCLI} compute - -o again.parquet -q", tmp_path
    )
    assert piped.returncode == 0, piped.stderr
    direct = shell(f"{ADVCLI} compute dump.parquet -o direct.parquet -q", tmp_path)
    assert direct.returncode == 0, direct.stderr
    assert pl.read_parquet(tmp_path / "again.parquet").equals(
        pl.read_parquet(tmp_path / "direct.parquet")
    )
    inspected = shell(
        f"{ADVCLI} compute dump.parquet -o - -q | {ADVCLI} inspect - --json", tmp_path
    )
    assert json.loads(inspected.stdout)["inputs"]["format"] == "arrow_stream"

    (tmp_path / "cut.arrows").write_bytes(ipc_stream_bytes(sample_frame())[:-200])
    cut = shell(f"{ADVCLI} inspect - < cut.arrows", tmp_path)
    assert cut.returncode == 1
    assert cut.stderr.startswith("Error: <stdin>: not a readable Arrow IPC stream (")
    assert len(cut.stderr.splitlines()) == 1 and "Traceback" not in cut.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    ("redirect", "output"),
    [
        (">> link.parquet", "-o -"),
        ("1<> dump.parquet", "-o -"),
        (">> link.parquet", "-o /dev/stdout --format parquet"),
        (">> link.parquet", "-o /dev/fd/1 --format arrow"),
    ],
)
def test_an_output_written_into_an_input_through_standard_output_is_refused(
    redirect, output, tmp_path
):
    # Standard output is the input under another name (a hard link) or its own: a writer
    # opening /dev/stdout truncates it, '-' appends to it; the path checks see neither.
    source = tmp_path / "dump.parquet"
    pl.from_arrow(sample_table(groups=4, rollouts=2, seed=0)).write_parquet(source)
    os.link(source, tmp_path / "link.parquet")
    before = source.read_bytes()
    result = shell(f"{ADVCLI} compute dump.parquet {output} -q {redirect}", tmp_path)
    assert result.returncode == 1
    assert result.stderr == (
        "Error: standard output: the output is the input dump.parquet (the same file); choose "
        "another path\n"
    )
    assert source.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["dump.parquet", "link.parquet"]


@pytest.mark.process
@pytest.mark.parametrize(
    "command",
    ["compare dump.parquet", "compare dump.parquet --json -", "inspect dump.parquet --json",
     "compute dump.parquet -o out.parquet"],
)  # fmt: skip
def test_standard_output_appended_to_an_input_is_refused(command, tmp_path):
    # 'advcli compare dump.parquet >> dump.parquet': what the command prints would go into the
    # input; every command refuses it before any work, as cat does.
    source = tmp_path / "dump.parquet"
    pl.from_arrow(sample_table(groups=4, rollouts=2, seed=0)).write_parquet(source)
    before = source.read_bytes()
    result = shell(f"{ADVCLI} {command} >> dump.parquet", tmp_path)
    assert result.returncode == 1
    assert result.stderr == (
        "Error: standard output: the output is the input dump.parquet (the same file); choose "
        "another path\n"
    )
    assert source.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["dump.parquet"]

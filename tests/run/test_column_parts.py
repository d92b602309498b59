"""Issue 31: ``compare --by COLUMN`` one value at a time. A value's rows are read alone (a slice
of rows, or the value's rows of one where others lie between) and keep their numbers; the report
equals ``--by file``'s over the same rows split into files by the column, whether the values'
rows are contiguous or interleaved, and whether a value spans two input files; ``--jobs 2`` and
``--engine ray`` give the same report; a null value is refused at its first row, as before; an
error in a part names its file and its value."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_parts import assert_same

from advcli.errors import AdvcliError
from advcli.read.dataset import StepRows
from advcli.read.inputs import open_dataset
from advcli.run import parts
from advcli.run.parts import column_steps
from advcli.write.sample import sample_table


@pytest.fixture(autouse=True)
def a_value_at_a_time(monkeypatch):
    """Each value read as a part of its own, however few the rows (a dump of fewer than
    ONE_PASS_ROWS is compared in one grouped pass: test_a_small_dump_goes_in_one_pass)."""
    monkeypatch.setattr(parts, "ONE_PASS_ROWS", 0)


def run_of_steps(order: str) -> pl.DataFrame:
    """Three steps of sample rollouts whose group ids repeat across steps, each trajectory's
    score moved by a random amount (no two trajectories' figures tie, so that the top lists do
    not depend on the rows' order); ``order``: the steps one after another, or their rows
    interleaved."""
    steps = []
    for step in range(3):
        frame = pl.from_arrow(sample_table(groups=5 + 2 * step, rollouts=4, seed=step))
        assert isinstance(frame, pl.DataFrame)
        keys = ["data_id", "rollout_id"]
        trajectories = frame.select(keys).unique(maintain_order=True)
        noise = np.random.default_rng(step).uniform(0.0, 0.01, trajectories.height)
        steps.append(
            frame.join(
                trajectories.with_columns(pl.Series("noise", noise)),
                on=keys,
                maintain_order="left",
            ).select(
                *keys,
                "turn_index",
                pl.lit(10 * step, dtype=pl.Int64).alias("step"),
                (pl.col("token_level_rewards").list.sum() + pl.col("noise")).alias("score"),
                "response_mask",
            )
        )
    run = pl.concat(steps)
    if order == "interleaved":
        run = run.with_row_index("position").sort(pl.col("position") % 5, "position")
        run = run.drop("position")
    return run


def report(run, *args: object) -> dict[str, Any]:
    result = run("compare", *args, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def named_by_step(summary: dict[str, Any], steps: list[int]) -> dict[str, Any]:
    """A ``--by file`` report as ``--by step`` names its parts: each group keyed by its file's
    step (``steps``, in file order), the series' labels and the inputs left out."""
    for entry in (*summary["top_groups"], *summary["top_trajectories"]):
        group = entry["group"]
        entry["group"] = {"step": steps[group["file"]], "group": group["group"]}
    return without_part_names(summary)


def without_part_names(summary: dict[str, Any]) -> dict[str, Any]:
    """A report without what names its parts: the series' labels, its inputs, why its groups
    are keyed by them."""
    for entry in summary["by_step"]["steps"]:
        entry["step"] = None
    summary["by_step"]["by"] = None
    summary["settings"].pop("inputs")
    summary["settings"]["reading"]["roles"]["group"].pop("why")
    return summary


@pytest.mark.parametrize("order", ["contiguous", "interleaved"])
def test_by_column_equals_by_file_over_the_values_as_files(run, tmp_path, order):
    dump = tmp_path / "run.parquet"
    frame = run_of_steps(order)
    # Small row groups: a contiguous value's slice starts and ends inside them.
    frame.write_parquet(dump, row_group_size=50)
    files = []
    for step in (0, 10, 20):
        files.append(tmp_path / f"step_{step}.parquet")
        frame.filter(pl.col("step") == step).write_parquet(files[-1])
    by_column = report(run, dump, "--by", "step")
    by_file = report(run, *files, "--by", "file")
    assert [entry["step"] for entry in by_column["by_step"]["steps"]] == [0, 10, 20]
    assert by_column["by_step"]["by"] == "step"
    why = by_column["settings"]["reading"]["roles"]["group"]["why"]
    assert why.endswith(
        "each value of 'step' is its own batch (--by step): a group is a (step, group) pair"
    )
    assert without_part_names(by_column) == named_by_step(by_file, [0, 10, 20])
    # Top lists of trajectories from every step: the parts' candidates are merged.
    tops = {entry["group"]["step"] for entry in by_column["top_trajectories"]}
    assert len(by_column["top_trajectories"]) == 10 and len(tops) > 1


def test_the_one_pass_kept_for_the_plot_gives_the_same_report(run, tmp_path):
    """``--plot`` reads every row in one pass: its series is the parts' to the bit, its
    whole-run figures the parts' but for the last places of the float sums."""
    dump = tmp_path / "run.parquet"
    run_of_steps("interleaved").write_parquet(dump)
    parts = report(run, dump, "--by", "step")
    one_pass = report(run, dump, "--by", "step", "--plot", tmp_path / "run.png")
    assert parts["by_step"] == one_pass["by_step"]
    assert_same(parts, one_pass)


@pytest.mark.parametrize("order", ["contiguous", "interleaved"])
def test_a_small_dump_goes_in_one_pass_with_the_parts_report(run, tmp_path, monkeypatch, order):
    """Below ONE_PASS_ROWS the values are not read one at a time (a part's reading and report
    cost the same whatever its rows): the series is the parts' to the bit, the whole-run figures
    the parts' but for the last places of the float sums, and an error names its row without
    the value."""
    dump = tmp_path / "run.parquet"
    run_of_steps(order).write_parquet(dump)
    by_parts = report(run, dump, "--by", "step")
    monkeypatch.setattr(parts, "ONE_PASS_ROWS", 1_000_000)
    one_pass = report(run, dump, "--by", "step")
    assert one_pass["by_step"] == by_parts["by_step"]
    assert_same(one_pass, by_parts)
    frame = run_of_steps(order)
    null = pl.int_range(pl.len()) == 50
    frame.with_columns(
        pl.when(null).then(None).otherwise(pl.col("data_id")).alias("data_id")
    ).write_parquet(dump)
    result = run("compare", dump, "--by", "step", "-q")
    assert result.stderr.splitlines() == [
        f"Error: {dump} row 50: column 'data_id' (group id) is null"
    ]


def test_a_value_that_spans_two_files_is_one_part(run, tmp_path):
    """Also when a file's name reads as a pattern (the pass over the column opens it by name)."""
    frame = run_of_steps("contiguous")
    one = tmp_path / "run.parquet"
    frame.write_parquet(one)
    # Cut inside step 10: its rows are in both files.
    cut = frame.with_row_index().filter(pl.col("step") == 10)["index"][7]
    halves = [tmp_path / "first.parquet", tmp_path / "second[*].parquet"]
    frame[:cut].write_parquet(halves[0])
    frame[cut:].write_parquet(halves[1])
    whole = report(run, one, "--by", "step")
    split = report(run, *halves, "--by", "step")
    assert split["settings"].pop("inputs") == [str(path) for path in halves]
    whole["settings"].pop("inputs")
    assert split == whole


def test_two_jobs_give_the_same_report_in_the_values_order(run, tmp_path):
    dump = tmp_path / "run.parquet"
    run_of_steps("interleaved").write_parquet(dump)
    one = run("compare", dump, "--by", "step", "--json", "-", "-q")
    two = run("compare", dump, "--by", "step", "--json", "-", "-q", "--jobs", "2")
    assert two.exit_code == 0, two.stderr
    assert two.stdout == one.stdout


def test_a_null_value_is_refused_at_its_first_row(run, tmp_path):
    dump = tmp_path / "run.parquet"
    frame = run_of_steps("interleaved")
    null = pl.int_range(pl.len()).is_in([45, 60])
    frame.with_columns(
        pl.when(null).then(None).otherwise(pl.col("step")).alias("step")
    ).write_parquet(dump)
    result = run("compare", dump, "--by", "step", "-q")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: {dump} row 45: column 'step' (--by) is null"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_error_in_a_part_names_its_file_and_its_value(run, tmp_path, jobs):
    frame = run_of_steps("interleaved")
    broken = int(frame.with_row_index().filter(pl.col("step") == 20)["index"][-5])
    assert broken > 40
    group = pl.when(pl.int_range(pl.len()) == broken).then(None).otherwise(pl.col("data_id"))
    halves = [tmp_path / "first.parquet", tmp_path / "second.parquet"]
    frame = frame.with_columns(group.alias("data_id"))
    frame[:40].write_parquet(halves[0])
    frame[40:].write_parquet(halves[1])
    result = run("compare", *halves, "--by", "step", "-q", "--jobs", jobs)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: {halves[1]} row {broken - 40} (step=20): column 'data_id' (group id) is null"
    ]


@pytest.mark.ray
# Ray's own imports and workers raise deprecation and resource warnings we cannot fix.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_one_ray_task_per_value_gives_the_local_report(cluster, run, tmp_path):
    dump = tmp_path / "run.parquet"
    run_of_steps("interleaved").write_parquet(dump)
    local = run("compare", dump, "--by", "step", "--json", "-", "-q")
    distributed = run("compare", dump, "--by", "step", "--json", "-", "-q", "--engine", "ray")
    assert distributed.exit_code == 0, distributed.stderr
    assert distributed.stdout == local.stdout


def numbered_steps(n: np.ndarray) -> np.ndarray:
    """Row ``n``'s step: 1 and 2 interleaved from row 10 (every third row 2), 3 from row 25 to
    34 (across the two files), 0 before and after."""
    interleaved = np.where(n % 3 == 0, 2, 1)
    return np.where(n < 10, 0, np.where(n < 25, interleaved, np.where(n < 35, 3, 0)))


def numbered_files(folder: Path, suffix: str) -> list[Path]:
    """Two files of 30 and 25 rows (Parquet in row groups of 7): ``n`` holds each row's number
    across them, ``step`` its step."""
    n = np.arange(55)
    frame = pl.DataFrame({"n": n, "step": numbered_steps(n), "tokens": [[0] * (k % 4) for k in n]})
    paths = [folder / f"a.{suffix}", folder / f"b.{suffix}"]
    for path, part in zip(paths, (frame[:30], frame[30:]), strict=True):
        if suffix == "parquet":
            pq.write_table(part.to_arrow(), path, row_group_size=7)
        elif suffix == "jsonl":
            part.write_ndjson(path)
        elif suffix == "arrow":
            part.write_ipc(path)
        else:
            part.write_ipc_stream(path)
    return paths


@pytest.mark.parametrize("suffix", ["parquet", "arrows", "arrow", "jsonl"])
def test_each_values_rows_are_found_then_read_alone_keeping_their_numbers(tmp_path, suffix):
    dataset = open_dataset([str(path) for path in numbered_files(tmp_path, suffix)])
    steps = column_steps(dataset, "step")
    assert steps == [
        StepRows("step", 0, 0, 55, 30),
        StepRows("step", 1, 10, 24, 10),
        StepRows("step", 2, 12, 25, 5),
        StepRows("step", 3, 25, 35, 10),
    ]
    assert [step.interleaved for step in steps] == [True, True, True, False]
    for step in steps:
        rows = replace(dataset, step=step).rows("row").select("row", "n").collect()
        assert rows["row"].to_list() == rows["n"].to_list()
        n = np.arange(step.start, step.stop)
        assert rows["n"].to_list() == n[numbered_steps(n) == step.value].tolist()


def test_the_row_groups_around_a_slice_are_not_read(tmp_path):
    """A row group before the slice holds text that is not UTF-8, which a read of it refuses."""
    text = pa.array([b"ok"] * 3 + [b"\xff"] + [b"ok"] * 26, pa.binary()).view(pa.string())
    table = pa.table({"text": text, "step": [0] * 10 + [1] * 20})
    path = tmp_path / "run.parquet"
    pq.write_table(table, path, row_group_size=7)
    dataset = open_dataset([str(path)])
    with pytest.raises(AdvcliError, match="cannot read"):
        dataset.read_columns(["text"])
    later = replace(dataset, step=StepRows("step", 1, 10, 30, 20))
    assert later.read_columns(["text"])["text"].to_list() == ["ok"] * 20

"""Issue 7: Parquet input is decoded by Arrow and handed to Polars through an IO source.

The source must apply the column selection, row filter and row limit that Polars pushes down to it,
keep the row order across files and batches, let go of token data the key projection does not keep,
and report a damaged file as one error line.
"""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from advcli.read import scan as scan_module
from advcli.read.columns import resolve_columns
from advcli.read.inputs import open_dataset
from advcli.read.projection import key_projection
from advcli.settings.config import ColumnNames
from advcli.write.sample import sample_table


@pytest.fixture
def two_files(tmp_path: Path, monkeypatch) -> tuple[list[Path], list[dict]]:
    """Two Parquet files of 5 row groups each, read in batches of a few rows; and their rows as
    plain dicts, in order."""
    rows = [
        {"a": index, "b": f"row {index}", "tokens": list(range(index % 5))} for index in range(100)
    ]
    paths = []
    for number, part in enumerate((rows[:60], rows[60:])):
        path = tmp_path / f"part{number}.parquet"
        pq.write_table(pa.Table.from_pylist(part), path, row_group_size=12)
        paths.append(path)
    # About 7 rows a batch (each row holds 3 + its token count values), so batches split row groups.
    monkeypatch.setattr(scan_module, "BATCH_VALUES", 35)
    return paths, rows


def test_scan_keeps_every_row_in_order(two_files):
    paths, rows = two_files
    frame = open_dataset([str(p) for p in paths]).scan().with_row_index("n").collect()
    assert frame["n"].to_list() == list(range(100))
    assert frame.drop("n").to_dicts() == rows


def test_scan_applies_pushed_down_selection_filter_and_limit(two_files):
    paths, rows = two_files
    scan = open_dataset([str(p) for p in paths]).scan()

    assert scan.select("b").collect()["b"].to_list() == [r["b"] for r in rows]

    kept = scan.filter(pl.col("a") % 7 == 3).select("a", "b").collect()
    assert kept.to_dicts() == [{"a": r["a"], "b": r["b"]} for r in rows if r["a"] % 7 == 3]

    assert scan.head(65).collect()["a"].to_list() == list(range(65))
    limited = scan.filter(pl.col("a") % 2 == 1).head(40).collect(engine="streaming")
    assert limited["a"].to_list() == [r["a"] for r in rows if r["a"] % 2 == 1][:40]
    assert scan.slice(58, 5).collect()["a"].to_list() == [58, 59, 60, 61, 62]


def test_batches_hold_about_batch_values_of_the_columns_read(tmp_path, monkeypatch):
    """A batch's rows are counted from the values of the columns read, not of every column: a
    small column read beside a wide list column it leaves comes in batches as large as the
    budget allows. A struct counts each of its fields' values (found by position: the name holds
    a dot)."""
    path = tmp_path / "wide.parquet"
    rows = 1000
    table = pa.table(
        {
            "a": range(rows),
            "pair.of": [{"x": i, "y": [i, i]} for i in range(rows)],
            "tokens": [[0] * 50] * rows,
        }
    )
    pq.write_table(table, path)
    monkeypatch.setattr(scan_module, "BATCH_VALUES", 200)
    file = scan_module.ScannedFile(str(path), path.name, rows)

    def batch_rows(columns: list[str] | None) -> list[int]:
        frames = scan_module._parquet_frames([file], columns, None, None)
        return [frame.height for frame in frames]

    assert batch_rows(["a"]) == [200] * 5
    assert batch_rows(["a", "pair.of"]) == [50] * 20  # 1 + 1 + 2 values a row
    assert set(batch_rows(None)[:-1]) == {3}  # 54 values a row


def test_key_projection_lets_go_of_the_token_data(tmp_path):
    """The projection keeps the id columns; the batches' token lists must not stay alive with them.

    20,000 rows of 400 tokens hold some 40 MB of token data; their keys under 1 MB."""
    path = tmp_path / "wide.parquet"
    pq.write_table(sample_table(groups=800, rollouts=8, max_turns=5, tokens=400, seed=3), path)
    dump = open_dataset([str(path)])
    before = pa.total_allocated_bytes()
    projection = key_projection(dump, resolve_columns(dump.schema, dump.describe(), ColumnNames()))
    held = pa.total_allocated_bytes() - before
    assert projection.height > 10_000
    assert held < 4 * 2**20, f"Arrow still holds {held / 2**20:.1f} MiB after the key projection"


def test_kept_key_columns_live_apart_from_the_decoded_batches(tmp_path):
    """The id columns the projection keeps are copied out of the pool Arrow decodes batches in,
    so that they pin none of its pages: that pool holds nothing of them afterwards."""
    path = tmp_path / "wide.parquet"
    pq.write_table(sample_table(groups=800, rollouts=8, max_turns=5, tokens=400, seed=3), path)
    dump = open_dataset([str(path)])
    before = pa.total_allocated_bytes()
    projection = key_projection(dump, resolve_columns(dump.schema, dump.describe(), ColumnNames()))
    assert projection.height > 10_000
    assert pa.total_allocated_bytes() - before < 64 * 2**10


def _damage_column(path: Path, column: str) -> None:
    """Overwrite the middle of one column chunk's compressed pages."""
    metadata = pq.ParquetFile(path).metadata
    names = [metadata.row_group(0).column(i).path_in_schema for i in range(metadata.num_columns)]
    chunk = metadata.row_group(1).column(names.index(column))
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 64] = b"\x17" * 64
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("column", ["response_mask.list.element", "prompt"])
def test_damaged_column_is_one_error_line_and_no_output(column, run, tmp_path):
    """A damaged token column fails in the key projection; a damaged column that only the write
    reads fails in the write. Either way: one line, exit 1, no output."""
    table = sample_table(groups=200, tokens=64, seed=5)
    table = table.append_column("prompt", pa.array([f"prompt {i}" * 20 for i in range(len(table))]))
    path = tmp_path / "dump.parquet"
    pq.write_table(table, path, row_group_size=1000)
    _damage_column(path, column)
    output = tmp_path / "out.parquet"

    result = run("compute", path, "-o", output)

    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith(f"Error: {path}: cannot read the file (")
    assert len(result.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.parquet"]


@pytest.mark.parametrize("seed", range(40))
def test_repeated_turns_are_found_whatever_the_keys(seed, run, write_dump, tmp_path):
    """The repeated-turn check compares sorted key hashes first: any repeat must still be caught,
    and none reported where there is none (checked against a set of the keys)."""
    rng = random.Random(seed)
    ids = (lambda k: k) if seed % 2 else (lambda k: f"id-{k}")
    rows = [
        (ids(rng.randrange(6)), ids(rng.randrange(4)), rng.randrange(3), 1.0, 2)
        for _ in range(rng.randrange(1, 30))
    ]
    # One score per trajectory, so that only repeats can make the input bad.
    score = {(g, t): float(rng.randrange(3)) for g, t, *_ in rows}
    rows = [(g, t, turn, score[g, t], tokens) for g, t, turn, _, tokens in rows]
    first_repeat, seen = None, set()
    for index, (group, trajectory, turn, _, _) in enumerate(rows):
        if (group, trajectory, turn) in seen:
            first_repeat = index
            break
        seen.add((group, trajectory, turn))

    result = run("compute", write_dump(rows), "-o", tmp_path / "out.parquet", "-q")

    if first_repeat is None:
        assert result.exit_code == 0, result.stderr
    else:
        assert result.exit_code == 1
        assert f"row {first_repeat}: duplicate turn" in result.stderr


def test_a_zero_column_query_keeps_the_row_count(two_files):
    paths, _ = two_files
    scan = open_dataset([str(p) for p in paths]).scan()
    assert scan.select(pl.len()).collect().item() == 100
    assert scan.with_row_index("r").select("r").collect().height == 100


def test_a_scan_stopped_by_an_error_is_closed_when_the_block_ends(two_files):
    """Polars would otherwise drop the paused scan on one of its threads, possibly while Python
    shuts down (an abort, exit 134, seen in about one run in three)."""
    paths, _ = two_files
    scan = open_dataset([str(p) for p in paths]).scan()
    with scan_module.closing_sources():
        with pytest.raises(pl.exceptions.PolarsError):
            scan.select(pl.col("b").cast(pl.Int64)).collect(engine="streaming")
        opened = list(scan_module._OPEN_SOURCES)
        assert opened, "the scan registered no source"
    assert scan_module._OPEN_SOURCES == []
    assert all(source._frames.gi_frame is None for source in opened)  # generators closed


def test_polars_enum_and_categorical_columns_keep_their_types(run, tmp_path):
    table = pl.from_arrow(sample_table(groups=4, rollouts=2, seed=2))
    splits = ["test", "train", "val"]
    frame = table.with_columns(
        split=pl.Series([splits[i % 3] for i in range(table.height)], dtype=pl.Enum(splits)),
        source=pl.Series([f"s{i % 2}" for i in range(table.height)], dtype=pl.Categorical),
    )
    source = tmp_path / "dump.parquet"
    frame.write_parquet(source)
    output = tmp_path / "out.parquet"

    assert run("compute", source, "-o", output, "-q").exit_code == 0

    written = pl.read_parquet(output)
    assert written.schema["split"] == pl.Enum(splits)
    assert written.schema["source"] == pl.Categorical
    assert written["split"].to_list() == [splits[i % 3] for i in range(table.height)]
    assert written["source"].to_list() == [f"s{i % 2}" for i in range(table.height)]


def test_invalid_utf8_is_refused(run, tmp_path):
    table = sample_table(groups=2, rollouts=2, seed=4)
    bad = pa.array([b"fine"] * (len(table) - 1) + [b"\xff\xfe"], pa.binary()).view(pa.string())
    source = tmp_path / "dump.parquet"
    pq.write_table(table.append_column("prompt", bad), source)

    result = run("compute", source, "-o", tmp_path / "out.parquet")

    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {source}: cannot read the file (")
    assert "UTF8" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.parquet"]


def test_int96_timestamps_outside_the_nanosecond_range_are_kept(run, tmp_path):
    """Spark writes INT96 timestamps; read as nanoseconds, 1500 and 9999 would wrap around."""
    table = sample_table(groups=1, rollouts=2, seed=6)
    moments = [datetime(1500, 1, 1), datetime(2020, 1, 1, 0, 0, 0, 123456), datetime(9999, 1, 1)]
    stamps = [moments[i % 3] for i in range(len(table))]
    source = tmp_path / "dump.parquet"
    pq.write_table(
        table.append_column("at", pa.array(stamps, pa.timestamp("us"))),
        source,
        use_deprecated_int96_timestamps=True,
    )
    output = tmp_path / "out.parquet"

    assert run("compute", source, "-o", output, "-q").exit_code == 0
    assert pl.read_parquet(output)["at"].to_list() == stamps

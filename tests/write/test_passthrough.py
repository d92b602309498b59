"""Issue 13, part 3: the user's columns pass through untouched, whatever their names and types,
and inputs that are fine (float masks) are read as such."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import dump_frame

ROWS = [(0, "a", 0, 1.0, 2), (0, "a", 1, 1.0, 2), (0, "b", 0, 0.0, 3), (1, "a", 0, 0.5, 2)]
# Names advcli uses for its own columns inside a run (row numbers, keys, checks).
INTERNAL_NAMES = ["row", "group", "trajectory", "turn", "tokens", "problem", "__advcli_row"]


@pytest.mark.parametrize("output_name", ["out.parquet", "out.arrow"])
def test_columns_named_like_advcli_internals_pass_through(output_name, run, tmp_path):
    extra = {name: [f"{name}-{i}" for i in range(len(ROWS))] for name in INTERNAL_NAMES}
    source = tmp_path / "dump.parquet"
    dump_frame(ROWS).with_columns(**{k: pl.Series(v) for k, v in extra.items()}).write_parquet(
        source
    )
    output = tmp_path / output_name

    for level in ("turn", "trajectory"):
        result = run("compute", source, "-o", output, "--level", level, "--force", "-q")
        assert result.exit_code == 0, result.stderr
        written = pl.read_parquet(output) if output.suffix == ".parquet" else pl.read_ipc(output)
        for name, values in extra.items():
            assert written[name].to_list() == values

    for command in (("compare", source, "-q"), ("inspect", source)):
        assert run(*command).exit_code == 0


def test_a_group_column_named_row_is_read_as_the_group(run, tmp_path):
    frame = dump_frame(ROWS).rename({"data_id": "row"})
    source = tmp_path / "dump.parquet"
    frame.write_parquet(source)
    output = tmp_path / "out.parquet"
    renamed = run("compute", source, "-o", output, "--group-col", "row", "-q")
    assert renamed.exit_code == 0, renamed.stderr

    original = tmp_path / "original.parquet"
    dump_frame(ROWS).write_parquet(original)
    reference = tmp_path / "reference.parquet"
    assert run("compute", original, "-o", reference, "-q").exit_code == 0
    assert (
        pl.read_parquet(output)["advantage"].to_list()
        == pl.read_parquet(reference)["advantage"].to_list()
    )


@pytest.mark.parametrize("dtype", [pl.Float32, pl.Float64, pl.Boolean, pl.UInt8])
def test_masks_of_any_0_1_type_give_the_same_advantages(dtype, run, tmp_path):
    masks = [[1, 1], [1, 0], [1, 1, 0], [0, 1]]
    outputs = []
    for mask_type in (pl.Int8, dtype):
        frame = dump_frame(ROWS).with_columns(
            response_mask=pl.Series(masks).cast(pl.List(mask_type))
        )
        source = tmp_path / f"dump-{mask_type}.parquet"
        frame.write_parquet(source)
        output = tmp_path / f"out-{mask_type}.parquet"
        result = run("compute", source, "-o", output, "--level", "turn", "-q")
        assert result.exit_code == 0, result.stderr
        outputs.append(pl.read_parquet(output).select("advantage", "advantages"))
    assert outputs[0].equals(outputs[1])


def test_arrow_types_polars_holds_pass_through(run, tmp_path):
    table = dump_frame(ROWS).to_arrow()
    extra = {
        "large_text": pa.array(["a", "b", "c", "d"], pa.large_string()),
        "labels": pa.array(["x", "y", "x", "y"]).dictionary_encode(),
        "fixed": pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float32(), 2)),
        "mapping": pa.array([[("k", 1)]] * 4, pa.map_(pa.string(), pa.int64())),
        "stamp": pa.array([0, 1, 2, 3], pa.timestamp("ms", tz="UTC")),
        "halves": pa.array([0.5, 1.5, 2.5, 3.5], pa.float16()),
        "money": pa.array([1, 2, 3, 4], pa.int64()).cast(pa.decimal128(22, 2)),
    }
    for name, column in extra.items():
        table = table.append_column(name, column)
    source = tmp_path / "dump.parquet"
    pq.write_table(table, source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output, "-q")

    assert result.exit_code == 0, result.stderr
    written = pq.read_table(output)
    for name, column in extra.items():
        assert written[name].to_pylist() == column.to_pylist(), name

"""The bad-input corpus: every way a rollout dump can be broken that advcli must refuse.

Each case builds its input files in a folder and names the text its one ``Error:`` line must
contain (the problem) and where (file, column, row or key). ``make_corpus(folder)`` writes every
case to disk, so the corpus can also be inspected by hand:
``python tests/bad_inputs.py /tmp/corpus``.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

GOOD = pl.DataFrame(
    {
        "data_id": [0, 0, 0, 1],
        "rollout_id": ["a", "a", "b", "a"],
        "turn_index": [0, 1, 0, 0],
        "token_level_rewards": [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.0]],
        "response_mask": [[1, 1], [1, 0], [1, 1], [1, 1]],
    },
    schema_overrides={"response_mask": pl.List(pl.Int8)},
)


def replace(column: str, values: list, dtype: pl.DataType | None = None) -> pl.DataFrame:
    return GOOD.with_columns(pl.Series(column, values, dtype=dtype))


@dataclass(frozen=True)
class BadInput:
    """``build(folder)`` writes the input and returns the input arguments; ``expected`` lists the
    texts the error line must contain; ``output`` is where the command is asked to write, as a
    path relative to the folder (or absolute); ``options`` are extra CLI options."""

    name: str
    build: Callable[[Path], list[str]]
    expected: tuple[str, ...]
    output: str = "out"
    options: tuple[str, ...] = ()
    # inspect writes nothing, and reports (rather than refuses) inconsistent scores and repeated
    # turns: those cases run through compute and compare only.
    commands: tuple[str, ...] = ("compute", "compare", "inspect")
    existing_output: bool = field(default=False)
    # Puts something other than a file at the output path before the run.
    prepare_output: Callable[[Path], None] | None = None
    # 1 for bad input; 2 for a usage error, whose Error line follows the command's usage lines.
    exit_code: int = 1


def frame_case(name: str, frame: pl.DataFrame, *expected: str, options: tuple[str, ...] = ()):
    def build(folder: Path) -> list[str]:
        path = folder / "dump.parquet"
        frame.write_parquet(path)
        return [str(path)]

    return BadInput(name, build, ("dump.parquet", *expected), options=options)


def bytes_case(name: str, data: bytes, *expected: str) -> BadInput:
    def build(folder: Path) -> list[str]:
        path = folder / "dump.parquet"
        path.write_bytes(data)
        return [str(path)]

    return BadInput(name, build, ("dump.parquet", *expected))


def _truncated(folder: Path) -> list[str]:
    path = folder / "dump.parquet"
    GOOD.write_parquet(path)
    path.write_bytes(path.read_bytes()[:-40])
    return [str(path)]


def _empty_directory(folder: Path) -> list[str]:
    (folder / "nothing_here").mkdir()
    (folder / "nothing_here" / "notes.txt").write_text("no parquet")
    return [str(folder / "nothing_here")]


def _conflicting_schemas(folder: Path) -> list[str]:
    GOOD.write_parquet(folder / "part-0.parquet")
    GOOD.with_columns(pl.col("rollout_id").cast(pl.Categorical).to_physical()).write_parquet(
        folder / "part-1.parquet"
    )
    return [str(folder / "part-0.parquet"), str(folder / "part-1.parquet")]


def _good(folder: Path) -> list[str]:
    path = folder / "dump.parquet"
    GOOD.write_parquet(path)
    return [str(path)]


def _dump_folder(folder: Path) -> list[str]:
    (folder / "dump").mkdir()
    GOOD.write_parquet(folder / "dump" / "part-00000.parquet")
    return [str(folder / "dump")]


def _good_glob(folder: Path) -> list[str]:
    GOOD.write_parquet(folder / "dump.parquet")
    return [str(folder / "*.parquet")]


CASES: list[BadInput] = [
    frame_case(
        "missing group column",
        GOOD.drop("data_id"),
        "no group column",
        "'data_id'",
        "The file has 'rollout_id', 'turn_index', 'token_level_rewards', 'response_mask'",
    ),
    frame_case(
        "missing trajectory column", GOOD.drop("rollout_id"), "no trajectory column", "'rollout_id'"
    ),
    frame_case(
        "missing reward column",
        GOOD.drop("token_level_rewards"),
        "no reward column",
        "'token_level_rewards'",
    ),
    # compare and inspect read a dump without a mask (test_dumps.py): compute's per-token
    # output needs one.
    dataclasses.replace(
        frame_case(
            "missing mask column",
            GOOD.drop("response_mask"),
            "no mask column (the per-token output needs one; pass --no-tokens",
            "'response_mask'",
        ),
        commands=("compute",),
    ),
    frame_case(
        "option names a missing column",
        GOOD,
        "column 'prompt_id' (--group-col) not found",
        options=("--group-col", "prompt_id"),
    ),
    frame_case(
        "string rewards",
        replace("token_level_rewards", ["1", "1", "0", "0"]),
        "column 'token_level_rewards'",
        "has type String",
    ),
    frame_case(
        "list of strings mask",
        replace("response_mask", [["1"], ["1"], ["1"], ["1"]]),
        "column 'response_mask'",
        "List(String)",
    ),
    frame_case(
        "nested lists",
        replace("token_level_rewards", [[[0.0]], [[1.0]], [[0.0]], [[1.0]]]),
        "column 'token_level_rewards'",
        "List(List(Float64))",
    ),
    frame_case(
        "struct where a list is expected",
        replace("response_mask", [{"a": 1}, {"a": 1}, {"a": 1}, {"a": 1}]),
        "column 'response_mask'",
        "Struct",
    ),
    frame_case(
        "float ids",
        replace("data_id", [0.0, 0.0, 0.0, 1.0]),
        "column 'data_id'",
        "Float64",
        "integers or strings",
    ),
    frame_case(
        "null group id",
        replace("data_id", [0, 0, None, 1]),
        "row 2",
        "column 'data_id' (group id) is null",
    ),
    frame_case(
        "null trajectory id",
        replace("rollout_id", ["a", None, "b", "a"]),
        "row 1",
        "column 'rollout_id' (trajectory id) is null",
    ),
    frame_case(
        "null reward",
        replace("token_level_rewards", [[0.0, 1.0], [0.0, 1.0], None, [0.5, 0.0]]),
        "row 2",
        "column 'token_level_rewards' (reward) is null",
    ),
    frame_case(
        "null mask",
        replace("response_mask", [[1, 1], [1, 0], [1, 1], None], pl.List(pl.Int8)),
        "row 3",
        "column 'response_mask' (response mask) is null",
    ),
    frame_case(
        "null reward element",
        replace("token_level_rewards", [[0.0, 1.0], [None, 1.0], [0.0, 0.0], [0.5, 0.0]]),
        "row 1",
        "column 'token_level_rewards' has a null element",
    ),
    frame_case(
        "null mask element",
        replace("response_mask", [[1, 1], [1, 0], [1, None], [1, 1]], pl.List(pl.Int8)),
        "row 2",
        "column 'response_mask' has a null element",
    ),
    frame_case(
        "NaN score",
        replace("token_level_rewards", [[0.0, 1.0], [0.0, 1.0], [float("nan"), 0.0], [0.5, 0.0]]),
        "row 2",
        "the score is NaN",
    ),
    frame_case(
        "+inf score",
        replace("token_level_rewards", [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [float("inf"), 0.0]]),
        "row 3",
        "the score is +inf",
    ),
    frame_case(
        "-inf score",
        replace("token_level_rewards", [[0.0, float("-inf")], [0.0, 1.0], [0.0, 0.0], [0.5, 0.0]]),
        "row 0",
        "the score is -inf",
    ),
    frame_case(
        "mask value 2",
        replace("response_mask", [[1, 1], [1, 2], [1, 1], [1, 1]], pl.List(pl.Int8)),
        "row 1",
        "holds a value other than 0 and 1",
    ),
    frame_case(
        "negative response_length",
        GOOD.drop("response_mask").with_columns(response_length=pl.Series([2, 2, -1, 2])),
        "row 2",
        "column 'response_length' (response length) is negative",
        options=("--reward-col", "token_level_rewards"),
    ),
    frame_case(
        "mask and rewards of different lengths",
        replace("response_mask", [[1, 1], [1, 0], [1, 1, 1], [1, 1]], pl.List(pl.Int8)),
        "row 2",
        "have different lengths",
    ),
    frame_case(
        "inconsistent trajectory scores",
        replace("token_level_rewards", [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.5, 0.0]]),
        "trajectory (data_id=0, rollout_id='a')",
        "different scores [1.0, 0.0]",
    ),
    frame_case(
        "duplicate turn",
        replace("turn_index", [0, 0, 0, 0]),
        "row 1",
        "duplicate turn: (data_id=0, rollout_id='a', turn_index=0)",
    ),
    frame_case("zero rows", GOOD.clear(), "the input has no rows"),
    bytes_case("zero-byte file", b"", "the file is empty (0 bytes)"),
    BadInput("truncated Parquet", _truncated, ("dump.parquet", "not a readable Parquet file")),
    bytes_case("CSV named .parquet", b"data_id,rollout_id\n0,a\n", "not a readable Parquet file"),
    bytes_case(
        "JSON named .parquet", json.dumps({"data_id": 0}).encode(), "not a readable Parquet file"
    ),
    bytes_case("random bytes named .parquet", bytes(range(256)) * 8, "not a readable Parquet file"),
    BadInput(
        "directory with no Parquet files",
        _empty_directory,
        ("nothing_here", "the directory holds no Parquet file"),
    ),
    BadInput(
        "glob matching nothing",
        lambda folder: [str(folder / "step-*.parquet")],
        ("step-*.parquet", "the pattern matches no file"),
    ),
    BadInput(
        "conflicting schemas",
        _conflicting_schemas,
        ("schemas conflict: column 'rollout_id'", "part-0.parquet", "part-1.parquet"),
    ),
    BadInput(
        "output folder missing",
        _good,
        ("missing_folder", "does not exist"),
        output="missing_folder/out",
    ),
    BadInput(
        "output folder not writable", _good, ("/sys", "cannot write to /sys"), output="/sys/out"
    ),
    BadInput(
        "output equal to an input",
        _good,
        ("dump.parquet", "the output is also an input"),
        output="dump.parquet",
        options=("--force",),
    ),
    BadInput(
        "existing output without --force",
        _good,
        ("out", "the file exists; pass --force"),
        existing_output=True,
    ),
    BadInput(
        "output a symbolic link to an input",
        _good,
        ("link", "the output is also an input"),
        output="link",
        options=("--force",),
        prepare_output=lambda output: output.symlink_to(output.parent / "dump.parquet"),
    ),
    # A report is .json or .md: these paths only make sense for compute's output.
    BadInput(
        "output through '..' equal to an input",
        _good,
        ("sub/../dump.parquet", "the output is also an input"),
        output="sub/../dump.parquet",
        options=("--force",),
        commands=("compute",),
        prepare_output=lambda output: (output.parent.parent).mkdir(),
    ),
    BadInput(
        "output inside an input folder",
        _dump_folder,
        ("dump/out.parquet", "the output is inside the input folder", "read as inputs"),
        output="dump/out",
        commands=("compute",),
    ),
    BadInput(
        "output matched by the input glob",
        _good_glob,
        ("out.parquet", "the output is also an input"),
        options=("--force",),
        commands=("compute",),
        prepare_output=lambda output: GOOD.write_parquet(output),
    ),
]


# ---------------------------------------------------------------------------------------------
# Issue 13: numbers advcli cannot vouch for, damaged files, types Polars cannot hold, JSON lines.


def jsonl_case(name: str, text: str, *expected: str) -> BadInput:
    def build(folder: Path) -> list[str]:
        path = folder / "dump.jsonl"
        path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        return [str(path)]

    return BadInput(name, build, ("dump.jsonl", *expected))


def arrow_case(name: str, column: pa.Array, *expected: str, parquet: bool = False) -> BadInput:
    """GOOD plus a pass-through column ``extra`` of an Arrow type Polars cannot hold, written as
    an Arrow IPC file (or Parquet, where Parquet can store the type)."""

    def build(folder: Path) -> list[str]:
        table = GOOD.to_arrow().append_column("extra", column)
        path = folder / ("dump.parquet" if parquet else "dump.arrow")
        if parquet:
            pq.write_table(table, path)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
        return [str(path)]

    suffix = "dump.parquet" if parquet else "dump.arrow"
    return BadInput(name, build, (suffix, "column 'extra' has the Arrow type", *expected))


def _footer_overcounts(folder: Path) -> list[str]:
    """GOOD (4 rows in one row group) with the footer's row count patched to 5."""
    path = folder / "dump.parquet"
    GOOD.write_parquet(path, statistics=False)
    data = path.read_bytes()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    # Thrift compact: field header 0x16 (i64, delta 1) then zigzag(4) = 0x08. The row group holds
    # the same pair; patch each candidate and keep the one that changes only the file's count.
    for at in range(footer_start, len(data) - 9):
        if data[at : at + 2] == b"\x16\x08":
            path.write_bytes(data[:at] + b"\x16\x0a" + data[at + 2 :])
            metadata = pq.ParquetFile(path).metadata
            if metadata.num_rows == 5 and metadata.row_group(0).num_rows == 4:
                return [str(path)]
    raise AssertionError("no footer row count to patch")


def _mixed_formats(folder: Path) -> list[str]:
    GOOD.write_parquet(folder / "a.parquet")
    GOOD.write_ndjson(folder / "b.jsonl")
    return [str(folder / "a.parquet"), str(folder / "b.jsonl")]


def _split_duplicate_turn(folder: Path) -> list[str]:
    GOOD.write_parquet(folder / "part-0.parquet")
    GOOD.head(1).write_parquet(folder / "part-1.parquet")
    return [str(folder / "part-0.parquet"), str(folder / "part-1.parquet")]


JSON_LINE = '{"data_id": 0, "rollout_id": "a", "turn_index": 0, "score": 1.0, "response_length": 2}'
EXACT = 2**53

CASES += [
    frame_case(
        "integer rewards summing beyond 2^53",
        replace("token_level_rewards", [[0, 1], [2**62, 2**62], [0, 0], [1, 0]]),
        "row 1",
        "column 'token_level_rewards': the integer rewards of the row add up beyond 2^53",
    ),
    frame_case(
        "integer rewards wrapping around int64",
        replace("token_level_rewards", [[0, 1], [0, 1], [2**63 - 1, 1], [1, 0]]),
        "row 2",
        "add up beyond 2^53",
    ),
    frame_case(
        "scalar int64 reward beyond 2^53",
        GOOD.drop("token_level_rewards").with_columns(score=pl.Series([1, 1, EXACT + 1, 0])),
        "row 2",
        "column 'score': the integer reward is beyond 2^53",
    ),
    frame_case(
        "scalar negative int64 reward beyond 2^53",
        GOOD.drop("token_level_rewards").with_columns(score=pl.Series([1, 1, 0, -EXACT - 1])),
        "row 3",
        "the integer reward is beyond 2^53",
    ),
    frame_case(
        "scalar uint64 reward beyond 2^53",
        GOOD.drop("token_level_rewards").with_columns(
            score=pl.Series([2**64 - 1, 1, 0, 0], dtype=pl.UInt64)
        ),
        "row 0",
        "the integer reward is beyond 2^53",
    ),
    frame_case(
        "response_length longer than the reward list",
        GOOD.drop("response_mask").with_columns(response_length=pl.Series([2, 3, 2, 2])),
        "row 1",
        "column 'response_length' (response length) is longer than the row's list in column "
        "'token_level_rewards'",
    ),
    frame_case(
        "float mask value 0.5",
        replace("response_mask", [[1.0, 1.0], [1.0, 0.5], [1.0, 1.0], [1.0, 1.0]]),
        "row 1",
        "column 'response_mask' holds a value other than 0 and 1",
    ),
    frame_case(
        "mask value -1",
        replace("response_mask", [[1, 1], [1, 0], [-1, 1], [1, 1]], pl.List(pl.Int8)),
        "row 2",
        "holds a value other than 0 and 1",
    ),
    frame_case(
        "boolean rewards",
        replace("token_level_rewards", [[True], [True], [False], [False]]),
        "column 'token_level_rewards'",
        "List(Boolean)",
    ),
    frame_case(
        "binary group ids",
        replace("data_id", [b"a", b"a", b"a", b"b"]),
        "column 'data_id' (group id) has type Binary",
    ),
    frame_case(
        "float turn index",
        replace("turn_index", [0.0, 1.0, 0.0, 0.0]),
        "column 'turn_index' (turn index) has type Float64; expected integers",
    ),
    frame_case(
        "list trajectory ids",
        replace("rollout_id", [["a"], ["a"], ["b"], ["a"]]),
        "column 'rollout_id' (trajectory id) has type List(String)",
    ),
    BadInput(
        "Parquet footer counting more rows than its row groups",
        _footer_overcounts,
        ("dump.parquet: the Parquet footer counts 5 rows but its row groups hold 4",),
    ),
    arrow_case(
        "decimal256 pass-through column",
        pa.array([1, 2, 3, 4]).cast(pa.decimal256(50, 2)),
        "decimal256(50, 2)",
        parquet=True,
    ),
    arrow_case(
        "list_view pass-through column",
        pa.array([[1], [2], [3], [4]], pa.list_view(pa.int32())),
        "list_view<element: int32>",
        parquet=True,
    ),
    arrow_case(
        "decimal32 pass-through column in Parquet",
        pa.array([decimal.Decimal("1.25")] * 4, pa.decimal32(5, 2)),
        "decimal32(5, 2)",
        parquet=True,
    ),
    frame_case(
        "NaN in a float mask",
        replace("response_mask", [[1.0, 1.0], [1.0, float("nan")], [1.0, 1.0], [1.0, 1.0]]),
        "row 1",
        "column 'response_mask' holds a value other than 0 and 1",
    ),
    # Only compute makes per-token lists; compare and inspect read the length as a number.
    dataclasses.replace(
        frame_case(
            "response_length too long to hold in memory",
            GOOD.drop("token_level_rewards", "response_mask").with_columns(
                score=pl.Series([1.0, 1.0, 0.0, 0.5]),
                response_length=pl.Series([2, 2, 2**40, 2]),
            ),
        ),
        expected=(
            "out.parquet: a row's response_length of 1,099,511,627,776 tokens needs 12,288.0 GiB "
            "of memory for its per-token advantages (",
            "GiB available); check the column, or pass --no-tokens",
        ),
        commands=("compute",),
    ),
    arrow_case(
        "run-end encoded pass-through column",
        pa.RunEndEncodedArray.from_arrays([4], [1.5]),
        "run_end_encoded",
    ),
    arrow_case(
        "interval pass-through column",
        pa.array([(1, 2, 3)] * 4, pa.month_day_nano_interval()),
        "month_day_nano_interval",
    ),
    arrow_case(
        "union pass-through column",
        pa.UnionArray.from_sparse(pa.array([0, 0, 0, 0], pa.int8()), [pa.array([1, 2, 3, 4])]),
        "sparse_union",
    ),
    arrow_case(
        "union nested in a struct",
        pa.StructArray.from_arrays(
            [pa.UnionArray.from_sparse(pa.array([0] * 4, pa.int8()), [pa.array([1, 2, 3, 4])])],
            ["inner"],
        ),
        "sparse_union",
    ),
    jsonl_case(
        "JSON ids mixing numbers and strings",
        f"{JSON_LINE}\n" + JSON_LINE.replace('"data_id": 0', '"data_id": "0"') + "\n",
        "line 1: column 'data_id' mixes JSON strings with other values",
        '(line 2 holds "0", line 1 a number, 0)',
    ),
    jsonl_case(
        "JSON trajectory ids mixing booleans and strings",
        f"{JSON_LINE}\n" + JSON_LINE.replace('"rollout_id": "a"', '"rollout_id": true') + "\n",
        "line 2: column 'rollout_id' mixes JSON strings with other values",
    ),
    jsonl_case(
        "JSON ids mixing lists and strings",
        JSON_LINE.replace('"data_id": 0', '"data_id": [1]')
        + "\n"
        + JSON_LINE.replace('"data_id": 0', '"data_id": "[1]"')
        + "\n",
        "line 1: column 'data_id' mixes JSON strings with other values",
        '(line 2 holds "[1]", line 1 a list, [1])',
    ),
    jsonl_case(
        "JSON ids mixing objects and strings",
        f"{JSON_LINE}\n".replace('"data_id": 0', '"data_id": "x"')
        + JSON_LINE.replace('"data_id": 0', '"data_id": {"k": 1}')
        + "\n",
        "line 2: column 'data_id' mixes JSON strings with other values",
        'line 2 an object, {"k": 1}',
    ),
    jsonl_case(
        "JSON integer reward beyond 2^53 among floats",
        f"{JSON_LINE}\n".replace('"score": 1.0', '"score": 0.5')
        + JSON_LINE.replace('"score": 1.0', '"score": 9007199254740993').replace('"a"', '"b"')
        + "\n",
        "line 2: column 'score' holds the integer 9007199254740993, beyond 2^53",
    ),
    jsonl_case(
        "malformed JSON line",
        f"{JSON_LINE}\n\n{JSON_LINE}\n" + JSON_LINE[:-10] + "\n",
        "line 4: not valid JSON",
    ),
    jsonl_case("JSON line that is not an object", f"{JSON_LINE}\n[1, 2]\n", "line 2"),
    jsonl_case(
        "JSON lines that are not UTF-8", f"{JSON_LINE}\n".encode() + b'{"a": "\xff"}\n', "UTF-8"
    ),
    BadInput(
        "inputs of two formats",
        _mixed_formats,
        ("a.parquet", "inputs mix formats (JSON-lines, Parquet)"),
    ),
    BadInput(
        "duplicate turn across files",
        _split_duplicate_turn,
        ("part-1.parquet row 0", "duplicate turn: (data_id=0, rollout_id='a', turn_index=0)"),
    ),
    dataclasses.replace(
        frame_case(
            "padding a huge row for .npz",
            GOOD.drop("token_level_rewards", "response_mask").with_columns(
                score=pl.Series([1.0, 1.0, 0.0, 0.5]),
                response_length=pl.Series([2, 2, 2_000_000_000, 2]),
            ),
        ),
        expected=(
            "out.npz: padding 4 rows to 2,000,000,000 tokens needs 119.2 GiB of memory (",
            "GiB available); write .parquet or .arrow instead",
        ),
        output="out.npz",
        commands=("compute",),
    ),
    BadInput(
        "output name over the filesystem's limit",
        _good,
        ("o" * 251, "the file name is too long (", "bytes; this filesystem allows 255)"),
        output="o" * 251,
    ),
    BadInput(
        "dangling symbolic link at the output",
        _good,
        ("dangling", "the file exists; pass --force to replace it"),
        output="dangling",
        prepare_output=lambda output: output.symlink_to(output.parent / "nowhere"),
    ),
    BadInput(
        "output is a directory",
        _good,
        ("a_folder.parquet: is a directory; name a file",),
        output="a_folder.parquet",
        prepare_output=lambda output: output.mkdir(),
    ),
]


# ---------------------------------------------------------------------------------------------
# Issue 26: names that are not UTF-8, Arrow IPC streams and files, JSON literals that are not JSON.

# A name's bytes that are not UTF-8, as Python holds them (surrogate escapes) and as advcli's
# messages show them.
NOT_UTF8 = os.fsdecode(b"-\xff")
NOT_UTF8_SHOWN = "-\\xff"


def named_case(name: str, frame: pl.DataFrame, *expected: str) -> BadInput:
    """``frame`` written as ``dump-\\xff.parquet`` in a folder ``runs-\\xff``: the error line
    names both with their bytes escaped."""

    def build(folder: Path) -> list[str]:
        (folder / f"runs{NOT_UTF8}").mkdir()
        path = folder / f"runs{NOT_UTF8}" / f"dump{NOT_UTF8}.parquet"
        # Through a Python file: Polars takes a path only as UTF-8 text.
        with path.open("wb") as file:
            frame.write_parquet(file)
        return [str(path)]

    shown = f"runs{NOT_UTF8_SHOWN}/dump{NOT_UTF8_SHOWN}.parquet"
    return BadInput(name, build, (shown, *expected))


def stream_case(name: str, data: Callable[[], bytes], *expected: str, suffix: str = ".arrows"):
    def build(folder: Path) -> list[str]:
        path = folder / f"dump{suffix}"
        path.write_bytes(data())
        return [str(path)]

    return BadInput(name, build, (f"dump{suffix}", *expected))


def ipc_stream(frame: pl.DataFrame, batches: int = 1) -> bytes:
    table = frame.to_arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for _ in range(batches):
            writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _feather_v1() -> bytes:
    """The first bytes of a Feather version 1 file (its magic) and some more."""
    return b"FEA1" + bytes(64) + b"FEA1"


CASES += [
    named_case("missing group column in a file named in bytes", GOOD.drop("data_id"), "no group"),
    named_case("zero rows in a file named in bytes", GOOD.clear(), "the input has no rows"),
    named_case(
        "null group id in a file named in bytes",
        replace("data_id", [0, None, 0, 1]),
        "row 1",
        "column 'data_id' (group id) is null",
    ),
    BadInput(
        "missing file named in bytes",
        lambda folder: [str(folder / f"gone{NOT_UTF8}.parquet")],
        (f"gone{NOT_UTF8_SHOWN}.parquet: no such file or directory",),
    ),
    BadInput(
        "glob in bytes matching nothing",
        lambda folder: [str(folder / f"step{NOT_UTF8}-*.parquet")],
        (f"step{NOT_UTF8_SHOWN}-*.parquet: the pattern matches no file",),
    ),
    BadInput(
        "existing output named in bytes without --force",
        _good,
        (f"out{NOT_UTF8_SHOWN}", "the file exists; pass --force"),
        output=f"out{NOT_UTF8}",
        existing_output=True,
    ),
    BadInput(
        "output folder named in bytes missing",
        _good,
        (f"gone{NOT_UTF8_SHOWN}/out", "the folder ", f"gone{NOT_UTF8_SHOWN} does not exist"),
        output=f"gone{NOT_UTF8}/out",
    ),
    jsonl_case(
        "JSON NaN literal in the reward column",
        f"{JSON_LINE}\n" + JSON_LINE.replace('"score": 1.0', '"score": NaN') + "\n",
        "line 2: column 'score' holds NaN, which is not JSON",
        "write null or a number",
    ),
    jsonl_case(
        "JSON -Infinity literal in a reward list",
        f"{JSON_LINE}\n\n"
        + JSON_LINE.replace('"score": 1.0', '"score": [0.0, -Infinity]').replace('"a"', '"b"')
        + "\n",
        "line 3: column 'score' holds -Infinity, which is not JSON",
    ),
    jsonl_case(
        "JSON Infinity literal in an id column",
        JSON_LINE.replace('"data_id": 0', '"data_id": Infinity') + "\n",
        "line 1: column 'data_id' holds Infinity, which is not JSON",
    ),
    jsonl_case(
        "JSON NaN literal in a trajectory id column",
        f"{JSON_LINE}\n" + JSON_LINE.replace('"rollout_id": "a"', '"rollout_id": NaN') + "\n",
        "line 2: column 'rollout_id' holds NaN",
    ),
    jsonl_case(
        "JSON lowercase nan",
        f"{JSON_LINE}\n" + JSON_LINE.replace('"score": 1.0', '"score": nan') + "\n",
        "line 2: not valid JSON",
    ),
    stream_case("empty .arrows stream", lambda: b"", "the file is empty (0 bytes)"),
    stream_case(
        "Arrow IPC stream of no batches", lambda: ipc_stream(GOOD, 0), "the input has no rows"
    ),
    stream_case(
        "truncated Arrow IPC stream",
        lambda: ipc_stream(GOOD, 2)[:-100],
        "not a readable Arrow IPC stream",
    ),
    stream_case(
        "text named .arrows",
        lambda: b"data_id,rollout_id\n0,a\n",
        "not a readable Arrow IPC stream",
    ),
    stream_case(
        "missing group column in an Arrow IPC stream",
        lambda: ipc_stream(GOOD.drop("data_id")),
        "no group column",
    ),
    stream_case(
        "null reward in an Arrow IPC stream named .arrow",
        lambda: ipc_stream(
            replace("token_level_rewards", [[0.0, 1.0], None, [0.0, 0.0], [0.5, 0.0]])
        ),
        "row 1",
        "column 'token_level_rewards' (reward) is null",
        suffix=".arrow",
    ),
    stream_case(
        "Feather version 1",
        _feather_v1,
        "a Feather version 1 file, which advcli does not read",
        suffix=".feather",
    ),
]


# inspect writes nothing, and it reports (rather than refuses) scores that disagree within a
# trajectory and repeated turns: these cases go through compute and compare only.
# ---------------------------------------------------------------------------------------------
# Issue 29: GiGPO's roles, read by compute --estimator gigpo only.

GIGPO = GOOD.with_columns(
    anchor=pl.Series(["s0", "s1", "s0", "s0"]), step_reward=pl.Series([0.0, 1.0, 0.0, 0.5])
)


def gigpo_case(name: str, frame: pl.DataFrame, *expected: str) -> BadInput:
    return dataclasses.replace(
        frame_case(name, frame, *expected, options=("--estimator", "gigpo")), commands=("compute",)
    )


def gigpo_usage(name: str, *options: str, expected: str) -> BadInput:
    """An option of gigpo's out of its range: a usage error (exit 2) before any input is read."""
    return dataclasses.replace(
        frame_case(name, GIGPO, expected, options=options),
        expected=(expected,),
        commands=("compute",),
        exit_code=2,
    )


def _roll(frame: pl.DataFrame) -> pl.DataFrame:
    """The GiGPO frame in ROLL's names (its dialect): no option names a column."""
    return frame.rename(
        {
            "data_id": "traj_group_id",
            "rollout_id": "traj_id",
            "turn_index": "step",
            "token_level_rewards": "scores",
            "anchor": "state_hash",
            "step_reward": "step_scores",
        }
    ).with_columns(episode_scores=pl.Series([1.0, 1.0, 0.0, 0.5]))


def _gigpo_json(*anchors: object) -> Callable[[Path], list[str]]:
    """The GiGPO dump as JSON lines with these four anchors."""

    def build(folder: Path) -> list[str]:
        path = folder / "dump.jsonl"
        lines = GIGPO.with_columns(anchor=pl.Series([None] * 4, dtype=pl.String)).to_dicts()
        for line, anchor in zip(lines, anchors, strict=True):
            line["anchor"] = anchor
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return [str(path)]

    return build


CASES += [
    gigpo_case(
        "gigpo anchor null",
        GIGPO.with_columns(anchor=pl.Series(["s0", None, "s0", "s0"])),
        "row 1",
        "column 'anchor' (anchor) is null",
    ),
    gigpo_case(
        "gigpo anchor of floats",
        GIGPO.with_columns(anchor=pl.Series([0.5, 0.25, 0.5, 0.5])),
        "column 'anchor' (anchor) has type Float64",
        "a string, an integer, or a list or struct of them",
    ),
    BadInput(
        "gigpo anchor mixing JSON strings and numbers",
        _gigpo_json("s0", 0, "s1", "s1"),
        ("dump.jsonl", "line 2: column 'anchor' mixes JSON strings with other values"),
        options=("--estimator", "gigpo"),
        commands=("compute",),
    ),
    # Inside a list or an object Polars reads the text of a number where other lines hold a
    # string there: [1] and ["1"] would be one state.
    *(
        BadInput(
            f"gigpo anchor mixing JSON strings and numbers inside {kind}",
            _gigpo_json(*anchors),
            ("dump.jsonl", f"line {line}: column 'anchor' holds 1 inside its list or object"),
            options=("--estimator", "gigpo"),
            commands=("compute",),
        )
        for kind, line, anchors in (
            ("lists", 1, ([1], ["1"], ["2"], ["2"])),
            ("objects", 2, ({"k": "1"}, {"k": 1}, {"k": "2"}, {"k": "2"})),
            ("lists of lists", 3, ([["0"]], [["2"]], [[1, "3"]], [["1"]])),
            ("lists of objects", 4, ([{"k": "1"}], [{"k": "2"}], [{"k": "2"}], [{"k": 1}])),
        )
    ),
    gigpo_case(
        "gigpo step reward NaN",
        GIGPO.with_columns(step_reward=pl.Series([0.0, float("nan"), 0.0, 0.5])),
        "row 1",
        "column 'step_reward' (step reward) is NaN",
    ),
    gigpo_case(
        "gigpo step reward null",
        GIGPO.with_columns(step_reward=pl.Series([0.0, 1.0, None, 0.5])),
        "row 2",
        "column 'step_reward' (step reward) is null",
    ),
    gigpo_case(
        "gigpo step reward infinite",
        GIGPO.with_columns(step_reward=pl.Series([0.0, 1.0, 0.0, float("-inf")])),
        "row 3",
        "column 'step_reward' (step reward) is infinite",
    ),
    gigpo_case(
        "gigpo step return NaN",
        GIGPO.drop("step_reward").with_columns(
            step_return=pl.Series([0.0, float("nan"), 0.0, 0.5])
        ),
        "row 1",
        "column 'step_return' (step return) is NaN",
    ),
    gigpo_case(
        "gigpo anchor a list of floats",
        GIGPO.with_columns(anchor=pl.Series([[0.5], [0.25], [0.5], [0.5]])),
        "column 'anchor' (anchor) has type List(Float64)",
        "a string, an integer, or a list or struct of them",
    ),
    gigpo_case(
        "gigpo ROLL anchor null",
        _roll(GIGPO.with_columns(anchor=pl.Series(["s0", "s1", None, "s0"]))),
        "row 2",
        "column 'state_hash' (anchor) is null",
    ),
    gigpo_case(
        "gigpo ROLL step reward NaN",
        _roll(GIGPO.with_columns(step_reward=pl.Series([0.0, 1.0, 0.0, float("nan")]))),
        "row 3",
        "column 'step_scores' (step reward) is NaN",
    ),
    gigpo_usage(
        "gigpo gamma above 1",
        "--estimator",
        "gigpo",
        "--gamma",
        "1.5",
        expected="--gamma must be in [0, 1], got 1.5",
    ),
    gigpo_usage(
        "gigpo gamma below 0",
        "--recipe",
        "roll",
        "--gamma",
        "-0.5",
        expected="--gamma must be in [0, 1], got -0.5",
    ),
    gigpo_usage(
        "gigpo gamma NaN",
        "--estimator",
        "gigpo",
        "--gamma",
        "nan",
        expected="--gamma must be in [0, 1], got nan",
    ),
    gigpo_usage(
        "gigpo gamma beside step returns",
        "--estimator",
        "gigpo",
        "--step-return-col",
        "step_reward",
        "--gamma",
        "0.5",
        expected="--gamma discounts step rewards, and --step-return-col names returns "
        "discounted already ('step_reward'): give one of the two",
    ),
    gigpo_usage(
        "gigpo step weight negative",
        "--estimator",
        "gigpo",
        "--step-weight",
        "-1",
        expected="--step-weight must be a finite number >= 0, got -1.0",
    ),
    gigpo_usage(
        "gigpo step weight infinite",
        "--recipe",
        "verl-agent",
        "--step-weight",
        "inf",
        expected="--step-weight must be a finite number >= 0, got inf",
    ),
    gigpo_case(
        "gigpo anchor missing",
        GIGPO.drop("anchor"),
        "no anchor column (gigpo's step groups need one)",
        "'anchor'",
        "--anchor-col",
    ),
    gigpo_case(
        "gigpo step reward missing",
        GIGPO.drop("step_reward"),
        "no step reward column",
        "--step-return-col",
    ),
]

PER_TURN = ("--reward-mode", "per-turn")


def per_turn_case(name: str, frame: pl.DataFrame, *expected: str) -> BadInput:
    """Per-turn rewards (each row's own turn's reward, discounted along the turn order)."""
    return dataclasses.replace(
        frame_case(name, frame, *expected, options=PER_TURN), commands=("compute",)
    )


CASES += [
    per_turn_case(
        "per-turn reward null",
        replace("token_level_rewards", [[0.0, 1.0], None, [0.0, 0.0], [0.5, 0.0]]),
        "row 1",
        "column 'token_level_rewards' (reward) is null",
    ),
    per_turn_case(
        "per-turn reward NaN",
        GOOD.drop("token_level_rewards").with_columns(
            score=pl.Series([1.0, float("nan"), 0.0, 0.0])
        ),
        "row 1",
        "column 'score': the score is NaN",
    ),
    per_turn_case(
        "per-turn turn indices with a gap",
        replace("turn_index", [0, 2, 0, 0]),
        "row 0",
        "trajectory (data_id=0, rollout_id='a') has turns 0, 2 in 'turn_index'",
        "consecutive turn indices",
    ),
    per_turn_case(
        "per-turn turn indices repeated",
        replace("turn_index", [1, 1, 0, 0]),
        "row 1",
        "duplicate turn: (data_id=0, rollout_id='a', turn_index=1)",
    ),
    dataclasses.replace(
        frame_case("per-turn gamma out of range", GOOD, options=(*PER_TURN, "--gamma", "2")),
        expected=("--gamma must be in [0, 1], got 2.0",),
        commands=("compute",),
        exit_code=2,
    ),
]

NOT_FOR_INSPECT = {
    "inconsistent trajectory scores",
    "duplicate turn",
    "duplicate turn across files",
    "output name over the filesystem's limit",
    "dangling symbolic link at the output",
    "output is a directory",
    "output folder missing",
    "output folder not writable",
    "output equal to an input",
    "existing output without --force",
    "output a symbolic link to an input",
    "existing output named in bytes without --force",
    "output folder named in bytes missing",
}
CASES = [
    dataclasses.replace(case, commands=("compute", "compare"))
    if case.name in NOT_FOR_INSPECT
    else case
    for case in CASES
]


def make_corpus(folder: Path) -> None:
    """Write every case's input files under ``folder/<case name>/``."""
    for case in CASES:
        case_folder = folder / case.name.replace(" ", "_")
        case_folder.mkdir(parents=True, exist_ok=True)
        case.build(case_folder)


if __name__ == "__main__":
    make_corpus(Path(sys.argv[1]))

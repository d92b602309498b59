"""The bad-input corpus: every way a rollout dump can be broken that advcli must refuse.

Each case builds its input files in a folder and names the text its one ``Error:`` line must
contain (the problem) and where (file, column, row or key). ``make_corpus(folder)`` writes every
case to disk, so the corpus can also be inspected by hand:
``python tests/bad_inputs.py /tmp/corpus``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

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


CASES: list[BadInput] = [
    frame_case("missing group column", GOOD.drop("data_id"), "no group column", "'data_id'"),
    frame_case(
        "missing trajectory column", GOOD.drop("rollout_id"), "no trajectory column", "'rollout_id'"
    ),
    frame_case(
        "missing reward column",
        GOOD.drop("token_level_rewards"),
        "no reward column",
        "'token_level_rewards'",
    ),
    frame_case(
        "missing mask column", GOOD.drop("response_mask"), "no mask column", "'response_mask'"
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
]


# inspect writes nothing, and it reports (rather than refuses) scores that disagree within a
# trajectory and repeated turns: these cases go through compute and compare only.
NOT_FOR_INSPECT = {
    "inconsistent trajectory scores",
    "duplicate turn",
    "output folder missing",
    "output folder not writable",
    "output equal to an input",
    "existing output without --force",
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

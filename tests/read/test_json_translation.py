"""JSON lines read once into an Arrow file by Arrow's strict reader, or by Polars with the schema of
all their lines: the same table either way (advcli/read/json_translation.py).

Each file below is read as a command reads it (with a spool folder) and compared with Polars'
own reading of every line (``infer_schema_length=None``); the test also says which of the two
readings advcli took, from the rule written in the module: a field or a type the first 1,000
lines do not show, a NaN literal, a blank line or two objects on one line, a byte-order mark, a
lone surrogate, each sends the file to Polars.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from advcli.errors import AdvcliError
from advcli.read.inputs import open_dataset
from advcli.read.json_translation import BLOCK_BYTES, PREFIX_ROWS

LATE = PREFIX_ROWS + 5  # a line the first lines' schema does not see
# The roles of the dumps of the command-line tests below.
ROLES = ("--group-col", "data_id", "--traj-col", "rollout_id", "--reward-col", "reward")


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """The run's spool folder, as opened() makes it."""
    folder = tmp_path / "spool"
    folder.mkdir()
    return folder


def lines(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def plain(count: int = LATE + 10) -> list[dict]:
    """Rows of every type JSON gives: integers, floats, strings, booleans, lists, objects."""
    return [
        {
            "id": f"g{n % 7}",
            "step": n,
            "score": n / 8,
            "ok": n % 2 == 0,
            "tokens": list(range(n % 4)),
            "meta": {"name": f"t{n}", "weights": [0.5, float(n)]},
        }
        for n in range(count)
    ]


def with_row(rows: list[dict], at: int, row: dict) -> list[dict]:
    return [*rows[:at], row, *rows[at + 1 :]]


# (name, text, read by Arrow): the texts the strict reading takes, and those it leaves to Polars.
CASES = [
    ("every type", lines(plain()), True),
    (
        "integers in a float column",
        lines(with_row(plain(), LATE, {**plain()[LATE], "score": 3})),
        True,
    ),
    (
        "a field missing from some lines",
        lines([{k: v for k, v in r.items() if k != "ok" or r["step"] % 3} for r in plain()]),
        True,
    ),
    ("a field null on every line", lines([{**r, "note": None} for r in plain()]), True),
    ("CRLF line ends", lines(plain()).replace("\n", "\r\n"), True),
    ("no line end at the end", lines(plain()).rstrip("\n"), True),
    (
        "a field first seen late",
        lines(with_row(plain(), LATE, {**plain()[LATE], "extra": 1})),
        False,
    ),
    (
        "a float late in an integer column",
        lines(with_row(plain(), LATE, {**plain()[LATE], "step": 1.5})),
        False,
    ),
    (
        "a key first seen late in an object",
        lines(
            with_row(
                plain(), LATE, {**plain()[LATE], "meta": {"name": "x", "weights": [], "more": 2}}
            )
        ),
        False,
    ),
    (
        "values after nulls",
        lines([{**r, "note": None if r["step"] < LATE else 1.0} for r in plain()]),
        False,
    ),
    ("a blank line", lines(plain()).replace("\n", "\n\n", 1), False),
]


@pytest.mark.parametrize("name,text,by_arrow", CASES, ids=[case[0] for case in CASES])
def test_the_same_table_either_way(
    tmp_path: Path, spool: Path, name: str, text: str, by_arrow: bool
) -> None:
    path = tmp_path / "dump.jsonl"
    path.write_bytes(text.encode("utf-8"))
    dataset = open_dataset([str(path)], spool=lambda: spool)
    assert (dataset.translated_from == "json") == by_arrow
    assert dataset.inputs == (path,)
    expected = pl.read_ndjson(path, infer_schema_length=None)
    assert dataset.schema == expected.schema
    assert_frame_equal(dataset.rows().collect(), expected)
    # Nothing is left in the spool of a reading that was not taken.
    assert bool(list(spool.iterdir())) == by_arrow


def test_files_with_a_field_null_in_one_are_read_with_one_schema(
    tmp_path: Path, spool: Path
) -> None:
    """Two steps' files, one of which never writes the note: each is read by Arrow with the
    type the other gives it, as Polars' reading of the two unites them."""
    first, second = tmp_path / "step1.jsonl", tmp_path / "step2.jsonl"
    first.write_text(lines([{"id": "a", "note": None}, {"id": "b", "note": None}]))
    second.write_text(lines([{"id": "a", "note": "x"}, {"id": "b", "note": None}]))
    dataset = open_dataset([str(first), str(second)], spool=lambda: spool)
    assert dataset.translated_from == "json"
    assert dataset.schema == pl.Schema({"id": pl.String, "note": pl.String})
    assert dataset.rows().collect()["note"].to_list() == [None, None, "x", None]


def test_a_float_where_another_file_held_nulls_is_left_to_polars(
    tmp_path: Path, spool: Path
) -> None:
    """step1's first lines hold nulls and its later ones integers; step2's floats. Arrow would
    read step1's integers as the floats the united schema says; Polars' types of every line
    conflict, as they always did."""
    first, second = tmp_path / "step1.jsonl", tmp_path / "step2.jsonl"
    first.write_text(lines([{"a": None}] * LATE + [{"a": 1}]))
    second.write_text(lines([{"a": 1.5}]))
    with pytest.raises(AdvcliError, match="schemas conflict: column 'a' is Int64"):
        open_dataset([str(first), str(second)], spool=lambda: spool)


LEFT_TO_POLARS = [
    # What Arrow reads otherwise than Polars: a null line (Polars refuses it), a row of nulls
    # alone, the integer literal -0 in a float column (Polars: 0.0, Arrow: -0.0).
    ("a null line", '{"a": 1}\nnull\n{"a": 2}\n'),
    ("a null line first", 'null\n{"a": 1}\n'),
    ("an empty object", '{"a": 1}\n{}\n'),
    ("-0 in a float column", '{"a": 1.5}\n{"a": -0}\n'),
    ("-0 in a float list", '{"a": [1.5]}\n{"a": [2.5, -0]}\n'),
]


@pytest.mark.parametrize("name,text", LEFT_TO_POLARS, ids=[case[0] for case in LEFT_TO_POLARS])
def test_what_arrow_reads_otherwise_is_left_to_polars(
    tmp_path: Path, spool: Path, name: str, text: str
) -> None:
    path = tmp_path / "dump.jsonl"
    path.write_text(text)
    try:
        expected = pl.read_ndjson(path, infer_schema_length=None)
    except pl.exceptions.PolarsError as error:
        with pytest.raises((AdvcliError, pl.exceptions.PolarsError), match="null"):
            open_dataset([str(path)], spool=lambda: spool).rows().collect()
        assert "null" in str(error)
        return
    dataset = open_dataset([str(path)], spool=lambda: spool)
    assert dataset.translated_from is None
    got = dataset.rows().collect()
    assert_frame_equal(got, expected)
    # Bit for bit: 0.0, not -0.0 (which equals it).
    values = got["a"].explode() if isinstance(got.schema["a"], pl.List) else got["a"]
    assert not np.signbit(values.drop_nulls().to_numpy()).any()


def test_minus_zero_written_as_a_float_stays_with_arrow(tmp_path: Path, spool: Path) -> None:
    """-0.0 is -0.0 in both readings: the file is Arrow's."""
    path = tmp_path / "dump.jsonl"
    path.write_text('{"a": 1.5}\n{"a": -0.0}\n')
    dataset = open_dataset([str(path)], spool=lambda: spool)
    assert dataset.translated_from == "json"
    assert np.signbit(dataset.rows().collect()["a"].to_numpy()).tolist() == [False, True]


def test_a_line_longer_than_a_block(tmp_path: Path, spool: Path) -> None:
    long = "x" * (BLOCK_BYTES + 1000)
    path = tmp_path / "dump.jsonl"
    path.write_text(lines([{"a": "short"}, {"a": long}, {"a": "end"}]))
    dataset = open_dataset([str(path)], spool=lambda: spool)
    assert dataset.translated_from == "json"
    assert dataset.rows().collect()["a"].to_list() == ["short", long, "end"]


def test_without_a_spool_polars_reads_the_lines(tmp_path: Path) -> None:
    """The library's open_dataset with no spool folder: no translation, Polars' reading."""
    path = tmp_path / "dump.jsonl"
    path.write_text(lines(plain(20)))
    dataset = open_dataset([str(path)])
    assert dataset.translated_from is None and dataset.input_format == "json"
    assert_frame_equal(dataset.rows().collect(), pl.read_ndjson(path))


REFUSED = [
    # What Polars refuses, the strict reading sends to it: the error is the one it always was.
    ("two objects on a line", '{"a": 1}\n{"a": 2} {"a": 3}\n', "line 2: not valid JSON"),
    ("NaN", '{"a": 1.0}\n{"a": NaN}\n', "line 2: column 'a' holds NaN"),
    (
        "Infinity in a list",
        '{"a": [1.0]}\n{"a": [-Infinity]}\n',
        "line 2: column 'a' holds -Infinity",
    ),
    ("a byte-order mark", '\ufeff{"a": 1}\n', "line 1: not valid JSON (Unexpected UTF-8 BOM"),
]


@pytest.mark.parametrize("name,text,said", REFUSED, ids=[case[0] for case in REFUSED])
def test_what_polars_refuses_is_still_refused(
    tmp_path: Path, spool: Path, name: str, text: str, said: str
) -> None:
    path = tmp_path / "dump.jsonl"
    path.write_text(text)
    with pytest.raises(AdvcliError) as error:
        open_dataset([str(path)], spool=lambda: spool)
    assert str(error.value).startswith(f"{path} {said}"), str(error.value)
    assert list(spool.iterdir()) == []


def test_a_lone_surrogate_is_left_to_polars(tmp_path: Path, spool: Path) -> None:
    path = tmp_path / "dump.jsonl"
    path.write_text('{"id": "a"}\n{"id": "\\ud800"}\n')
    dataset = open_dataset([str(path)], spool=lambda: spool)
    assert dataset.translated_from is None


def test_mixed_ids_after_the_first_lines_are_refused_as_before(tmp_path: Path, run) -> None:
    """An id that is a number on a late line: Arrow's strict reading stops on it, and Polars'
    reading of every line is checked as it always was (the number would become text)."""
    rows = [
        {"data_id": "7" if n % 2 else "8", "rollout_id": f"r{n}", "reward": float(n % 2)}
        for n in range(LATE + 2)
    ]
    rows[LATE] = {**rows[LATE], "data_id": 7}
    path = tmp_path / "dump.jsonl"
    path.write_text(lines(rows))
    result = run("compare", path, *ROLES, "-q")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {path} line {LATE + 1}: column 'data_id'"), (
        result.stderr
    )


def test_a_reward_integer_beyond_2_53_is_found_in_arrows_reading(tmp_path: Path, run) -> None:
    """Arrow reads the literal as float64 (rounded), as Polars does: the line is still named."""
    rows = [
        {"data_id": f"g{n // 2}", "rollout_id": f"r{n}", "reward": n / 4} for n in range(LATE + 2)
    ]
    path = tmp_path / "dump.jsonl"
    text = lines(rows).replace(f'"reward": {LATE / 4}', '"reward": 9007199254740993', 1)
    path.write_text(text)
    result = run("compare", path, *ROLES, "-q")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {path} line {LATE + 1}: column 'reward' holds the integer 9007199254740993"
    ), result.stderr


def test_a_reward_below_2_53_reads_no_line_again(tmp_path: Path, run) -> None:
    """Scores below 2^53: compare runs on Arrow's reading, with scores as Polars reads them."""
    rows = [
        {"data_id": f"g{n // 4}", "rollout_id": f"r{n}", "reward": [0.25 * (n % 4)]}
        for n in range(40)
    ]
    path = tmp_path / "dump.jsonl"
    path.write_text(lines(rows))
    result = run("compare", path, *ROLES, "-q", "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["counts"]["groups"] == 10


@pytest.mark.process
@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("by", ["file", "step"])
def test_parts_read_in_workers_keep_the_json_checks(
    tmp_path: Path, run, jobs: str, by: str
) -> None:
    """``--jobs 2`` parts read the run's Arrow files in worker processes: the raw-text check of
    the reward still reads the JSON lines, and names the file and line."""
    for step in (1, 2):
        rows = [
            {"step": step, "data_id": f"g{n // 2}", "rollout_id": f"r{n}", "reward": n / 4}
            for n in range(LATE + 2)
        ]
        text = lines(rows)
        if step == 2:
            text = text.replace(f'"reward": {LATE / 4}', '"reward": 9007199254740993', 1)
        (tmp_path / f"step{step}.jsonl").write_text(text)
    result = run("compare", tmp_path, "--by", by, "--jobs", jobs, "-q", *ROLES)
    assert result.exit_code == 1
    assert f"{tmp_path / 'step2.jsonl'} line {LATE + 1}: column 'reward' holds the integer" in (
        result.stderr
    ), result.stderr


@pytest.mark.process
def test_parts_in_workers_give_the_report_one_process_gives(tmp_path: Path, run) -> None:
    for step in (1, 2, 3):
        rows = [
            {"data_id": f"g{n // 4}", "rollout_id": f"r{n}", "reward": [float((n * step) % 3)]}
            for n in range(48)
        ]
        (tmp_path / f"step{step}.jsonl").write_text(lines(rows))
    reports = [
        run("compare", tmp_path, "--by", "file", "--jobs", jobs, "-q", "--json", "-")
        for jobs in ("1", "2")
    ]
    assert [result.exit_code for result in reports] == [0, 0], reports[1].stderr
    assert json.loads(reports[0].stdout) == json.loads(reports[1].stdout)


def test_inspect_names_the_json_lines_not_their_arrow_file(tmp_path: Path, run) -> None:
    """The reading is of the user's file in its format, whatever the run read it into."""
    path = tmp_path / "dump.jsonl"
    path.write_text(
        lines([{"data_id": "g", "rollout_id": f"r{n}", "reward": n / 2} for n in range(3)])
    )
    result = run("inspect", path, *ROLES, "--json")
    assert result.exit_code == 0, result.stderr
    inputs = json.loads(result.stdout)["inputs"]
    assert (inputs["files"], inputs["format"]) == ([str(path)], "json")

"""Reading a trainer's own advantages for ``audit`` (issue 47): which column, each row's value
over its response tokens, and one clear error for each broken column."""

from __future__ import annotations

import polars as pl
import pytest
from audit_dumps import audited_frame
from conftest import dump_frame

from advcli.errors import AdvcliError
from advcli.run.audit import audit
from advcli.settings.config import ColumnNames

ROWS = [("A", 0, 0, 1.0, 2), ("A", 1, 0, 0.0, 2), ("B", 2, 0, 3.0, 3), ("B", 3, 0, 1.0, 3)]
# grpo at either level, epsilon 0: A's and B's scores are 1/sqrt(2) std-units from the mean.
FOUND = [0.5**0.5, -(0.5**0.5), 0.5**0.5, -(0.5**0.5)]


def audited(tmp_path, frame: pl.DataFrame, names: ColumnNames = ColumnNames()) -> dict:
    path = tmp_path / "dump.parquet"
    frame.write_parquet(path)
    return audit([path], names)


def refused(tmp_path, frame: pl.DataFrame, names: ColumnNames = ColumnNames()) -> str:
    with pytest.raises(AdvcliError) as error:
        audited(tmp_path, frame, names)
    return str(error.value)


def test_per_token_values_are_read_over_the_response_tokens(tmp_path) -> None:
    """The mask's zeros (a tool's observation, padding) hold anything; the response tokens'
    values are the row's."""
    frame = audited_frame(ROWS, FOUND).with_columns(
        pl.Series("response_mask", [[0, 1, 1], [1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1]]),
        pl.Series(
            "advantages",
            [
                [9.0, *[FOUND[0]] * 2],
                [FOUND[1], -9.0, FOUND[1]],
                [*[FOUND[2]] * 3, 7.0],
                [0.0, *[FOUND[3]] * 3],
            ],
            dtype=pl.List(pl.Float32),
        ),
        pl.Series(
            "token_level_rewards",
            [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
        ),
    )
    report = audited(tmp_path, frame)
    assert report["rule"]["rows_matched"] == 4
    assert report["findings"] == []
    why = report["reading"]["roles"]["trainer_advantage"]
    assert why == {
        "column": "advantages",
        "why": "the column named 'advantages', a value per token",
    }


@pytest.mark.parametrize("dtype", [pl.Float32, pl.Float64])
def test_no_value_outside_the_response_is_read(tmp_path, dtype) -> None:
    """Null, NaN, infinities and huge values on the tokens the mask leaves out are no error and
    change no row's value; a row's least and greatest values are its response tokens' (float32
    lists are read as they are, others as float64)."""
    frame = audited_frame(ROWS, FOUND).with_columns(
        pl.Series("response_mask", [[0, 1, 1], [1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 0]]),
        pl.Series(
            "advantages",
            [
                [float("-inf"), FOUND[0], FOUND[0]],
                [FOUND[1], float("nan"), FOUND[1]],
                [*[FOUND[2]] * 3, float("inf")],
                [None, FOUND[3], FOUND[3] + 0.5, -1e305 if dtype == pl.Float64 else -3e38],
            ],
            dtype=pl.List(dtype),
        ),
        pl.Series(
            "token_level_rewards",
            [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 1.0, 0.0]],
        ),
    )
    report = audited(tmp_path, frame)
    # Row 3's response tokens disagree (FOUND[3] and FOUND[3] + 0.5): per-token, not audited.
    assert (report["rows"]["audited"], report["rule"]["rows_matched"]) == (3, 3)
    assert [finding["kind"] for finding in report["findings"]] == ["per-token-advantages"]


def test_a_per_row_column_and_one_named_by_option(tmp_path) -> None:
    scalar = dump_frame(ROWS).with_columns(pl.Series("advantage", FOUND))
    assert audited(tmp_path, scalar)["rule"]["rows_matched"] == 4
    named = dump_frame(ROWS).with_columns(pl.Series("trainer_adv", FOUND))
    report = audited(tmp_path, named, ColumnNames(advantage="trainer_adv"))
    assert report["rule"]["rows_matched"] == 4
    assert report["reading"]["roles"]["trainer_advantage"]["why"].startswith("--advantage-col")


def test_a_row_without_response_tokens_is_not_audited(tmp_path) -> None:
    frame = audited_frame(ROWS, FOUND).with_columns(
        pl.Series("response_mask", [[1, 1], [1, 1], [1, 1, 1], [0, 0, 0]], dtype=pl.List(pl.Int8))
    )
    report = audited(tmp_path, frame)
    assert (report["rows"]["audited"], report["rows"]["without_advantage"]) == (3, 1)


@pytest.mark.parametrize(
    ("advantages", "row", "message"),
    [
        (
            [[0.5, 0.5], [1.0], [0.1] * 3, [0.1] * 3],
            1,
            "and column 'response_mask' have different lengths",
        ),
        ([[0.5, 0.5], None, [0.1] * 3, [0.1] * 3], 1, "is null"),
        (
            [[0.5, 0.5], [1.0, 1.0], [0.1, float("nan"), 0.1], [0.1] * 3],
            2,
            "has a null, NaN or infinite value (or one beyond ±1e300) on a response token",
        ),
        (
            [[0.5, 0.5], [1.0, None], [0.1] * 3, [0.1] * 3],
            1,
            "has a null, NaN or infinite value (or one beyond ±1e300) on a response token",
        ),
        (
            [[0.5, 0.5], [1.0, 1.0], [0.1, float("-inf"), 0.1], [0.1] * 3],
            2,
            "has a null, NaN or infinite value (or one beyond ±1e300) on a response token",
        ),
        (
            [[0.5, 0.5], [1.0, 1.0], [0.1] * 3, [0.1, 0.1, float("inf")]],
            3,
            "has a null, NaN or infinite value (or one beyond ±1e300) on a response token",
        ),
        (
            [[0.5, 0.5], [1.0, 1e301], [0.1] * 3, [0.1] * 3],
            1,
            "has a null, NaN or infinite value (or one beyond ±1e300) on a response token",
        ),
    ],
    ids=["wrong-length", "null", "nan", "null-token", "minus-inf", "inf", "beyond-1e300"],
)
def test_a_broken_list_is_one_error_at_its_row(tmp_path, advantages, row, message) -> None:
    frame = dump_frame(ROWS).with_columns(
        pl.Series("advantages", advantages, dtype=pl.List(pl.Float64))
    )
    error = refused(tmp_path, frame)
    assert error.endswith(f"row {row}: column 'advantages' (the trainer's advantages) {message}")


def test_errors_of_the_column(tmp_path) -> None:
    plain = dump_frame(ROWS)
    assert "no column of the trainer's advantages" in refused(tmp_path, plain)
    assert "--advantage-col" in refused(tmp_path, plain)
    missing = refused(tmp_path, plain, ColumnNames(advantage="nope"))
    assert missing.endswith("column 'nope' (--advantage-col) not found")
    words = plain.with_columns(pl.lit("x").alias("advantage"))
    assert "(the trainer's advantages) is String, not numbers" in refused(tmp_path, words)
    nan = plain.with_columns(pl.Series("advantage", [0.0, float("nan"), 0.0, 0.0]))
    assert refused(tmp_path, nan).endswith(
        "row 1: column 'advantage' (the trainer's advantages) is not a finite number"
    )
    reward = refused(tmp_path, plain, ColumnNames(advantage="token_level_rewards"))
    assert reward.endswith(
        "column 'token_level_rewards' is the reward, not the trainer's advantages"
    )


def test_no_row_to_audit_and_a_key_column_named_as_advantages(tmp_path) -> None:
    silent = audited_frame(ROWS, FOUND).with_columns(
        pl.Series("response_mask", [[0, 0], [0, 0], [0, 0, 0], [0, 0, 0]], dtype=pl.List(pl.Int8))
    )
    assert refused(tmp_path, silent).endswith(
        "no row has an advantage of the trainer's to audit: every row's response is empty "
        "(its mask all 0) or its advantage null"
    )
    ids = dump_frame(ROWS).with_columns(pl.Series("advantage", FOUND))
    assert refused(tmp_path, ids, ColumnNames(advantage="rollout_id")).endswith(
        "column 'rollout_id' is the trajectory id, not the trainer's advantages"
    )


def test_a_response_length_reads_the_first_tokens(tmp_path) -> None:
    """With an integer mask column (a response length), a row's first tokens are its response:
    anything after them is not read; a list shorter than the length, or a broken value among
    those tokens, is one error at its row."""
    lengths = [2, 2, 3, 2]
    values = [[FOUND[0]] * 2 + [float("nan")], [FOUND[1]] * 3, [FOUND[2]] * 3, [FOUND[3]] * 2]
    frame = dump_frame(ROWS).with_columns(
        pl.Series("response_length", lengths),
        pl.Series("advantages", values, dtype=pl.List(pl.Float64)),
    )
    names = ColumnNames(mask="response_length")
    report = audited(tmp_path, frame.drop("response_mask"), names)
    assert report["rule"]["rows_matched"] == report["rows"]["audited"] == 4
    cut = [*values[:2], [FOUND[2]] * 2, values[3]]
    short = frame.with_columns(pl.Series("advantages", cut, dtype=pl.List(pl.Float64)))
    short = short.drop("response_mask")
    assert refused(tmp_path, short, names).endswith(
        "row 2: column 'advantages' (the trainer's advantages) is shorter than the response "
        "length in column 'response_length'"
    )
    nan_inside = [[FOUND[0], float("nan")], *values[1:]]
    broken = frame.with_columns(pl.Series("advantages", nan_inside, dtype=pl.List(pl.Float64)))
    broken = broken.drop("response_mask")
    assert refused(tmp_path, broken, names).endswith(
        "row 0: column 'advantages' (the trainer's advantages) has a null, NaN or infinite "
        "value (or one beyond ±1e300) on a response token"
    )

"""Edges found by a hostile probe, each refused in one line or read as asked."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from advcli.sample import sample_table


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

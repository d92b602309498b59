"""Padded (batch, length) tensors written the natural way: Arrow fixed-size lists."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from reference import reference_advantages

WIDTH = 4


def _fixed(values: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), WIDTH)


def test_fixed_size_lists_from_pyarrow(tmp_path, run):
    groups = [0, 0, 0, 1, 1]
    rollouts = ["a", "a", "b", "a", "b"]
    lengths = [2, 4, 1, 3, 4]
    rewards = np.zeros((5, WIDTH), dtype=np.float32)
    mask = np.zeros((5, WIDTH), dtype=np.int8)
    # A reward on a padding position would not count for the mask, but it is summed (verl sums
    # every token reward): here padding holds 0, as trainers leave it.
    for row, (length, score) in enumerate(zip(lengths, [1.0, 1.0, 0.0, 0.5, 0.25], strict=True)):
        mask[row, :length] = 1
        rewards[row, length - 1] = score
    source = tmp_path / "dump.parquet"
    table = pa.table(
        {
            "data_id": groups,
            "rollout_id": rollouts,
            "token_level_rewards": _fixed(rewards),
            "response_mask": _fixed(mask),
        }
    )
    assert pa.types.is_fixed_size_list(table.schema.field("response_mask").type)
    pq.write_table(table, source)

    output = tmp_path / "out.parquet"
    result = run("compute", source, "-o", output)
    assert result.exit_code == 0, result.output
    got = pl.read_parquet(output)
    rows = [
        (g, r, 0, float(s), n)
        for g, r, s, n in zip(groups, rollouts, rewards.sum(1), lengths, strict=True)
    ]
    expected = reference_advantages(rows, level="trajectory", estimator="grpo")
    np.testing.assert_allclose(got["advantage"].to_numpy(), expected, atol=1e-6)
    assert got.schema["advantages"] == pl.Array(pl.Float32, WIDTH)
    np.testing.assert_allclose(
        np.stack(got["advantages"].to_numpy()), mask * np.array(expected)[:, None], atol=1e-6
    )

    arrays = tmp_path / "out.npz"
    assert run("compute", source, "-o", arrays).exit_code == 0
    with np.load(arrays) as padded:
        assert padded["advantages"].shape == (5, WIDTH)
        np.testing.assert_array_equal(padded["response_mask"], mask)

    # opo weighs units by their tokens: the padding must not count.
    result = run("compute", source, "-o", tmp_path / "opo.parquet", "--estimator", "opo")
    assert result.exit_code == 0, result.output
    expected_opo = reference_advantages(rows, level="trajectory", estimator="opo")
    np.testing.assert_allclose(
        pl.read_parquet(tmp_path / "opo.parquet")["advantage"].to_numpy(), expected_opo, atol=1e-6
    )

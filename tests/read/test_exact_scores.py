"""Issue 13, part 2: no silently wrong number.

A row's score is the sum of its token rewards, and it must be the exact sum (to float64) whatever
the list's type: float16 and float32 lists lose small terms when summed in their own precision,
and integer lists wrap around. The CLI and ``advcli.torch`` must agree on the same rows.
The expected values are worked out here with Python's exact ``math.fsum``.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")

from advcli.run.loading import load_dump, opened  # noqa: E402
from advcli.torch import compute_grpo_outcome_advantage  # noqa: E402

# Three trajectories of one group (one turn each) and a singleton group: with three members the
# normalized advantages depend on every score, not only on their order.
GROUPS = [0, 0, 0, 1]
TRAJECTORIES = [0, 1, 2, 0]


def rows_with(rewards: list[list[float]], dtype: pl.DataType) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "data_id": GROUPS,
            "rollout_id": TRAJECTORIES,
            "token_level_rewards": pl.Series(rewards, dtype=pl.List(dtype)),
            "response_mask": [[1] * len(row) for row in rewards],
        }
    )


def exact_scores(rewards: list[list[float]], dtype: pl.DataType) -> list[float]:
    """Each row's exact sum of its rewards as stored (rounded to ``dtype`` first)."""
    numpy_type = {pl.Float16: np.float16, pl.Float32: np.float32, pl.Float64: np.float64}[dtype]
    return [math.fsum(float(numpy_type(value)) for value in row) for row in rewards]


def drgrpo_reference(scores: list[float]) -> list[float]:
    """Dr. GRPO by hand: score minus its group's mean (a singleton group keeps its score)."""
    out = []
    for group, score in zip(GROUPS, scores, strict=True):
        members = [s for g, s in zip(GROUPS, scores, strict=True) if g == group]
        out.append(score if len(members) == 1 else score - sum(members) / len(members))
    return out


PADDED = 3000
CASES = {
    # 3000 float16 ones sum to 2048 in float16 (2048 + 1 rounds back to 2048).
    "float16 ones": (pl.Float16, [[1.0] * PADDED, [1.0] * 1000, [0.0] * 10, [1.0] * 2500]),
    # In float32, 1e8 + 1 == 1e8: summed in its own precision the 1 is lost.
    "float32 cancellation": (
        pl.Float32,
        [[1e8, 1.0, -1e8], [1e8, 3.0, -1e8], [0.5, 0.25, 0.125], [1e8, 2.0, -1e8]],
    ),
    "float64": (pl.Float64, [[0.1] * 10, [0.2, 0.3], [1e-9, 1.0], [3.0]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cli_scores_are_exact_sums(name, run, tmp_path):
    dtype, rewards = CASES[name]
    source = tmp_path / "dump.parquet"
    rows_with(rewards, dtype).write_parquet(source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output, "--level", "turn", "--estimator", "drgrpo", "-q")

    assert result.exit_code == 0, result.stderr
    written = pl.read_parquet(output)
    expected = exact_scores(rewards, dtype)
    np.testing.assert_allclose(written["score"].to_numpy(), expected, rtol=1e-7)
    np.testing.assert_allclose(
        written["advantage"].to_numpy(), drgrpo_reference(expected), rtol=1e-6, atol=1e-6
    )


@pytest.mark.torch
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("normalize", [False, True], ids=["drgrpo", "grpo"])
def test_cli_and_torch_agree_on_the_same_rows(name, normalize, run, tmp_path):
    dtype, rewards = CASES[name]
    source = tmp_path / "dump.parquet"
    rows_with(rewards, dtype).write_parquet(source)
    output = tmp_path / "out.parquet"
    estimator = "grpo" if normalize else "drgrpo"
    result = run("compute", source, "-o", output, "--level", "turn", "--estimator", estimator)
    assert result.exit_code == 0, result.stderr
    from_cli = pl.read_parquet(output)["advantage"].to_numpy()

    # The same rows as a padded (bs, length) tensor in the same dtype.
    torch_type = {pl.Float16: torch.float16, pl.Float32: torch.float32, pl.Float64: torch.float64}
    width = max(len(row) for row in rewards)
    padded = torch.zeros(len(rewards), width, dtype=torch_type[dtype])
    mask = torch.zeros(len(rewards), width)
    for index, row in enumerate(rewards):
        padded[index, : len(row)] = torch.tensor(row, dtype=torch_type[dtype])
        mask[index, : len(row)] = 1
    advantages, _ = compute_grpo_outcome_advantage(
        padded, mask, np.array(GROUPS), norm_adv_by_std_in_grpo=normalize
    )
    # The singleton group (row 3) keeps its raw score in both (verl's rule: mean 0, std 1).
    np.testing.assert_allclose(from_cli, advantages[:, 0].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("dtype", "rewards"),
    [
        # Summed in their own type these wrap: 300 is 44 in int8, 2**32 - 2 is -2 in int32.
        (pl.Int8, [[100, 100, 100], [1, 2, 3], [0], [-128, -128]]),
        (pl.Int32, [[2**31 - 1, 2**31 - 1], [1], [0], [-(2**31), -1]]),
        (pl.Int64, [[2**52, 2**52 - 1], [2**40, 2**40], [0], [-(2**52), -(2**51)]]),
        (pl.UInt64, [[2**52, 2**52 - 1], [3], [0], [2**52]]),
    ],
    ids=["int8", "int32", "int64", "uint64"],
)
def test_integer_rewards_sum_exactly_below_2_to_53(dtype, rewards, tmp_path):
    source = tmp_path / "dump.parquet"
    pl.DataFrame(
        {
            "data_id": GROUPS,
            "rollout_id": TRAJECTORIES,
            "token_level_rewards": pl.Series(rewards, dtype=pl.List(dtype)),
            "response_mask": [[1] * len(row) for row in rewards],
        }
    ).write_parquet(source)

    with opened([str(source)]) as dataset:
        scores = load_dump(dataset).projection["score"].to_list()

    assert scores == [float(sum(row)) for row in rewards]  # Python ints: exact


def test_integer_scalar_rewards_up_to_2_to_53_are_kept(run, tmp_path):
    source = tmp_path / "dump.parquet"
    pl.DataFrame(
        {
            "data_id": GROUPS,
            "rollout_id": TRAJECTORIES,
            "score": pl.Series([2**53, -(2**53), 0, 7], dtype=pl.Int64),
            "response_length": [1, 1, 1, 1],
        }
    ).write_parquet(source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output, "--level", "turn", "--estimator", "drgrpo")

    assert result.exit_code == 0, result.stderr
    # float32 output: 2**53 is a power of two, exactly representable.
    assert pl.read_parquet(output)["score"].to_list() == [2.0**53, -(2.0**53), 0.0, 7.0]

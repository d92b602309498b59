"""Hand-computed cases (tests/cases.py) through the library below the command line (advcli's
compute, every stage, real Parquet files), every level and estimator; and the README's numbers
through the real command line."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from cases import CASES, Case

LEVELS = ("turn", "trajectory")
ESTIMATORS = ("grpo", "drgrpo")


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_computed_case(case: Case, level, estimator, computed):
    out = computed(case.rows, level=level, estimator=estimator)
    assert out["advantage"].dtype == pl.Float32
    np.testing.assert_allclose(
        out["advantage"].to_numpy(), case.expected[(level, estimator)], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(out["score"].to_numpy(), [r[3] for r in case.rows])


def test_bias_example_numbers_in_the_readme(write_dump, run, tmp_path):
    """The README quotes these rounded values; keep the two in step."""
    source = write_dump(CASES[0].rows)
    turn, trajectory = tmp_path / "turn.parquet", tmp_path / "traj.parquet"
    assert run("compute", source, "-o", turn, "--level", "turn").exit_code == 0
    assert run("compute", source, "-o", trajectory).exit_code == 0
    assert pl.read_parquet(turn)["advantage"].to_list() == pytest.approx(
        [1.789, -0.447, -0.447, -0.447, -0.447], abs=5e-4
    )
    assert pl.read_parquet(trajectory)["advantage"].to_list() == pytest.approx(
        [0.707, -0.707, -0.707, -0.707, -0.707], abs=5e-4
    )


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param(pl.Series([5, 5, 9, 9], dtype=pl.UInt8), id="numpy-uint8"),
        pytest.param(pl.Series([5, 5, 9, 9], dtype=pl.Int32), id="int32"),
        pytest.param(pl.Series(["p", "p", "q", "q"]), id="string"),
        pytest.param(pl.Series(["p", "p", "q", "q"], dtype=pl.Categorical), id="categorical"),
    ],
)
def test_id_types(ids, computed):
    # Two groups of two one-turn trajectories: scores 1/0 and 3/1 -> drgrpo ±0.5 and ±1.
    frame = pl.DataFrame(
        {
            "data_id": ids,
            "rollout_id": ids.cast(pl.String) + pl.Series(["a", "b", "a", "b"]),
            "token_level_rewards": [[1.0], [0.0], [3.0], [1.0]],
            "response_mask": [[1], [1], [1], [1]],
        }
    )
    out = computed(frame, estimator="drgrpo")
    assert out["advantage"].to_list() == [0.5, -0.5, 1.0, -1.0]
    assert out["data_id"].dtype == ids.dtype


def test_numpy_int_ids_from_numpy_arrays(computed):
    frame = pl.DataFrame(
        {
            "data_id": np.array([3, 3], dtype=np.int16),
            "rollout_id": np.array([0, 1], dtype=np.uint64),
            "token_level_rewards": [[2.0], [0.0]],
            "response_mask": [[1], [1]],
        }
    )
    assert computed(frame, estimator="drgrpo")["advantage"].to_list() == [1.0, -1.0]


# A trajectory whose two turns disagree (turn 0 scores 1, turn 1 scores 3; listed turn 1 first)
# beside a one-turn trajectory scoring 0. drgrpo at trajectory level gives x - x/2 = x/2 to the
# first trajectory, where x is its score under the rule, and -x/2 to the other.
INCONSISTENT = [("g", "t", 1, 3.0, 2), ("g", "u", 0, 0.0, 2), ("g", "t", 0, 1.0, 2)]


@pytest.mark.parametrize(
    ("rule", "trajectory_score"),
    [("first", 1.0), ("last", 3.0), ("mean", 2.0), ("max", 3.0), ("sum", 4.0)],
)
def test_traj_score_rules(rule, trajectory_score, computed):
    out = computed(INCONSISTENT, estimator="drgrpo", traj_score=rule)
    half = trajectory_score / 2
    assert out["advantage"].to_list() == pytest.approx([half, -half, half])
    assert out["score"].to_list() == [trajectory_score, 0.0, trajectory_score]


def test_first_and_last_follow_row_order_without_turn_index(computed):
    out = computed(pl.DataFrame(dump_rows_without_turns()), traj_score="first", estimator="drgrpo")
    # Without turn_index the first row in input order (score 3) is the trajectory's first turn.
    assert out["score"].to_list() == [3.0, 0.0, 3.0]


def dump_rows_without_turns() -> dict[str, list]:
    return {
        "data_id": ["g", "g", "g"],
        "rollout_id": ["t", "u", "t"],
        "token_level_rewards": [[3.0], [0.0], [1.0]],
        "response_mask": [[1], [1], [1]],
    }


def test_turn_level_uses_each_rows_own_score(computed):
    out = computed(INCONSISTENT, level="turn", estimator="drgrpo")
    # Scores [3, 0, 1], mean 4/3.
    assert out["advantage"].to_list() == pytest.approx([3 - 4 / 3, -4 / 3, 1 - 4 / 3])


def test_scores_within_relative_tolerance_are_consistent(write_dump, run, tmp_path):
    rows = [(0, 0, 0, 1.0, 1), (0, 0, 1, 1.0 + 5e-7, 1), (0, 1, 0, 0.0, 1)]
    result = run("compute", write_dump(rows), "-o", tmp_path / "out.parquet")
    assert result.exit_code == 0, result.output


def test_epsilon_option(write_dump, run, tmp_path):
    output = tmp_path / "out.parquet"
    result = run("compute", write_dump(CASES[0].rows), "-o", output, "--epsilon", "0.5")
    assert result.exit_code == 0
    # Trajectory level: ±0.5 / (sqrt(0.5) + 0.5).
    expected = 0.5 / (0.5**0.5 + 0.5)
    np.testing.assert_allclose(
        pl.read_parquet(output)["advantage"].to_numpy(), [expected] + [-expected] * 4, rtol=1e-6
    )


def test_spread_beyond_tolerance_names_an_extreme_row(write_dump, run, tmp_path):
    # No row differs from the first by more than the tolerance, but the two extremes do.
    rows = [(0, 0, 0, 1.0, 1), (0, 0, 1, 1.0 + 9e-7, 1), (0, 0, 2, 1.0 - 9e-7, 1)]
    source = write_dump(rows)
    result = run("compute", source, "-o", tmp_path / "out.parquet")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {source} row 1: trajectory (data_id=0, rollout_id=0)")

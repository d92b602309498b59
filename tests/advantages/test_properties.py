"""Property tests: advcli's output against the plain-Python reference in ``tests/reference.py``.

Hypothesis generates small rollout dumps (groups of trajectories of turns, rows shuffled, ids
int or str), writes them as Parquet, runs ``advcli.compute`` and compares every row with the
reference, which is written from the specification and not from advcli's code. The first
tests check the reference itself against numbers worked out by hand.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cases import CASES, EPS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference_advantages, reference_scores

from advcli import AdvantageConfig, Estimator, Level, Scale, Singleton, TrajScore, compute
from advcli.settings.config import OUTCOME, SCALED

RTOL = 1e-5
ATOL = 1e-5

PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ESTIMATORS = list(OUTCOME)
LEVELS = list(Level)


# --------------------------------------------------------------------------------------------
# The reference against hand-computed numbers
# --------------------------------------------------------------------------------------------


def _close(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert math.isclose(a, e, rel_tol=1e-12, abs_tol=1e-12), (actual, expected)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_shared_hand_cases(case) -> None:
    for (level, estimator), expected in case.expected.items():
        _close(reference_advantages(case.rows, level=level, estimator=estimator), expected)


def test_reference_bias_example_by_hand() -> None:
    # Scores [1, 0, 0, 0, 0] at turn level: mean 0.2, variance (0.64 + 4 * 0.04) / 4 = 0.2.
    rows = [(0, "s", 0, 1.0, 10)] + [(0, "f", t, 0.0, 10) for t in range(4)]
    std = math.sqrt(0.2)
    _close(
        reference_advantages(rows, level="turn", estimator="grpo"),
        [0.8 / (std + EPS)] + [-0.2 / (std + EPS)] * 4,
    )
    # Trajectory level: [1, 0], mean 0.5, std sqrt(0.5).
    _close(
        reference_advantages(rows, level="trajectory", estimator="grpo"),
        [0.5 / (math.sqrt(0.5) + EPS)] + [-0.5 / (math.sqrt(0.5) + EPS)] * 4,
    )
    # rloo at turn level: the success row's baseline is mean(0, 0, 0, 0) = 0, a failure's is
    # mean(1, 0, 0, 0) = 0.25. Equals 5/4 * (s - 0.2).
    _close(
        reference_advantages(rows, level="turn", estimator="rloo"),
        [1.0] + [-0.25] * 4,
    )
    # rloo at trajectory level: n = 2, each unit's baseline is the other unit.
    _close(
        reference_advantages(rows, level="trajectory", estimator="rloo"),
        [1.0] + [-1.0] * 4,
    )


def test_reference_opo_by_hand() -> None:
    # Trajectory level: a (score 1, 2 + 3 = 5 tokens), b (score 0, 10 tokens), c (score 2, 5
    # tokens, one turn). Baseline (5 * 1 + 10 * 0 + 5 * 2) / 20 = 0.75.
    rows = [
        ("g", "a", 0, 1.0, 2),
        ("g", "b", 0, 0.0, 10),
        ("g", "a", 1, 1.0, 3),
        ("g", "c", 0, 2.0, 5),
    ]
    _close(
        reference_advantages(rows, level="trajectory", estimator="opo"),
        [0.25, -0.75, 0.25, 1.25],
    )
    # Turn level: baseline (2 * 1 + 10 * 0 + 3 * 1 + 5 * 2) / 20 = 0.75 too.
    _close(
        reference_advantages(rows, level="turn", estimator="opo"),
        [0.25, -0.75, 0.25, 1.25],
    )
    # No response tokens in the group: baseline 0.
    empty = [(1, 0, 0, 1.0, 0), (1, 1, 0, 3.0, 0)]
    _close(reference_advantages(empty, level="turn", estimator="opo"), [1.0, 3.0])
    # Singleton group: baseline 0 (raw), 0 (zero).
    single = [(5, 0, 0, 2.0, 4)]
    _close(reference_advantages(single, level="turn", estimator="opo"), [2.0])
    _close(reference_advantages(single, level="turn", estimator="opo", singleton="zero"), [0.0])


def test_reference_passk_by_hand() -> None:
    # Scores [1, 3, 2, 3]: the first 3 (row 1) is the best, the second-highest is the tied 3,
    # so every advantage is 0.
    tied = [(0, i, 0, s, 1) for i, s in enumerate([1.0, 3.0, 2.0, 3.0])]
    _close(reference_advantages(tied, level="turn", estimator="grpo_passk"), [0.0] * 4)
    # Scores [1, 3, 2]: mean 2, variance (1 + 1 + 0) / 2 = 1. Best 3, second 2: (3 - 2) / (1 + eps)
    rows = [(0, i, 0, s, 1) for i, s in enumerate([1.0, 3.0, 2.0])]
    _close(
        reference_advantages(rows, level="turn", estimator="grpo_passk"),
        [0.0, 1 / (1 + EPS), 0.0],
    )
    _close(
        reference_advantages(rows, level="turn", estimator="grpo_passk", scale="none"),
        [0.0, 1.0, 0.0],
    )
    # Trajectory level, two turns for the winner: both its rows get the value.
    traj = [(0, "w", 1, 5.0, 1), (0, "l", 0, 1.0, 1), (0, "w", 0, 5.0, 1)]
    # scores [5, 1]: std sqrt(8), gap 4.
    _close(
        reference_advantages(traj, level="trajectory", estimator="grpo_passk"),
        [4 / (math.sqrt(8) + EPS), 0.0, 4 / (math.sqrt(8) + EPS)],
    )
    # A singleton gets 0 either way.
    _close(reference_advantages([(0, 0, 0, 7.0, 1)], level="turn", estimator="grpo_passk"), [0.0])


def test_reference_grpo_scales_by_hand() -> None:
    # Group 0: [0, 2] (mean 1); group 1: [4, 4] (all equal -> 0). All units [0, 2, 4, 4]: mean
    # 2.5, variance (6.25 + 0.25 + 2.25 + 2.25) / 3 = 11 / 3.
    rows = [(0, 0, 0, 0.0, 1), (0, 1, 0, 2.0, 1), (1, 0, 0, 4.0, 1), (1, 1, 0, 4.0, 1)]
    batch = math.sqrt(11 / 3) + EPS
    _close(
        reference_advantages(rows, level="turn", estimator="grpo", scale="batch"),
        [-1 / batch, 1 / batch, 0.0, 0.0],
    )
    _close(
        reference_advantages(rows, level="turn", estimator="grpo", scale="none"),
        [-1.0, 1.0, 0.0, 0.0],
    )
    _close(
        reference_advantages(rows, level="turn", estimator="grpo"),
        [-1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS), 0.0, 0.0],
    )


def test_reference_singletons_by_hand() -> None:
    rows = [(0, 0, 0, 2.0, 3), (1, 0, 0, -1.0, 3), (1, 1, 0, 1.0, 3)]
    raw = {
        "grpo": [2 / (1 + EPS), -1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)],
        "drgrpo": [2.0, -1.0, 1.0],
        "rloo": [2.0, -2.0, 2.0],
        "opo": [2.0, -1.0, 1.0],
        "grpo_passk": [0.0, 0.0, 2 / (math.sqrt(2) + EPS)],
    }
    for estimator, expected in raw.items():
        _close(reference_advantages(rows, level="turn", estimator=estimator), expected)
        expected_zero = [0.0, *expected[1:]]
        _close(
            reference_advantages(rows, level="turn", estimator=estimator, singleton="zero"),
            expected_zero,
        )


def test_reference_reinforce_pp_by_hand() -> None:
    # Group 0: scores [1, 0] -> [0.5, -0.5]; group 1 singleton score 2 -> 2 (raw) or 0 (zero).
    # Tokens 1, 3, 2 -> values with weights: raw [0.5, -0.5 x3, 2 x2], T = 6.
    rows = [(0, 0, 0, 1.0, 1), (0, 1, 0, 0.0, 3), (1, 0, 0, 2.0, 2)]
    mu = (0.5 - 1.5 + 4.0) / 6  # 0.5
    var = (1 * 0.0**2 + 3 * 1.0**2 + 2 * 1.5**2) / 5  # (3 + 4.5) / 5 = 1.5
    d = math.sqrt(var + 1e-8)
    _close(
        reference_advantages(rows, level="turn", estimator="reinforce_pp_baseline"),
        [(0.5 - mu) / d, (-0.5 - mu) / d, (2.0 - mu) / d],
    )
    # singleton zero: [0.5, -0.5 x3, 0 x2]: mu = -1/6, var = (4/9 + 3 * 1/9 + 2 * 1/36) / 5.
    mu = -1 / 6
    var = ((2 / 3) ** 2 + 3 * (1 / 3) ** 2 + 2 * (1 / 6) ** 2) / 5
    d = math.sqrt(var + 1e-8)
    _close(
        reference_advantages(
            rows, level="turn", estimator="reinforce_pp_baseline", singleton="zero"
        ),
        [(0.5 - mu) / d, (-0.5 - mu) / d, (0.0 - mu) / d],
    )


def test_reference_traj_score_rules_by_hand() -> None:
    # Trajectory x: turns 2, 0, 1 with scores 3, 1, 2 (row order); y: one turn, score 0.
    rows = [(0, "x", 2, 3.0, 1), (0, "y", 0, 0.0, 1), (0, "x", 0, 1.0, 1), (0, "x", 1, 2.0, 1)]
    expected_x = {"first": 1.0, "last": 3.0, "mean": 2.0, "max": 3.0, "sum": 6.0}
    for rule, x in expected_x.items():
        assert reference_scores(rows, level="trajectory", traj_score=rule) == [x, 0.0, x, x]
        # drgrpo with two units [x, 0]: mean x / 2.
        _close(
            reference_advantages(rows, level="trajectory", estimator="drgrpo", traj_score=rule),
            [x / 2, -x / 2, x / 2, x / 2],
        )
    assert reference_scores(rows, level="turn") == [3.0, 0.0, 1.0, 2.0]
    # The same trajectory id in two groups is two trajectories.
    two = [(0, "t", 0, 1.0, 1), (1, "t", 0, 5.0, 1)]
    assert reference_scores(two, level="trajectory") == [1.0, 5.0]


# --------------------------------------------------------------------------------------------
# Generated dumps
# --------------------------------------------------------------------------------------------


@dataclass
class Dump:
    """A generated dump: the reference's rows plus the Parquet columns that encode them."""

    rows: list[tuple[object, object, int, float, int]]
    rewards: list[list[float]]
    masks: list[list[int]]
    mask_type: pa.DataType

    def table(self) -> pa.Table:
        groups = [r[0] for r in self.rows]
        trajs = [r[1] for r in self.rows]
        id_type = {int: pa.int64(), str: pa.string()}
        return pa.table(
            {
                "data_id": pa.array(groups, id_type[type(groups[0])]),
                "rollout_id": pa.array(trajs, id_type[type(trajs[0])]),
                "turn_index": pa.array([r[2] for r in self.rows], pa.int64()),
                "token_level_rewards": pa.array(self.rewards, pa.list_(pa.float64())),
                "response_mask": pa.array(self.masks, pa.list_(self.mask_type)),
            }
        )


SCORE_SET = st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5])
SCORE_FLOATS = st.floats(
    min_value=-5.0, max_value=5.0, allow_nan=False, allow_infinity=False, allow_subnormal=False
)
SCORES = st.one_of(SCORE_SET, SCORE_FLOATS)


def _ids(kind: type, size: int) -> st.SearchStrategy[list]:
    if kind is int:
        elements = st.integers(min_value=-(2**40), max_value=2**40)
    else:
        elements = st.text(alphabet="abcxyz_-0", min_size=1, max_size=4)
    return st.lists(elements, min_size=size, max_size=size, unique=True)


@st.composite
def dumps(
    draw: st.DrawFn, *, consistent: bool = True, scores: st.SearchStrategy[float] = SCORES
) -> Dump:
    """1-6 groups of 1-5 trajectories of 1-4 turns, shuffled.

    ``consistent``: every row of a trajectory carries the trajectory's score. Turn indices are
    distinct within a trajectory but not necessarily 0..k-1. Each row's score sits at one
    position of its reward list (the other rewards are 0.0, so the sum is exact), and the mask
    has any mix of 0 and 1, possibly all 0.
    """
    group_kind = draw(st.sampled_from([int, str]))
    traj_kind = draw(st.sampled_from([int, str]))
    n_groups = draw(st.integers(min_value=1, max_value=6))
    group_ids = draw(_ids(group_kind, n_groups))
    rows: list[tuple[object, object, int, float, int]] = []
    rewards: list[list[float]] = []
    masks: list[list[int]] = []
    for group in group_ids:
        n_trajs = draw(st.integers(min_value=1, max_value=5))
        # Small pools, so the same trajectory id often appears in several groups.
        if traj_kind is int:
            traj_ids = draw(
                st.lists(st.integers(0, 6), min_size=n_trajs, max_size=n_trajs, unique=True)
            )
        else:
            traj_ids = draw(
                st.lists(
                    st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]),
                    min_size=n_trajs,
                    max_size=n_trajs,
                    unique=True,
                )
            )
        for traj in traj_ids:
            n_turns = draw(st.integers(min_value=1, max_value=4))
            turns = draw(
                st.lists(st.integers(0, 9), min_size=n_turns, max_size=n_turns, unique=True)
            )
            traj_score = draw(scores)
            for turn in turns:
                score = traj_score if consistent else draw(scores)
                length = draw(st.integers(min_value=1, max_value=6))
                mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
                position = draw(st.integers(min_value=0, max_value=length - 1))
                reward = [0.0] * length
                reward[position] = score
                rows.append((group, traj, turn, score, sum(mask)))
                rewards.append(reward)
                masks.append(mask)
    order = draw(st.permutations(range(len(rows))))
    mask_type = draw(st.sampled_from([pa.int64(), pa.int32(), pa.int8()]))
    return Dump(
        rows=[rows[i] for i in order],
        rewards=[rewards[i] for i in order],
        masks=[masks[i] for i in order],
        mask_type=mask_type,
    )


def _run(dump: Dump, config: AdvantageConfig) -> pl.DataFrame:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "rollouts.parquet"
        target = Path(tmp) / "advantages.parquet"
        pq.write_table(dump.table(), source)
        compute([str(source)], target, config, force=True)
        return pl.read_parquet(target)


def _needs_tokens(dump: Dump, estimator: Estimator) -> bool:
    """Whitening needs two response tokens in the whole input; the reference raises otherwise."""
    return estimator.value == "reinforce_pp_baseline" and sum(r[4] for r in dump.rows) < 2


def _check_against_reference(dump: Dump, config: AdvantageConfig, out: pl.DataFrame) -> np.ndarray:
    """Compare every row of ``out`` with the reference; return the advantages (float32)."""
    rows = dump.rows
    traj_score = None if config.traj_score is None else config.traj_score.value
    assert out.height == len(rows)
    # Every input row, in input order.
    assert out["data_id"].to_list() == [r[0] for r in rows]
    assert out["rollout_id"].to_list() == [r[1] for r in rows]
    assert out["turn_index"].to_list() == [r[2] for r in rows]
    assert out["score"].dtype == pl.Float32
    assert out["advantage"].dtype == pl.Float32
    assert out["advantages"].dtype == pl.List(pl.Float32)

    expected_scores = reference_scores(rows, level=config.level.value, traj_score=traj_score)
    np.testing.assert_allclose(
        out["score"].to_numpy(), expected_scores, rtol=RTOL, atol=ATOL, err_msg="score"
    )
    expected = reference_advantages(
        rows,
        level=config.level.value,
        estimator=config.estimator.value,
        epsilon=config.epsilon,
        traj_score=traj_score,
        scale="group" if config.scale is None else config.scale.value,
        singleton=config.singleton.value,
    )
    advantage = out["advantage"].to_numpy()
    np.testing.assert_allclose(advantage, expected, rtol=RTOL, atol=ATOL, err_msg="advantage")

    # Per token: advantage x mask, same length as the mask.
    for a, tokens, mask in zip(advantage, out["advantages"].to_list(), dump.masks, strict=True):
        assert len(tokens) == len(mask)
        assert tokens == [float(np.float32(a) * m) for m in mask]
    return advantage


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda v: v.value)
@PROPERTY_SETTINGS
@given(dump=dumps(), level=st.sampled_from(LEVELS))
def test_matches_reference(dump: Dump, level: Level, estimator: Estimator) -> None:
    if _needs_tokens(dump, estimator):
        return
    config = AdvantageConfig(level=level, estimator=estimator, epsilon=1e-6, traj_score=None)
    _check_against_reference(dump, config, _run(dump, config))


@settings(PROPERTY_SETTINGS, max_examples=45)
@given(
    dump=dumps(consistent=False),
    estimator=st.sampled_from(ESTIMATORS),
    rule=st.sampled_from([rule for rule in TrajScore if rule is not TrajScore.OWN]),
)
def test_traj_score_rules_match_reference(
    dump: Dump, estimator: Estimator, rule: TrajScore
) -> None:
    if _needs_tokens(dump, estimator):
        return
    config = AdvantageConfig(
        level=Level.TRAJECTORY, estimator=estimator, epsilon=1e-6, traj_score=rule
    )
    _check_against_reference(dump, config, _run(dump, config))


@settings(PROPERTY_SETTINGS, max_examples=40)
@given(
    dump=dumps(consistent=False),
    estimator=st.sampled_from([Estimator.GRPO, Estimator.DRGRPO]),
    scale=st.sampled_from([None, Scale.NONE]),
)
def test_own_score_rule_matches_reference(
    dump: Dump, estimator: Estimator, scale: Scale | None
) -> None:
    """--traj-score own: each trajectory's first row in its group's statistics, each row
    centred on its own score, a group whose first rows tie divided by 1 + ε."""
    if estimator is Estimator.DRGRPO and scale is not None:
        return
    config = AdvantageConfig(
        level=Level.TRAJECTORY,
        estimator=estimator,
        epsilon=1e-6,
        traj_score=TrajScore.OWN,
        scale=scale,
    )
    _check_against_reference(dump, config, _run(dump, config))


@settings(PROPERTY_SETTINGS, max_examples=40)
@given(
    dump=dumps(scores=SCORE_FLOATS),
    estimator=st.sampled_from(ESTIMATORS),
    level=st.sampled_from(LEVELS),
    epsilon=st.sampled_from([1e-6, 1e-4, 0.1, 1.0]),
)
def test_float32_output_matches_float64_reference(
    dump: Dump, estimator: Estimator, level: Level, epsilon: float
) -> None:
    """Arbitrary float scores (near-ties included), other epsilons: float32 output within 1e-5."""
    if _needs_tokens(dump, estimator):
        return
    config = AdvantageConfig(level=level, estimator=estimator, epsilon=epsilon, traj_score=None)
    _check_against_reference(dump, config, _run(dump, config))


def _per_trajectory(out: pl.DataFrame) -> pl.DataFrame:
    return out.group_by(["data_id", "rollout_id"], maintain_order=True).agg(
        pl.col("advantage").cast(pl.Float64).min().alias("low"),
        pl.col("advantage").cast(pl.Float64).max().alias("high"),
        pl.col("advantage").cast(pl.Float64).first().alias("advantage"),
        pl.col("score").cast(pl.Float64).first().alias("score"),
    )


@settings(PROPERTY_SETTINGS, max_examples=30)
@given(
    dump=dumps(),
    estimator=st.sampled_from([e for e in Estimator if e.value in ("grpo", "drgrpo")]),
)
def test_trajectory_advantages_sum_to_zero_per_group(dump: Dump, estimator: Estimator) -> None:
    config = AdvantageConfig(level=Level.TRAJECTORY, estimator=estimator, epsilon=1e-6)
    trajs = _per_trajectory(_run(dump, config))
    # Use the input's scores (exact float64) to decide which groups count.
    traj_scores: dict[object, set[float]] = {}
    for group, _traj, _turn, score, _tokens in dump.rows:
        traj_scores.setdefault(group, set()).add(score)
    for (group,), per_group in trajs.group_by(["data_id"], maintain_order=True):
        if per_group.height < 2 or len(traj_scores[group]) < 2:
            continue
        advantages = per_group["advantage"].to_numpy()
        # float32 values of magnitude up to ~sqrt(n) each: allow a few float32 ulps per term.
        assert abs(advantages.sum()) <= 1e-5 * (1 + np.abs(advantages).sum()), (group, advantages)


@settings(PROPERTY_SETTINGS, max_examples=30)
@given(
    dump=dumps(consistent=False),
    estimator=st.sampled_from(ESTIMATORS),
    # Not "own": under it each row is centred on its own score.
    rule=st.sampled_from([rule for rule in TrajScore if rule is not TrajScore.OWN]),
)
def test_rows_of_a_trajectory_share_its_advantage(
    dump: Dump, estimator: Estimator, rule: TrajScore
) -> None:
    if _needs_tokens(dump, estimator):
        return
    config = AdvantageConfig(
        level=Level.TRAJECTORY, estimator=estimator, epsilon=1e-6, traj_score=rule
    )
    out = _run(dump, config)
    if estimator.value == "reinforce_pp_baseline":
        # Rows without response tokens get 0 (their whitened value times an empty mask); the
        # rows that carry tokens share the trajectory's advantage.
        out = out.filter(pl.col("response_mask").list.sum() > 0)
    trajs = _per_trajectory(out)
    assert (trajs["low"] == trajs["high"]).all(), trajs.filter(pl.col("low") != pl.col("high"))
    if estimator.value != "reinforce_pp_baseline":
        assert trajs.height == len({(r[0], r[1]) for r in dump.rows})


@settings(PROPERTY_SETTINGS, max_examples=40)
@given(
    dump=dumps(),
    estimator=st.sampled_from(ESTIMATORS),
    level=st.sampled_from(LEVELS),
    scale=st.sampled_from([None, *Scale]),
    singleton=st.sampled_from(list(Singleton)),
    epsilon=st.sampled_from([1e-6, 0.5]),
)
def test_scale_and_singleton_match_reference(
    dump: Dump,
    estimator: Estimator,
    level: Level,
    scale: Scale | None,
    singleton: Singleton,
    epsilon: float,
) -> None:
    """``scale`` only where it applies (grpo, grpo_passk, grpo_loo; advcli rejects it
    elsewhere)."""
    if _needs_tokens(dump, estimator):
        return
    if estimator not in SCALED:
        scale = None
    config = AdvantageConfig(
        level=level, estimator=estimator, epsilon=epsilon, scale=scale, singleton=singleton
    )
    _check_against_reference(dump, config, _run(dump, config))


@pytest.mark.parametrize("level", LEVELS, ids=lambda v: v.value)
def test_equal_scores_give_zero_even_with_zero_epsilon(level: Level) -> None:
    """Equal scores: std 0 and advantage exactly 0, not 0 / 0, even with epsilon 0."""
    rows = [(0, 0, 0, 1.5, 2), (0, 1, 0, 1.5, 2), (1, 0, 0, -1.0, 1), (1, 1, 0, 2.0, 1)]
    dump = Dump(
        rows=rows,
        rewards=[[0.0, r[3]] for r in rows],
        masks=[[1] * r[4] + [0] * (2 - r[4]) for r in rows],
        mask_type=pa.int64(),
    )
    config = AdvantageConfig(level=level, estimator=Estimator.GRPO, epsilon=0.0)
    advantage = _check_against_reference(dump, config, _run(dump, config))
    assert advantage[0] == 0.0
    assert advantage[1] == 0.0


@pytest.mark.parametrize("level", LEVELS, ids=lambda v: v.value)
def test_batch_scale_raw_singleton(level: Level) -> None:
    # Two singleton groups, scores 0 and 0.5: with --scale batch a raw singleton is divided by
    # the batch std, as every other unit: stdev([0, 0.5]) = 0.5 / sqrt(2), so the advantages are
    # [0, 0.5 / (0.5 / sqrt(2) + eps)] = [0, ~sqrt(2)].
    rows = [(0, 0, 0, 0.0, 1), (1, 0, 0, 0.5, 1)]
    dump = Dump(rows=rows, rewards=[[0.0], [0.5]], masks=[[1], [1]], mask_type=pa.int64())
    config = AdvantageConfig(
        level=level,
        estimator=Estimator.GRPO,
        epsilon=1e-6,
        scale=Scale.BATCH,
        singleton=Singleton.RAW,
    )
    advantage = _check_against_reference(dump, config, _run(dump, config))
    assert advantage[1] == pytest.approx(0.5 / (0.5 / math.sqrt(2) + 1e-6))


@pytest.mark.parametrize("level", LEVELS, ids=lambda v: v.value)
def test_batch_scale_passk(level: Level) -> None:
    # Group "a": scores [0, 0.5] (gap 0.5); three singleton groups scoring 0. All units
    # [0, 0.5, 0, 0, 0]: batch std sqrt(0.05) ~ 0.224, so the best unit gets 0.5 / 0.224 = 2.236.
    rows = [("a", 0, 0, 0.0, 1), ("a", 1, 0, 0.5, 1), ("b", 0, 0, 0.0, 1)]
    rows += [("c", 0, 0, 0.0, 1), ("d", 0, 0, 0.0, 1)]
    dump = Dump(
        rows=rows,
        rewards=[[r[3]] for r in rows],
        masks=[[1] for _ in rows],
        mask_type=pa.int64(),
    )
    config = AdvantageConfig(
        level=level, estimator=Estimator.GRPO_PASSK, epsilon=1e-6, scale=Scale.BATCH
    )
    advantage = _check_against_reference(dump, config, _run(dump, config))
    assert advantage[1] == pytest.approx(0.5 / (0.05**0.5 + 1e-6), rel=1e-5)

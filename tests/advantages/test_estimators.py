"""The estimator family (issue 4) on hand-computed values, both levels, through the real CLI."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import polars as pl
import pytest
from cases import LOO_BY_HAND, LOO_NEAR_TIES, LOO_ROWS
from conftest import ROOT
from reference import reference_advantages

from advcli.settings.rules import RULES

EPS = 1e-6

# Rows (group, trajectory, turn, score, tokens), in input order.
# G: a (1 turn, 1.0, 4 tokens), b (2 turns, 0.0, 2 + 2 tokens), c (1 turn, 0.8, 2 tokens).
# S: one trajectory s of 2 turns scoring 2.0 (a singleton at trajectory level only).
# Z: z1, z2 both 0.5 (zero std). T: t1 = t2 = 1.0, t3 = 0.0 (a tie at the top for pass@k).
ROWS = [
    ("G", "a", 0, 1.0, 4),
    ("G", "b", 0, 0.0, 2),
    ("S", "s", 0, 2.0, 1),
    ("G", "c", 0, 0.8, 2),
    ("G", "b", 1, 0.0, 2),
    ("Z", "z1", 0, 0.5, 1),
    ("S", "s", 1, 2.0, 1),
    ("Z", "z2", 0, 0.5, 3),
    ("T", "t1", 0, 1.0, 1),
    ("T", "t2", 0, 1.0, 1),
    ("T", "t3", 0, 0.0, 1),
]
TOKENS = [r[4] for r in ROWS]

# Trajectory level, group G: units [1, 0, 0.8], mean 0.6, deviations .4, -.6, .2,
# variance (.16 + .36 + .04) / 2 = 0.28. Group T: [1, 1, 0], mean 2/3, variance (1/9 + 1/9 + 4/9)/2.
# Turn level, group G: rows [1, 0, 0.8, 0], mean 0.45, deviations .55, -.45, .35, -.45,
# variance (.3025 + .2025 + .1225 + .2025) / 3 = .83 / 3. Group S: rows [2, 2], zero std.
G_STD_TRAJ = math.sqrt(0.28)
G_STD_TURN = math.sqrt(0.83 / 3)
T_STD = math.sqrt(1 / 3)
T_GRPO = [(1 / 3) / (T_STD + EPS), (1 / 3) / (T_STD + EPS), (-2 / 3) / (T_STD + EPS)]
T_CENTRED = [1 / 3, 1 / 3, -2 / 3]
# rloo in T: 3/2 * (s - 2/3) = 0.5, 0.5, -1.
T_RLOO = [0.5, 0.5, -1.0]
# opo in T: every unit 1 token, baseline = mean = 2/3.

EXPECTED = {
    ("trajectory", "grpo"): [
        0.4 / (G_STD_TRAJ + EPS),
        -0.6 / (G_STD_TRAJ + EPS),
        2 / (1 + EPS),
        0.2 / (G_STD_TRAJ + EPS),
        -0.6 / (G_STD_TRAJ + EPS),
        0,
        2 / (1 + EPS),
        0,
        *T_GRPO,
    ],
    ("turn", "grpo"): [
        0.55 / (G_STD_TURN + EPS),
        -0.45 / (G_STD_TURN + EPS),
        0,
        0.35 / (G_STD_TURN + EPS),
        -0.45 / (G_STD_TURN + EPS),
        0,
        0,
        0,
        *T_GRPO,
    ],
    ("trajectory", "drgrpo"): [0.4, -0.6, 2, 0.2, -0.6, 0, 2, 0, *T_CENTRED],
    ("turn", "drgrpo"): [0.55, -0.45, 0, 0.35, -0.45, 0, 0, 0, *T_CENTRED],
    # rloo, G trajectory level: 3/2 * deviation -> .6, -.9, .3 (a: 1 - mean(0, .8) = .6).
    # Turn level: 4/3 * deviation -> a .7333, b -.6, c .4667 (a: 1 - mean(0, .8, 0)).
    ("trajectory", "rloo"): [0.6, -0.9, 2, 0.3, -0.9, 0, 2, 0, *T_RLOO],
    ("turn", "rloo"): [4 / 3 * 0.55, -0.6, 0, 4 / 3 * 0.35, -0.6, 0, 0, 0, *T_RLOO],
    # opo, G: (4*1 + 4*0 + 2*0.8) / 10 = 0.56 at both levels (the token-weighted mean does not
    # change when a trajectory's tokens are split over turns). S at turn level: baseline 2.
    ("trajectory", "opo"): [0.44, -0.56, 2, 0.24, -0.56, 0, 2, 0, *T_CENTRED],
    ("turn", "opo"): [0.44, -0.56, 0, 0.24, -0.56, 0, 0, 0, *T_CENTRED],
    # grpo_passk: only G's top unit a gets (1 - 0.8) / (std + eps); T ties at the top (s_max -
    # s_second = 0), S is a singleton at trajectory level (0) and zero-std at turn level (0).
    ("trajectory", "grpo_passk"): [0.2 / (G_STD_TRAJ + EPS)] + [0.0] * 10,
    ("turn", "grpo_passk"): [0.2 / (G_STD_TURN + EPS)] + [0.0] * 10,
}

# grpo_loo (NeMo-RL's): c = s - mean of the other units, divided by the sample std of the other
# units plus eps where that std is above 0, else undivided. Trajectory level, G [a 1, b 0,
# c .8]: a's others [0, .8], b's [1, .8], c's [1, 0]. T [1, 1, 0]: t1's and t2's others
# [1, 0]; t3's [1, 1] tie, so t3 gets 0 - 1 undivided. Turn level, G [a 1, b 0, c .8, b 0]:
# a's others [0, .8, 0], each b's [1, .8, 0], c's [1, 0, 0]; S's two rows tie (0).


def _loo(score: float, others: list[float]) -> float:
    return (score - statistics.mean(others)) / (statistics.stdev(others) + EPS)


T_LOO = [_loo(1, [1, 0]), _loo(1, [1, 0]), -1.0]
EXPECTED[("trajectory", "grpo_loo")] = [
    _loo(1, [0, 0.8]),
    _loo(0, [1, 0.8]),
    2 / (1 + EPS),
    _loo(0.8, [1, 0]),
    _loo(0, [1, 0.8]),
    0,
    2 / (1 + EPS),
    0,
    *T_LOO,
]
EXPECTED[("turn", "grpo_loo")] = [
    _loo(1, [0, 0.8, 0]),
    _loo(0, [1, 0.8, 0]),
    0,
    _loo(0.8, [1, 0, 0]),
    _loo(0, [1, 0.8, 0]),
    0,
    0,
    0,
    *T_LOO,
]


def whiten(values: list[float]) -> list[float]:
    """verl's masked whitening written out: token mean and unbiased token variance."""
    total = sum(TOKENS)
    mean = sum(t * v for t, v in zip(TOKENS, values, strict=True)) / total
    variance = sum(t * (v - mean) ** 2 for t, v in zip(TOKENS, values, strict=True)) / (total - 1)
    return [(v - mean) / math.sqrt(variance + 1e-8) for v in values]


EXPECTED[("trajectory", "reinforce_pp_baseline")] = whiten(EXPECTED[("trajectory", "drgrpo")])
EXPECTED[("turn", "reinforce_pp_baseline")] = whiten(EXPECTED[("turn", "drgrpo")])


@pytest.fixture
def advantages(computed):
    """The advantages of ROWS under the settings given."""

    def of(**settings) -> np.ndarray:
        return computed(ROWS, **settings)["advantage"].to_numpy()

    return of


@pytest.mark.parametrize(("level", "estimator"), sorted(EXPECTED))
def test_estimator_by_hand(level, estimator, advantages):
    got = advantages(level=level, estimator=estimator)
    np.testing.assert_allclose(got, EXPECTED[(level, estimator)], rtol=1e-5, atol=1e-6)


def test_reinforce_pp_whitening_has_zero_token_mean_and_unit_variance(advantages):
    got = advantages(estimator="reinforce_pp_baseline")
    tokens = np.array(TOKENS)
    mean = (got * tokens).sum() / tokens.sum()
    variance = (tokens * (got - mean) ** 2).sum() / (tokens.sum() - 1)
    assert abs(mean) < 1e-6 and variance == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize(
    "estimator",
    ["grpo", "drgrpo", "rloo", "opo", "grpo_passk", "grpo_loo", "reinforce_pp_baseline"],
)
def test_singleton_zero(estimator, advantages):
    # At trajectory level S is a singleton: rows 2 and 6 get 0 before any whitening.
    raw = advantages(estimator=estimator)
    zero = advantages(estimator=estimator, singleton="zero")
    if estimator == "reinforce_pp_baseline":
        expected = whiten(
            [0 if i in (2, 6) else v for i, v in enumerate(EXPECTED[("trajectory", "drgrpo")])]
        )
        np.testing.assert_allclose(zero, expected, rtol=1e-5, atol=1e-6)
    else:
        assert zero[2] == zero[6] == 0
        others = [i for i in range(len(ROWS)) if i not in (2, 6)]
        np.testing.assert_array_equal(zero[others], raw[others])


def test_scale_batch(advantages):
    # Trajectory-level units of the whole input: G [1, 0, .8], S [2], Z [.5, .5], T [1, 1, 0].
    batch_std = statistics.stdev([1, 0, 0.8, 2, 0.5, 0.5, 1, 1, 0])
    got = advantages(scale="batch")
    centred = EXPECTED[("trajectory", "drgrpo")]
    expected = [c / (batch_std + EPS) for c in centred]
    # S is a singleton at trajectory level: mean 0 (verl's rule), and the batch divisor every
    # other unit shares: 2 / (batch std + eps), not 2 / (1 + eps).
    expected[2] = expected[6] = 2 / (batch_std + EPS)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_scale_batch_singleton_when_every_score_is_equal(computed):
    # Every unit scores 1: the batch std is 0, no other unit is divided (each is exactly 0), and
    # the singleton S keeps the singleton std 1: 1 / (1 + eps), not 1 / eps.
    rows = [("G", "a", 0, 1.0, 1), ("G", "b", 0, 1.0, 1), ("S", "s", 0, 1.0, 1)]
    got = computed(rows, scale="batch")["advantage"].to_list()
    np.testing.assert_allclose(got, [0.0, 0.0, 1 / (1 + EPS)], rtol=1e-6)


def test_scale_none_is_drgrpo(advantages):
    for level in ("turn", "trajectory"):
        got = advantages(scale="none", level=level)
        np.testing.assert_allclose(got, EXPECTED[(level, "drgrpo")], rtol=1e-5, atol=1e-6)


def test_passk_scale_none(advantages):
    got = advantages(estimator="grpo_passk", scale="none")
    np.testing.assert_allclose(got, [0.2] + [0.0] * 10, atol=1e-6)


def test_scale_only_for_grpo_estimators(write_dump, run, tmp_path):
    result = run(
        "compute",
        write_dump(ROWS),
        "-o",
        tmp_path / "o.parquet",
        "--estimator",
        "rloo",
        "--scale",
        "batch",
    )
    assert result.exit_code == 2
    assert "--scale applies to grpo, grpo_passk, grpo_loo, not to rloo" in result.output


def test_summary_names_estimator_scale_singleton(write_dump, run, tmp_path):
    result = run(
        "compute",
        write_dump(ROWS),
        "-o",
        tmp_path / "o.parquet",
        "--estimator",
        "grpo_passk",
        "--singleton",
        "zero",
    )
    assert result.exit_code == 0
    text = " ".join(result.stderr.split())
    assert "grpo_passk (scale group, singleton zero, epsilon 1e-06)" in text
    # Trajectory level: S is a singleton; Z is zero-std.
    assert "singleton groups (trajectory level) │ 1" in text
    assert "zero-std groups (trajectory level) │ 1" in text


@pytest.mark.parametrize(
    "estimator",
    ["grpo", "drgrpo", "rloo", "opo", "grpo_passk", "grpo_loo", "reinforce_pp_baseline"],
)
def test_compare_reports_every_estimator(estimator, write_dump, run, tmp_path):
    result = run("compare", write_dump(ROWS), "--estimator", estimator, "--json", "-")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["estimator"] == estimator
    assert report["settings"]["singleton"] == "raw"
    assert report["counts"]["singleton_groups"] == 1
    by_turns = {entry["turns"]: entry for entry in report["by_turns"]}
    # The 2-turn trajectories are b (G) and s (S): their mean advantage at each level is the
    # mean of the expected values of their first rows (1 and 2).
    for level, key in (
        ("turn", "mean_advantage_turn"),
        ("trajectory", "mean_advantage_trajectory"),
    ):
        expected = EXPECTED[(level, estimator)]
        assert by_turns[2][key] == pytest.approx((expected[1] + expected[2]) / 2, abs=1e-6)


def test_reinforce_pp_needs_two_tokens(write_dump, run, tmp_path):
    result = run(
        "compute",
        write_dump([("g", "a", 0, 1.0, 1)]),
        "-o",
        tmp_path / "o.parquet",
        "--estimator",
        "reinforce_pp_baseline",
    )
    assert result.exit_code == 1
    assert "needs at least 2" in result.stderr


def test_opo_equal_scores_give_exactly_zero(computed):
    # Token-weighted mean of three equal scores with different lengths: 0.3 exactly, not
    # 0.3 + rounding (which would leave ~5e-17).
    rows = [("g", "a", 0, 0.3, 1), ("g", "b", 0, 0.3, 2), ("g", "c", 0, 0.3, 4)]
    assert computed(rows, estimator="opo")["advantage"].to_list() == [0.0, 0.0, 0.0]


def test_reinforce_pp_row_without_tokens_gets_zero(computed):
    # The zero-token row's value is multiplied by its (empty) mask, as in verl: 0. The other
    # rows are whitened over the 6 tokens of rows 0 and 1: values 0.5 (x4) and -0.5 (x2).
    frame = pl.DataFrame(
        {
            "data_id": ["g", "g", "g"],
            "rollout_id": ["a", "b", "c"],
            "score": [1.0, 0.0, 0.5],
            "response_length": [4, 2, 0],
        }
    )
    got = computed(frame, estimator="reinforce_pp_baseline")["advantage"].to_numpy()
    # Centred: 0.5, -0.5, 0 (mean 0.5). Token mean (4*0.5 - 2*0.5)/6 = 1/6.
    mean = 1 / 6
    variance = (4 * (0.5 - mean) ** 2 + 2 * (-0.5 - mean) ** 2) / 5
    scale = math.sqrt(variance + 1e-8)
    np.testing.assert_allclose(got, [(0.5 - mean) / scale, (-0.5 - mean) / scale, 0.0], rtol=1e-6)


def test_reinforce_pp_trajectory_without_tokens_is_written_as_zero_whatever_its_value(computed):
    # Group A's trajectories have no response tokens: their rows are written as 0, so A's huge
    # centred scores (±5e35, which whitening by a 1e-4 scale would take past float32) are no
    # error. Group B: units 0 (5 tokens) and 1e-7 (10 tokens), centred -5e-8 and 5e-8.
    frame = pl.DataFrame(
        {
            "data_id": ["A", "A", "A", "B", "B", "B"],
            "rollout_id": ["a1", "a1", "a2", "b1", "b2", "b2"],
            "turn_index": [0, 1, 0, 0, 0, 1],
            "score": [1e36, 1e36, 0.0, 0.0, 1e-7, 1e-7],
            "response_length": [0, 0, 0, 5, 5, 5],
        }
    )
    got = computed(frame, estimator="reinforce_pp_baseline")["advantage"].to_list()
    # Token mean over B's 15 tokens: (5 * -5e-8 + 10 * 5e-8) / 15; A's tokens count for nothing.
    mean = (5 * -5e-8 + 10 * 5e-8) / 15
    variance = (5 * (-5e-8 - mean) ** 2 + 10 * (5e-8 - mean) ** 2) / 14
    scale = math.sqrt(variance + 1e-8)
    assert got[:3] == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(
        got[3:], [(-5e-8 - mean) / scale, (5e-8 - mean) / scale, (5e-8 - mean) / scale], rtol=1e-6
    )


def test_traj_score_mean_of_rows_that_agree_is_their_score(computed):
    # Added up, six rows of 0.2 make 1.2000000000000002 and three 0.6000000000000001: divided
    # by the turns they are not 0.2 again. Rows that agree have their score as the mean, so the
    # group is zero-std and every advantage is exactly 0.
    rows = [("g", "a", turn, 0.2, 1) for turn in range(6)]
    rows += [("g", "b", turn, 0.2, 1) for turn in range(3)]
    assert computed(rows, traj_score="mean")["advantage"].to_list() == [0.0] * 9


def test_scores_too_large_for_float32_are_an_error(write_dump, run, tmp_path):
    rows = [("g", "a", 0, 1e39, 1), ("g", "b", 0, 0.0, 1)]
    output = tmp_path / "out.parquet"
    result = run("compute", write_dump(rows), "-o", output)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'rollouts.parquet'} row 0: the score or its advantage does not fit "
        "a float32 (the scores are too large; rescale the rewards)\n"
    )
    assert not output.exists()


def test_the_docs_rule_table_is_the_code_table():
    """The docs' table of four facts per estimator says what advcli/settings/rules.py says."""
    readme = (ROOT / "docs" / "estimators.md").read_text()
    start = readme.index("| estimator | baseline | divides by a std (`--scale`) |")
    rows = {}
    for line in readme[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        name, baseline, divides, singleton, post = (c.strip() for c in line.strip("|").split("|"))
        rows[name.strip("`")] = (baseline, divides, singleton, post)
    expected = {
        name: (
            rule.baseline.value,
            "yes" if rule.divides else "no",
            "keeps its score" if rule.singleton_keeps_score else "0",
            "token whitening" if rule.whitens else "none",
        )
        for name, rule in RULES.items()
    }
    assert rows == expected


def test_grpo_loo_by_hand(computed):
    got = computed(LOO_ROWS, recipe="nemo-rl", epsilon=0.0)["advantage"].to_list()
    np.testing.assert_allclose(got, LOO_BY_HAND, rtol=1e-6, atol=1e-6)
    # The population std of the others: 2's [4, 6, 8] is sqrt(8 / 3).
    got = computed(LOO_ROWS, estimator="grpo_loo", std="population", epsilon=0.0)["advantage"]
    assert got[0] == pytest.approx(-4 / math.sqrt(8 / 3), rel=1e-6)
    assert got[10] == pytest.approx(5.0)  # --singleton raw: s / (1 + 0)


def test_grpo_loo_keeps_the_precision_of_nearly_tied_others(computed):
    got = computed(LOO_NEAR_TIES, estimator="grpo_loo")["advantage"].to_list()
    expected = reference_advantages(LOO_NEAR_TIES, level="trajectory", estimator="grpo_loo")
    assert abs(expected[0]) > 4e5 and abs(expected[6]) > 9e5
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

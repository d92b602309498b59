"""The two implementations of the rules agree: ``advcli.torch`` on a padded batch and the Polars
path (stage 2, :func:`advcli.advantages.estimators.compute_advantages`) on the same rows give the
same
advantages, for every estimator both implement, at turn and trajectory level, and refuse the
same rows (scores float64 cannot give exactly, NaN and infinite ones)."""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from advcli.advantages.estimators import compute_advantages  # noqa: E402
from advcli.errors import AdvcliError  # noqa: E402
from advcli.keys import GROUP, ROW, SCORE, TOKENS, TRAJECTORY, TURN  # noqa: E402
from advcli.settings.config import (  # noqa: E402
    OUTCOME,
    OWN_SCORE_ESTIMATORS,
    SCALED,
    AdvantageConfig,
    Estimator,
    Level,
    Scale,
    Singleton,
    StdDenominator,
    TrajScore,
)
from advcli.settings.rules import RULES  # noqa: E402
from advcli.torch import (  # noqa: E402
    compute_advantage,
    compute_grpo_outcome_advantage,
    compute_rloo_outcome_advantage,
)

pytestmark = pytest.mark.torch

SCORES = [0.0, 1.0, 0.5, -0.25, 2.0, 1e-3]
WIDTH = 4


@st.composite
def batches(draw):
    """Rows in any order; every row of a trajectory carries its trajectory's score (where the
    two paths' semantics meet: torch normalizes each row's own score)."""
    n = draw(st.integers(1, 30))
    groups = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    trajectories = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    keys = sorted(set(zip(groups, trajectories, strict=True)))
    score_of = {key: draw(st.sampled_from(SCORES)) for key in keys}
    tokens = draw(st.lists(st.integers(1, WIDTH), min_size=n, max_size=n))
    epsilon = draw(st.sampled_from([1e-6, 0.0, 0.1]))
    row_scores = [score_of[key] for key in zip(groups, trajectories, strict=True)]
    return groups, trajectories, row_scores, tokens, epsilon


def polars_advantages(groups, trajectories, scores, tokens, config) -> np.ndarray:
    turn = [0] * len(groups)
    seen: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(groups, trajectories, strict=True)):
        turn[i] = seen[key] = seen.get(key, -1) + 1
    projection = pl.DataFrame(
        {
            ROW: pl.Series(range(len(groups)), dtype=pl.UInt32),
            GROUP: groups,
            TRAJECTORY: trajectories,
            TURN: turn,
            SCORE: pl.Series(scores, dtype=pl.Float64),
            TOKENS: tokens,
        }
    )
    return compute_advantages(projection, config).rows(projection)["advantage"].to_numpy()


def torch_advantages(groups, trajectories, scores, tokens, estimator, level, epsilon):
    n = len(groups)
    rewards = torch.zeros(n, WIDTH, dtype=torch.float64)
    mask = torch.zeros(n, WIDTH)
    for i, (score, count) in enumerate(zip(scores, tokens, strict=True)):
        rewards[i, count - 1] = score
        mask[i, :count] = 1
    flags = {"compute_mean_std_cross_all_data": level is Level.TURN}
    index, traj = np.array(groups), np.array(trajectories)
    if estimator is Estimator.RLOO:
        advantages, _ = compute_rloo_outcome_advantage(rewards, mask, index, traj, **flags)
    else:
        advantages, _ = compute_grpo_outcome_advantage(
            rewards,
            mask,
            index,
            traj,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=estimator is Estimator.GRPO,
            **flags,
        )
    # The scalar advantage sits on every unmasked token; the last one is always unmasked.
    return advantages[torch.arange(n), torch.tensor(tokens) - 1].numpy()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=batches(),
    estimator=st.sampled_from([Estimator.GRPO, Estimator.DRGRPO, Estimator.RLOO]),
    level=st.sampled_from(list(Level)),
)
def test_torch_and_polars_give_the_same_advantages(batch, estimator, level):
    groups, trajectories, scores, tokens, epsilon = batch
    config = AdvantageConfig(level=level, estimator=estimator, epsilon=epsilon)
    expected = polars_advantages(groups, trajectories, scores, tokens, config)
    actual = torch_advantages(groups, trajectories, scores, tokens, estimator, level, epsilon)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    # Exact zeros (zero-std groups) are exact in both.
    assert (actual[expected == 0] == 0).all()


@st.composite
def any_batches(draw):
    """Rows in any order whose trajectories may carry different scores (a trajectory-score rule
    then decides), with turn numbers in any order, and rows without response tokens."""
    n = draw(st.integers(1, 30))
    groups = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    trajectories = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    consistent = draw(st.booleans())
    keys = sorted(set(zip(groups, trajectories, strict=True)))
    score_of = {key: draw(st.sampled_from(SCORES)) for key in keys}
    scores = [
        score_of[key] if consistent else draw(st.sampled_from(SCORES))
        for key in zip(groups, trajectories, strict=True)
    ]
    tokens = draw(st.lists(st.integers(0, WIDTH), min_size=n, max_size=n))
    # Distinct turns within a trajectory, in a drawn order.
    turns = draw(st.permutations(range(n)))
    return groups, trajectories, scores, tokens, list(turns), consistent


SETTINGS = [
    (estimator, scale)
    for estimator in OUTCOME
    for scale in ([None, "group", "batch", "none"] if estimator in SCALED else [None])
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=any_batches(),
    setting=st.sampled_from(SETTINGS),
    level=st.sampled_from(list(Level)),
    singleton=st.sampled_from(list(Singleton)),
    traj_score=st.sampled_from([None, *TrajScore]),
    epsilon=st.sampled_from([1e-6, 0.1]),
    std=st.sampled_from([None, StdDenominator.POPULATION]),
)
def test_compute_advantage_gives_the_command_lines_numbers(
    batch, setting, level, singleton, traj_score, epsilon, std
):
    """advcli.torch.compute_advantage against stage 2 of `advcli compute` (the Polars path) on
    the same rows: every estimator × scale × level × singleton × trajectory-score rule × std
    denominator (where the rule divides by a std)."""
    groups, trajectories, scores, tokens, turns, consistent = batch
    estimator, scale = setting
    if traj_score is None and not consistent:
        traj_score = TrajScore.MEAN
    # The own rule takes the estimators of a mean baseline at their group scale (both refuse
    # the others, as the usage tests check).
    assume(
        traj_score is not TrajScore.OWN
        or (estimator in OWN_SCORE_ESTIMATORS and scale in (None, "group", "none"))
    )
    assume(std is None or (RULES[estimator].divides and scale != "none"))
    config = AdvantageConfig(
        level=level,
        estimator=estimator,
        epsilon=epsilon,
        traj_score=traj_score,
        scale=Scale(scale) if scale else None,
        singleton=singleton,
        std=std,
    )
    n = len(groups)
    projection = pl.DataFrame(
        {
            ROW: pl.Series(range(n), dtype=pl.UInt32),
            GROUP: groups,
            TRAJECTORY: trajectories,
            TURN: turns,
            SCORE: pl.Series(scores, dtype=pl.Float64),
            TOKENS: tokens,
        }
    )
    try:
        expected = compute_advantages(projection, config).rows(projection)["advantage"].to_numpy()
    except AdvcliError as error:
        # Fewer than 2 response tokens for REINFORCE++: both refuse.
        with pytest.raises(ValueError, match="at least 2"):
            _compute(batch, config, scale)
        assert "at least 2" in str(error)
        return
    actual = _compute(batch, config, scale)
    with_tokens = np.array(tokens) > 0
    np.testing.assert_allclose(actual[with_tokens], expected[with_tokens], rtol=1e-5, atol=1e-6)
    sums_decide = traj_score in (TrajScore.MEAN, TrajScore.SUM) and config.level is not Level.TURN
    if not sums_decide and not RULES[estimator].whitens:
        # Exact zeros are exact in both where no float sum decides the values: the mean and sum
        # rules add a trajectory's row scores, and whitening subtracts the batch's token mean, in
        # another order on each side.
        assert (actual[with_tokens][expected[with_tokens] == 0] == 0).all()


def _compute(batch, config, scale) -> np.ndarray:
    groups, trajectories, scores, tokens, turns, _ = batch
    n = len(groups)
    rewards = torch.zeros(n, WIDTH, dtype=torch.float64)
    mask = torch.zeros(n, WIDTH)
    for i, (score, count) in enumerate(zip(scores, tokens, strict=True)):
        rewards[i, 0] = score
        mask[i, :count] = 1
    advantages, _ = compute_advantage(
        rewards,
        mask,
        np.array(groups),
        np.array(trajectories),
        estimator=config.estimator.value,
        level=config.level.value,
        scale=scale,
        singleton=config.singleton.value,
        traj_score=config.traj_score.value if config.traj_score else None,
        turn_index=np.array(turns),
        epsilon=config.epsilon,
        std=config.std.value if config.std else None,
    )
    # Each row's scalar sits on its first token (0 for a row without tokens).
    return advantages[:, 0].numpy()


def test_turn_numbers_keep_their_order_whatever_their_container():
    """Turns 1, 0 for trajectory a: 'first' is the row of turn 0, whether the turns come as a
    list, an object array (agent-lightning's turn_index_list in non_tensor_batch), an int array
    or a tensor."""
    rewards = torch.tensor([[0.0], [1.0], [0.5]])
    mask = torch.ones(3, 1)
    expected = [0.25, 0.25, -0.25]  # a's score is its turn-0 row's, 1.0; b 0.5; mean 0.75
    for turns in (
        [1, 0, 0],
        np.array([1, 0, 0], dtype=object),
        np.array([1, 0, 0]),
        torch.tensor([1, 0, 0]),
    ):
        advantages, _ = compute_advantage(
            rewards,
            mask,
            ["q"] * 3,
            ["a", "a", "b"],
            estimator="drgrpo",
            traj_score="first",
            turn_index=turns,
        )
        np.testing.assert_allclose(advantages[:, 0].numpy(), expected)
    with pytest.raises(ValueError, match="turn_index must hold integers"):
        compute_advantage(
            rewards,
            mask,
            ["q"] * 3,
            ["a", "a", "b"],
            traj_score="first",
            turn_index=["1", "0", "0"],
        )


REFUSED_ROWS = {
    # Row 1 of each: (its token rewards, its mask, the command line's words, advcli.torch's).
    "integer 2^53+1": (
        [2**53 + 1, 0],
        [1, 1],
        "the integer rewards of the row add up beyond 2^53",
        "row 1: the integer rewards of the row add up (in absolute value) to 9007199254740993, "
        "beyond 2^53",
    ),
    "integers 2^52 + (2^52+1)": (
        [2**52, 2**52 + 1],
        [1, 1],
        "the integer rewards of the row add up beyond 2^53",
        "row 1: the integer rewards of the row add up (in absolute value) to 9007199254740993, "
        "beyond 2^53",
    ),
    "NaN on a masked-out token": (
        [0.0, float("nan")],
        [1, 0],
        "the score is NaN",
        "row 1: the reward at token 1 is NaN",
    ),
    "+inf": (
        [float("inf"), 0.0],
        [1, 1],
        "the score is +inf",
        "row 1: the reward at token 0 is +inf",
    ),
    "-inf": (
        [0.0, float("-inf")],
        [1, 1],
        "the score is -inf",
        "row 1: the reward at token 1 is -inf",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_ROWS))
def test_the_command_line_and_torch_refuse_the_same_rows(case, tmp_path, run):
    """A row whose score float64 cannot give exactly, or that is NaN or infinite: the command
    line exits 1 naming the row, advcli.torch raises naming the same row."""
    row_rewards, row_mask, cli_words, torch_words = REFUSED_ROWS[case]
    integer = isinstance(row_rewards[0], int)
    zero = 0 if integer else 0.0
    rewards = [[zero, zero], row_rewards, [zero + 1, zero]]
    masks = [[1, 1], row_mask, [1, 1]]
    source = tmp_path / "dump.parquet"
    pl.DataFrame(
        {
            "uid": ["p", "p", "q"],
            "token_level_rewards": pl.Series(
                rewards, dtype=pl.List(pl.Int64 if integer else pl.Float64)
            ),
            "response_mask": masks,
        }
    ).write_parquet(source)
    output = tmp_path / "out.parquet"

    result = run("compute", source, "-o", output, "--level", "turn", "-q")

    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: {source} row 1: column 'token_level_rewards': {cli_words}"
    )
    assert not output.exists()
    tensor = torch.tensor(rewards, dtype=torch.int64 if integer else torch.float64)
    with pytest.raises(AdvcliError, match=rf"^{re.escape(torch_words)}"):
        compute_advantage(tensor, torch.tensor(masks), ["p", "p", "q"], level="turn")


@pytest.mark.parametrize(
    "row_rewards", [[2**53, 0], [2**52, 2**52], [-(2**53), 0], [2**53 + 1, -1]], ids=str
)
def test_the_command_line_and_torch_take_integer_sums_up_to_2_53(row_rewards, tmp_path, run):
    """|rewards| adding up to 2^53 exactly: every partial sum is an integer float64 holds, so both
    take the row, with the same advantages; one more (2^53 + 1 and -1: a score of 2^53, through
    a partial sum beyond it) and both refuse it."""
    rewards = [[0, 0], row_rewards]
    source = tmp_path / "dump.parquet"
    pl.DataFrame(
        {
            "uid": ["p", "p"],
            "token_level_rewards": pl.Series(rewards, dtype=pl.List(pl.Int64)),
            "response_mask": [[1, 1], [1, 1]],
        }
    ).write_parquet(source)
    output = tmp_path / "out.parquet"
    result = run("compute", source, "-o", output, "--level", "turn", "-q", "--no-tokens")
    tensor = torch.tensor(rewards, dtype=torch.int64)
    if abs(row_rewards[0]) + abs(row_rewards[1]) > 2**53:
        assert result.exit_code == 1
        assert result.stderr == (
            f"Error: {source} row 1: column 'token_level_rewards': the integer rewards of the "
            "row add up beyond 2^53, where float64 cannot hold every integer\n"
        )
        with pytest.raises(AdvcliError, match=r"^row 1: the integer rewards of the row add up"):
            compute_advantage(tensor, torch.ones(2, 2), ["p", "p"], level="turn")
        return
    assert result.exit_code == 0, result.stderr
    # Two rows, scores 0 and ±2^53: ∓1/√2 and ±1/√2 (mean ±2^52, std 2^52·√2).
    sign = 1 if sum(row_rewards) > 0 else -1
    expected = [-sign / math.sqrt(2), sign / math.sqrt(2)]
    written = pl.read_parquet(output)
    assert written["score"].to_list() == [0.0, float(sum(row_rewards))]
    np.testing.assert_allclose(written["advantage"].to_numpy(), expected, rtol=1e-6)
    advantages, _ = compute_advantage(tensor, torch.ones(2, 2), ["p", "p"], level="turn")
    np.testing.assert_allclose(advantages[:, 0].numpy(), expected, rtol=1e-6)

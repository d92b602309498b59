"""--reward-mode per-turn on the trainers' own dumps: each dialect's per-turn reward column is
the reward (ROLL's ``step_scores``, verl-agent's ``rewards``, SkyRL's step rows' ``rewards``),
its outcome column under outcome rewards; an outcome score repeated on every turn is refused
unless --reward-col names it; SkyRL's ``is_last_step`` must flag each trajectory's last turn.

The dumps are one group of two trajectories, A of one turn (reward 2) and B of three (rewards
1, 0, 3), in the column names and types each trainer's batch holds. By hand (γ = 1): the
rewards-to-go are A [2], B [4, 3, 3]; pooled drgrpo centres them on their mean 3: [-1, 1, 0, 0].
γ = 0.5: B [1 + 0.5·1.5, 0 + 0.5·3, 3] = [1.75, 1.5, 3]; with A's 2 the mean is 2.0625:
[-0.0625, -0.3125, -0.5625, 0.9375]."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from advcli import AdvantageConfig, Estimator, Level, compute
from advcli.settings.config import ColumnNames, PerTurn, StepGroups

REWARDS = [2.0, 1.0, 0.0, 3.0]
POOLED = [-1.0, 1.0, 0.0, 0.0]
POOLED_HALF = [-0.0625, -0.3125, -0.5625, 0.9375]
# The outcome each trainer repeats on every row: a trajectory's summed reward.
OUTCOMES = [2.0, 4.0, 4.0, 4.0]
LAST = [True, False, False, True]


def roll(step_scores: bool = True) -> pl.DataFrame:
    """ROLL's StepEnvManager rows (non_tensor_batch keys, a bool response mask)."""
    frame = pl.DataFrame(
        {
            "traj_group_id": ["q"] * 4,
            "traj_id": ["q_a", "q_b", "q_b", "q_b"],
            "step": [0, 0, 1, 2],
            "episode_scores": OUTCOMES,
            "response_mask": [[True, True]] * 4,
        }
    )
    return frame.with_columns(step_scores=pl.Series(REWARDS)) if step_scores else frame


def verl_agent(rewards: bool = True) -> pl.DataFrame:
    """verl-agent's rows: the per-step environment reward 'rewards', the episode's sum on the last
    token of every row's token_level_rewards (EpisodeRewardManager)."""
    frame = pl.DataFrame(
        {
            "uid": ["q"] * 4,
            "traj_uid": ["a", "b", "b", "b"],
            "token_level_rewards": [[0.0, r] for r in OUTCOMES],
            "response_mask": [[1, 1]] * 4,
        },
        schema_overrides={"token_level_rewards": pl.List(pl.Float32)},
    )
    return frame.with_columns(rewards=pl.Series(REWARDS)) if rewards else frame


def skyrl(last_step: list[bool] = LAST, trajectory_ids: bool = True) -> pl.DataFrame:
    """SkyRL's step-wise rows: each step's own reward on its last token of 'rewards', float
    loss_mask, is_last_step; skyrl 0.4.0 stores no trajectory_ids (runs of rows)."""
    frame = pl.DataFrame(
        {
            "uids": ["q"] * 4,
            "rewards": [[0.0, r] for r in REWARDS],
            "loss_mask": [[1.0, 1.0]] * 4,
            "is_last_step": last_step,
        },
        schema_overrides={"rewards": pl.List(pl.Float32), "loss_mask": pl.List(pl.Float32)},
    )
    if not trajectory_ids:
        return frame
    return frame.with_columns(trajectory_ids=pl.Series(["q_0", "q_1", "q_1", "q_1"]))


def per_turn(gamma: float = 1.0) -> AdvantageConfig:
    return AdvantageConfig(
        estimator=Estimator.DRGRPO,
        level=Level.TURN,
        per_turn=PerTurn(gamma=gamma, groups=StepGroups.POOLED),
    )


def computed(tmp_path: Path, frame: pl.DataFrame, config: AdvantageConfig, **names):
    """The summary and output of the library's compute on ``frame`` written as Parquet."""
    source, output = tmp_path / "rollouts.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    summary = compute(source, output, config, names=ColumnNames(**names), tokens=False)
    return summary, pl.read_parquet(output)


@pytest.mark.parametrize(
    ("frame", "column", "trainer"),
    [(roll(), "step_scores", "ROLL"), (verl_agent(), "rewards", "verl-agent")],
    ids=["ROLL", "verl-agent"],
)
def test_the_dialects_per_turn_reward_is_read_under_per_turn(frame, column, trainer, tmp_path):
    summary, out = computed(tmp_path, frame, per_turn())
    assert summary.columns.reward == column
    assert summary.columns.reasons["reward"].startswith(
        f"'{column}' is the per-turn reward column of {trainer}'s dumps, read under "
        "--reward-mode per-turn; its outcome column"
    )
    assert out["score"].to_list() == [2.0, 4.0, 3.0, 3.0]
    assert out["advantage"].to_list() == pytest.approx(POOLED, abs=1e-6)


@pytest.mark.parametrize(
    ("frame", "outcome"),
    [(roll(), "episode_scores"), (verl_agent(), "token_level_rewards")],
    ids=["ROLL", "verl-agent"],
)
def test_the_outcome_column_is_read_under_outcome_rewards(frame, outcome, tmp_path):
    """Trajectory level drgrpo on the outcomes 2 and 4: -1 and 1."""
    config = AdvantageConfig(estimator=Estimator.DRGRPO)
    summary, out = computed(tmp_path, frame, config)
    assert summary.columns.reward == outcome
    assert out["advantage"].to_list() == pytest.approx([-1.0, 1.0, 1.0, 1.0], abs=1e-6)


@pytest.mark.parametrize("trajectory_ids", [True, False], ids=["SkyRL", "SkyRL 0.4.0"])
def test_skyrl_step_rows_are_each_their_own_turn(trajectory_ids, tmp_path):
    """Under outcome rewards SkyRL's trajectory score is its last step's reward; per turn each
    row's reward is its own, the rewards-to-go in row order (no turn column)."""
    summary, out = computed(tmp_path, skyrl(trajectory_ids=trajectory_ids), per_turn(0.5))
    assert summary.columns.reward == "rewards"
    flagged = "each trajectory's last row in turn order must be its one row flagged 'is_last_step'"
    assert flagged in summary.columns.reasons["reward"]
    assert out["score"].to_list() == [2.0, 1.75, 1.5, 3.0]
    assert out["advantage"].to_list() == pytest.approx(POOLED_HALF, abs=1e-6)


@pytest.mark.parametrize(
    ("flags", "row", "said"),
    [
        (
            [True, True, False, True],
            1,
            "this row is flagged 'is_last_step' but is not the last turn of trajectory "
            "(uids='q', trajectory_ids='q_1') in row order",
        ),
        (
            [True, False, False, False],
            3,
            "this row is the last turn of trajectory (uids='q', trajectory_ids='q_1') in row "
            "order but is not flagged 'is_last_step'",
        ),
    ],
    ids=["flag-before-the-end", "end-not-flagged"],
)
def test_skyrl_last_step_flags_must_agree_with_the_turn_order(flags, row, said, run, tmp_path):
    source = tmp_path / "rollouts.parquet"
    skyrl(flags).write_parquet(source)
    result = run(
        "compute", source, "-o", tmp_path / "out.parquet", "--no-tokens",
        "--reward-mode", "per-turn",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {source} row {row}: {said}; SkyRL flags")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(
    ("frame", "reward", "where"),
    [
        (
            roll(step_scores=False),
            "episode_scores",
            "ROLL's dumps keep it in 'step_scores', which this one does not have: name",
        ),
        (
            verl_agent(rewards=False),
            "token_level_rewards",
            "verl-agent's dumps keep it in 'rewards', which this one does not have: name",
        ),
    ],
    ids=["ROLL", "verl-agent"],
)
def test_an_outcome_repeated_on_every_turn_is_refused(frame, reward, where, run, tmp_path):
    source = tmp_path / "rollouts.parquet"
    frame.write_parquet(source)
    options = ("-o", tmp_path / "out.parquet", "--no-tokens", "--reward-mode", "per-turn")
    result = run("compute", source, *options)
    assert result.exit_code == 1
    trajectory = "'q_b'" if reward == "episode_scores" else "'b'"
    assert result.stderr == (
        f"Error: {source} row 1: column '{reward}' (reward) has one value on all the rows of "
        f"each trajectory (trajectory ({frame.columns[0]}='q', {frame.columns[1]}={trajectory}) "
        "has 3 rows of 4): it looks like an outcome score repeated on every turn, which "
        "--reward-mode per-turn would count once per turn (the reward-to-go multiplies it by "
        f"the turn count); {where} the per-turn reward column with --reward-col, or pass "
        f"--reward-col {reward} to read this one as each turn's own reward\n"
    )
    assert not (tmp_path / "out.parquet").exists()
    # Named with --reward-col it is read as each turn's reward: B's return is 4 + 4 + 4 = 12
    # at its first turn.
    confirmed = run("compute", source, *options, "--reward-col", reward, "--force")
    assert confirmed.exit_code == 0, confirmed.stderr
    out = pl.read_parquet(tmp_path / "out.parquet")
    assert out["score"].to_list() == [2.0, 12.0, 8.0, 4.0]


def test_a_dump_of_no_trainer_with_constant_rewards_per_trajectory_is_refused(run, tmp_path):
    """advcli's own names: the same rule, pointing to advcli's own per-step reward column."""
    frame = pl.DataFrame(
        {
            "data_id": [0, 0, 0],
            "rollout_id": ["a", "b", "b"],
            "turn_index": [0, 0, 1],
            "score": [1.0, -1.0, -1.0],
        }
    )
    source = tmp_path / "rollouts.parquet"
    frame.write_parquet(source)
    options = ("-o", tmp_path / "out.parquet", "--no-tokens", "--reward-mode", "per-turn")
    result = run("compute", source, *options)
    assert result.exit_code == 1
    assert (
        "advcli's dumps keep it in 'step_reward', which this one does not have: name the "
        "per-turn reward column with --reward-col, or pass --reward-col score "
    ) in result.stderr
    assert run("compute", source, *options, "--reward-col", "score").exit_code == 0

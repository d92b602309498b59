"""advcli.torch's and advcli.verl's per-turn rewards (reward_mode="per-turn"): every step grouping
of advcli.rules.STEP_GROUPINGS x estimator x γ x singleton rule on shuffled dumps, against the
plain-Python reference (tests/per_turn_reference.py) and against `advcli compute --reward-mode
per-turn` on the same rows written to Parquet; the hand-computed cases of
tests/advantages/test_per_turn.py; LightRFT's recipe; a real verl DataProto as verl-agent holds
it; and the bad inputs."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from per_turn_reference import advantages as reference_advantages
from per_turn_reference import lightrft_group_norm, per_index_sum_advantages
from test_per_turn import GAMMA_HALF, GAMMA_ONE, TWO

from advcli.settings.rules import PER_TURN_ESTIMATORS, STEP_GROUPINGS
from advcli.torch import RewardError, compute_advantage, compute_advantage_with_metrics

pytest.importorskip("verl")
from verl import DataProto

from advcli.verl import compute_advantage as verl_compute_advantage

EPS = 1e-6
ANCHORS = 3


def _reference(rows: list[tuple], grouping: str, estimator: str, gamma: float, singleton: str):
    """The plain-Python reference of a grouping on (group, trajectory, position, reward) rows;
    None for the anchor grouping, which it does not state (held to the command line and to
    hand-computed cases instead)."""
    if STEP_GROUPINGS[grouping].anchors:
        return None
    if STEP_GROUPINGS[grouping].normalizes_rewards:
        return per_index_sum_advantages(rows, estimator, gamma, singleton)
    return reference_advantages(rows, grouping, estimator, gamma, singleton)


def _random_dump(seed: int) -> pl.DataFrame:
    """Six groups of 1-4 trajectories of 1-4 turns, rewards from a few values (ties, zero-std
    step groups and groups of one happen), some trajectories' turns starting at 2 (positions
    count from a trajectory's first turn), an anchor from a few states, rows shuffled."""
    rng = np.random.default_rng(seed)
    rows = []
    for group in range(6):
        for rollout in range(int(rng.integers(1, 5))):
            start = int(rng.choice([0, 0, 2]))
            for turn in range(start, start + int(rng.integers(1, 5))):
                reward = float(rng.choice([0.0, 1.0, 0.5, -0.2]))
                anchor = int(rng.integers(0, ANCHORS))
                rows.append((group, f"{group}-{rollout}", turn, reward, anchor))
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    schema = ["data_id", "rollout_id", "turn_index", "score", "anchor"]
    return pl.DataFrame(shuffled, schema=schema, orient="row").with_columns(
        pl.lit(2).alias("response_length")
    )


def _positions(frame: pl.DataFrame) -> list[tuple]:
    """The rows for the reference: (group, trajectory, position from the trajectory's first
    turn, reward)."""
    first = frame.group_by("data_id", "rollout_id").agg(pl.col("turn_index").min().alias("first"))
    rows = frame.join(first, on=["data_id", "rollout_id"], maintain_order="left")
    return list(
        rows.select("data_id", "rollout_id", pl.col("turn_index") - pl.col("first"), "score")
        .iter_rows()
    )  # fmt: skip


def _torch(frame: pl.DataFrame, grouping: str | None, **keywords) -> list[float]:
    """advcli.torch on the dump's rows: (bs, 1) rewards, int group ids, string trajectory ids."""
    if grouping is not None and STEP_GROUPINGS[grouping].anchors:
        keywords["anchor_index"] = frame["anchor"].to_numpy()
    advantages, returns = compute_advantage(
        torch.tensor(frame["score"].to_numpy()).unsqueeze(1),
        torch.ones(frame.height, 1),
        frame["data_id"].to_numpy(),
        frame["rollout_id"].to_numpy().astype(object),
        turn_index=frame["turn_index"].to_numpy(),
        step_groups=grouping,
        **keywords,
    )
    assert advantages.dtype == torch.float32 and advantages is returns
    return advantages[:, 0].tolist()


def _command_line(run, tmp_path: Path, frame: pl.DataFrame, grouping: str, *options) -> list:
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    anchor = ("--anchor-col", "anchor") if STEP_GROUPINGS[grouping].anchors else ()
    result = run(
        "compute", source, "-o", output, "--no-tokens", "--force", "-q", "--reward-mode",
        "per-turn", "--step-groups", grouping, *anchor, *options,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return pl.read_parquet(output)["advantage"].to_list()


CASES = [
    (grouping, estimator, gamma, singleton)
    for grouping in STEP_GROUPINGS
    for estimator in PER_TURN_ESTIMATORS
    for gamma in (1.0, 0.9)
    for singleton in ("raw", "zero")
]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_case_is_the_reference(seed):
    """Every grouping the reference states, estimator, γ and singleton rule, on shuffled rows
    whose turns do not all start at 0."""
    frame = _random_dump(seed)
    rows = _positions(frame)
    for grouping, estimator, gamma, singleton in CASES:
        expected = _reference(rows, grouping, estimator, gamma, singleton)
        if expected is None:
            continue
        got = _torch(
            frame, grouping, reward_mode="per-turn", estimator=estimator, gamma=gamma,
            singleton=singleton,
        )  # fmt: skip
        assert got == pytest.approx(expected, abs=1e-5), (grouping, estimator, gamma, singleton)


def test_every_case_is_the_command_line(run, tmp_path):
    """Every case, the anchor grouping included, gives `advcli compute`'s numbers on the same
    rows (float32, to 1e-5)."""
    frame = _random_dump(2)
    for grouping, estimator, gamma, singleton in CASES:
        options = ("--estimator", estimator, "--gamma", str(gamma), "--singleton", singleton)
        expected = _command_line(run, tmp_path, frame, grouping, *options)
        got = _torch(
            frame, grouping, reward_mode="per-turn", estimator=estimator, gamma=gamma,
            singleton=singleton,
        )  # fmt: skip
        assert got == pytest.approx(expected, abs=1e-5), (grouping, estimator, gamma, singleton)


def test_anchor_scope_batch_is_the_command_line(run, tmp_path):
    frame = _random_dump(3)
    expected = _command_line(run, tmp_path, frame, "anchor", "--anchor-scope", "batch")
    got = _torch(frame, "anchor", reward_mode="per-turn", anchor_scope="batch")
    assert got == pytest.approx(expected, abs=1e-5)


def test_lightrft_recipe(run, tmp_path):
    """recipe="lightrft" implies per-turn rewards: LightRFT's group_norm, as the reference and
    as `advcli compute --recipe lightrft`."""
    frame = _random_dump(4)
    expected = lightrft_group_norm(_positions(frame), 0.9)
    got = _torch(frame, None, recipe="lightrft", gamma=0.9)
    assert got == pytest.approx(expected, abs=1e-5)
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    result = run(
        "compute", source, "-o", output, "--no-tokens", "-q", "--recipe", "lightrft",
        "--gamma", "0.9",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert got == pytest.approx(pl.read_parquet(output)["advantage"].to_list(), abs=1e-5)


@pytest.mark.parametrize(("gamma", "table"), [(1.0, GAMMA_ONE), (0.5, GAMMA_HALF)])
def test_the_hand_computed_cases(gamma, table):
    """tests/advantages/test_per_turn.py's hand-computed values (one group: A one turn, B three)."""
    for (grouping, estimator), expected in table.items():
        got = _torch(TWO, grouping, reward_mode="per-turn", estimator=estimator, gamma=gamma)
        assert got == pytest.approx(expected, abs=1e-6), (grouping, estimator)


def test_anchor_groups_by_hand():
    """Anchors s0, s0, s1, s0 on TWO (γ = 1, G = [2, 4, 3, 3]): s0 {2, 4, 3} has mean 3 and
    std 1, s1 is alone (grpo: 3 / (1 + ε); zero: 0)."""
    frame = TWO.with_columns(anchor=pl.Series(["s0", "s0", "s1", "s0"]))
    got = _torch(frame, "anchor", reward_mode="per-turn")
    assert got == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 3 / (1 + EPS), 0.0], abs=1e-6)
    got = _torch(frame, "anchor", reward_mode="per-turn", singleton="zero")
    assert got == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 0.0, 0.0], abs=1e-6)


def test_a_padded_index_with_one_real_row_by_hand():
    """Trajectories a, b, c, only c reaching position 1 (G = 6): the padded group {6, 0, 0} has
    mean 2 and std √12: grpo 4 / (√12 + ε), rloo 6, drgrpo 4; the metrics count its virtual
    members (a group of 3, not a singleton)."""
    rewards = torch.tensor([[1.0], [2.0], [0.0], [6.0]])
    arguments = (rewards, torch.ones(4, 1), [0, 0, 0, 0], ["a", "b", "c", "c"])
    expected = {"grpo": 4 / (math.sqrt(12) + EPS), "rloo": 6.0, "drgrpo": 4.0}
    for estimator, value in expected.items():
        result = compute_advantage_with_metrics(
            *arguments, estimator=estimator, turn_index=[0, 0, 0, 1], reward_mode="per-turn"
        )
        assert float(result.advantages[3, 0]) == pytest.approx(value, abs=1e-6)
    assert result.metrics.groups == 2 and result.metrics.singleton_groups == 0
    assert result.metrics.trajectories == 3
    assert result.scores.tolist() == [1.0, 2.0, 0.0, 6.0]


def test_shuffled_rows_give_each_row_its_own_numbers():
    """The same rows in another order, and with no turn key but in turn order: each row keeps
    its advantage."""
    frame = _random_dump(5).sort("data_id", "rollout_id", "turn_index")
    expected = _torch(frame, "turn-padded", reward_mode="per-turn", gamma=0.9)
    order = np.random.default_rng(0).permutation(frame.height)
    shuffled = _torch(frame[order], "turn-padded", reward_mode="per-turn", gamma=0.9)
    assert shuffled == pytest.approx([expected[i] for i in order], abs=1e-6)
    no_turn, _ = compute_advantage(
        torch.tensor(frame["score"].to_numpy()).unsqueeze(1), torch.ones(frame.height, 1),
        frame["data_id"].to_numpy(), frame["rollout_id"].to_list(), reward_mode="per-turn",
        gamma=0.9,
    )  # fmt: skip
    assert no_turn[:, 0].tolist() == pytest.approx(expected, abs=1e-6)


def test_without_trajectory_ids_each_row_is_a_trajectory():
    """Rewards 1, 3 in one group, no traj_index: two one-turn trajectories (drgrpo: ∓1)."""
    advantages, _ = compute_advantage(
        torch.tensor([[1.0], [3.0]]), torch.ones(2, 1), [0, 0], estimator="drgrpo",
        reward_mode="per-turn",
    )  # fmt: skip
    assert advantages[:, 0].tolist() == [-1.0, 1.0]


def test_an_empty_batch():
    advantages, _ = compute_advantage(
        torch.zeros(0, 3), torch.zeros(0, 3), [], [], reward_mode="per-turn", turn_index=[]
    )
    assert advantages.shape == (0, 3)


ROWS = (torch.tensor([[2.0], [1.0], [0.0], [3.0]]), torch.ones(4, 1), [0] * 4, list("ABBB"))


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"turn_index": [0, 0, 2, 3]}, ValueError,
         "row 3: trajectory 'B' of group 0 has turns 0, 2, 3: per-turn rewards need "
         "consecutive turn indices (a gap)"),
        ({"turn_index": [0, 0, 1, 1]}, ValueError,
         "row 2: trajectory 'B' of group 0 has turns 0, 1, 1: per-turn rewards need "
         "consecutive turn indices (a repeat)"),
        ({"step_rewards": [1.0, math.nan, 0.0, 1.0]}, RewardError, "row 1: step_rewards is nan"),
        ({"gamma": 1.5}, ValueError, "--gamma must be in [0, 1], got 1.5"),
        ({"gamma": -0.1}, ValueError, "--gamma must be in [0, 1], got -0.1"),
        ({"estimator": "opo"}, ValueError, "takes --estimator grpo, drgrpo, rloo, not opo"),
        ({"level": "trajectory"}, ValueError, "--level does not apply under --reward-mode"),
        ({"step_groups": "rows"}, ValueError, "step_groups='rows' is not one of 'turn'"),
        ({"reward_mode": "steps"}, ValueError, "reward_mode='steps' is not one of 'outcome'"),
        ({"step_groups": "anchor"}, ValueError, "step_groups='anchor' needs anchor_index"),
        ({"anchor_index": [1, 1, 2, 1]}, ValueError,
         "anchor_index applies to anchor step groups, not to 'turn-padded'"),
        ({"step_returns": [1.0] * 4}, ValueError, "give step_rewards (each turn's reward)"),
        ({"step_weight": 1.0}, ValueError,
         "step_weight applies to gigpo, not to reward_mode='per-turn'"),
        ({"recipe": "roll"}, ValueError, "recipe='roll' applies to gigpo, not to reward_mode="),
        ({"anchor_scope": "batch"}, ValueError, "--anchor-scope applies to --step-groups anchor"),
    ],
)  # fmt: skip
def test_bad_inputs(keywords, error, message):
    keywords = {"reward_mode": "per-turn", **keywords}
    with pytest.raises(error) as raised:
        compute_advantage(*ROWS, **keywords)
    assert message in str(raised.value)


def test_bad_rewards_and_settings_under_outcome():
    rewards = ROWS[0].clone()
    rewards[2, 0] = math.nan
    with pytest.raises(RewardError, match="row 2: the reward at token 0 is NaN"):
        compute_advantage(rewards, *ROWS[1:], reward_mode="per-turn")
    with pytest.raises(ValueError, match="step_groups applies to reward_mode='per-turn'"):
        compute_advantage(*ROWS, step_groups="turn")
    message = "recipe='lightrft' implies reward_mode='per-turn', not reward_mode='outcome'"
    with pytest.raises(ValueError, match=message):
        compute_advantage(*ROWS, recipe="lightrft", reward_mode="outcome")


# verl-agent's batch at its advantage step: uuids for uid and traj_uid, the episode score on
# each row's last token, the per-step rewards as an object array in non_tensor_batch, each
# trajectory's rows in turn order and the trajectories interleaved (one env step at a time).
AGENT_ROWS = [  # (group, trajectory, step reward, anchor)
    (0, "a", 0.5, "s0"), (0, "b", 0.0, "s0"), (1, "c", 1.0, "s0"),
    (0, "a", 0.0, "s1"), (0, "b", 1.0, "s2"), (1, "c", 0.0, "s1"),
    (0, "a", 1.0, "s1"), (1, "c", 1.0, "s3"),
]  # fmt: skip


def agent_batch(rows=AGENT_ROWS, rewards=None) -> DataProto:
    uids = {group: str(uuid.uuid4()) for group in {row[0] for row in rows}}
    trajs = {traj: str(uuid.uuid4()) for traj in {row[1] for row in rows}}
    count = len(rows)
    token_rewards = torch.zeros(count, 3)
    token_rewards[:, -1] = 1.0  # the episode score: not the per-turn reward
    step = [np.float32(row[2]) for row in rows] if rewards is None else rewards
    anchors = np.empty(count, dtype=object)
    anchors[:] = [row[3] for row in rows]
    return DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": torch.ones(count, 3)},
        non_tensors={
            "uid": np.array([uids[row[0]] for row in rows], dtype=object),
            "traj_uid": np.array([trajs[row[1]] for row in rows], dtype=object),
            "rewards": np.array(step, dtype=object),
            "anchor_obs": anchors,
        },
    )


def _agent_reference_rows() -> list[tuple]:
    """AGENT_ROWS with each row's position: its rank among its trajectory's rows in batch
    order."""
    seen: dict[str, int] = {}
    rows = []
    for group, trajectory, reward, _ in AGENT_ROWS:
        rows.append((group, trajectory, seen.get(trajectory, 0), reward))
        seen[trajectory] = seen.get(trajectory, 0) + 1
    return rows


@pytest.mark.parametrize("grouping", ["turn-padded", "turn-rewards", "pooled"])
def test_verl_agent_batch_is_the_reference(grouping):
    """The per-step `rewards` are the per-turn rewards (the token rewards carry the episode
    score), the batch order is the turn order, γ is verl's gamma argument."""
    batch = agent_batch()
    out = verl_compute_advantage(
        batch, "grpo", gamma=0.9, reward_mode="per-turn", step_groups=grouping
    )
    expected = _reference(_agent_reference_rows(), grouping, "grpo", 0.9, "raw")
    assert out.batch["advantages"][:, -1].tolist() == pytest.approx(expected, abs=1e-5)
    assert torch.equal(out.batch["returns"], out.batch["advantages"])
    metrics = out.meta_info["metrics"]
    assert metrics["advcli/rows"] == 8 and metrics["advcli/trajectories"] == 3
    assert not any(key.startswith("advcli/groups/") for key in metrics)


def test_verl_agent_anchor_groups_and_config():
    """anchor_obs makes the anchor step groups; config's reward_mode and step_groups are read
    as verl reads its algorithm section. γ = 1: G_a = [1.5, 1, 1], G_b = [1, 1], G_c = [2, 1, 1];
    group 0's s0 {1.5, 1} (drgrpo ±0.25), s1 {1, 1} (0), s2 alone (1); group 1's s0, s1, s3 are
    each alone (their G)."""
    config = {"reward_mode": "per-turn", "step_groups": "anchor"}
    out = verl_compute_advantage(agent_batch(), "drgrpo", config=config)
    expected = [0.25, -0.25, 2.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert out.batch["advantages"][:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match=r"step_groups='turn' but config\.step_groups='anchor'"):
        verl_compute_advantage(agent_batch(), "drgrpo", config=config, step_groups="turn")


def test_verl_batch_without_per_step_rewards_sums_the_token_rewards():
    """A verl batch with advcli's keys (a turn key, rows shuffled) and no per-step rewards: each
    row's token rewards summed are its turn's reward, ordered by the turn key."""
    frame = _random_dump(6)
    width = 2
    token_rewards = torch.zeros(frame.height, width)
    token_rewards[:, 0] = torch.tensor(frame["score"].to_numpy()) / 2
    token_rewards[:, 1] = torch.tensor(frame["score"].to_numpy()) / 2
    mask = torch.ones(frame.height, width)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={
            "data_id": frame["data_id"].to_numpy(),
            "rollout_id": frame["rollout_id"].to_numpy().astype(object),
            "turn_index": frame["turn_index"].to_numpy(),
        },
    )
    out = verl_compute_advantage(batch, "rloo", reward_mode="per-turn", gamma=0.9)
    expected = reference_advantages(_positions(frame), "turn-padded", "rloo", 0.9)
    assert out.batch["advantages"][:, 1].tolist() == pytest.approx(expected, abs=1e-5)


def test_verl_lightrft_recipe():
    out = verl_compute_advantage(agent_batch(), "grpo", recipe="lightrft")
    expected = lightrft_group_norm(_agent_reference_rows())
    assert out.batch["advantages"][:, 0].tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "the batch's 'rewards' holds a null (None) at row 2"),
        (math.nan, "the batch's 'rewards' (per-turn reward) is nan at row 2"),
        (math.inf, "the batch's 'rewards' (per-turn reward) is inf at row 2"),
    ],
)
def test_verl_bad_per_turn_rewards(value, message):
    rewards = [np.float32(row[2]) for row in AGENT_ROWS]
    rewards[2] = value
    batch = agent_batch(rewards=rewards)
    with pytest.raises(RewardError) as raised:
        verl_compute_advantage(batch, "grpo", reward_mode="per-turn")
    assert message in str(raised.value)
    assert batch.batch.get("advantages", None) is None


def test_verl_refuses_what_per_turn_rewards_do_not_take():
    with pytest.raises(ValueError, match="step_groups applies to reward_mode='per-turn'"):
        verl_compute_advantage(agent_batch(), "grpo", step_groups="turn")
    with pytest.raises(ValueError, match="takes --estimator grpo, drgrpo, rloo, not opo"):
        verl_compute_advantage(agent_batch(), "opo", reward_mode="per-turn")
    with pytest.raises(ValueError, match="the batch has no 'turn_rewards' \\(step_reward_key\\)"):
        verl_compute_advantage(
            agent_batch(), "grpo", reward_mode="per-turn", step_reward_key="turn_rewards"
        )


def test_verl_termination_figures_are_compares(run, tmp_path):
    """Under per-turn rewards the step's metrics are `advcli compare --reward-mode per-turn`'s
    figures on the same rows, per grouping: its implied bonus and sign flips."""
    frame = _random_dump(7)
    batch = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor(frame["score"].to_numpy()).unsqueeze(1),
            "response_mask": torch.ones(frame.height, 1),
        },
        non_tensors={
            "data_id": frame["data_id"].to_numpy(),
            "rollout_id": frame["rollout_id"].to_numpy().astype(object),
            "turn_index": frame["turn_index"].to_numpy(),
        },
    )
    metrics = verl_compute_advantage(batch, "rloo", reward_mode="per-turn", gamma=0.9).meta_info[
        "metrics"
    ]
    source = tmp_path / "in.parquet"
    frame.drop("anchor").write_parquet(source)
    result = run(
        "compare", source, "--reward-mode", "per-turn", "--estimator", "rloo", "--gamma", "0.9",
        "--json", "-",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    groupings = json.loads(result.stdout)["groupings"]
    assert len(groupings) >= len(STEP_GROUPINGS) - 1  # every grouping but anchor (no anchors)
    for name, entry in groupings.items():
        for figure in ("implied_bonus", "sign_flips"):
            expected = math.nan if entry[figure] is None else entry[figure]
            got = metrics[f"advcli/groupings/{name}/{figure}"]
            assert got == pytest.approx(expected, abs=1e-9, nan_ok=True), (name, figure)

"""advcli.verl on real verl 0.9.1 DataProto batches, against verl's own estimator functions (turn
level), verl's v1 compute_advantage_for_multi_trajectories (trajectory level, final-turn rule),
the independent reference, and advcli compute on the same rows."""

from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pytest
from reference import reference_advantages

from advcli.dump import write_batch
from advcli.errors import AdvcliError

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from verl import DataProto  # noqa: E402

from advcli.torch import (  # noqa: E402
    RewardError,
    compute_grpo_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from advcli.verl import compute_advantage  # noqa: E402

with warnings.catch_warnings():
    # verl's trainer modules warn on import (Ray's state API, no megatron): not ours to fix.
    warnings.simplefilter("ignore")
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

pytestmark = pytest.mark.peers

WIDTH = 8
RNG_SEED = 7


def _batch(
    n_groups: int = 6,
    *,
    dtype: torch.dtype = torch.float32,
    int_ids: bool = False,
    shuffle: bool = True,
    distinct: bool = False,
) -> tuple[DataProto, list[tuple]]:
    """Trajectories of 1-4 turn rows in groups of 2-5, each row carrying its trajectory's reward
    on its last valid token; rows shuffled as verl's _balance_batch leaves them (a trajectory's
    rows not adjacent). ``distinct``: no two trajectories of a group share a score (verl's pass@k
    breaks ties its own way). Returns the batch and the rows as reference tuples (group,
    trajectory, turn, score as the tensor holds it, tokens)."""
    rng = np.random.default_rng(RNG_SEED)
    rows = []
    for group in range(n_groups):
        size = int(rng.integers(2, 6))
        if distinct:
            scores = rng.permutation([0.0, 0.25, 0.5, 0.75, 1.0, 1.5])[:size]
        else:
            scores = rng.choice([0.0, 0.5, 1.0], size=size)
        for trajectory, score in enumerate(scores):
            for turn in range(int(rng.integers(1, 5))):
                rows.append(
                    (group, trajectory, turn, float(score), int(rng.integers(1, WIDTH + 1)))
                )
    if shuffle:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    n = len(rows)
    rewards = torch.zeros(n, WIDTH, dtype=dtype)
    mask = torch.zeros(n, WIDTH, dtype=torch.int64)
    for i, (_, _, _, score, tokens) in enumerate(rows):
        rewards[i, tokens - 1] = score
        mask[i, :tokens] = 1
    held = rewards.to(torch.float64).sum(-1).tolist()  # bf16 rounds some rewards
    rows = [(g, t, k, held[i], n_tokens) for i, (g, t, k, _, n_tokens) in enumerate(rows)]
    if int_ids:
        uid = np.array([g for g, *_ in rows])
        traj = np.array([1000 * g + t for g, t, *_ in rows])
    else:
        uid = np.array([f"prompt-{g}" for g, *_ in rows], dtype=object)
        traj = np.array([f"rollout-{g}-{t}" for g, t, *_ in rows], dtype=object)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": uid, "traj_uid": traj, "turn_index": np.array([r[2] for r in rows])},
    )
    return batch, rows


def _scalar(advantages: torch.Tensor, rows: list[tuple]) -> np.ndarray:
    """Each row's scalar advantage: the value on its last valid token."""
    last = torch.tensor([r[4] for r in rows]) - 1
    return advantages[torch.arange(len(rows)), last].to(torch.float64).numpy()


@pytest.mark.parametrize("int_ids", [False, True], ids=["str ids", "int ids"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("level", ["trajectory", "turn"])
def test_grpo_against_the_reference(level, dtype, int_ids):
    batch, rows = _batch(dtype=dtype, int_ids=int_ids)
    metrics = compute_advantage(batch, level=level).meta_info["metrics"]
    expected = reference_advantages(rows, level=level, estimator="grpo")
    np.testing.assert_allclose(_scalar(batch.batch["advantages"], rows), expected, atol=1e-5)
    assert torch.equal(batch.batch["returns"], batch.batch["advantages"])
    assert batch.batch["advantages"].dtype == torch.float32
    # Zero outside the mask.
    assert (batch.batch["advantages"][batch.batch["response_mask"] == 0] == 0).all()
    assert metrics["advcli/rows"] == len(rows)


def _verl_turn_level(batch: DataProto, estimator: str) -> torch.Tensor:
    rewards, mask = batch.batch["token_level_rewards"], batch.batch["response_mask"]
    uid = batch.non_tensor_batch["uid"]
    if estimator in ("grpo", "drgrpo"):
        advantages, _ = core_algos.compute_grpo_outcome_advantage(
            rewards, mask, uid, norm_adv_by_std_in_grpo=estimator == "grpo"
        )
    elif estimator == "grpo_passk":
        advantages, _ = core_algos.compute_grpo_passk_outcome_advantage(
            rewards, mask, uid, config={"norm_adv_by_std_in_grpo": True}
        )
    else:
        name = {
            "rloo": "rloo",
            "opo": "opo",
            "reinforce_pp_baseline": "reinforce_plus_plus_baseline",
        }[estimator]
        function = core_algos.get_adv_estimator_fn(name)
        advantages, _ = function(token_level_rewards=rewards, response_mask=mask, index=uid)
    return advantages


@pytest.mark.parametrize(
    "estimator", ["grpo", "drgrpo", "rloo", "opo", "grpo_passk", "reinforce_pp_baseline"]
)
def test_turn_level_is_verls_own_estimator(estimator):
    """At turn level every row is a unit, as verl's estimators count them: the same numbers (to
    float32), on the batch's rows in balanced order."""
    batch, _ = _batch(distinct=estimator == "grpo_passk")
    expected = _verl_turn_level(batch, estimator)
    compute_advantage(batch, estimator, level="turn")
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-5, rtol=1e-5)


def _v1_batch() -> tuple[DataProto, list[str]]:
    """verl v1's rows: keys `{uid}_{session}_{index}`, `uid` and `session_id` per row, every row
    of a session with its own reward here (v1 copies the final one; the final-turn rule reads
    only that one either way)."""
    rng = np.random.default_rng(RNG_SEED)
    keys, rewards = [], []
    for prompt in range(5):
        for session in range(int(rng.integers(1, 5))):
            for index in range(int(rng.integers(1, 4))):
                keys.append(f"u{prompt}_{session}_{index}")
                rewards.append(float(rng.choice([0.0, 0.3, 1.0])))
    order = rng.permutation(len(keys))
    keys = [keys[i] for i in order]
    rewards = [rewards[i] for i in order]
    lengths = rng.integers(1, WIDTH + 1, size=len(keys))
    token_rewards = torch.zeros(len(keys), WIDTH)
    mask = torch.zeros(len(keys), WIDTH, dtype=torch.int64)
    for i, (reward, length) in enumerate(zip(rewards, lengths, strict=True)):
        token_rewards[i, length - 1] = reward
        mask[i, :length] = 1
    parts = [key.rsplit("_", 2) for key in keys]
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={
            "uid": np.array([uid for uid, _, _ in parts], dtype=object),
            "session_id": np.array([int(session) for _, session, _ in parts]),
            "turn_index": np.array([int(index) for _, _, index in parts]),
        },
    )
    return batch, keys


def test_trajectory_level_is_verl_v1_final_turn_grpo():
    """verl v1's compute_advantage_for_multi_trajectories: GRPO over each session's final turn,
    broadcast to the session. advcli: the v1 dialect (uid, session_id), traj_score='last'."""
    batch, keys = _v1_batch()
    ours, _ = _v1_batch()
    verl_result = compute_advantage_for_multi_trajectories(
        batch, keys, core_algos.AdvantageEstimator.GRPO
    )
    metrics = compute_advantage(ours, traj_score="last").meta_info["metrics"]
    torch.testing.assert_close(
        ours.batch["advantages"], verl_result.batch["advantages"], atol=1e-5, rtol=1e-5
    )
    sessions = {key.rsplit("_", 1)[0] for key in keys}
    assert metrics["advcli/trajectories"] == len(sessions)


def test_a_trajectory_with_disagreeing_rows_is_refused():
    batch, _ = _v1_batch()
    with pytest.raises(ValueError, match=r"different scores.*traj_score"):
        compute_advantage(batch)
    assert "advantages" not in batch.batch.keys()  # noqa: SIM118 (a TensorDict iterates rows)


def test_metrics_by_hand():
    # Group p: trajectories a (3 rows), b (1 row), both score 1 (zero std); group q: one
    # trajectory c of 2 rows (a singleton group).
    rewards = torch.tensor([[1.0], [1.0], [1.0], [1.0], [0.0], [0.0]])
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(6, 1)},
        non_tensors={
            "uid": np.array(list("pppqpq"), dtype=object),
            "traj_uid": np.array(list("aaacbc"), dtype=object),
        },
    )
    rewards[4] = 1.0  # b scores 1 too
    rewards[3] = 0.0  # c: both rows 0
    assert compute_advantage(batch, bias_metrics=False, metrics_prefix="") is batch
    assert batch.meta_info["metrics"] == {
        "rows": 6,
        "trajectories": 3,
        "multi_row_trajectories": 2,
        "max_rows_per_trajectory": 3,
        "groups": 2,
        "singleton_groups": 1,
        "zero_std_groups": 1,
    }
    assert batch.batch["advantages"][:, 0].tolist() == [0.0] * 6


def test_agent_lightnings_first_row_tokens_for_opo():
    """agent-lightning's rollout-level path runs verl's estimator on each rollout's first row and
    broadcasts (agentlightning/verl/rollout_level_advantage.py): opo then weighs a trajectory by
    its first row's tokens. unit_tokens='first_row' gives that number; verl's opo on the first
    rows is the independent check."""
    batch, rows = _batch(shuffle=False)
    firsts = sorted({(r[0], r[1]): i for i, r in reversed(list(enumerate(rows)))}.values())
    first_rows = batch.select_idxs(firsts)
    verl_first, _ = core_algos.get_adv_estimator_fn("opo")(
        token_level_rewards=first_rows.batch["token_level_rewards"],
        response_mask=first_rows.batch["response_mask"],
        index=first_rows.non_tensor_batch["uid"],
    )
    compute_advantage(batch, "opo", unit_tokens="first_row")
    ours = _scalar(batch.batch["advantages"], rows)
    by_trajectory = {
        (rows[i][0], rows[i][1]): float(verl_first[k, 0]) for k, i in enumerate(firsts)
    }
    expected = [by_trajectory[(r[0], r[1])] for r in rows]
    np.testing.assert_allclose(ours, expected, atol=1e-5)
    # advcli's own rule (a trajectory's tokens summed) gives another number here.
    compute_advantage(batch, "opo")
    assert not np.allclose(_scalar(batch.batch["advantages"], rows), expected, atol=1e-5)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "opo", "reinforce_pp_baseline"])
def test_the_command_lines_numbers(estimator, tmp_path, run):
    """advcli.verl and `advcli compute` on the same batch (written by advcli.dump)."""
    batch, rows = _batch(dtype=torch.bfloat16)
    write_batch(batch, tmp_path / "dump")
    output = tmp_path / "out.parquet"
    result = run("compute", tmp_path / "dump", "-o", output, "--estimator", estimator)
    assert result.exit_code == 0, result.output
    compute_advantage(batch, estimator)
    np.testing.assert_allclose(
        _scalar(batch.batch["advantages"], rows),
        pl.read_parquet(output)["advantage"].to_numpy(),
        atol=1e-6,
    )


# Group "p" (rows 0-2) and group "q" (rows 3-4); row 1's last token is masked out.
EDGE_REWARDS = [[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 1.0], [0.0, 0.0]]
EDGE_UID = np.array(["p", "p", "p", "q", "q"], dtype=object)


def _edge_mask() -> torch.Tensor:
    mask = torch.ones(5, 2)
    mask[1, 1] = 0
    return mask


VERL_ESTIMATORS = {
    "grpo": (core_algos.compute_grpo_outcome_advantage, compute_grpo_outcome_advantage),
    "rloo": (core_algos.compute_rloo_outcome_advantage, compute_rloo_outcome_advantage),
}


@pytest.mark.parametrize("estimator", sorted(VERL_ESTIMATORS))
@pytest.mark.parametrize(
    ("row", "token", "value", "name"),
    [
        (0, 1, math.nan, "NaN"),
        (0, 1, math.inf, "+inf"),
        (2, 1, -math.inf, "-inf"),
        (1, 1, math.nan, "NaN"),  # a masked-out token: verl's score sums it too
    ],
    ids=["nan", "inf", "-inf", "masked-out nan"],
)
def test_a_non_finite_reward_is_refused_where_verl_returns_nan(estimator, row, token, value, name):
    """verl 0.9.1's own estimator makes the whole group p non-finite (its mean is NaN or inf;
    NaN * 0 is NaN on masked-out tokens) and group q unchanged, with no error. advcli's drop-in
    refuses the batch naming the row, token and value, and so does advcli.verl on a DataProto,
    naming the batch's keys and leaving the batch without advantages."""
    verl_function, ours = VERL_ESTIMATORS[estimator]
    rewards = torch.tensor(EDGE_REWARDS)
    rewards[row, token] = value
    expected, _ = verl_function(rewards.clone(), _edge_mask(), EDGE_UID)
    assert not bool(torch.isfinite(expected[:3]).any())
    clean, _ = verl_function(torch.tensor(EDGE_REWARDS), _edge_mask(), EDGE_UID)
    torch.testing.assert_close(expected[3:], clean[3:])

    message = f"row {row}: the reward at token {token} is {name}"
    with pytest.raises(RewardError) as caught:
        ours(rewards, _edge_mask(), EDGE_UID)
    assert str(caught.value) == message
    assert isinstance(caught.value, AdvcliError) and isinstance(caught.value, ValueError)

    batch = DataProto.from_dict(
        tensors={"token_level_scores": rewards, "response_mask": _edge_mask()},
        non_tensors={"uid": EDGE_UID},
    )
    with pytest.raises(RewardError) as caught:
        compute_advantage(batch, estimator)
    assert (
        str(caught.value)
        == f"batch 'token_level_scores' (reward), 'response_mask' (mask): {message}"
    )
    assert "advantages" not in batch.batch.keys()  # noqa: SIM118 (a TensorDict iterates rows)


def test_a_nan_mask_value_is_refused_where_verl_returns_nan_at_that_token():
    """verl multiplies the advantage by the mask: a NaN there is a NaN at that one token."""
    mask = _edge_mask()
    mask[3, 0] = math.nan
    rewards = torch.tensor(EDGE_REWARDS)
    expected, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, EDGE_UID)
    assert torch.isnan(expected).nonzero().tolist() == [[3, 0]]
    with pytest.raises(RewardError, match=r"^row 3: the response mask at token 0 is NaN$"):
        compute_grpo_outcome_advantage(rewards, mask, EDGE_UID)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_an_empty_batch_like_verls(dtype):
    """0 rows: verl's estimators return (0, response_length); so do advcli's drop-ins, and
    advcli.verl fills an empty DataProto with float32 (0, response_length) advantages and
    reports zero counts, and NaN for the bias figures (there is no report of no rows)."""
    rewards, mask = torch.zeros(0, WIDTH, dtype=dtype), torch.zeros(0, WIDTH, dtype=torch.int64)
    uid = np.array([], dtype=object)
    for estimator, (verl_function, ours) in VERL_ESTIMATORS.items():
        expected, _ = verl_function(rewards, mask, uid)
        advantages, _ = ours(rewards, mask, uid)
        assert advantages.shape == expected.shape == (0, WIDTH), estimator
        assert advantages.dtype == torch.float32
    for estimator in ("grpo", "rloo", "opo", "reinforce_pp_baseline"):
        batch = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask},
            non_tensors={"uid": uid, "traj_uid": np.array([], dtype=object)},
        )
        metrics = compute_advantage(batch, estimator).meta_info["metrics"]
        assert batch.batch["advantages"].shape == (0, WIDTH)
        assert batch.batch["advantages"].dtype == torch.float32
        counts = {key: value for key, value in metrics.items() if key.count("/") == 1}
        assert len(counts) == 7 and set(counts.values()) == {0}
        bias = [value for key, value in metrics.items() if key.count("/") > 1]
        assert len(bias) == 6 and all(math.isnan(value) for value in bias)

"""advcli.verl.compute_advantage called as verl 0.9.1's trainer calls its own
``compute_advantage``: on a DataProto built as verl's ``RayPPOTrainer.fit`` builds it, with verl's
estimator names and ``norm_adv_by_std_in_grpo`` / ``config``, returning the batch with the step's
metrics, the bias among them equal to ``advcli compare``'s on the same batch; and its errors in
the library's words."""

from __future__ import annotations

import json
import math
import uuid
import warnings

import numpy as np
import pytest
from cases import PENALIZED_OWN_RULE, PENALIZED_ROWS

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from verl import DataProto  # noqa: E402

from advcli.dump import write_batch  # noqa: E402
from advcli.errors import AdvcliError  # noqa: E402
from advcli.verl import compute_advantage  # noqa: E402

with warnings.catch_warnings():
    # verl's trainer modules warn on import (Ray's state API, no accelerator): not ours to fix.
    warnings.simplefilter("ignore")
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.core_algos import AdvantageEstimator

pytestmark = pytest.mark.peers

WIDTH = 6


def verl_step_batch(
    prompts: int = 8, n: int = 4, *, max_turns: int = 4, seed: int = 3, distinct: bool = False
) -> DataProto:
    """A batch as verl's fit loop holds it at the advantage step: a ``uid`` per prompt, the
    prompts repeated ``n`` times (interleaved), a verl-agent ``traj_uid`` per rollout and one row
    per turn, ``response_mask``, ``token_level_scores`` (the rollout's score on each turn row's
    last token) copied to ``token_level_rewards`` (no KL in the reward), and the rows reordered
    as ``_balance_batch`` leaves them. ``distinct``: no two rollouts of a prompt tie."""
    rng = np.random.default_rng(seed)
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros(prompts, 3, dtype=torch.int64)})
    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object
    )
    batch = batch.repeat(repeat_times=n, interleave=True)
    rollouts = len(batch)
    batch.non_tensor_batch["traj_uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(rollouts)], dtype=object
    )
    if distinct:
        scores = np.concatenate([rng.permutation(n) / n for _ in range(prompts)])
    else:
        scores = rng.choice([0.0, 0.5, 1.0], size=rollouts)
    turns = rng.integers(1, max_turns + 1, size=rollouts)
    batch = batch.select_idxs(np.repeat(np.arange(rollouts), turns))
    rows = len(batch)
    lengths = torch.from_numpy(rng.integers(1, WIDTH + 1, size=rows))
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).to(torch.int64)
    reward_tensor = torch.zeros(rows, WIDTH)
    reward_tensor[torch.arange(rows), lengths - 1] = torch.from_numpy(
        np.repeat(scores, turns)
    ).float()
    batch.batch["response_mask"] = mask
    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.reorder(torch.from_numpy(rng.permutation(rows)))
    return batch


def verl_compute_advantage(batch: DataProto, **kwargs) -> torch.Tensor:
    """verl's own ray_trainer.compute_advantage on a copy of the batch."""
    copy = batch.select_idxs(np.arange(len(batch)))
    return ray_trainer.compute_advantage(copy, **kwargs).batch["advantages"]


# verl's names with the settings verl's trainer passes, at turn level verl's own numbers.
VERL_CALLS = [
    ("grpo", True),
    ("grpo", False),
    ("grpo_vectorized", True),
    ("rloo", True),
    ("rloo_vectorized", True),
    ("opo", True),
    ("grpo_passk", True),
    ("grpo_passk", False),
    ("reinforce_plus_plus_baseline", True),
]


@pytest.mark.parametrize("as_member", [False, True], ids=["string", "AdvantageEstimator"])
@pytest.mark.parametrize(("name", "norm"), VERL_CALLS, ids=[f"{n}-std{s}" for n, s in VERL_CALLS])
def test_verls_call_at_turn_level_is_verls_own_compute_advantage(name, norm, as_member):
    """Every row a unit (level="turn") is how verl counts: its compute_advantage's numbers, for
    the same arguments (pass@k breaks ties its own way: one turn per rollout, no ties)."""
    passk = name == "grpo_passk"
    batch = verl_step_batch(max_turns=1 if passk else 4, distinct=passk)
    estimator = AdvantageEstimator(name) if as_member else name
    call = {
        "adv_estimator": estimator,
        "gamma": 1.0,
        "lam": 1.0,
        "num_repeat": 4,
        "norm_adv_by_std_in_grpo": norm,
        "config": AlgoConfig(adv_estimator=name, norm_adv_by_std_in_grpo=norm),
    }
    expected = verl_compute_advantage(batch, **call)
    returned = compute_advantage(batch, **call, level="turn")
    assert returned is batch
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.batch["returns"], batch.batch["advantages"])


@pytest.mark.parametrize(("name", "norm"), VERL_CALLS, ids=[f"{n}-std{s}" for n, s in VERL_CALLS])
def test_a_prompt_of_one_row_gets_what_verl_gives_it(name, norm):
    """Prompts of one row beside prompts of several (verl's rloo_vectorized gives a lone row 0,
    its rloo the raw score, grpo the score over 1 + ε): verl's own numbers, at turn level."""
    if name == "grpo_passk":
        pytest.skip("verl 0.9.1's grpo_passk refuses a prompt of one sample (a ValueError)")
    uid = np.array(["a", "a", "b", "c", "c", "c", "d"], dtype=object)
    rewards = torch.tensor(
        [[0.0, 1.0], [0.0, 0.0], [0.0, 0.7], [1.0, 0.0], [0.0, 0.5], [0, 0], [2.0, 0]]
    )

    def batch() -> DataProto:
        return DataProto.from_dict(
            tensors={"token_level_rewards": rewards.clone(), "response_mask": torch.ones(7, 2)},
            non_tensors={"uid": uid.copy()},
        )

    config = AlgoConfig(adv_estimator=name, norm_adv_by_std_in_grpo=norm)
    call = {"adv_estimator": name, "norm_adv_by_std_in_grpo": norm, "config": config}
    expected = verl_compute_advantage(batch(), **call)
    ours = compute_advantage(batch(), **call, level="turn").batch["advantages"]
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_rloo_vectorized_takes_the_singleton_setting_given():
    """singleton= overrides the rule verl's name implies: "raw" keeps a lone row's score."""
    batch = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[1.0], [0.0], [0.7]]),
            "response_mask": torch.ones(3, 1),
        },
        non_tensors={"uid": np.array(["a", "a", "b"], dtype=object)},
    )
    ours = compute_advantage(batch, "rloo_vectorized", level="turn", singleton="raw")
    assert ours.batch["advantages"][:, 0].tolist() == pytest.approx([1.0, -1.0, 0.7])


def test_without_the_std_grpo_is_dr_grpo_and_grpo_vectorized_too():
    """norm_adv_by_std_in_grpo=False: verl's grpo is Dr. GRPO, advcli's drgrpo. verl 0.9.1's
    compute_advantage does not pass the flag on to grpo_vectorized (it divides by the std
    whatever the flag); advcli reads the flag for grpo_vectorized as for grpo."""
    batch = verl_step_batch()
    dr_grpo = verl_compute_advantage(batch, adv_estimator="grpo", norm_adv_by_std_in_grpo=False)
    with_std = verl_compute_advantage(batch, adv_estimator="grpo")
    assert not torch.allclose(dr_grpo, with_std)
    vectorized = verl_compute_advantage(
        batch, adv_estimator="grpo_vectorized", norm_adv_by_std_in_grpo=False
    )
    torch.testing.assert_close(vectorized, with_std, atol=1e-5, rtol=1e-5)
    for name in ("grpo", "grpo_vectorized"):
        compute_advantage(batch, name, norm_adv_by_std_in_grpo=False, level="turn")
        torch.testing.assert_close(batch.batch["advantages"], dr_grpo, atol=1e-5, rtol=1e-5)
    compute_advantage(batch, estimator="drgrpo", level="turn")
    torch.testing.assert_close(batch.batch["advantages"], dr_grpo, atol=1e-5, rtol=1e-5)


BIAS_KEYS = {
    "advcli/groups/baseline_shift_mean": ("groups", "baseline_shift_mean"),
    "advcli/groups/baseline_shift_max": ("groups", "baseline_shift_max"),
    "advcli/trajectories/advantage_diff_mean": ("trajectories", "advantage_diff_mean"),
    "advcli/trajectories/advantage_diff_max": ("trajectories", "advantage_diff_max"),
    "advcli/trajectories/sign_flips": ("trajectories", "sign_flips"),
    "advcli/loss_weights/token-mean/longest_vs_shortest": (
        "loss_weights",
        "token-mean",
        "longest_vs_shortest",
    ),
}
COUNT_KEYS = {
    "advcli/rows": "rows",
    "advcli/trajectories": "trajectories",
    "advcli/groups": "groups",
}
# (verl's call, compare's options for the same numbers). opo has no bias to show here: its
# token-weighted baseline is the same at both levels when a trajectory's rows share a score.
COMPARED = [
    ({"adv_estimator": "grpo"}, ["--estimator", "grpo"]),
    ({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False}, ["--estimator", "drgrpo"]),
    ({"adv_estimator": "rloo_vectorized", "level": "turn"}, ["--estimator", "rloo"]),
    ({"adv_estimator": "opo"}, ["--estimator", "opo"]),
    ({"adv_estimator": "reinforce_plus_plus_baseline"}, ["--estimator", "reinforce_pp_baseline"]),
    (
        {"estimator": "grpo", "scale": "batch", "epsilon": 0.01},
        ["--scale", "batch", "--epsilon", 0.01],
    ),
]


@pytest.mark.parametrize(
    ("call", "options"), COMPARED, ids=[" ".join(map(str, o)) for _, o in COMPARED]
)
def test_a_verl_step_logs_the_bias_compare_reports(call, options, tmp_path, run):
    """verl's step, advcli's call in place of verl's: the batch comes back with advantages and
    its metrics in meta_info["metrics"], which the step logs; each bias figure is what
    `advcli compare` reports on the same batch written by write_batch (both levels, whatever
    the level used)."""
    batch = verl_step_batch()
    metrics: dict[str, float] = {"training/global_step": 1}
    # As verl's fit passes them: the flag and the config it is read from.
    config = AlgoConfig(norm_adv_by_std_in_grpo=call.get("norm_adv_by_std_in_grpo", True))
    batch = compute_advantage(batch, **call, config=config)
    metrics.update(batch.meta_info["metrics"])
    # verl's next step sends the batch to its workers as a TensorDict, meta_info included.
    assert batch.to_tensordict()["token_level_rewards"].shape == batch.batch["advantages"].shape

    write_batch(batch, tmp_path / "dump")
    report_path = tmp_path / "report.json"
    result = run("compare", tmp_path / "dump", "--json", report_path, *options)
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    for key, path in BIAS_KEYS.items():
        expected = report
        for part in path:
            expected = expected[part]
        assert metrics[key] == pytest.approx(expected, rel=1e-6, abs=1e-12), key
    for key, name in COUNT_KEYS.items():
        assert metrics[key] == report["counts"][name], key
    # Figures that can be wrong: the batch's trajectories have 1 to 4 turns.
    biased = call.get("adv_estimator") != "opo"
    assert (metrics["advcli/trajectories/advantage_diff_mean"] > 0.01) == biased
    assert metrics["advcli/loss_weights/token-mean/longest_vs_shortest"] > 1


def test_the_metrics_merge_into_meta_info_and_the_bias_can_be_turned_off():
    batch = verl_step_batch()
    held = {"timing/gen": 1.5}
    batch.meta_info["metrics"] = held
    compute_advantage(batch, "grpo", bias_metrics=False)
    assert held == {"timing/gen": 1.5}  # the caller's dict is not changed under it
    assert batch.meta_info["metrics"]["timing/gen"] == 1.5
    assert batch.meta_info["metrics"]["advcli/rows"] == len(batch)
    assert not any(key.startswith("advcli/groups/") for key in batch.meta_info["metrics"])


def test_an_empty_batch_has_nan_bias_figures():
    batch = verl_step_batch().select_idxs(np.array([], dtype=np.int64))
    metrics = compute_advantage(batch).meta_info["metrics"]
    assert metrics["advcli/rows"] == 0
    assert all(math.isnan(metrics[key]) for key in BIAS_KEYS)


IMPLEMENTED = (
    "grpo, grpo_vectorized, rloo, rloo_vectorized, opo, grpo_passk, "
    "reinforce_plus_plus_baseline, drgrpo, reinforce_pp_baseline, grpo_loo, gigpo"
)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"adv_estimator": "GRPO"},
            ValueError,
            f"unknown estimator 'GRPO'; advcli.verl computes {IMPLEMENTED}",
        ),
        (
            {"adv_estimator": AdvantageEstimator.GAE},
            ValueError,
            f"verl's estimator 'gae' is not one advcli implements; advcli.verl computes "
            f"{IMPLEMENTED}",
        ),
        (
            {"adv_estimator": "remax"},
            ValueError,
            f"verl's estimator 'remax' is not one advcli implements; advcli.verl computes "
            f"{IMPLEMENTED}",
        ),
        (
            {"adv_estimator": "rloo", "estimator": "grpo"},
            ValueError,
            "adv_estimator='rloo' and estimator='grpo' name the same setting: give one",
        ),
        (
            {"adv_estimator": "grpo_passk", "config": {"norm_adv_by_std_in_grpo": False}},
            ValueError,
            "norm_adv_by_std_in_grpo=True but config.norm_adv_by_std_in_grpo=False: verl's grpo "
            "reads the argument and its grpo_passk the config; give them one value",
        ),
        (
            {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False, "scale": "batch"},
            ValueError,
            "norm_adv_by_std_in_grpo=False divides by no std, and scale='batch' by one: give one "
            "of them",
        ),
        (
            {"adv_estimator": "grpo", "gamma": "turn"},
            TypeError,
            "gamma is verl's number (unused by the outcome estimators), got 'turn'; advcli's "
            "settings (level=, …) are keywords",
        ),
        (
            {"level": "traj"},
            ValueError,
            "level='traj' is not one of 'trajectory', 'turn'",
        ),
        (
            {"singleton": "none"},
            ValueError,
            "singleton='none' is not one of 'raw', 'zero'",
        ),
        (
            {"traj_score": "median"},
            ValueError,
            "traj_score='median' is not one of 'first', 'last', 'mean', 'max', 'sum', 'own'",
        ),
        (
            {"scale": "global"},
            ValueError,
            "scale='global' is not one of 'group', 'batch', 'none'",
        ),
    ],
    ids=[
        "wrong name",
        "gae",
        "remax",
        "both names",
        "config disagrees",
        "scale",
        "gamma",
        "level",
        "singleton",
        "traj_score",
        "scale value",
    ],
)
def test_settings_errors_name_the_valid_values(kwargs, error, message):
    batch = verl_step_batch()
    with pytest.raises(error) as caught:
        compute_advantage(batch, **kwargs)
    assert str(caught.value) == message
    assert "advantages" not in batch.batch.keys()  # noqa: SIM118 (a TensorDict iterates rows)


def test_a_trajectory_whose_rows_disagree_is_named_by_the_batchs_ids():
    """The message names the trajectory and its group by their ids, not advcli.torch's
    argument names."""
    batch = _plain_batch(
        uid=np.array(["p", "p", "p"], dtype=object),
        session_id=np.array(["a", "a", "b"], dtype=object),
    )
    batch.batch["token_level_rewards"][1, 1] = 0.0
    with pytest.raises(ValueError) as caught:
        compute_advantage(batch)
    assert str(caught.value) == (
        "row 0: trajectory 'a' of group 'p' has rows with different scores [1.0, 2.0]; pass "
        "traj_score ('first', 'last', 'mean', 'max', 'sum' or 'own')"
    )
    with pytest.raises(ValueError, match=r"pass traj_score \('first', 'last', 'mean', 'max' or"):
        compute_advantage(batch, "rloo")


def test_rloo_takes_verls_flag_without_reading_it():
    """verl passes norm_adv_by_std_in_grpo whatever the estimator; the ones that divide by no
    std ignore it there, and here."""
    batch = verl_step_batch()
    expected = verl_compute_advantage(batch, adv_estimator="rloo", norm_adv_by_std_in_grpo=False)
    compute_advantage(batch, "rloo", norm_adv_by_std_in_grpo=False, level="turn")
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-5, rtol=1e-5)


def _plain_batch(**non_tensors: np.ndarray) -> DataProto:
    rows = len(next(iter(non_tensors.values())))
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.ones(rows, 2),
            "response_mask": torch.ones(rows, 2, dtype=torch.int64),
        },
        non_tensors=non_tensors,
    )


def test_key_errors_name_the_librarys_arguments():
    """The messages of the shared role reading, in compute_advantage's and write_batch's
    arguments, never the command line's flags."""
    uid = np.array(["p", "p", "p", "q"], dtype=object)
    batch = _plain_batch(uid=uid)
    with pytest.raises(ValueError) as caught:
        compute_advantage(batch, trajectory_key="traj")
    assert str(caught.value) == (
        "the batch: column 'traj' (trajectory_key=) not found. The batch has "
        "'token_level_rewards', 'response_mask', 'uid'"
    )
    with pytest.raises(AdvcliError) as caught:
        write_batch(batch, "unused", trajectory="traj")
    assert "column 'traj' (trajectory=) not found" in str(caught.value)

    both = np.array(["a", "a", "b", "c"], dtype=object)
    with pytest.raises(ValueError) as caught:
        compute_advantage(_plain_batch(uid=uid, trajectory_id=both, episode_id=both + "x"))
    assert str(caught.value) == (
        "the batch: the rows are not whole trajectories: 'trajectory_id' and 'episode_id' both "
        "repeat within groups; name the trajectory column with trajectory_key='trajectory_id'"
    )

    turns = np.array([0, 1, 0, 0])
    with pytest.raises(ValueError) as caught:
        compute_advantage(_plain_batch(uid=uid, turn_index=turns))
    assert str(caught.value).endswith(
        "no column says which trajectory a row belongs to; name the trajectory column with "
        "trajectory_key="
    )

    # Constant within each group, two values: the training step, not a turn.
    steps, two_groups = np.array([3, 3, 4, 4]), np.array(list("ppqq"), dtype=object)
    with pytest.raises(ValueError) as caught:
        compute_advantage(
            _plain_batch(uid=two_groups, traj=np.array(list("abcd"), dtype=object), step=steps),
            trajectory_key="traj",
        )
    assert str(caught.value).endswith(
        "it looks like the training step; compute each step on its own, or pass "
        "turn_key='step' to read it as the turn"
    )

    no_reward = DataProto.from_dict(
        tensors={"response_mask": torch.ones(4, 2, dtype=torch.int64)},
        non_tensors={"uid": uid, "rollout_id": both},
    )
    with pytest.raises(ValueError) as caught:
        compute_advantage(no_reward)
    assert "or name one with reward_key=" in str(caught.value)
    assert "--" not in str(caught.value)


def _penalized_agent_batch() -> DataProto:
    """verl-agent's batch with its invalid-action penalty (tests/cases.py's PENALIZED_ROWS)."""
    rows = PENALIZED_ROWS
    uids = {key: str(uuid.uuid4()) for key in {row[0] for row in rows} | {row[1] for row in rows}}
    rewards = torch.zeros(len(rows), 2)
    rewards[:, -1] = torch.tensor([score for _, _, score in rows])
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(len(rows), 2)},
        non_tensors={
            "uid": np.array([uids[group] for group, _, _ in rows], dtype=object),
            "traj_uid": np.array([uids[traj] for _, traj, _ in rows], dtype=object),
        },
    )


def test_a_verl_agent_batch_takes_verl_agents_own_rule_with_no_keyword(run, tmp_path):
    """Rows that differ by the penalty: each trajectory's first row in the statistics, each row
    centred on its own score, a tie divided by 1 + ε, not by ε (verl-agent's -1e5); the bias
    metrics are compare's on the batch written, read with no flags."""
    batch = compute_advantage(_penalized_agent_batch(), "grpo")
    advantages = batch.batch["advantages"][:, -1].tolist()
    assert advantages == pytest.approx(PENALIZED_OWN_RULE, abs=1e-6)
    chosen = compute_advantage(_penalized_agent_batch(), "grpo", traj_score="own")
    assert torch.equal(chosen.batch["advantages"], batch.batch["advantages"])
    mean = compute_advantage(_penalized_agent_batch(), "grpo", traj_score="mean")
    assert not torch.equal(mean.batch["advantages"], batch.batch["advantages"])

    write_batch(_penalized_agent_batch(), tmp_path / "dump", step=1)
    result = run("compare", tmp_path / "dump", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    metrics = batch.meta_info["metrics"]
    diff = report["trajectories"]["advantage_diff_mean"]
    assert metrics["advcli/trajectories/advantage_diff_mean"] == pytest.approx(diff, abs=1e-6)
    shift = report["groups"]["baseline_shift_mean"]
    assert metrics["advcli/groups/baseline_shift_mean"] == pytest.approx(shift, abs=1e-6)

"""advcli's pooled and trajectory choices against TorchRL 0.14.1's ``MCAdvantage``
(``torchrl/objectives/llm/grpo.py``), run on the same rows.

TorchRL's pin on tensordict excludes verl's, so this file runs in an environment of its own:
``bash .ci/torchrl`` (which CI runs) makes it and runs this file there (elsewhere it is skipped).

How the rows are fed to ``MCAdvantage``, read from its code:

- one TensorDict per trajectory, its steps in turn order along the batch dimension, the group id
  under ``prompt_key`` (an integer tensor is grouped by value), the reward under
  ``("next", "reward")`` and ``("next", "done")`` true on the last step only (it refuses a
  trajectory that is not done, and splits a batch at each done step);
- a group is computed when ``grpo_size`` trajectories of one id have arrived: here every
  trajectory of the group, so ``grpo_size`` is the group's trajectory count;
- ``trajectory_return=None``: ``(r − mean) / std.clamp_min(1e-6)`` over every step of the group,
  ``std`` torch's (Bessel's correction). Fed each step's reward-to-go (TorchRL's own
  ``reward2go``), this is advcli's ``--reward-mode per-turn --step-groups pooled``;
- ``"sum"`` / ``"mean"``: each trajectory's rewards reduced to one return, the returns normalized
  the same way over the group and broadcast to every step: advcli's trajectory level with
  ``--traj-score sum`` / ``mean`` over the per-turn rewards (outcome mode, where each row's
  reward is read as the trajectory's score to be combined).

advcli adds ε = 1e-6 to the std where TorchRL clamps the std at 1e-6, so the two differ by a
relative 1e-6 / std, under the tolerance for the stds of these rows; a group whose values are
all equal gets 0 from both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")
torchrl = pytest.importorskip("torchrl")
tensordict = pytest.importorskip("tensordict")

from torchrl.objectives.llm import MCAdvantage  # noqa: E402
from torchrl.objectives.value.functional import reward2go  # noqa: E402

pytestmark = pytest.mark.peers

# Group 0: three trajectories of 1, 3 and 2 turns; group 1: two of 4 and 1 turns; group 2: two
# trajectories whose rewards sum (and average) alike, a zero-std group at trajectory level.
TURN_REWARDS: dict[tuple[int, str], list[float]] = {
    (0, "a"): [1.0],
    (0, "b"): [0.5, -0.25, 2.0],
    (0, "c"): [0.0, 1.5],
    (1, "d"): [0.2, 0.4, -1.0, 3.0],
    (1, "e"): [-1.5],
    (2, "f"): [1.0, 1.0],
    (2, "g"): [2.0, 0.0],
}


def dump(tmp_path: Path) -> Path:
    """The rows in a Parquet file, shuffled: advcli orders each trajectory by ``turn_index``."""
    rows = [
        (group, trajectory, turn, reward)
        for (group, trajectory), rewards in TURN_REWARDS.items()
        for turn, reward in enumerate(rewards)
    ]
    order = np.random.default_rng(7).permutation(len(rows))
    frame = pl.DataFrame(
        [rows[i] for i in order],
        schema=["data_id", "rollout_id", "turn_index", "score"],
        orient="row",
    ).with_columns(response_length=pl.lit(3))
    path = tmp_path / "rollouts.parquet"
    frame.write_parquet(path)
    return path


def advcli_advantages(run, source: Path, tmp_path: Path, *options: str) -> dict:
    output = tmp_path / "out.parquet"
    result = run("compute", source, "-o", output, "--no-tokens", "--force", "-q", *options)
    assert result.exit_code == 0, result.stderr
    frame = pl.read_parquet(output)
    keys = zip(frame["rollout_id"], frame["turn_index"], strict=True)
    return dict(zip(keys, frame["advantage"].to_list(), strict=True))


def torchrl_advantages(trajectory_return: str | None, gamma: float) -> dict:
    """Each (trajectory, turn)'s advantage from ``MCAdvantage``, fed one trajectory at a time.
    Under ``trajectory_return=None`` the reward it reads is the reward-to-go."""
    from tensordict import TensorDict

    found: dict[tuple[str, int], float] = {}
    groups = sorted({group for group, _ in TURN_REWARDS})
    for group in groups:
        members = [(t, r) for (g, t), r in TURN_REWARDS.items() if g == group]
        transform = MCAdvantage(
            grpo_size=len(members),
            prompt_key="group_id",
            trajectory_return=trajectory_return,
        )
        out = None
        for index, (_, rewards) in enumerate(members):
            steps = len(rewards)
            reward = torch.tensor(rewards, dtype=torch.float64).reshape(steps, 1)
            done = torch.zeros(steps, 1, dtype=torch.bool)
            done[-1] = True
            if trajectory_return is None:
                reward = reward2go(reward, done, gamma, time_dim=-2)
            td = TensorDict(
                group_id=torch.full((steps,), group),
                member=torch.full((steps,), index),
                turn=torch.arange(steps),
                next=TensorDict(reward=reward, done=done, batch_size=[steps]),
                batch_size=[steps],
            )
            out = transform.inv(td)
            if index < len(members) - 1:
                assert out is None, "MCAdvantage wrote a group before it was complete"
        assert out is not None
        advantage = out["advantage"].reshape(-1).tolist()
        for member, turn, value in zip(
            out["member"].tolist(), out["turn"].tolist(), advantage, strict=True
        ):
            found[members[member][0], turn] = value
    return found


def assert_same(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    keys = sorted(ours)
    np.testing.assert_allclose(
        [ours[k] for k in keys], [theirs[k] for k in keys], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_pooled_is_mcadvantage_on_the_reward_to_go(gamma, run, tmp_path):
    ours = advcli_advantages(
        run, dump(tmp_path), tmp_path,
        "--reward-mode", "per-turn", "--step-groups", "pooled", "--estimator", "grpo",
        "--gamma", str(gamma),
    )  # fmt: skip
    assert_same(ours, torchrl_advantages(None, gamma))


@pytest.mark.parametrize("rule", ["sum", "mean"])
def test_trajectory_level_is_mcadvantage_trajectory_return(rule, run, tmp_path):
    ours = advcli_advantages(
        run, dump(tmp_path), tmp_path,
        "--level", "trajectory", "--traj-score", rule, "--estimator", "grpo",
    )  # fmt: skip
    theirs = torchrl_advantages(rule, 1.0)
    assert_same(ours, theirs)
    # The zero-std group (its two trajectories' rewards sum and average alike): 0 from both.
    assert [theirs[t, k] for t in "fg" for k in (0, 1)] == [0.0] * 4

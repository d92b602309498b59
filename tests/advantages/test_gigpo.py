"""compute --estimator gigpo: the issue's worked case for each recipe, the step returns against a
direct recurrence, the step groups' rules (scope, singletons, ROLL's std floor, verl-agent's
penalty rows), the anchors' hashing, the trainers' names and the options' errors.

Every expected value is computed here by hand from the formulas in docs/estimators.md."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ROOT

from advcli import AdvantageConfig, Estimator, compute
from advcli.advantages.step_groups import step_returns
from advcli.advantages.units import index_trajectories
from advcli.keys import GROUP, ROW, STEP_REWARD, TRAJECTORY, TURN
from advcli.settings.recipes import RECIPES

EPS = 1e-6

# The worked case: one group; trajectory 1 visits s0 -> s1 with step rewards 0, 1,
# trajectory 2 visits s0 -> s2 -> s3 with 0, 0, 0; outcome scores 1 and 0.
WORKED = pl.DataFrame(
    {
        "data_id": [0] * 5,
        "rollout_id": [1, 1, 2, 2, 2],
        "turn_index": [0, 1, 0, 1, 2],
        "score": [1.0, 1.0, 0.0, 0.0, 0.0],
        "anchor": ["s0", "s1", "s0", "s2", "s3"],
        "step_reward": [0.0, 1.0, 0.0, 0.0, 0.0],
    }
)


def advantages(computed, frame: pl.DataFrame, **settings: object) -> list[float]:
    """The advantages of ``frame`` under the settings given (the library below the command
    line: every stage, real Parquet files)."""
    advantage: list[float] = computed(frame, tokens=False, **settings)["advantage"].to_list()
    return advantage


def cli_advantages(run, tmp_path: Path, frame: pl.DataFrame, *options: str) -> list[float]:
    """The advantages ``advcli compute`` writes for ``frame`` with the options given."""
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    result = run("compute", source, "-o", output, "--no-tokens", "--force", "-q", *options)
    assert result.exit_code == 0, result.stderr
    return pl.read_parquet(output)["advantage"].to_list()


def worked_step_term() -> list[float]:
    """γ 0.9: returns 0.9, 1 and 0, 0, 0; the s0 group {0.9, 0} has mean 0.45 and std
    0.45·√2; s1, s2, s3 are groups of one (0)."""
    half = 0.45 / (0.45 * math.sqrt(2) + EPS)
    return [half, 0.0, -half, 0.0, 0.0]


def test_worked_case_verl_agent_upstream(computed):
    """Every row in the episode statistics: scores 1, 1, 0, 0, 0 have mean 0.4 and std √0.3."""
    got = advantages(computed, WORKED, recipe="verl-agent", gigpo_norm="mean_std", gamma=0.9)
    std = math.sqrt(0.3)
    episode = [0.6 / (std + EPS)] * 2 + [-0.4 / (std + EPS)] * 3
    expected = [e + s for e, s in zip(episode, worked_step_term(), strict=True)]
    assert got == pytest.approx(expected, abs=1e-6)
    assert got == pytest.approx([1.8025, 1.0954, -1.4374, -0.7303, -0.7303], abs=1e-4)


@pytest.mark.parametrize("recipe", ["verl-agent-trajectory", "trinity"])
def test_worked_case_each_trajectory_counted_once(recipe, run, tmp_path):
    """Scores 1 and 0 (Trinity: the step rewards' sums, the same) have mean 0.5 and std √0.5."""
    got = cli_advantages(
        run, tmp_path, WORKED, "--recipe", recipe, "--gigpo-norm", "mean_std", "--gamma", "0.9"
    )
    std = math.sqrt(0.5)
    episode = [0.5 / (std + EPS)] * 2 + [-0.5 / (std + EPS)] * 3
    expected = [e + s for e, s in zip(episode, worked_step_term(), strict=True)]
    assert got == pytest.approx(expected, abs=1e-6)
    assert got == pytest.approx([1.4142, 0.7071, -1.4142, -0.7071, -0.7071], abs=1e-4)


def test_mean_norm_and_step_weight(computed):
    """--gigpo-norm mean divides by 1 + ε; ω scales the step term only."""
    got = advantages(
        computed, WORKED, estimator="gigpo", level="trajectory", gamma=0.9, step_weight=2.0
    )
    episode = [0.5 / (1 + EPS)] * 2 + [-0.5 / (1 + EPS)] * 3
    step = [0.45 / (1 + EPS), 0.0, -0.45 / (1 + EPS), 0.0, 0.0]
    assert got == pytest.approx([e + 2 * s for e, s in zip(episode, step, strict=True)], abs=1e-6)


def test_verl_agent_mean_norm_subtracts_only(computed):
    """verl-agent's mean_norm is x − μ: its recipe sets ε 0 under mean (γ 1: returns 1, 1 and 0,
    0, 0; s0 {1, 0} has mean 0.5)."""
    got = advantages(computed, WORKED, recipe="verl-agent")
    episode = [0.6, 0.6, -0.4, -0.4, -0.4]
    step = [0.5, 0.0, -0.5, 0.0, 0.0]
    assert got == pytest.approx([e + s for e, s in zip(episode, step, strict=True)], abs=1e-7)


def test_rows_out_of_turn_order_follow_the_turn_column(computed):
    """The same rows shuffled give each row the same advantage: the returns follow turn_index."""
    shuffled = WORKED.with_row_index("original")[[4, 1, 3, 0, 2]]
    got = advantages(computed, shuffled.drop("original"), recipe="trinity", gamma=0.9)
    unshuffled = advantages(computed, WORKED, recipe="trinity", gamma=0.9)
    assert got == [unshuffled[i] for i in shuffled["original"]]


def test_without_a_turn_column_the_returns_run_in_row_order_and_say_so(tmp_path):
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    WORKED.drop("turn_index").write_parquet(source)
    config = AdvantageConfig(estimator=Estimator.GIGPO)
    summary = compute([str(source)], output, config, tokens=False)
    why = summary.columns.reading()["roles"]["step_reward"]["why"]
    assert why.endswith("run over each trajectory's rows in row order (no turn column)")
    WORKED.write_parquet(tmp_path / "turns.parquet")
    with_turns = compute(
        [str(tmp_path / "turns.parquet")], tmp_path / "t.parquet", config, tokens=False
    )
    assert with_turns.columns.reading()["roles"]["step_reward"]["why"].endswith(
        "in the order of 'turn_index'"
    )
    # Row order is the turn order here, so the numbers are the worked case's (γ 1, mean norm).
    got = pl.read_parquet(output)["advantage"].to_list()
    expected = [1.0, 0.5, -1.0, -0.5, -0.5]
    assert got == pytest.approx([value / (1 + EPS) for value in expected], abs=1e-7)


def recurrence(rewards: list[float], gamma: float) -> list[float]:
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9, 0.95, 0.999, 1.0])
def test_step_returns_match_the_recurrence(gamma):
    """Trajectories of 1 to 3000 steps, rows shuffled: within 1e-9 of R_t = r_t + γ R_{t+1},
    and bit for bit at γ 0 and 1."""
    rng = np.random.default_rng(7)
    lengths = [1, 2, 3, 17, 300, 3000]
    rows = [(t, k, float(rng.normal())) for t, n in enumerate(lengths) for k in range(n)]
    shuffle = rng.permutation(len(rows))
    projection = pl.DataFrame(
        {
            ROW: np.arange(len(rows)),
            GROUP: [0] * len(rows),
            TRAJECTORY: [rows[i][0] for i in shuffle],
            TURN: [rows[i][1] for i in shuffle],
            STEP_REWARD: [rows[i][2] for i in shuffle],
            "score": [0.0] * len(rows),
            "tokens": [1] * len(rows),
        }
    )
    got = step_returns(projection, index_trajectories(projection), gamma)
    expected = {}
    for t in range(len(lengths)):
        rewards = [r for (traj, _, r) in rows if traj == t]
        for k, value in enumerate(recurrence(rewards, gamma)):
            expected[(t, k)] = value
    want = np.array([expected[(rows[i][0], rows[i][1])] for i in shuffle])
    if gamma in (0.0, 1.0):
        assert np.array_equal(got, want)
    else:
        assert np.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_a_long_trajectory_never_underflows():
    """γ 0.5 over 5000 steps with one reward at the end: γ^t alone underflows past t ≈ 1075,
    yet each R_t is 0.5^(4999 − t) (0 only where that is below the smallest float)."""
    n = 5000
    projection = pl.DataFrame(
        {
            ROW: np.arange(n),
            GROUP: [0] * n,
            TRAJECTORY: [0] * n,
            TURN: np.arange(n),
            STEP_REWARD: [0.0] * (n - 1) + [1.0],
            "score": [0.0] * n,
            "tokens": [1] * n,
        }
    )
    got = step_returns(projection, index_trajectories(projection), 0.5)
    assert got[-1] == 1.0 and got[-2] == 0.5 and got[-1001] == 0.5**1000
    assert got[0] == 0.5**4999


TWO_GROUPS = pl.DataFrame(
    {
        "data_id": [0, 0, 1, 1],
        "rollout_id": [0, 1, 0, 1],
        "score": [0.0, 0.0, 0.0, 0.0],
        "anchor": ["s", "s", "s", "t"],
        "step_return": [1.0, 3.0, 5.0, 0.0],
    }
)


def test_anchor_scope_group_and_batch(computed):
    """Scores all 0: the episode term is 0 and the advantage is the step term (mean norm).
    Within groups: {1, 3} (mean 2) and two groups of one; batch-wide: {1, 3, 5} (mean 3)."""
    by_group = advantages(computed, TWO_GROUPS, estimator="gigpo")
    assert by_group == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 0.0, 0.0], abs=1e-7)
    batch = advantages(computed, TWO_GROUPS, estimator="gigpo", anchor_scope="batch")
    assert batch == pytest.approx([-2 / (1 + EPS), 0.0, 2 / (1 + EPS), 0.0], abs=1e-7)


def test_roll_gives_a_step_group_of_tiny_std_nothing(computed):
    """ROLL: a step group whose std is at most 1e-6 gets 0; the others (mean_std) do not."""
    frame = pl.DataFrame(
        {
            "data_id": [0, 0, 0, 0],
            "rollout_id": [0, 1, 2, 3],
            "score": [0.0] * 4,
            "anchor": ["a", "a", "b", "b"],
            "step_return": [1.0, 1.0 + 1e-7, 0.0, 2.0],
        }
    )
    got = advantages(computed, frame, recipe="roll")
    b = 1.0 / (math.sqrt(2) + EPS)
    assert got == pytest.approx([0.0, 0.0, -b, b], abs=1e-7)
    plain = advantages(computed, frame, estimator="gigpo", gigpo_norm="mean_std")
    assert plain[0] == pytest.approx(-0.5e-7 / (1e-7 / math.sqrt(2) + EPS), rel=1e-3)


def test_penalty_rows_are_centred_on_their_own_score(computed):
    """verl-agent-trajectory: first rows 1 and 0 give mean 0.5 and std √0.5; trajectory 0's
    penalized second row (0.9) is centred on its own score. Group 1's first rows tie (std 0):
    its penalized row (−0.1) is divided by 1 + ε, not by ε (verl-agent's −1e5)."""
    frame = pl.DataFrame(
        {
            "uid": ["g", "g", "g", "h", "h", "h"],
            "traj_uid": [0, 0, 1, 0, 0, 1],
            "turn_index": [0, 1, 0, 0, 1, 0],
            "token_level_rewards": [[1.0], [0.9], [0.0], [0.0], [-0.1], [0.0]],
            "anchor_obs": ["a", "b", "c", "d", "e", "f"],
            "rewards": [0.0] * 6,
        }
    )
    got = advantages(computed, frame, recipe="verl-agent-trajectory", gigpo_norm="mean_std")
    std = math.sqrt(0.5)
    expected = [0.5 / (std + EPS), 0.4 / (std + EPS), -0.5 / (std + EPS), 0.0, -0.1 / (1 + EPS)]
    assert got == pytest.approx([*expected, 0.0], abs=1e-7)


def test_list_and_struct_anchors_are_equal_when_their_values_are(computed):
    """A list anchor and a struct anchor: equal values are one step group."""
    for anchor in (
        pl.Series("anchor", [[1, 2], [1, 2], [2, 1]]),
        pl.Series("anchor", [{"x": 1, "y": "a"}, {"x": 1, "y": "a"}, {"x": 1, "y": "b"}]),
    ):
        frame = pl.DataFrame(
            {
                "data_id": [0, 0, 0],
                "rollout_id": [0, 1, 2],
                "score": [0.0, 0.0, 0.0],
                "step_return": [0.0, 2.0, 7.0],
            }
        ).with_columns(anchor)
        got = advantages(computed, frame, estimator="gigpo")
        assert got == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 0.0], abs=1e-7)


@pytest.mark.parametrize(
    ("anchor", "step"),
    [("anchor_obs", "rewards"), ("env_state_hash", "step_reward"), ("state_hash", "step_scores")],
)
def test_trainers_names_are_found_without_flags(anchor, step, computed):
    """verl-agent's batch keys (in its own dialect), Trinity-RFT's and ROLL's names."""
    frame = WORKED.rename({"anchor": anchor, "step_reward": step})
    if anchor == "anchor_obs":
        frame = frame.rename({"data_id": "uid", "rollout_id": "traj_uid"})
    got = advantages(computed, frame, recipe="trinity", gigpo_norm="mean_std")
    std = math.sqrt(0.5)
    half = 0.5 / (0.5 * math.sqrt(2) + EPS)  # γ 1: s0's returns are 1 and 0
    expected = [0.5 / (std + EPS) + half, 0.5 / (std + EPS), -0.5 / (std + EPS) - half]
    assert got[:3] == pytest.approx(expected, abs=1e-6)


def test_every_output_format(run, tmp_path, computed):
    """The per-token outputs carry gigpo's row advantage on every response token."""
    expected = advantages(computed, WORKED, estimator="gigpo")
    frame = WORKED.with_columns(response_mask=pl.Series([[1, 1], [1, 0], [1], [0, 1], [1]]))
    source = tmp_path / "masked.parquet"
    frame.write_parquet(source)
    for fmt in ("parquet", "arrow", "npz"):
        output = tmp_path / f"out.{fmt}"
        result = run("compute", source, "-o", output, "-q", "--force", "--estimator", "gigpo")
        assert result.exit_code == 0, result.stderr
        if fmt == "npz":
            with np.load(output) as arrays:
                tokens = arrays["advantages"]
                mask = arrays["response_mask"]
            assert tokens[mask == 1] == pytest.approx(
                [expected[r] for r in range(5) for _ in range(int(mask[r].sum()))], abs=1e-6
            )
            continue
        read = pl.read_parquet(output) if fmt == "parquet" else pl.read_ipc(output)
        assert read["advantage"].to_list() == pytest.approx(expected, abs=1e-7)
        assert read["advantages"][1].to_list() == pytest.approx([expected[1], 0.0], abs=1e-7)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--estimator", "gigpo", "--gamma", "1.5"), "--gamma must be in [0, 1], got 1.5"),
        (("--estimator", "gigpo", "--gamma", "-0.1"), "--gamma must be in [0, 1], got -0.1"),
        (("--estimator", "gigpo", "--step-weight", "-1"), "--step-weight must be a finite"),
        (("--gamma", "0.9",),
         "Error: Invalid value: --gamma applies to gigpo, not to grpo (--gamma applies to "
         "--reward-mode per-turn too)\n"),
        (("--recipe", "roll", "--estimator", "rloo"),
         "Error: Invalid value: --recipe roll applies to gigpo, not to rloo\n"),
        (("--estimator", "drgrpo", "--step-weight", "2", "--anchor-scope", "batch"),
         "Error: Invalid value: --step-weight and --anchor-scope apply to gigpo, not to "
         "drgrpo (--anchor-scope applies to --reward-mode per-turn too)\n"),
        (("--estimator", "gigpo", "--scale", "batch"), "its divisor is --gigpo-norm's"),
    ],
)  # fmt: skip
def test_usage_errors(options, message, run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "out.parquet", "--no-tokens", *options)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "out.parquet").exists()


def test_compare_reports_the_episode_terms_bias(run, tmp_path):
    """compare --estimator gigpo on a dump without an anchor reports the episode term's levels
    and says the step term was not measured (tests/advantages/test_step_credit.py has the rest)."""
    source = tmp_path / "in.parquet"
    WORKED.drop("anchor", "step_reward").write_parquet(source)
    result = run("compare", source, "--estimator", "gigpo", "--json", tmp_path / "r.json", "-q")
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["settings"]["estimator"] == "gigpo"
    assert summary["step_credit"]["measured"] is False


def test_the_docs_recipe_table_is_the_code_table():
    text = (ROOT / "docs" / "estimators.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (--level [^|]+?) \|", text, re.MULTILINE))
    assert rows == {recipe.value: settings.describe() for recipe, settings in RECIPES.items()}


def test_batch_scope_with_by_keeps_each_step_apart(run, tmp_path):
    """--by step --anchor-scope batch: step 1's s0 rows are their own step group, as if that
    step's rows were computed alone (returns 0.5 and 0.2: mean 0.35; scores the same)."""
    frame = pl.concat(
        [
            WORKED.with_columns(step=pl.lit(0, dtype=pl.Int64)),
            pl.DataFrame(
                {
                    "data_id": [1, 1],
                    "rollout_id": [1, 2],
                    "turn_index": [0, 0],
                    "score": [0.5, 0.2],
                    "anchor": ["s0", "s0"],
                    "step_reward": [0.5, 0.2],
                    "step": [1, 1],
                }
            ),
        ]
    )
    options = ("--estimator", "gigpo", "--anchor-scope", "batch", "--by", "step")
    got = cli_advantages(run, tmp_path, frame, *options)
    each = 2 * 0.15 / (1 + EPS)  # episode and step terms alike
    assert got[5:] == pytest.approx([each, -each], abs=1e-7)
    # Step 0's s0 group is the worked case's {1, 0} (γ 1), not merged with step 1's.
    assert got[0] == pytest.approx(2 * 0.5 / (1 + EPS), abs=1e-7)


@pytest.mark.parametrize(
    "scores", [[5.0, 5.0, 7.0, 7.0, 7.0], [0.0, 1.0, 0.0, 0.0, 0.0]], ids=["outcome", "per-step"]
)
def test_trinity_reads_the_step_rewards_whatever_the_score_column_holds(
    scores, run, tmp_path, computed
):
    """R(τ) is 1 and 0 (the worked case's step rewards), whether the score column holds other
    outcomes (5 and 7: the larger outcome on the trajectory that scores 0) or each row's own
    step reward. Episode: ±0.5/(1 + ε); step (γ 1, batch scope): s0's returns 1 and 0, ±0.5/(1 + ε),
    the rest 0."""
    frame = WORKED.with_columns(pl.Series("score", scores))
    half = 0.5 / (1 + EPS)
    got = advantages(computed, frame, recipe="trinity")
    assert got == pytest.approx([2 * half, half, -2 * half, -half, -half], abs=1e-7)
    frame.write_parquet(tmp_path / "in.parquet")
    result = run("compare", tmp_path / "in.parquet", "--recipe", "trinity", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("recipe", "rule"), [("trinity", "max"), ("verl-agent-trajectory", "last")]
)
def test_a_traj_score_the_recipe_leaves_unread_is_a_usage_error(recipe, rule, run, tmp_path):
    source = tmp_path / "in.parquet"
    WORKED.write_parquet(source)
    result = run("compute", source, "--recipe", recipe, "--traj-score", rule, "-o", "-")
    assert result.exit_code == 2
    assert f"--traj-score {rule} does not apply" in result.stderr


@pytest.mark.peers
@pytest.mark.parametrize(("fnorm", "gamma"), [("none", 1.0), ("std", 0.9), ("none", 0.0)])
def test_trinity_recipe_is_trinitys_own_function(fnorm, gamma, run, tmp_path):
    """Trinity-RFT 0.6.0's GiGPOAdvantageFn on a generated batch (tasks with runs of 1 to 4
    steps, anchors shared within and across tasks, one lone task) gives what --recipe trinity
    gives, to float32's precision (Trinity normalizes in float32)."""
    pytest.importorskip("torch")
    gigpo_module = pytest.importorskip("trinity.algorithm.advantage_fn.gigpo_advantage")
    experience = pytest.importorskip("trinity.common.experience")
    import torch

    rng = np.random.default_rng(3)
    rows = []
    for task in range(5):
        for run_id in range(1 if task == 4 else 3):
            for step in range(int(rng.integers(1, 5))):
                anchor = f"s{rng.integers(0, 4)}" if task < 3 else f"t{task}-{step}"
                reward = float(rng.choice([0.0, 0.0, 0.5, 1.0]))
                rows.append((task, run_id, step, anchor, reward))
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    exps = [
        experience.Experience(
            eid=experience.EID(task=task, run=run_id, step=step),
            tokens=torch.tensor([1, 2]),
            reward=0.0,
            info={"step_reward": reward, "env_state_hash": anchor},
        )
        for task, run_id, step, anchor, reward in rows
    ]
    function = gigpo_module.GiGPOAdvantageFn(gamma=gamma, fnorm=fnorm)
    out, metrics = function.process(exps)
    # The batch has step groups across tasks and a lone task: nothing here is trivially 0.
    assert metrics["gigpo/anchor_groups_size_gt1"] >= 3 and metrics["gigpo/mean_abs_A_S"] > 0.1
    theirs = {id(exp): float(exp.advantages) for exp in out}
    expected = [theirs[id(exp)] for exp in exps]

    frame = pl.DataFrame(
        {
            "data_id": [r[0] for r in rows],
            "rollout_id": [r[1] for r in rows],
            "turn_index": [r[2] for r in rows],
            "score": [0.0] * len(rows),
            "env_state_hash": [r[3] for r in rows],
            "step_reward": [r[4] for r in rows],
        }
    )
    norm = "mean_std" if fnorm == "std" else "mean"
    got = cli_advantages(
        run, tmp_path, frame, "--recipe", "trinity", "--gigpo-norm", norm, "--gamma", str(gamma)
    )
    assert got == pytest.approx(expected, abs=2e-5)


def test_categorical_anchors_hash_by_their_text_across_files(tmp_path):
    """Lists of Categorical in two files whose categories come in other orders: x is {0, 6}
    (mean 3) and y {2, 4} (mean 3) wherever they are."""
    anchor = pl.List(pl.Categorical)
    for name, trajectories, returns, anchors in (
        ("a", [0, 1], [0.0, 2.0], [["x"], ["y"]]),
        ("b", [2, 3], [4.0, 6.0], [["y"], ["x"]]),
    ):
        pl.DataFrame(
            {
                "data_id": [0, 0],
                "rollout_id": trajectories,
                "score": [0.0, 0.0],
                "step_return": returns,
                "anchor": pl.Series(anchors, dtype=anchor),
            }
        ).write_parquet(tmp_path / f"{name}.parquet")
    output = tmp_path / "out.parquet"
    inputs = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    compute(inputs, output, AdvantageConfig(estimator=Estimator.GIGPO), tokens=False)
    got = pl.read_parquet(output)["advantage"].to_list()
    assert got == pytest.approx([v / (1 + EPS) for v in (-3.0, -1.0, 1.0, 3.0)], abs=1e-6)

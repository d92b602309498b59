"""The std's denominator (issue 47): ``--std sample`` (n − 1, the default: torch.std, verl) or
``population`` (n: np.std, rLLM), in every std the rule divides by; ``--recipe rllm``.

Expected values are worked by hand below, or come from tests/reference.py (plain Python)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import dump_frame
from reference import reference_advantages

from advcli.errors import SettingsError
from advcli.settings.resolve import OPTION_WORDS, resolve_config

EPS = 1e-6

# Group A: trajectories of scores 1, 2, 3, 6 (a of 2 turns); group B: 0 and 1; group C alone.
ROWS = [
    ("A", "a", 0, 1.0, 2),
    ("A", "a", 1, 1.0, 2),
    ("A", "b", 0, 2.0, 2),
    ("A", "c", 0, 3.0, 2),
    ("A", "d", 0, 6.0, 2),
    ("B", "e", 0, 0.0, 2),
    ("B", "f", 0, 1.0, 2),
    ("C", "g", 0, 4.0, 2),
]
# A at trajectory level: mean 3, deviations -2, -1, 0, 3, squares summing to 14: the population
# std is sqrt(14 / 4), the sample std sqrt(14 / 3). B: mean 0.5, deviations -0.5, 0.5: population
# std 0.5, sample std sqrt(0.5). C, a group of one, keeps its score: 4 / (1 + eps).
A_POPULATION, A_SAMPLE = math.sqrt(3.5), math.sqrt(14 / 3)
B_POPULATION, B_SAMPLE = 0.5, math.sqrt(0.5)


def by_hand(a_std: float, b_std: float) -> list[float]:
    a = [d / (a_std + EPS) for d in (-2.0, -2.0, -1.0, 0.0, 3.0)]
    return [*a, -0.5 / (b_std + EPS), 0.5 / (b_std + EPS), 4.0 / (1.0 + EPS)]


def test_population_by_hand(computed) -> None:
    got = computed(ROWS, std="population")["advantage"].to_list()
    np.testing.assert_allclose(got, by_hand(A_POPULATION, B_POPULATION), rtol=1e-6)


def test_sample_stays_the_default(computed) -> None:
    default = computed(ROWS)["advantage"].to_list()
    np.testing.assert_allclose(default, by_hand(A_SAMPLE, B_SAMPLE), rtol=1e-6)
    assert computed(ROWS, std="sample")["advantage"].to_list() == default


def test_rllm_recipe_is_grpo_with_the_population_std(computed) -> None:
    """rLLM's calculate_grpo_advantages_per_group: np.std (ddof 0) + 1e-6, a group of one mean 0
    and std 1 (rllm/trainer/algorithms/rl_algo.py)."""
    config = resolve_config({"recipe": "rllm"})
    assert config.std_ddof == 0 and config.estimator.value == "grpo"
    assert config.describe() == "grpo (scale group, singleton raw, epsilon 1e-06, std population)"
    got = computed(ROWS, recipe="rllm")["advantage"].to_list()
    np.testing.assert_allclose(got, by_hand(A_POPULATION, B_POPULATION), rtol=1e-6)


def test_rllm_recipe_with_rloo_is_rloo() -> None:
    """rLLM's rloo divides by no std: the recipe sets none."""
    config = resolve_config({"recipe": "rllm", "estimator": "rloo"})
    assert config.std is None and config.estimator.value == "rloo"


@pytest.mark.parametrize("level", ["trajectory", "turn"])
@pytest.mark.parametrize("estimator", ["grpo", "grpo_passk"])
@pytest.mark.parametrize("scale", ["group", "batch"])
def test_population_against_the_reference(computed, level, estimator, scale) -> None:
    rng = np.random.default_rng(7)
    rows = []
    for group in range(30):
        for rollout in range(int(rng.integers(1, 6))):
            score = float(rng.choice([0.0, 0.25, 1.0, 3.0]))
            for turn in range(int(rng.integers(1, 4))):
                rows.append((f"g{group}", f"g{group}-r{rollout}", turn, score, 3))
    settings = {"level": level, "estimator": estimator, "scale": scale, "std": "population"}
    got = computed(rows, **settings)["advantage"].to_numpy()
    expected = reference_advantages(
        rows, level=level, estimator=estimator, scale=scale, std="population"
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    sample = reference_advantages(rows, level=level, estimator=estimator, scale=scale)
    assert not np.allclose(got, sample, rtol=1e-5, atol=1e-6)  # the setting is seen


REFUSED = [
    ({"estimator": "rloo", "std": "population"}, "--std applies where the rule divides by a std"),
    ({"estimator": "drgrpo", "std": "sample"}, "drgrpo divides by none"),
    ({"scale": "none", "std": "population"}, "grpo at scale none divides by none"),
    ({"estimator": "gigpo", "std": "population"}, "--std applies to gigpo under --gigpo-norm"),
    ({"recipe": "lightrft", "std": "population"}, "--std does not apply to --recipe lightrft"),
    ({"recipe": "rllm", "estimator": "gigpo"}, "--recipe rllm is an outcome-reward rule"),
    ({"recipe": "rllm", "reward_mode": "per-turn"}, "--recipe rllm is an outcome-reward rule"),
]


@pytest.mark.parametrize("given,said", REFUSED, ids=[str(given) for given, _ in REFUSED])
def test_refused_where_no_std_is_divided_by(given, said) -> None:
    with pytest.raises(SettingsError, match=said):
        resolve_config(given, OPTION_WORDS)


def test_gigpo_mean_std_takes_the_population_std(computed) -> None:
    """GiGPO under mean_std: the episode term's std and the step groups' std are population
    stds. One group of two trajectories (scores 1 and 0), each of two steps with step rewards 1, 0
    and 0, 0 (gamma 1), anchors s0 then s1 in both: step group s0 has returns 1 and 0 (population
    std 0.5), s1 returns 0 and 0 (a tie, 0)."""
    rows = [
        ("G", "a", 0, 1.0, 1),
        ("G", "a", 1, 1.0, 1),
        ("G", "b", 0, 0.0, 1),
        ("G", "b", 1, 0.0, 1),
    ]
    frame = dump_frame(rows).with_columns(
        pl.Series("anchor", ["s0", "s1", "s0", "s1"]),
        pl.Series("step_reward", [1.0, 0.0, 0.0, 0.0]),
    )
    got = computed(frame, estimator="gigpo", gigpo_norm="mean_std", gamma=1.0, std="population")[
        "advantage"
    ].to_list()
    # Episode term: scores 1, 0, mean 0.5, population std 0.5: ±0.5 / (0.5 + eps).
    # Step term: s0's returns 1, 0: ±0.5 / (0.5 + eps); s1 ties: 0. Step weight 1.
    episode, step = 0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(got, [episode + step, episode, -episode - step, -episode], rtol=1e-6)


def test_torch_takes_the_std_keyword() -> None:
    torch = pytest.importorskip("torch")
    from advcli.torch import compute_advantage

    n = len(ROWS)
    rewards = torch.tensor([[row[3]] for row in ROWS], dtype=torch.float64)
    groups, trajectories = [row[0] for row in ROWS], [row[1] for row in ROWS]
    advantages, _ = compute_advantage(
        rewards, torch.ones(n, 1), groups, trajectories, std="population"
    )
    expected = by_hand(A_POPULATION, B_POPULATION)
    np.testing.assert_allclose(advantages[:, 0].numpy(), expected, rtol=1e-6)
    with pytest.raises(SettingsError, match="applies where the rule divides by a std"):
        compute_advantage(
            rewards, torch.ones(n, 1), groups, trajectories, estimator="rloo", std="population"
        )


def test_verl_takes_the_std_keyword() -> None:
    torch = pytest.importorskip("torch")
    protocol = pytest.importorskip("verl.protocol")
    from advcli.verl import compute_advantage

    n = len(ROWS)
    batch = protocol.DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[row[3]] for row in ROWS]),
            "response_mask": torch.ones(n, 1),
        },
        non_tensors={
            "uid": np.array([row[0] for row in ROWS], dtype=object),
            "traj_uid": np.array([row[1] for row in ROWS], dtype=object),
        },
    )
    advantages = compute_advantage(batch, "grpo", std="population").batch["advantages"]
    np.testing.assert_allclose(
        advantages[:, 0].numpy(), by_hand(A_POPULATION, B_POPULATION), rtol=1e-6
    )


def test_a_string_std_is_the_setting() -> None:
    from advcli.settings.config import AdvantageConfig, StdDenominator

    assert AdvantageConfig(std="population").std is StdDenominator.POPULATION  # type: ignore[arg-type]


def test_rllm_recipe_counts_each_trajectory_once_over_a_saved_level(run, tmp_path) -> None:
    """rLLM scores each trajectory once in its group (rllm's transform groups a task's
    trajectories of one name): a typed --recipe rllm sets the level, over a saved one. Group:
    a (3 turns, 1) and b (1 turn, 0): population std 0.5, advantages ±0.5 / (0.5 + eps)."""
    rows = [("q", "a", 0, 1.0, 1), ("q", "a", 1, 1.0, 1), ("q", "a", 2, 1.0, 1)]
    rows.append(("q", "b", 0, 0.0, 1))
    dump = tmp_path / "dump.parquet"
    dump_frame(rows).write_parquet(dump)
    (tmp_path / "advcli.toml").write_text('level = "turn"\n')
    out = tmp_path / "out.parquet"
    result = run(
        "compute", dump, "-o", out, "--recipe", "rllm", "-q", "--config", tmp_path / "advcli.toml"
    )
    assert result.exit_code == 0, result.stderr
    got = pl.read_parquet(out)["advantage"].to_list()
    a = 0.5 / (0.5 + EPS)
    np.testing.assert_allclose(got, [a, a, a, -a], rtol=1e-6)


@pytest.mark.parametrize(
    "given,said",
    [
        ({"recipe": "rllm", "estimator": "reinforce_pp_baseline"}, "rule of grpo, drgrpo, rloo"),
        ({"recipe": "rllm", "estimator": "opo"}, "not of --estimator opo"),
        ({"recipe": "rllm", "scale": "batch"}, "has no rule of --scale batch"),
        ({"recipe": "prime-rl", "estimator": "grpo"}, "rule of drgrpo, not of --estimator grpo"),
    ],
)
def test_rllm_recipe_refuses_what_rllm_has_no_rule_for(given, said) -> None:
    with pytest.raises(SettingsError, match=said):
        resolve_config(given, OPTION_WORDS)


def test_rllm_recipe_with_drgrpo_divides_by_nothing() -> None:
    config = resolve_config({"recipe": "rllm", "estimator": "drgrpo"})
    assert config.std is None and config.std_in_use is None


def test_per_turn_reports_take_the_population_std(run, tmp_path) -> None:
    """compare under per-turn rewards computes every grouping's centring (drgrpo, rloo: no
    std) beside the estimator's: --std is the estimator's alone."""
    rows = [("q", "a", 0, 1.0, 1), ("q", "a", 1, 0.0, 1), ("q", "b", 0, 0.5, 1)]
    dump = tmp_path / "dump.parquet"
    dump_frame(rows).write_parquet(dump)
    result = run(
        "compare", dump, "--reward-mode", "per-turn", "--std", "population", "-q", "--json", "-"
    )
    assert result.exit_code == 0, result.stderr
    assert '"std": "population"' in result.stdout

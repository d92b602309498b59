"""compute --reward-mode per-turn: each row's reward-to-go G_t = Σ_{k≥t} γ^{k−t} r_k normalized
within its step group (turn, turn-padded, pooled, anchor) by grpo, drgrpo or rloo; the turn
order, the singleton and zero-std rules, every output format, and the bad inputs.

Every expected value is computed by hand in the docstrings from the formulas in
docs/estimators.md ("Per-turn rewards")."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from advcli.settings.config import ColumnNames

EPS = 1e-6
ROOT2 = math.sqrt(2)

# One group of two trajectories: A has one turn (reward 2), B three (rewards 1, 0, 3).
# γ = 1: G_A = [2], G_B = [4, 3, 3]. γ = 0.5: G_B = [1 + 0.5·1.5, 0 + 0.5·3, 3] = [1.75, 1.5, 3].
TWO = pl.DataFrame(
    {
        "data_id": [0, 0, 0, 0],
        "rollout_id": ["A", "B", "B", "B"],
        "turn_index": [0, 0, 1, 2],
        "score": [2.0, 1.0, 0.0, 3.0],
        "response_length": [2, 2, 2, 2],
    }
)


def per_turn_rows(computed, frame: pl.DataFrame, *options: str) -> pl.DataFrame:
    """The rows advcli computes for ``frame`` under per-turn rewards, with the options given as
    the command line spells them (``--step-groups turn``), each given to the library as the
    setting it names (``--anchor-col`` as the column it names): below the command line, every
    stage, real Parquet files."""
    settings: dict[str, object] = {
        option.removeprefix("--").replace("-", "_"): value
        for option, value in zip(options[::2], options[1::2], strict=True)
    }
    for number in ("gamma", "epsilon"):
        if number in settings:
            settings[number] = float(str(settings[number]))
    anchor = settings.pop("anchor_col", None)
    names = ColumnNames(anchor=None if anchor is None else str(anchor))
    rows: pl.DataFrame = computed(
        frame, names=names, tokens=False, reward_mode="per-turn", **settings
    )
    return rows


def advantages(computed, frame: pl.DataFrame, *options: str) -> list[float]:
    return per_turn_rows(computed, frame, *options)["advantage"].to_list()


def cli_advantages(run, tmp_path: Path, frame: pl.DataFrame, *options: str) -> list[float]:
    """The advantages ``advcli compute --reward-mode per-turn`` writes with the options given
    (for those that are no setting: ``--by``, the columns)."""
    source, output = tmp_path / "in.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    result = run(
        "compute", source, "-o", output, "--no-tokens", "--force", "-q",
        "--reward-mode", "per-turn", *options,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return pl.read_parquet(output)["advantage"].to_list()


# γ = 1, per grouping and estimator, rows A0, B0, B1, B2:
# - turn: position 0 {2, 4} has mean 3 and std √2; positions 1 and 2 are groups of one (raw:
#   grpo s / (1 + ε), drgrpo and rloo s). rloo: 2/(2−1)·(s − 3) = ∓2.
# - turn-padded: position 0 as turn; positions 1 and 2 are {3, virtual 0}: mean 1.5, std
#   1.5·√2, so grpo 1.5 / (1.5√2 + ε), drgrpo 1.5, rloo 2·1.5 = 3 (3 minus the other member, 0).
# - pooled: {2, 4, 3, 3} has mean 3 and std √(2/3); B1 and B2 are centred on exactly 0. rloo:
#   4/3·(s − 3).
GAMMA_ONE = {
    ("turn", "grpo"): [-1 / (ROOT2 + EPS), 1 / (ROOT2 + EPS), 3 / (1 + EPS), 3 / (1 + EPS)],
    ("turn", "drgrpo"): [-1.0, 1.0, 3.0, 3.0],
    ("turn", "rloo"): [-2.0, 2.0, 3.0, 3.0],
    ("turn-padded", "grpo"): [-1 / (ROOT2 + EPS), 1 / (ROOT2 + EPS)]
    + [1.5 / (1.5 * ROOT2 + EPS)] * 2,
    ("turn-padded", "drgrpo"): [-1.0, 1.0, 1.5, 1.5],
    ("turn-padded", "rloo"): [-2.0, 2.0, 3.0, 3.0],
    ("pooled", "grpo"): [-1 / (math.sqrt(2 / 3) + EPS), 1 / (math.sqrt(2 / 3) + EPS), 0.0, 0.0],
    ("pooled", "drgrpo"): [-1.0, 1.0, 0.0, 0.0],
    ("pooled", "rloo"): [-4 / 3, 4 / 3, 0.0, 0.0],
    # turn-rewards: the rewards at position 0, {2, 1}, have mean 1.5 and std √0.5 (z = ±0.5 /
    # (√0.5 + ε), drgrpo ±0.5, rloo ±1); B1 (0) and B2 (3) are alone (raw). Each advantage is
    # the sum of its trajectory's z from its turn on: B0 = z_B0 + 0 + z_B2.
    ("turn-rewards", "grpo"): [
        0.5 / (math.sqrt(0.5) + EPS),
        -0.5 / (math.sqrt(0.5) + EPS) + 3 / (1 + EPS),
        3 / (1 + EPS),
        3 / (1 + EPS),
    ],
    ("turn-rewards", "drgrpo"): [0.5, 2.5, 3.0, 3.0],
    ("turn-rewards", "rloo"): [1.0, 2.0, 3.0, 3.0],
}


@pytest.mark.parametrize(("groups", "estimator"), sorted(GAMMA_ONE))
def test_every_grouping_and_estimator_gamma_one(groups, estimator, computed):
    got = per_turn_rows(computed, TWO, "--step-groups", groups, "--estimator", estimator)
    assert got["score"].to_list() == [2.0, 4.0, 3.0, 3.0]
    assert got["advantage"].to_list() == pytest.approx(GAMMA_ONE[groups, estimator], abs=1e-6)


# γ = 0.5: G = [2, 1.75, 1.5, 3].
# - turn: position 0 {2, 1.75}: mean 1.875, std 0.125·√2; B1, B2 alone.
# - turn-padded: position 0 as turn; {1.5, 0}: mean 0.75, std 0.75·√2; {3, 0}: 1.5, 1.5·√2.
# - pooled: {2, 1.75, 1.5, 3}: mean 2.0625; squares of the deviations 0.00390625, 0.09765625,
#   0.31640625, 0.87890625 sum to 1.296875, so the std is √(1.296875 / 3).
POOLED_STD = math.sqrt(1.296875 / 3)
GAMMA_HALF = {
    ("turn", "grpo"): [
        0.125 / (0.125 * ROOT2 + EPS),
        -0.125 / (0.125 * ROOT2 + EPS),
        1.5 / (1 + EPS),
        3 / (1 + EPS),
    ],
    ("turn", "drgrpo"): [0.125, -0.125, 1.5, 3.0],
    ("turn", "rloo"): [0.25, -0.25, 1.5, 3.0],
    ("turn-padded", "grpo"): [
        0.125 / (0.125 * ROOT2 + EPS),
        -0.125 / (0.125 * ROOT2 + EPS),
        0.75 / (0.75 * ROOT2 + EPS),
        1.5 / (1.5 * ROOT2 + EPS),
    ],
    ("turn-padded", "drgrpo"): [0.125, -0.125, 0.75, 1.5],
    ("turn-padded", "rloo"): [0.25, -0.25, 1.5, 3.0],
    ("pooled", "grpo"): [(g - 2.0625) / (POOLED_STD + EPS) for g in (2.0, 1.75, 1.5, 3.0)],
    ("pooled", "drgrpo"): [g - 2.0625 for g in (2.0, 1.75, 1.5, 3.0)],
    ("pooled", "rloo"): [4 / 3 * (g - 2.0625) for g in (2.0, 1.75, 1.5, 3.0)],
    # turn-rewards: z as at γ = 1, summed with 0.5^(k−t): B2 = z_B2, B1 = 0 + 0.5·z_B2,
    # B0 = z_B0 + 0.5·B1.
    ("turn-rewards", "grpo"): [
        0.5 / (math.sqrt(0.5) + EPS),
        -0.5 / (math.sqrt(0.5) + EPS) + 0.25 * 3 / (1 + EPS),
        0.5 * 3 / (1 + EPS),
        3 / (1 + EPS),
    ],
    ("turn-rewards", "drgrpo"): [0.5, -0.5 + 0.75, 1.5, 3.0],
    ("turn-rewards", "rloo"): [1.0, -1.0 + 0.75, 1.5, 3.0],
}


@pytest.mark.parametrize(("groups", "estimator"), sorted(GAMMA_HALF))
def test_every_grouping_and_estimator_gamma_half(groups, estimator, computed):
    got = per_turn_rows(
        computed, TWO, "--step-groups", groups, "--estimator", estimator, "--gamma", "0.5"
    )
    assert got["score"].to_list() == [2.0, 1.75, 1.5, 3.0]
    assert got["advantage"].to_list() == pytest.approx(GAMMA_HALF[groups, estimator], abs=1e-6)


# Two groups: a has x (rewards 1, 2), y (0) and z (3, 1); b has p (1) and q (2, 5).
LIGHTRFT_DUMP = pl.DataFrame(
    {
        "data_id": ["a"] * 5 + ["b"] * 3,
        "rollout_id": ["x", "x", "y", "z", "z", "p", "q", "q"],
        "turn_index": [0, 1, 0, 0, 1, 0, 0, 1],
        "score": [1.0, 2.0, 0.0, 3.0, 1.0, 1.0, 2.0, 5.0],
    }
)


def test_lightrft_recipe(computed):
    """LightRFT's group_norm by hand: a's position 0 {1, 0, 3} has mean 4/3 and population
    variance ((1/3)² + (4/3)² + (5/3)²) / 3 = 42/27; its position 1 {2, 1} mean 1.5, variance
    0.25; b's position 0 {1, 2} mean 1.5, variance 0.25; q1 alone is its own mean (0). Each
    z = (r − mean) / √(variance + 1e-9), summed from the row's turn on."""
    a0 = math.sqrt(42 / 27 + 1e-9)
    half = math.sqrt(0.25 + 1e-9)
    z = {
        "x0": (1 - 4 / 3) / a0, "y0": (0 - 4 / 3) / a0, "z0": (3 - 4 / 3) / a0,
        "x1": 0.5 / half, "z1": -0.5 / half, "p0": -0.5 / half, "q0": 0.5 / half,
    }  # fmt: skip
    expected = [
        z["x0"] + z["x1"], z["x1"], z["y0"], z["z0"] + z["z1"], z["z1"], z["p0"], z["q0"], 0.0,
    ]  # fmt: skip
    got = per_turn_rows(computed, LIGHTRFT_DUMP, "--recipe", "lightrft")
    assert got["advantage"].to_list() == pytest.approx(expected, abs=1e-6)
    assert got["score"].to_list() == [3.0, 2.0, 0.0, 4.0, 1.0, 1.0, 7.0, 5.0]


def test_the_lightrft_recipe_is_the_reading(run, tmp_path):
    """The recipe implies --reward-mode per-turn and says what it computed."""
    source = tmp_path / "in.parquet"
    LIGHTRFT_DUMP.write_parquet(source)
    result = run(
        "compute", source, "-o", tmp_path / "out.parquet", "--no-tokens", "--recipe", "lightrft"
    )
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stderr.split())
    assert "step groups turn-rewards" in text
    assert "std sqrt(population variance + 1e-09)" in text


def test_anchor_groups(computed):
    """Anchors s0, s0, s1, s0 (γ = 1, G = [2, 4, 3, 3]): s0 {2, 4, 3} has mean 3 and std 1, s1 is
    alone (grpo: 3 / (1 + ε)); under --singleton zero s1 gets 0."""
    frame = TWO.with_columns(anchor=pl.Series(["s0", "s0", "s1", "s0"]))
    options = ("--step-groups", "anchor", "--anchor-col", "anchor")
    got = advantages(computed, frame, *options)
    assert got == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 3 / (1 + EPS), 0.0], abs=1e-6)
    got = advantages(computed, frame, *options, "--singleton", "zero")
    assert got == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS), 0.0, 0.0], abs=1e-6)


def test_anchor_scope_batch(computed):
    """Two groups, each with one row of anchor s (G 1 and 3): alone in their group, together
    batch-wide (mean 2, std √2): ∓1 / (√2 + ε)."""
    frame = pl.DataFrame(
        {"data_id": [0, 1], "rollout_id": ["a", "b"], "turn_index": [0, 0],
         "score": [1.0, 3.0], "response_length": [1, 1], "anchor": ["s", "s"]}
    )  # fmt: skip
    options = ("--step-groups", "anchor", "--anchor-col", "anchor")
    assert advantages(computed, frame, *options) == pytest.approx([1 / (1 + EPS), 3 / (1 + EPS)])
    got = advantages(computed, frame, *options, "--anchor-scope", "batch")
    assert got == pytest.approx([-1 / (ROOT2 + EPS), 1 / (ROOT2 + EPS)], abs=1e-6)


def test_singleton_zero(computed):
    """--singleton zero: turn grouping's lone B1 and B2 get 0 (γ = 1); turn-padded has no group
    of one here (every group has the 2 trajectories)."""
    got = advantages(computed, TWO, "--step-groups", "turn", "--singleton", "zero")
    assert got == pytest.approx([-1 / (ROOT2 + EPS), 1 / (ROOT2 + EPS), 0.0, 0.0], abs=1e-6)
    got = advantages(computed, TWO, "--step-groups", "turn-padded", "--singleton", "zero")
    assert got == pytest.approx(GAMMA_ONE["turn-padded", "grpo"], abs=1e-6)


def test_a_group_of_one_trajectory_is_a_singleton_when_padded(computed):
    """A group of one trajectory (rewards 1, 2; G = [3, 2]): every padded step group has n = 1,
    so under raw each row keeps G / (1 + ε), under zero 0."""
    frame = pl.DataFrame(
        {"data_id": [0, 0], "rollout_id": ["a", "a"], "turn_index": [0, 1],
         "score": [1.0, 2.0], "response_length": [1, 1]}
    )  # fmt: skip
    got = advantages(computed, frame, "--step-groups", "turn-padded")
    assert got == pytest.approx([3 / (1 + EPS), 2 / (1 + EPS)], abs=1e-6)
    got = advantages(computed, frame, "--step-groups", "turn-padded", "--singleton", "zero")
    assert got == [0.0, 0.0]


def test_zero_std_step_groups_get_zero(run, tmp_path, computed):
    """Trajectories a (rewards 1, 0) and b (reward 1): G_a = [1, 0], G_b = [1]. Position 0 {1, 1}
    is zero-std (0 exactly, also with ε = 0); padded position 1 {0, virtual 0} is zero-std too;
    unpadded, position 1 {0} is a group of one (0 / (1 + ε) = 0)."""
    frame = pl.DataFrame(
        {"data_id": [0, 0, 0], "rollout_id": ["a", "a", "b"], "turn_index": [0, 1, 0],
         "score": [1.0, 0.0, 1.0], "response_length": [1, 1, 1]}
    )  # fmt: skip
    source = tmp_path / "in.parquet"
    frame.write_parquet(source)
    for groups in ("turn", "turn-padded"):
        got = advantages(computed, frame, "--step-groups", groups, "--epsilon", "0")
        assert got == [0.0, 0.0, 0.0]
    result = run(
        "compute", source, "-o", tmp_path / "o.parquet", "--reward-mode", "per-turn",
        "--step-groups", "turn-padded",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert re.search(r"zero-std groups \(turn level\)\s*│\s*2\s", result.stderr)


def test_padded_index_with_one_real_row(computed):
    """Three trajectories, only c reaching position 1 (G_c1 = 6): the padded group {6, 0, 0} has
    mean 2 and std √((16 + 4 + 4) / 2) = √12, so grpo (6 − 2) / (√12 + ε), rloo 6 − 0 = 6,
    drgrpo 4; unpadded it is a lone row (grpo 6 / (1 + ε))."""
    frame = pl.DataFrame(
        {"data_id": [0, 0, 0, 0], "rollout_id": ["a", "b", "c", "c"],
         "turn_index": [0, 0, 0, 1], "score": [1.0, 2.0, 0.0, 6.0],
         "response_length": [1, 1, 1, 1]}
    )  # fmt: skip
    expected = {"grpo": 4 / (math.sqrt(12) + EPS), "rloo": 6.0, "drgrpo": 4.0}
    for estimator, value in expected.items():
        got = advantages(computed, frame, "--step-groups", "turn-padded", "--estimator", estimator)
        assert got[3] == pytest.approx(value, abs=1e-6)
    assert advantages(computed, frame, "--step-groups", "turn")[3] == pytest.approx(6 / (1 + EPS))


def test_turn_order_from_the_turn_column(computed):
    """B's rows stored as turns 2, 0, 1 with rewards 3, 1, 0: in turn order 1, 0, 3, so G_B is
    4 (turn 0), 3 (turn 1), 3 (turn 2) — written back in the stored order 3, 4, 3. Without the
    turn column the row order is the turn order: rewards 3, 1, 0 give G = 4, 1, 0."""
    frame = pl.DataFrame(
        {"data_id": [0, 0, 0], "rollout_id": ["B", "B", "B"], "turn_index": [2, 0, 1],
         "score": [3.0, 1.0, 0.0], "response_length": [1, 1, 1]}
    )  # fmt: skip
    assert per_turn_rows(computed, frame)["score"].to_list() == [3.0, 4.0, 3.0]
    no_turns = frame.drop("turn_index")
    assert per_turn_rows(computed, no_turns)["score"].to_list() == [4.0, 1.0, 0.0]


def test_the_reading_note_names_the_turn_order(run, tmp_path):
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "o.parquet", "--reward-mode", "per-turn")
    assert result.exit_code == 0, result.stderr
    assert "rewards-to-go follow the turn column 'turn_index'" in result.stderr
    TWO.drop("turn_index").write_parquet(source)
    result = run(
        "compute", source, "-o", tmp_path / "o.parquet", "--reward-mode", "per-turn", "--force"
    )
    assert result.exit_code == 0, result.stderr
    assert "rewards-to-go follow row order (no turn column)" in result.stderr


def test_every_output_format(run, tmp_path):
    """Each format carries the turn-padded grpo advantages (γ = 1) on every response token."""
    import torch

    expected = GAMMA_ONE["turn-padded", "grpo"]
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    for fmt in ("parquet", "arrow", "arrows", "npz", "pt"):
        output = tmp_path / f"out.{fmt}"
        result = run("compute", source, "-o", output, "-q", "--reward-mode", "per-turn")
        assert result.exit_code == 0, result.stderr
        if fmt in ("npz", "pt"):
            if fmt == "npz":
                with np.load(output) as arrays:
                    tokens, mask = arrays["advantages"], arrays["response_mask"]
            else:
                saved = torch.load(output)
                tokens, mask = saved["advantages"].numpy(), saved["response_mask"].numpy()
            assert tokens[mask == 1] == pytest.approx(np.repeat(expected, 2), abs=1e-6)
            continue
        if fmt == "parquet":
            read = pl.read_parquet(output)
        elif fmt == "arrow":
            read = pl.read_ipc(output)
        else:
            read = pl.read_ipc_stream(output)
        assert read["advantage"].to_list() == pytest.approx(expected, abs=1e-6)
        assert read["advantages"][3].to_list() == pytest.approx([expected[3]] * 2, abs=1e-6)


def test_outcome_mode_is_the_default(run, tmp_path):
    """Without --reward-mode, the scores are the trajectory's outcome, as before: grpo at
    trajectory level on these rows needs --traj-score (B's rows disagree)."""
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "o.parquet")
    assert result.exit_code == 1
    assert "--traj-score" in result.stderr


PER_TURN = ("--reward-mode", "per-turn")
ESTIMATORS = "takes --estimator grpo, drgrpo, rloo, not"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ((*PER_TURN, "--gamma", "1.5"), "--gamma must be in [0, 1], got 1.5"),
        ((*PER_TURN, "--gamma", "-0.5"), "--gamma must be in [0, 1], got -0.5"),
        ((*PER_TURN, "--estimator", "opo"), f"{ESTIMATORS} opo"),
        ((*PER_TURN, "--estimator", "gigpo"), f"{ESTIMATORS} gigpo"),
        ((*PER_TURN, "--level", "trajectory"), "--level does not apply under --reward-mode"),
        ((*PER_TURN, "--scale", "batch"), "each step group's std only"),
        ((*PER_TURN, "--traj-score", "sum"), "--traj-score does not apply"),
        ((*PER_TURN, "--step-weight", "1"),
         "Error: Invalid value: --step-weight applies to gigpo, not to --reward-mode per-turn"),
        ((*PER_TURN, "--anchor-scope", "batch"), "--anchor-scope applies to --step-groups"),
        (("--step-groups", "pooled"), "--step-groups applies to --reward-mode per-turn"),
        (("--recipe", "lightrft", "--reward-mode", "outcome"),
         "--recipe lightrft implies --reward-mode per-turn, not --reward-mode outcome"),
        (("--recipe", "lightrft", "--step-groups", "pooled"), "not pooled"),
        (("--recipe", "lightrft", "--estimator", "gigpo"), f"{ESTIMATORS} gigpo"),
        ((*PER_TURN, "--recipe", "roll"),
         "Error: Invalid value: --recipe roll applies to gigpo, not to --reward-mode per-turn"),
        (("--recipe", "lightrft", "--estimator", "gigpo", "--reward-mode", "outcome"),
         "implies --reward-mode per-turn"),
    ],
)  # fmt: skip
def test_usage_errors(options, message, run, tmp_path):
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    result = run("compute", source, "-o", tmp_path / "out.parquet", *options)
    assert result.exit_code == 2
    assert message in result.stderr.replace("\n", " ")
    assert not (tmp_path / "out.parquet").exists()


def test_compare_by_refuses_per_turn(run, tmp_path):
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    result = run("compare", source, "--reward-mode", "per-turn", "--by", "file")
    assert result.exit_code == 2
    assert "compare --by does not take --reward-mode per-turn" in result.stderr.replace("\n", " ")


def test_anchor_grouping_needs_an_anchor(run, tmp_path):
    source = tmp_path / "in.parquet"
    TWO.write_parquet(source)
    result = run(
        "compute", source, "-o", tmp_path / "o.parquet", "--reward-mode", "per-turn",
        "--step-groups", "anchor",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "--step-groups anchor needs each row's anchor state" in result.stderr


def test_each_by_step_is_its_own_batch(run, tmp_path):
    """Step 0 holds TWO (drgrpo turn-padded, γ = 1: −1, 1, 1.5, 1.5); step 1 repeats the group
    and trajectory ids with one turn each, rewards 1 and 3: mean 2, so −1 and 1. Under anchor
    grouping on the turn index, step 0's anchor 0 is {2, 4} (∓1) and anchors 1 and 2 are lone
    rows keeping 3."""
    frame = pl.concat(
        [
            TWO.with_columns(step=pl.lit(0)),
            pl.DataFrame(
                {"data_id": [0, 0], "rollout_id": ["A", "B"], "turn_index": [0, 0],
                 "score": [1.0, 3.0], "response_length": [2, 2], "step": [1, 1]}
            ),
        ],
        how="vertical_relaxed",
    )  # fmt: skip
    options = ("--by", "step", "--estimator", "drgrpo")
    got = cli_advantages(run, tmp_path, frame, *options)
    assert got == pytest.approx([-1.0, 1.0, 1.5, 1.5, -1.0, 1.0])
    got = cli_advantages(
        run, tmp_path, frame, *options, "--step-groups", "anchor", "--anchor-col", "turn_index"
    )
    assert got == pytest.approx([-1.0, 1.0, 3.0, 3.0, -1.0, 1.0])


def _random_dump(seed: int) -> pl.DataFrame:
    """Six groups of 1-4 trajectories of 1-4 turns each, rewards drawn from a few values (ties
    and a zero-std step group happen), rows shuffled."""
    rng = np.random.default_rng(seed)
    rows = []
    for group in range(6):
        for rollout in range(int(rng.integers(1, 5))):
            for turn in range(int(rng.integers(1, 5))):
                reward = float(rng.choice([0.0, 1.0, 0.5, -0.2]))
                rows.append((group, f"{group}-{rollout}", turn, reward))
    order = rng.permutation(len(rows))
    shuffled = [rows[i] for i in order]
    return pl.DataFrame(
        shuffled, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    ).with_columns(pl.lit(2).alias("response_length"))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("grouping", ["turn", "turn-padded", "pooled", "turn-rewards"])
def test_every_grouping_is_the_plain_python_reference(seed, grouping, computed):
    """The engine against tests/per_turn_reference.py (written from the formulas, no advcli) for
    every estimator, γ and singleton rule, on shuffled dumps."""
    import per_turn_reference

    def reference(rows, grouping, estimator, gamma, singleton):
        if grouping == "turn-rewards":
            return per_turn_reference.per_index_sum_advantages(rows, estimator, gamma, singleton)
        return per_turn_reference.advantages(rows, grouping, estimator, gamma, singleton)

    frame = _random_dump(seed)
    rows = list(frame.select("data_id", "rollout_id", "turn_index", "score").iter_rows())
    for estimator in ("grpo", "drgrpo", "rloo"):
        for gamma in (1.0, 0.7):
            for singleton in ("raw", "zero"):
                got = advantages(
                    computed, frame, "--step-groups", grouping, "--estimator", estimator,
                    "--gamma", str(gamma), "--singleton", singleton,
                )  # fmt: skip
                expected = reference(rows, grouping, estimator, gamma, singleton)
                assert got == pytest.approx(expected, abs=1e-5), (estimator, gamma, singleton)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_lightrft_recipe_is_its_plain_python_reference(seed, computed):
    from per_turn_reference import lightrft_group_norm

    frame = _random_dump(seed)
    rows = list(frame.select("data_id", "rollout_id", "turn_index", "score").iter_rows())
    got = advantages(computed, frame, "--recipe", "lightrft")
    assert got == pytest.approx(lightrft_group_norm(rows), abs=1e-5)

"""Loss weights: compute --loss-weight on hand-computed values and against verl's own agg_loss,
and the report's loss-weight section by hand."""

from __future__ import annotations

import json
import warnings

import numpy as np
import polars as pl
import pytest

torch = pytest.importorskip("torch")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's imports warn (Ray's state API, no megatron)
    from verl.trainer.ppo.core_algos import agg_loss

# (group, trajectory, turn, score, tokens). a: 2 turns (2 + 4 tokens); b: 1 turn (3); c: 1 turn
# (1); d: 2 turns (2 + 0 tokens). 12 tokens, 6 rows, 5 with tokens, 4 trajectories.
ROWS = [
    ("G", "a", 0, 1.0, 2),
    ("G", "a", 1, 1.0, 4),
    ("G", "b", 0, 0.0, 3),
    ("H", "c", 0, 1.0, 1),
    ("H", "d", 0, 0.0, 2),
    ("H", "d", 1, 0.0, 0),
]

# Per-token weight of each row, by the formulas (README: "Loss weights").
EXPECTED = {
    "token-mean": [1 / 12] * 5 + [0.0],
    "token-sum": [1.0] * 5 + [0.0],
    "seq-mean-token-sum": [1 / 5] * 5 + [0.0],
    "seq-mean-token-mean": [1 / 10, 1 / 20, 1 / 15, 1 / 5, 1 / 10, 0.0],
    # H = 4.
    "seq-mean-token-sum-norm": [1 / 20] * 5 + [0.0],
    # 1 / (trajectory tokens × 6 rows): a 6 tokens, b 3, c 1, d 2.
    "per-rollout-mean": [1 / 36, 1 / 36, 1 / 18, 1 / 6, 1 / 12, 0.0],
}


def _dump(tmp_path, width: int | None = None):
    columns = {
        "data_id": [r[0] for r in ROWS],
        "rollout_id": [r[1] for r in ROWS],
        "turn_index": [r[2] for r in ROWS],
        "score": [r[3] for r in ROWS],
    }
    if width is None:
        columns["response_length"] = [r[4] for r in ROWS]
    else:
        mask = np.zeros((len(ROWS), width), dtype=np.int64)
        for i, row in enumerate(ROWS):
            mask[i, : row[4]] = 1
        columns["response_mask"] = mask
    path = tmp_path / "dump.parquet"
    pl.DataFrame(columns).write_parquet(path)
    return path


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_loss_weight_column_by_hand(mode, run, tmp_path):
    output = tmp_path / "out.parquet"
    options = ["--loss-scale-factor", "4"] if mode == "seq-mean-token-sum-norm" else []
    result = run("compute", _dump(tmp_path), "-o", output, "--loss-weight", mode, *options)
    assert result.exit_code == 0, result.output
    got = pl.read_parquet(output)["loss_weight"].to_list()
    # rtol 1e-7: seq-mean-token-mean divides by tokens + 1e-8, as verl does.
    np.testing.assert_allclose(got, EXPECTED[mode], rtol=1e-7)


@pytest.mark.peers
@pytest.mark.parametrize(
    "mode",
    [
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ],
)
def test_a_plain_sum_gives_verls_agg_loss(mode, run, tmp_path):
    """Σ loss_weight × per-token loss over the masked tokens equals verl's agg_loss of the same
    per-token losses (one data-parallel rank); H is the fixed-size mask's width by default."""
    width = 5
    output = tmp_path / "out.parquet"
    result = run("compute", _dump(tmp_path, width), "-o", output, "--loss-weight", mode)
    assert result.exit_code == 0, result.output
    out = pl.read_parquet(output)
    mask = torch.from_numpy(np.stack(out["response_mask"].to_numpy())).double()
    losses = torch.from_numpy(np.random.default_rng(3).normal(size=(len(ROWS), width)))
    weight = torch.from_numpy(out["loss_weight"].to_numpy(writable=True))
    ours = float((weight[:, None] * losses * mask).sum())
    verl = float(agg_loss(losses, mask, mode))
    assert ours == pytest.approx(verl, rel=1e-9)


def test_scale_factor_is_needed_for_a_list_mask(run, tmp_path):
    result = run(
        "compute",
        _dump(tmp_path),
        "-o",
        tmp_path / "o.parquet",
        "--loss-weight",
        "seq-mean-token-sum-norm",
    )
    assert result.exit_code == 2
    assert "--loss-scale-factor" in result.output


def test_report_loss_weights_by_hand(run, tmp_path):
    """drgrpo, trajectory level: G a +0.5, b -0.5; H c +0.5, d -0.5. Turn level: G rows (1, 1,
    0) mean 2/3: a +1/3, b -2/3; H rows (1, 0, 0) mean 1/3: c +2/3, d -1/3."""
    report = tmp_path / "r.json"
    result = run("compare", _dump(tmp_path), "--estimator", "drgrpo", "--json", report)
    assert result.exit_code == 0, result.output
    weights = json.loads(report.read_text())["loss_weights"]

    # token-mean: trajectory weights a 6/12, b 3/12, c 1/12, d 2/12; an equal share is 1/4.
    one, two = weights["token-mean"]["by_turns"]
    assert (one["turns"], one["trajectories"], two["turns"]) == (1, 2, 2)
    assert one["relative_weight"] == pytest.approx((1 + 1 / 3) / 2)  # b, c
    assert two["relative_weight"] == pytest.approx((2 + 2 / 3) / 2)  # a, d
    assert one["weight_share"] == pytest.approx(4 / 12)
    assert weights["token-mean"]["longest_vs_shortest"] == pytest.approx(2.0)
    # Mass Σ weight × advantage: trajectory level b 3/12·(−1/2) + c 1/12·(1/2) = −1/12; turn
    # level b 3/12·(−2/3) + c 1/12·(2/3) = −1/9.
    assert one["mass_trajectory"] == pytest.approx(-1 / 12)
    assert one["mass_turn"] == pytest.approx(-1 / 9)
    assert two["mass_trajectory"] == pytest.approx(1 / 4 - 1 / 12)
    assert two["mass_turn"] == pytest.approx(1 / 6 - 1 / 18)

    # seq-mean-token-mean: every row with tokens weighs 1/5: a 2/5, b, c, d 1/5 each.
    one, two = weights["seq-mean-token-mean"]["by_turns"]
    assert one["relative_weight"] == pytest.approx(4 / 5)
    assert two["relative_weight"] == pytest.approx((8 / 5 + 4 / 5) / 2)
    assert weights["seq-mean-token-mean"]["longest_vs_shortest"] == pytest.approx(1.5)

    # agent-lightning's per-rollout mean: every trajectory weighs the same.
    for entry in weights["per-rollout-mean"]["by_turns"]:
        assert entry["relative_weight"] == pytest.approx(1.0)
    assert weights["per-rollout-mean"]["longest_vs_shortest"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # Step 0: rows of 2 and 3 tokens (T = 5, B = N = 2); step 1: one row of 4 (T = B = N = 1).
        ("token-mean", [1 / 5, 1 / 5, 1 / 4]),
        ("seq-mean-token-sum", [1 / 2, 1 / 2, 1.0]),
        ("per-rollout-mean", [1 / (2 * 2), 1 / (3 * 2), 1 / (4 * 1)]),
    ],
)
def test_with_by_each_step_is_its_own_batch(mode, expected, run, write_dump, tmp_path):
    """compute --by weighs each step's rows over that step's batch, as it computes their
    advantages (the same group id in both files stays two groups)."""
    first = write_dump([(0, 0, 0, 1.0, 2), (0, 1, 0, 0.0, 3)], "step-0.parquet")
    second = write_dump([(0, 0, 0, 1.0, 4)], "step-1.parquet")
    out = tmp_path / "out.parquet"
    result = run(
        "compute", first, second, "-o", out, "--by", "file", "--loss-weight", mode, "-q"
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(out)["loss_weight"].to_list() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("longest", "said"),
    [(8, "an 8-turn trajectory"), (11, "an 11-turn trajectory"), (6, "a 6-turn trajectory")],
)
def test_the_verdict_names_the_turn_counts_with_their_article(longest, said, run, write_dump):
    # One group: a trajectory of `longest` turns (score 1) and one of 1 turn (score 0), one
    # token each: token-mean weighs the long one `longest` times the short one.
    rows = [("g", "long", turn, 1.0, 1) for turn in range(longest)] + [("g", "short", 0, 0.0, 1)]
    result = run("compare", write_dump(rows), "--json", "-", "-q")
    verdict = " ".join(json.loads(result.stdout)["verdict"].split())
    assert f"token-mean gives {said} {float(longest):.1f}× the weight of a 1-turn one" in verdict

"""advcli.torch.audit_advantages (issue 47): a batch's own advantages audited on tensors, in
the training step, as ``advcli audit`` audits a dump. The trainer's advantages are the plain
Python reference's (tests/reference.py) or a bug's formula written here; the expected metrics
are counted by hand."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from gigpo_reference import gigpo_recipe, step_returns
from gigpo_rows import agent_rows
from reference import reference_advantages

torch = pytest.importorskip("torch")

import advcli.torch  # noqa: E402
from advcli.verl import audit_advantages as audit_verl_batch  # noqa: E402

pytestmark = pytest.mark.torch

PREFIX = "advcli/audit/"
WIDTH = 4
# (group, trajectory, turn, score, tokens): trajectories of one to three turns, each row
# carrying its trajectory's score, as an agent loop's turns do.
ROWS = [
    ("p", "a", 0, 1.0, 2),
    ("p", "a", 1, 1.0, 3),
    ("p", "a", 2, 1.0, 1),
    ("p", "b", 0, 0.0, 4),
    ("p", "c", 0, 0.0, 2),
    ("p", "c", 1, 0.0, 2),
    ("p", "d", 0, 0.5, 3),
    ("q", "e", 0, 2.0, 1),
    ("q", "f", 0, -1.0, 2),
    ("q", "f", 1, -1.0, 2),
    ("q", "g", 0, 0.0, 3),
]


def batch(rows, found, dtype=torch.float32):
    """The tensors of ``rows``: each row's score on its first response token, a mask of its
    tokens, and the trainer's advantage ``found`` on each response token."""
    mask = torch.tensor([[1.0 if t < row[4] else 0.0 for t in range(WIDTH)] for row in rows])
    rewards = torch.zeros(len(rows), WIDTH)
    rewards[:, 0] = torch.tensor([row[3] for row in rows], dtype=torch.float64).float()
    advantages = (torch.tensor(found, dtype=torch.float64)[:, None] * mask).to(dtype)
    return {
        "advantages": advantages,
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": np.array([row[0] for row in rows], dtype=object),
        "traj_index": np.array([row[1] for row in rows], dtype=object),
    }


def findings(metrics) -> dict[str, float]:
    return {
        key.removeprefix(f"{PREFIX}findings/"): rows
        for key, rows in metrics.items()
        if "findings/" in key and rows
    }


@pytest.mark.parametrize(
    ("level", "estimator", "std"),
    [
        ("trajectory", "grpo", "sample"),
        ("trajectory", "grpo", "population"),
        ("trajectory", "rloo", "sample"),
        ("trajectory", "drgrpo", "sample"),
        ("turn", "grpo", "sample"),
    ],
)
def test_a_trainers_rule_is_found_with_no_bug(level, estimator, std) -> None:
    found = reference_advantages(ROWS, level=level, estimator=estimator, std=std)
    metrics = advcli.torch.audit_advantages(**batch(ROWS, found))
    assert metrics[f"{PREFIX}rule_matched"] == 1.0
    assert (metrics[f"{PREFIX}rows"], metrics[f"{PREFIX}rows_off"]) == (11.0, 0.0)
    # At turn level every row counts: a rule, reported as such, on the 7 rows of the three
    # trajectories of more than one turn.
    assert findings(metrics) == ({"turn-level-counting": 7.0} if level == "turn" else {})


def test_groups_normalized_as_one_batch() -> None:
    """slime #1414: six groups normalized as one batch: every row is a batch-as-one-group
    finding; the three rewards of 5.0 of group u0 are not 0."""
    groups = {
        "u0": [5.0, 5.0, 5.0],
        "u1": [0.0, 1.0, 0.0, 1.0, 1.0],
        "u2": [2.0, 0.0],
        "u3": [1.0, 0.0, 0.0, 4.0],
        "u4": [3.0, 1.0, 2.0, 0.0, 6.0, 2.0],
        "u5": [0.0, 4.0],
    }
    rows = [
        (group, f"{group}-{i}", 0, score, 2)
        for group, scores in groups.items()
        for i, score in enumerate(scores)
    ]
    scores = [row[3] for row in rows]
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
    metrics = advcli.torch.audit_advantages(
        **batch(rows, [(s - mean) / (std + 1e-6) for s in scores])
    )
    assert metrics[f"{PREFIX}rule_matched"] == 0.0
    assert findings(metrics) == {"batch-as-one-group": 22.0}
    assert metrics[f"{PREFIX}rows_off"] == 22.0


def test_advantages_held_in_bfloat16_are_low_precision() -> None:
    """OpenRLHF PR #1334's precision: the rule is still named, its rows a finding."""
    found = reference_advantages(ROWS, level="trajectory", estimator="grpo")
    metrics = advcli.torch.audit_advantages(**batch(ROWS, found, dtype=torch.bfloat16))
    assert metrics[f"{PREFIX}rule_matched"] == 0.0
    # No value here is one bfloat16 holds within float32's precision (checked below): every
    # row is the finding. Before, an epsilon read off the rounded values (3.3e-4) was named,
    # the median row's unit explained by it exactly.
    assert not any(
        float(torch.tensor(value).bfloat16().double()) == pytest.approx(value, rel=1e-5)
        for value in found
    )
    assert findings(metrics) == {"low-precision-advantages": 11.0}


def test_the_tensor_face_equals_the_batch_face() -> None:
    """The same batch as a mapping under verl's keys, through advcli.verl: the same metrics."""
    rows = [*ROWS, ("r", "h", 0, 3.0, 2)]
    found = [*reference_advantages(ROWS, level="turn", estimator="grpo"), 7.0]
    tensors = batch(rows, found)
    metrics = advcli.torch.audit_advantages(**tensors, expect="level=trajectory")
    mapping = {
        "advantages": tensors["advantages"],
        "token_level_rewards": tensors["token_level_rewards"],
        "response_mask": tensors["response_mask"],
        "uid": tensors["index"],
        "traj_uid": tensors["traj_index"],
    }
    assert audit_verl_batch(mapping, expect="level=trajectory") == metrics
    assert findings(metrics) == {
        "unexpected-rule": 11.0,
        "turn-level-counting": 7.0,
        "unexplained": 1.0,
    }


def test_each_row_a_trajectory_without_traj_index() -> None:
    rows = [("p", i, 0, score, 2) for i, score in enumerate([1.0, 0.0, 0.0, 1.0])]
    found = [(s - 0.5) / (math.sqrt(1 / 3) + 1e-6) for s in [1.0, 0.0, 0.0, 1.0]]
    tensors = batch(rows, found)
    del tensors["traj_index"]
    metrics = advcli.torch.audit_advantages(**tensors)
    assert (metrics[f"{PREFIX}rule_matched"], metrics[f"{PREFIX}rows_off"]) == (1.0, 0.0)


def test_bad_inputs_are_one_value_error_each() -> None:
    found = reference_advantages(ROWS, level="trajectory", estimator="grpo")
    good = batch(ROWS, found)
    with pytest.raises(
        ValueError, match="the batch's 'index' has 10 rows, 'token_level_rewards' 11"
    ):
        advcli.torch.audit_advantages(**{**good, "index": good["index"][:10]})
    with pytest.raises(ValueError, match=r"the batch's 'advantages' .* has 3 rows"):
        advcli.torch.audit_advantages(**{**good, "advantages": good["advantages"][:3]})
    broken = good["advantages"].clone()
    broken[4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"row 4: .*null, NaN or infinite value"):
        advcli.torch.audit_advantages(**{**good, "advantages": broken})
    with pytest.raises(ValueError, match=r"not a 0/1 mask: row 1 counts 1\.5 tokens"):
        advcli.torch.audit_advantages(**{**good, "response_mask": good["response_mask"] * 0.5})
    with pytest.raises(ValueError, match="--expect takes key=value pairs"):
        advcli.torch.audit_advantages(**good, expect="grpo")


@pytest.mark.process
def test_import_advcli_torch_does_not_load_polars() -> None:
    code = (
        "import sys, advcli.torch\n"
        "assert 'polars' not in sys.modules\n"
        "advcli.torch.audit_advantages\n"
        "assert 'polars' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("returns", [False, True])
def test_gigpo_with_anchors_and_step_rewards(returns) -> None:
    """verl-agent's GiGPO (the plain-Python reference's, mean_std_norm, γ 0.95) on tensors:
    with the anchors and the step rewards (or the returns, discounted already) its rule
    explains every row."""
    rows = agent_rows(3, n=4)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.95)
    tensors = batch([(r.group, r.trajectory, r.turn, r.score, 2) for r in rows], found)
    steps = (
        {"step_returns": torch.tensor(step_returns(rows, 0.95))}
        if returns
        else {"step_rewards": np.array([r.step_reward for r in rows])}
    )
    metrics = advcli.torch.audit_advantages(
        **tensors, anchor_index=np.array([r.anchor for r in rows]), **steps
    )
    assert (metrics[f"{PREFIX}rule_matched"], metrics[f"{PREFIX}rows_off"]) == (1.0, 0.0)
    # Without the anchors no GiGPO rule is tried: the step term's rows are unexplained.
    assert advcli.torch.audit_advantages(**tensors)[f"{PREFIX}rows_off"] > 0
    anchors = np.array([r.anchor for r in rows])
    with pytest.raises(ValueError, match=r"no step reward column .* named with step_returns="):
        advcli.torch.audit_advantages(**tensors, anchor_index=anchors)
    with pytest.raises(ValueError, match=f"'anchor_index' has {len(rows) - 1} rows"):
        advcli.torch.audit_advantages(**tensors, anchor_index=anchors[1:], **steps)

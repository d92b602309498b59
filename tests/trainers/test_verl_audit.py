"""advcli.verl.audit_advantages in verl 0.9.1's training step (issue 47): after verl's own
compute_advantage, the batch's advantages audited as ``advcli audit`` audits a dump, the step's
metrics returned and merged into ``meta_info["metrics"]``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from test_verl_call import verl_compute_advantage, verl_step_batch  # noqa: E402

from advcli.verl import audit_advantages  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.config import AlgoConfig

pytestmark = pytest.mark.peers

PREFIX = "advcli/audit/"


def with_verls_advantages(batch, name: str, norm: bool = True, uid=None):
    """``batch`` with the advantages verl's own compute_advantage gives it (over ``uid`` as the
    groups, where given: a bug's groups)."""
    given = batch.select_idxs(np.arange(len(batch)))
    if uid is not None:
        given.non_tensor_batch["uid"] = uid
    batch.batch["advantages"] = verl_compute_advantage(
        given,
        adv_estimator=name,
        num_repeat=4,
        norm_adv_by_std_in_grpo=norm,
        config=AlgoConfig(adv_estimator=name, norm_adv_by_std_in_grpo=norm),
    )
    return batch


@pytest.mark.parametrize(
    ("name", "norm", "turns"),
    [
        ("grpo", True, 4),
        ("grpo", False, 4),
        ("rloo", True, 4),
        ("grpo_passk", True, 1),
        ("reinforce_plus_plus_baseline", True, 4),
    ],
)
def test_verls_own_advantages_follow_a_rule(name, norm, turns):
    batch = with_verls_advantages(
        verl_step_batch(max_turns=turns, distinct=name == "grpo_passk"), name, norm
    )
    metrics = audit_advantages(batch)
    assert metrics[f"{PREFIX}rule_matched"] == 1.0
    assert (metrics[f"{PREFIX}rows"], metrics[f"{PREFIX}rows_off"]) == (len(batch), 0.0)
    # verl counts every row: with trajectories of several turns, that is what the audit says.
    kinds = {
        key.removeprefix(f"{PREFIX}findings/")
        for key, rows in metrics.items()
        if rows and "findings/" in key
    }
    assert kinds == ({"turn-level-counting"} if turns > 1 else set())
    assert batch.meta_info["metrics"] == metrics


def test_two_prompts_taken_for_one_group():
    """verl's GRPO over groups two prompts were merged into (NeMo-RL PR #3882's bug): the rows
    of the merged prompts are a merged-groups finding."""
    batch = verl_step_batch(max_turns=1, seed=5)
    uid = batch.non_tensor_batch["uid"].copy()
    prompts = list(dict.fromkeys(uid))
    merged = np.where(uid == prompts[1], prompts[0], uid)
    metrics = audit_advantages(with_verls_advantages(batch, "grpo", uid=merged))
    assert metrics[f"{PREFIX}rule_matched"] == 0.0
    assert metrics[f"{PREFIX}findings/merged-groups"] == 8.0
    assert metrics[f"{PREFIX}rows_off"] == 8.0


def test_expect_and_errors():
    batch = with_verls_advantages(verl_step_batch(), "grpo")
    metrics = audit_advantages(batch, expect="level=trajectory", metrics_prefix="a/")
    assert metrics["a/findings/unexpected-rule"] > 0
    with pytest.raises(ValueError, match="--expect takes key=value pairs"):
        audit_advantages(batch, expect="trajectory")
    del batch.batch["advantages"]
    with pytest.raises(ValueError, match="the batch has no 'advantages'"):
        audit_advantages(batch)
    batch.batch["advantages"] = torch.zeros(len(batch), 6)
    batch.batch["advantages"][2, 0] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"the batch's row 2: .*null, NaN or infinite value \(or one beyond ±1e38\) on a "
        "response token",
    ):
        audit_advantages(batch)
    with pytest.raises(TypeError, match="audit_advantages takes a verl DataProto or a mapping"):
        audit_advantages([1, 2])


def test_advantages_of_another_row_count_are_one_error():
    batch = with_verls_advantages(verl_step_batch(), "grpo")
    entries = {**batch.batch, **batch.non_tensor_batch}
    entries["advantages"] = entries["advantages"][:4]
    with pytest.raises(
        ValueError, match=r"the batch's 'advantages' .* has 4 rows, 'response_mask'"
    ):
        audit_advantages(entries)

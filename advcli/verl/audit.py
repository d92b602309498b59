"""A batch's own advantages audited in the training step: after the trainer's advantage call,
``advcli audit``'s rule and findings on the batch, as the step's metrics, so that a run logs its
own advantage health."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from advcli.errors import AdvcliError
from advcli.read.batch import batch_entries
from advcli.report.audit import audit_metrics
from advcli.torch.audit import audit_batch, believed_rule
from advcli.verl.advantage import key_roles


def audit_advantages(  # noqa: PLR0913
    data: Any,
    *,
    advantage_key: str = "advantages",
    group_key: str | None = None,
    trajectory_key: str | None = None,
    turn_key: str | None = None,
    reward_key: str | None = None,
    mask_key: str | None = None,
    expect: str | None = None,
    metrics_prefix: str = "advcli/audit/",
) -> dict[str, Any]:
    """Audit the advantages the trainer set on ``data`` (a verl ``DataProto`` after its
    ``compute_advantage``, or a mapping of tensors and arrays): the rule they follow and what no
    rule explains, as ``advcli audit`` finds them on a dump.

    Returns the step's metrics (:func:`advcli.report.audit.audit_metrics`, each under
    ``metrics_prefix``: ``rule_matched``, ``rows``, ``rows_off``, ``findings/KIND``), also
    merged into ``data.meta_info["metrics"]`` for a ``DataProto``. The keys are found as
    :func:`advcli.verl.compute_advantage` finds them; ``advantage_key`` names the advantages,
    ``(bs, response_length)`` beside the mask, read over each row's response tokens.
    ``expect``: the rule believed run, as ``advcli audit --expect`` takes it
    (``"estimator=grpo,level=trajectory"``), a mismatch being a finding. A batch the audit
    cannot read raises ``ValueError`` and leaves it as it was.
    """
    if not isinstance(data, Mapping) and not hasattr(data, "meta_info"):
        raise TypeError(
            "audit_advantages takes a verl DataProto or a mapping of tensors and arrays, not "
            f"{type(data).__name__}"
        )
    believed = believed_rule(expect)
    entries = batch_entries(data)
    roles = key_roles(
        entries, group_key, trajectory_key, turn_key, reward_key, mask_key, steps=None
    )
    try:
        report = audit_batch(entries, roles, advantage_key, "advantage_key=", believed)
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    metrics = audit_metrics(report, metrics_prefix)
    if not isinstance(data, Mapping):
        data.meta_info["metrics"] = {**(data.meta_info.get("metrics") or {}), **metrics}
    return metrics

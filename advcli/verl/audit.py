"""A batch's own advantages audited in the training step: after the trainer's advantage call,
``advcli audit``'s rule and findings on the batch, as the step's metrics, so that a run logs its
own advantage health."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from advcli import __version__
from advcli.advantages.fit import fit_rule
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import index_trajectories
from advcli.errors import AdvcliError, SettingsError
from advcli.read.batch import as_numpy, batch_entries, batch_projection, batch_trainer_advantages
from advcli.report.audit import audit_metrics, audit_report
from advcli.settings.resolve import expected_rule
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
    try:
        believed = expected_rule(expect) if expect is not None else None
    except SettingsError as error:
        raise ValueError(str(error)) from None
    entries = batch_entries(data)
    roles = key_roles(
        entries, group_key, trajectory_key, turn_key, reward_key, mask_key, steps=False
    )
    try:
        report = _audit(entries, roles, advantage_key, believed)
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    metrics = audit_metrics(report, metrics_prefix)
    if not isinstance(data, Mapping):
        data.meta_info["metrics"] = {**(data.meta_info.get("metrics") or {}), **metrics}
    return metrics


def _audit(entries: Mapping[str, Any], roles: Any, key: str, believed: Any) -> dict[str, Any]:
    """The audit report of the batch's advantages (``key``)."""
    assert roles.reward is not None
    # Each row's score in float64, however the rewards are held (bfloat16 widened exactly).
    scores = as_numpy(entries[roles.reward]).astype(np.float64).sum(axis=-1)
    roles, trainer = batch_trainer_advantages(entries, roles, key, "advantage_key=")
    projection = pl.concat([batch_projection(entries, roles, scores), trainer], how="horizontal")
    trajectories = index_trajectories(projection)
    naming = Naming(roles.group or "group", roles.trajectory or "row")
    expected = believed.config if believed is not None else None
    fit = fit_rule(projection, naming, trajectories, expected=expected)
    return audit_report(
        fit,
        projection,
        trajectories,
        reading=roles.reading(),
        inputs=["the batch"],
        version=__version__,
        expected=believed,
    )

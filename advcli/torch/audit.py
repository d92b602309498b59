"""A batch's own advantages audited in the training step: ``advcli audit``'s rule and findings
on one batch, for :func:`advcli.torch.audit_advantages` (tensors under verl's argument names)
and :func:`advcli.verl.audit_advantages` (a ``DataProto`` or a mapping, its keys found).

Unlike the rest of :mod:`advcli.torch`, the audit reads the batch with Polars, as the command
line reads a dump: ``import advcli.torch`` loads this module only when its face is first used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl
import torch

from advcli import __version__
from advcli.advantages.fit import fit_rule
from advcli.advantages.unit_scores import Naming
from advcli.advantages.units import index_trajectories
from advcli.errors import AdvcliError, SettingsError
from advcli.read.batch import (
    as_numpy,
    batch_projection,
    batch_roles,
    batch_trainer_advantages,
    step_columns,
)
from advcli.read.columns import ColumnRoles
from advcli.read.picker import Options
from advcli.report.audit import audit_metrics, audit_report
from advcli.settings.resolve import ExpectedRule, expected_rule
from advcli.torch.ids import Ids

# The batch the tensors make holds each under its argument's name, and the errors name the
# arguments (``traj_index=``), as advcli.torch's computing does.
_OPTIONS = Options(
    {
        "group": "index",
        "trajectory": "traj_index",
        "turn": "turn_index",
        "reward": "token_level_rewards",
        "mask": "response_mask",
        "anchor": "anchor_index",
        "step_reward": "step_rewards",
        "step_return": "step_returns",
    },
    keywords=True,
    by=None,
    holder="batch",
    rows_without_trajectory=True,
)


def audit_advantages(  # noqa: PLR0913
    advantages: torch.Tensor,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Ids,
    traj_index: Ids | None = None,
    *,
    turn_index: Ids | None = None,
    anchor_index: Ids | None = None,
    step_rewards: Any = None,
    step_returns: Any = None,
    expect: str | None = None,
    metrics_prefix: str = "advcli/audit/",
) -> dict[str, float]:
    """Audit the advantages a trainer computed on one batch: the rule of advcli's table they
    follow and the rows no rule explains, classed as ``advcli audit`` classes a dump's.

    ``advantages``, ``token_level_rewards`` and ``response_mask`` are ``(bs, response_length)``
    (the advantages are read over each row's response tokens: a row whose tokens disagree is a
    per-token estimator's, left out of the fit); ``index``, ``traj_index`` and ``turn_index``
    are ``bs`` ids as :func:`advcli.torch.compute_advantage` takes them (``traj_index`` None:
    each row is a trajectory). ``anchor_index`` with ``step_rewards`` or ``step_returns``
    (``bs`` each, as :func:`advcli.torch.compute_advantage` takes them): GiGPO's recipes are
    candidates too. ``expect``: the rule believed run, as ``advcli audit --expect`` takes it
    (``"estimator=grpo,level=trajectory"``), a mismatch being a finding.

    Returns the step's metrics (:func:`advcli.report.audit.audit_metrics`, each under
    ``metrics_prefix``): ``rule_matched`` (1 where a rule explains every row), ``rows``,
    ``rows_off``, and ``findings/KIND``, the rows of each kind (0 where there is none). Inputs
    the audit cannot read raise ``ValueError`` naming the argument and the row.
    """
    believed = believed_rule(expect)
    entries: dict[str, Any] = {
        "advantages": advantages,
        "token_level_rewards": token_level_rewards,
        "response_mask": response_mask,
        "index": index,
    }
    optional = {
        "traj_index": traj_index,
        "turn_index": turn_index,
        "anchor_index": anchor_index,
        "step_rewards": step_rewards,
        "step_returns": step_returns,
    }
    entries.update((name, value) for name, value in optional.items() if value is not None)

    def key(name: str) -> str | None:
        return name if name in entries else None

    try:
        roles = batch_roles(
            entries,
            group="index",
            trajectory=key("traj_index"),
            turn=key("turn_index"),
            reward="token_level_rewards",
            mask="response_mask",
            mask_needed_for="the advantages are read over the response tokens",
            options=_OPTIONS,
            steps=anchor_index is not None,
            anchor=key("anchor_index"),
            step_reward=key("step_rewards"),
            step_return=key("step_returns"),
        )
        report = audit_batch(entries, roles, "advantages", "advantages", believed)
    except AdvcliError as error:
        raise ValueError(str(error)) from None
    return audit_metrics(report, metrics_prefix)


def audit_batch(
    entries: Mapping[str, Any],
    roles: ColumnRoles,
    key: str,
    option: str,
    believed: ExpectedRule | None,
) -> dict[str, Any]:
    """The audit report (``advcli audit --json``'s document) of the advantages under ``key`` of
    a batch read with ``roles`` (``option``: the argument that names them, for the errors)."""
    assert roles.reward is not None
    # Each row's score in float64, however the rewards are held (bfloat16 widened exactly).
    scores = as_numpy(entries[roles.reward]).astype(np.float64).sum(axis=-1)
    roles, trainer = batch_trainer_advantages(entries, roles, key, option)
    projection = pl.concat(
        [batch_projection(entries, roles, scores), trainer], how="horizontal"
    ).with_columns(step_columns(entries, roles))
    trajectories = index_trajectories(projection)
    naming = Naming(roles.group or "group", roles.trajectory or "row")
    fit = fit_rule(
        projection,
        naming,
        trajectories,
        expected=believed.config if believed is not None else None,
    )
    return audit_report(
        fit,
        projection,
        trajectories,
        reading=roles.reading(),
        inputs=["the batch"],
        version=__version__,
        expected=believed,
    )


def believed_rule(expect: str | None) -> ExpectedRule | None:
    """``expect=``'s rule, a bad one raising ``ValueError``."""
    try:
        return expected_rule(expect) if expect is not None else None
    except SettingsError as error:
        raise ValueError(str(error)) from None

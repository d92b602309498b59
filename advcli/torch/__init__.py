"""Vectorized GRPO-family advantages for a training step, on torch tensors.

This module is the in-trainer counterpart of ``advcli compute``: a drop-in for verl's
``compute_grpo_outcome_advantage`` that works on one batch of rows (one row per turn of a
multi-turn trajectory) without a Python loop over the rows, optionally counting each trajectory
once in its group's statistics.

It needs the optional extra ``advcli[torch]``; it is the only module of advcli that imports torch,
and ``import advcli`` never imports it.

Semantics (``s`` is a row's score, the sum of its token-level rewards):

* The *units* of a group are the rows that enter its statistics: every row when ``traj_index`` is
  ``None`` or ``compute_mean_std_cross_all_data=True`` (verl's GRPO); otherwise only the first row,
  in batch order, of each ``(index, traj_index)`` pair.
* Each row is normalized with its group's statistics using its **own** score:
  ``(s - mean) / (std + epsilon)`` (GRPO), ``s - mean`` (Dr. GRPO), ``n / (n - 1) * (s - mean)``
  (RLOO). The std is unbiased (ddof=1); a group with a single unit has mean 0 and std 1 (RLOO: the
  raw score); when all units of a group have exactly the same score, the mean is that score and
  the std 0, so a row with that score gets exactly 0.
* Statistics are accumulated in float64; the result is float32 ``(bs, response_length)``, the
  scalar advantage times ``response_mask``, on the rewards' device, with no autograd graph.
* Before any statistic, a NaN or infinite reward on any token (the score sums every token, masked
  out or not, as verl's estimators do) or mask value, and integer rewards of a row that add up
  beyond 2^53 in absolute value (float64 would round the score; 2^53 itself is kept), raise
  :class:`RewardError` naming the row (batch index), the token and the value; so do finite
  scores whose advantages do not fit the float32 result ("too large"). verl 0.9.1's own
  estimators return NaN for every row of that reward's group instead, with no error.
* ``estimator="gigpo"`` adds ``step_weight`` times GiGPO's step term to the episode term (the
  level's advantage with GiGPO's normalization): each row's step return over its trajectory in
  turn order, normalized within its step group (the rows of one anchor id, within a group or
  batch-wide); a step group of one row gets 0 (:mod:`advcli.torch.step_groups`).
* ``reward_mode="per-turn"``: each row's score is its own turn's reward, and its reward-to-go
  over its trajectory in turn order is normalized within its step group (the entries of
  ``advcli.rules.STEP_GROUPINGS``: per turn position, the same zero-padded, pooled, by anchor,
  or each position's rewards normalized and then summed) by grpo, drgrpo or rloo
  (:mod:`advcli.torch.per_turn`).
* :func:`audit_advantages` audits the advantages a trainer computed on a batch (``advcli
  audit``'s rule and findings, as step metrics); it reads the batch with Polars and is imported
  on first use, so that ``import advcli.torch`` does not load Polars.
* An empty batch (0 rows) gives float32 ``(0, response_length)`` advantages and metrics that
  count 0.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401  (the extra's check, before any module of the package needs it)
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("advcli.torch needs torch: pip install 'advcli[torch]'") from error

from advcli.torch.advantage import (
    AdvantageMetrics,
    AdvantageResult,
    compute_advantage,
    compute_advantage_with_metrics,
)
from advcli.torch.drop_in import compute_grpo_outcome_advantage, compute_rloo_outcome_advantage
from advcli.torch.step_groups import StepMetrics
from advcli.torch.tensors import RewardError


def __getattr__(name: str) -> object:
    # The audit's face is imported on first use (see the module's docstring).
    if name == "audit_advantages":
        from advcli.torch.audit import audit_advantages

        return audit_advantages
    raise AttributeError(f"module 'advcli.torch' has no attribute {name!r}")


__all__ = [
    "AdvantageMetrics",
    "AdvantageResult",
    "RewardError",
    "StepMetrics",
    "audit_advantages",
    "compute_advantage",
    "compute_advantage_with_metrics",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
]

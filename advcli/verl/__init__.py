"""verl's ``compute_advantage`` on a ``DataProto``, with advcli's rules: ``advantages`` and
``returns`` set, the counts and ``compare``'s bias figures in ``meta_info["metrics"]``
(:mod:`advcli.verl.advantage`); verl's and verl-agent's keywords read as advcli's settings
(:mod:`advcli.verl.keywords`); the advantages a trainer set audited in the step, as metrics
(:mod:`advcli.verl.audit`). It needs torch (``advcli[verl]``), never verl itself."""

from advcli.verl.advantage import compute_advantage
from advcli.verl.audit import audit_advantages

__all__ = ["audit_advantages", "compute_advantage"]

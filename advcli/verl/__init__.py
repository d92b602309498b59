"""verl's ``compute_advantage`` on a ``DataProto``, with advcli's rules: ``advantages`` and
``returns`` set, the counts and ``compare``'s bias figures in ``meta_info["metrics"]``
(:mod:`advcli.verl.advantage`); verl's and verl-agent's keywords read as advcli's settings
(:mod:`advcli.verl.keywords`). It needs torch (``advcli[verl]``), never verl itself."""

from advcli.verl.advantage import compute_advantage

__all__ = ["compute_advantage"]

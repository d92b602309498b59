"""advcli: trajectory-level advantage normalization for multi-turn agent RL rollout dumps.

The library API mirrors the commands::

    from pathlib import Path
    from advcli import AdvantageConfig, Level, compute

    compute(["rollouts.parquet"], Path("advantages.parquet"), AdvantageConfig(level=Level.TURN))

The settings import nothing heavy; ``compute``, ``compare`` and the rest load Polars on first use.
"""

import importlib
from typing import Any

from advcli.errors import AdvcliError
from advcli.settings import (
    AdvantageConfig,
    ColumnNames,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)

_LAZY = {
    "compute": "advcli.pipeline",
    "compare": "advcli.pipeline",
    "load_dump": "advcli.pipeline",
    "Advantages": "advcli.advantage",
    "compute_advantages": "advcli.advantage",
}


def __getattr__(name: str) -> Any:
    # Looked up on first use: importlib.metadata is slow to import, and the command line's
    # start-up (where a Ctrl-C has no handler yet) should be short.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("advcli")
        except PackageNotFoundError:  # running from a source tree that is not installed
            return "0.0.0+unknown"
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'advcli' has no attribute {name!r}")


__all__ = [
    "AdvantageConfig",
    "Advantages",
    "AdvcliError",
    "ColumnNames",
    "Estimator",
    "Level",
    "Scale",
    "Singleton",
    "TrajScore",
    "__version__",
    "compare",
    "compute",
    "compute_advantages",
    "load_dump",
]

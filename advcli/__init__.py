"""advcli: trajectory-level advantage normalization for multi-turn agent RL rollout dumps.

The library API mirrors the commands::

    from advcli import AdvantageConfig, Level, compute
    compute(["rollouts.parquet"], Path("advantages.parquet"), AdvantageConfig(level=Level.TURN))
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("advcli")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

from advcli.advantage import (
    AdvantageConfig,
    Advantages,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)
from advcli.errors import AdvcliError
from advcli.pipeline import ColumnNames, compute, load_dump

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
    "compute",
    "load_dump",
]

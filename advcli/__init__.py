"""advcli: trajectory-level advantage normalization for multi-turn agent RL rollout dumps.

The library API mirrors the commands::

    from pathlib import Path
    from advcli import AdvantageConfig, Level, compute

    compute(["rollouts.parquet"], Path("advantages.parquet"), AdvantageConfig(level=Level.TURN))

Names are imported on first use; ``compute``, ``compare`` and the rest load Polars then.
"""

import importlib
from typing import TYPE_CHECKING

from advcli.errors import AdvcliError, UsageError

if TYPE_CHECKING:
    # Looked up on first use (see __getattr__); a string, for the type checker.
    __version__: str

# Everything else is imported on first use, so that starting the command line (where a Ctrl-C
# has no handler yet) imports next to nothing.
_LAZY = {
    "compute": "advcli.pipeline",
    "compare": "advcli.pipeline",
    "inspect": "advcli.pipeline",
    "ComputeSummary": "advcli.pipeline",
    "ReportFiles": "advcli.write.documents",
    "BiasReport": "advcli.report.bias",
    "TerminationReport": "advcli.report.termination",
    "AdvantageConfig": "advcli.settings",
    "ColumnNames": "advcli.settings",
    "Engine": "advcli.settings",
    "Estimator": "advcli.settings",
    "Level": "advcli.settings",
    "LossMode": "advcli.settings",
    "OutputColumns": "advcli.settings",
    "OutputFormat": "advcli.settings",
    "Scale": "advcli.settings",
    "Singleton": "advcli.settings",
    "TrajScore": "advcli.settings",
}


def __getattr__(name: str) -> object:
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
    "AdvcliError",
    "BiasReport",
    "ColumnNames",
    "ComputeSummary",
    "Engine",
    "Estimator",
    "Level",
    "LossMode",
    "OutputColumns",
    "OutputFormat",
    "ReportFiles",
    "Scale",
    "Singleton",
    "TerminationReport",
    "TrajScore",
    "UsageError",
    "__version__",
    "compare",
    "compute",
    "inspect",
]

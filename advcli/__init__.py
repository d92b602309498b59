"""advcli: trajectory-level advantage normalization for multi-turn agent RL rollout dumps.

The library API mirrors the commands::

    from pathlib import Path
    from advcli import AdvantageConfig, Level, compute

    compute(["rollouts.parquet"], Path("advantages.parquet"), AdvantageConfig(level=Level.TURN))

Names are imported on first use; ``compute``, ``compare`` and the rest load Polars then.
"""

import importlib
from typing import TYPE_CHECKING

from advcli.errors import AdvcliError, SettingsError, UsageError

if TYPE_CHECKING:
    # Looked up on first use (see __getattr__); a string, for the type checker.
    __version__: str

# Everything else is imported on first use, so that starting the command line (where a Ctrl-C
# has no handler yet) imports next to nothing.
_LAZY = {
    "compute": "advcli.run.commands",
    "compare": "advcli.run.commands",
    "inspect": "advcli.run.commands",
    "audit": "advcli.run.audit",
    "ComputeSummary": "advcli.run.commands",
    "ReportFiles": "advcli.write.documents",
    "BiasReport": "advcli.report.bias",
    "TerminationReport": "advcli.report.termination",
    "AdvantageConfig": "advcli.settings.config",
    "ColumnNames": "advcli.settings.config",
    "Engine": "advcli.settings.config",
    "Estimator": "advcli.settings.config",
    "Level": "advcli.settings.config",
    "LossMode": "advcli.settings.config",
    "OutputColumns": "advcli.settings.config",
    "OutputFormat": "advcli.settings.config",
    "Scale": "advcli.settings.config",
    "Singleton": "advcli.settings.config",
    "TrajScore": "advcli.settings.config",
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
    "SettingsError",
    "Singleton",
    "TerminationReport",
    "TrajScore",
    "UsageError",
    "__version__",
    "audit",
    "compare",
    "compute",
    "inspect",
]

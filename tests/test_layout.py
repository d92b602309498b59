"""The package's shape: the architecture page's table names every module, and imports point down the
data flow (the math imports no I/O, nothing imports the command line)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "advcli"

# Modules that read or write files, streams or processes.
IO = {
    "inputs",
    "names",
    "scan",
    "projection",
    "duplicates",
    "rows",
    "atomic",
    "process",
    "native_stderr",
    "pipeline",
    "ray_engine",
}
# The math and the reports over it: pure functions of frames and settings.
PURE = {"settings", "rules", "keys", "units", "estimators", "bias", "inspection"}


def advcli_imports(module: Path) -> set[str]:
    """The advcli modules ``module`` imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("advcli"):
            found.add(node.module.rsplit(".", 1)[-1] if node.module != "advcli" else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("advcli."):
                    found.add(alias.name.rsplit(".", 1)[-1])
    return found


def test_the_architecture_page_names_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[: page.index("## Development")]
    listed = set(re.findall(r"^\| `advcli/([\w/]+)\.py` \|", section, flags=re.MULTILINE))
    modules = {str(path.relative_to(PACKAGE).with_suffix("")) for path in PACKAGE.rglob("*.py")}
    assert listed == {module for module in modules if not module.endswith("__init__")}


def test_imports_point_down_the_flow():
    imports = {path.stem: advcli_imports(path) for path in PACKAGE.rglob("*.py")}
    for name, imported in imports.items():
        if name != "__main__":  # the entry point runs the command line
            assert "app" not in imported, f"{name} imports the command line"
        if name in PURE:
            assert not (imported & IO), f"{name} (pure) imports I/O: {imported & IO}"
    assert imports["atomic"] <= {"errors", "signals"}
    assert imports["rules"] == set()

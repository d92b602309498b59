"""The package's shape, as folder rules: the architecture page names every module, each folder
imports only the folders before it in the data flow, only the command line imports rich or typer,
nothing imports the command line, there are no import cycles (type-only imports included), and no
module or function grows past its bound."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "advcli"
MODULES = {
    ".".join(("advcli", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__"
    ): path
    for path in PACKAGE.rglob("*.py")
}
# The leaves every room may use: the settings and rules that decide the numbers, the key
# projection's column names, the exception type and file names shown escaped.
SHARED = {"advcli.settings", "advcli.rules", "advcli.keys", "advcli.errors", "advcli.names"}
# What each room may import besides itself and the shared leaves.
ALLOWED = {
    "advcli.advantages": set(),
    "advcli.read": {"advcli._runtime"},
    "advcli.report": {"advcli.advantages"},
    "advcli.write": {"advcli._runtime", "advcli.read"},
    "advcli._runtime": set(),
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


def room(module: str) -> str:
    """The folder (or top-level module) a module lives in: ``advcli.read.inputs`` is in
    ``advcli.read``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def imports_of(path: Path) -> set[str]:
    """The advcli modules ``path`` imports, at any depth of its code, type-only imports included
    (``from advcli.write import atomic`` counts as ``advcli.write.atomic``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("advcli"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("advcli")}
    return found


IMPORTS = {module: imports_of(path) for module, path in MODULES.items()}


def test_the_architecture_page_names_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `(advcli/[\w/]+\.py)` \|", page, flags=re.MULTILINE))
    modules = {str(path.relative_to(ROOT)) for path in MODULES.values()}
    modules -= {
        path for path in modules if path.endswith("__init__.py") and path != "advcli/__init__.py"
    }
    assert listed == modules


def test_each_room_imports_only_the_rooms_before_it():
    for module, imported in IMPORTS.items():
        here = room(module)
        if here not in ALLOWED:
            continue
        allowed = {here, *SHARED, *ALLOWED[here]}
        stray = {name for name in imported if room(name) not in allowed and name not in SHARED}
        assert not stray, f"{module} imports {sorted(stray)}"


def test_only_the_command_line_imports_rich_or_typer():
    for module, path in MODULES.items():
        if room(module) == "advcli.cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in {"rich", "typer", "click"}, f"{module}: {name}"


def test_nothing_imports_the_command_line():
    for module, imported in IMPORTS.items():
        if module == "advcli.__main__" or room(module) == "advcli.cli":
            continue
        assert not any(room(name) == "advcli.cli" for name in imported), module


def test_no_import_cycles():
    # A module importing a package imports its __init__, which imports nothing of advcli but
    # advcli's own lazy names: the graph is over modules.
    graph = {
        module: {name for name in imported if name in MODULES}
        for module, imported in IMPORTS.items()
    }
    graph["advcli"] = set()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError(" → ".join((*path[path.index(module) :], module)))
        if module in done:
            return
        for name in graph.get(module, ()):
            visit(name, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_no_module_or_function_grows_past_its_bound():
    for module, path in MODULES.items():
        text = path.read_text()
        assert len(text.splitlines()) <= MAX_MODULE_LINES, (
            f"{module}: {len(text.splitlines())} lines"
        )
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{module}.{node.name}: {length} lines"

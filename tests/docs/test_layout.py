"""The package's shape, as folder rules: the architecture page names every module, every module
lives in a room that the room table fences, the rooms stand in one order and each imports only
rooms below it, only the command line imports rich or typer, nothing imports the command line,
there are no import cycles (type-only imports included), at most eight modules stand at the top
level, and no function grows past its bound. Files are cut by job, not by length: there is no
module bound."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "advcli"
MODULES = {
    ".".join(("advcli", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__"
    ): path
    for path in PACKAGE.rglob("*.py")
}
# Every room, from the top of the flow to its leaves, with the rooms it may import besides its
# own modules. Each imports only rooms listed after it: one order, cli → run →
# {read, advantages, report, write} → settings → the leaves. The package's face (``advcli``)
# stands among the leaves: at import it loads nothing but ``errors`` (``__version__`` and its
# public names are looked up on first use), so the rooms that print the version may import it.
ROOMS = {
    "advcli.__main__": {"advcli.cli", "advcli._runtime"},
    "advcli.cli": {
        "advcli.run",
        "advcli.report",
        "advcli.write",
        "advcli._runtime",
        "advcli.settings",
        "advcli",
        "advcli.names",
        "advcli.errors",
    },
    "advcli.dump": {"advcli.write", "advcli.read", "advcli.errors"},
    "advcli.verl": {
        "advcli.torch",
        "advcli.report",
        "advcli.read",
        "advcli.advantages",
        "advcli.settings",
        "advcli",
        "advcli.keys",
        "advcli.errors",
    },
    "advcli.run": {
        "advcli.report",
        "advcli.write",
        "advcli.read",
        "advcli.advantages",
        "advcli._runtime",
        "advcli.settings",
        "advcli",
        "advcli.names",
        "advcli.keys",
        "advcli.errors",
    },
    # The tensor rules import only the settings; the audit's face (advcli.torch.audit, loaded on
    # first use) reads a batch as a dump is read, fits the rule and makes the report.
    "advcli.torch": {
        "advcli.report",
        "advcli.read",
        "advcli.advantages",
        "advcli.settings",
        "advcli",
        "advcli.errors",
    },
    "advcli.report": {
        "advcli.advantages",
        "advcli.settings",
        "advcli.names",
        "advcli.keys",
        "advcli.errors",
    },
    "advcli.write": {
        "advcli.read",
        "advcli._runtime",
        "advcli.settings",
        "advcli.names",
        "advcli.keys",
        "advcli.errors",
    },
    "advcli.read": {
        "advcli._runtime",
        "advcli.settings",
        "advcli.names",
        "advcli.keys",
        "advcli.errors",
    },
    "advcli.advantages": {"advcli.settings", "advcli.keys", "advcli.errors"},
    "advcli._runtime": {"advcli.errors"},
    "advcli.settings": {"advcli.errors"},
    "advcli": {"advcli.errors"},
    "advcli.names": {"advcli.errors"},
    "advcli.keys": set(),
    "advcli.errors": set(),
}
# The faces (the package, its entry point, ``advcli.dump``) and the ground-floor leaves.
MAX_TOP_LEVEL_MODULES = 8
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


def test_every_module_is_in_a_fenced_room():
    unfenced = sorted(module for module in MODULES if room(module) not in ROOMS)
    assert not unfenced, f"modules in no room of the table: {unfenced}"


def test_the_rooms_stand_in_one_order():
    order = list(ROOMS)
    for here, allowed in ROOMS.items():
        above = {name for name in allowed if order.index(name) <= order.index(here)}
        assert not above, f"{here} may import {sorted(above)}, listed above it"


def test_each_room_imports_only_the_rooms_below_it():
    for module, imported in IMPORTS.items():
        here = room(module)
        stray = {name for name in imported if room(name) not in {here, *ROOMS[here]}}
        assert not stray, f"{module} imports {sorted(stray)}"


def test_at_most_eight_modules_at_the_top_level():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


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


def test_no_function_grows_past_its_bound():
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{module}.{node.name}: {length} lines"

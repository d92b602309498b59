"""The package's public face: what ``advcli.__all__`` exports is what the docs document, and every
name in it imports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import advcli

LIBRARY_PAGE = (Path(__file__).resolve().parent.parent / "docs" / "library.md").read_text()


def test_every_exported_name_imports():
    for name in advcli.__all__:
        assert getattr(advcli, name) is not None, name


def test_the_docs_document_exactly_the_exported_names():
    section = LIBRARY_PAGE[LIBRARY_PAGE.index("## The library calls") :]
    table = section[section.index("| name | what it is |") :]
    documented = set()
    for line in table.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cell = line.split(" | ")[0].lstrip("| ")
        documented |= {name.split("(")[0] for name in re.findall(r"`([^`]+)`", cell)}
    assert documented == set(advcli.__all__)


def test_exported_members_belong_to_the_package():
    """As httpx checks: each exported class or function says it is advcli's."""
    for name in advcli.__all__:
        member = getattr(advcli, name)
        if callable(member):
            assert member.__module__.startswith("advcli"), name
            assert member.__doc__, f"{name} has no docstring"


def test_importing_the_package_loads_no_polars():
    code = "import sys, advcli; print('polars' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False"]

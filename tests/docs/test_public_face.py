"""The package's public face: what ``advcli.__all__`` exports is what the docs document, and every
name in it imports."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import ROOT

import advcli

LIBRARY_PAGE = (ROOT / "docs" / "library.md").read_text()
SAMPLE = ROOT / "sample_data" / "rollouts.parquet"


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


@pytest.mark.process
def test_importing_the_package_loads_no_polars():
    code = "import sys, advcli; print('polars' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.process
def test_star_import_gives_every_exported_name():
    code = (
        "import advcli\n"
        "from advcli import *\n"
        "missing = [name for name in advcli.__all__ if name not in globals()]\n"
        "assert not missing, missing\n"
        "print(compare.__module__, BiasReport.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["advcli.run.commands", "advcli.report.bias"]


def _table_after(heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` on the library page."""
    section = LIBRARY_PAGE[LIBRARY_PAGE.index(heading) :]
    lines = section[section.index("\n|") + 1 :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_docs_give_every_field_of_compute_summary():
    documented = [
        name for row in _table_after("`ComputeSummary`, a frozen") for name in _names(row[0])
    ]
    assert documented == [field.name for field in dataclasses.fields(advcli.ComputeSummary)]


def test_the_docs_give_the_columns_of_the_bias_reports_frames():
    report = advcli.compare([str(SAMPLE)])
    frames = {row[0].strip("`"): _names(row[2]) for row in _table_after("`BiasReport`, a frozen")}
    assert frames == {
        "trajectories": report.trajectories.columns,
        "groups": report.groups.columns,
    }
    assert [field.name for field in dataclasses.fields(advcli.BiasReport)] == [
        "summary",
        *frames,
    ]


def test_one_path_given_alone_is_one_input(tmp_path):
    """A str or a Path is the name of one input (not a sequence of one-letter names), and the
    report files may be named by text."""
    by_str = advcli.compare(str(SAMPLE), files=advcli.ReportFiles(json=str(tmp_path / "r.json")))
    by_path = advcli.inspect(SAMPLE)
    assert by_str.summary["counts"]["trajectories"] == by_path["counts"]["trajectories"] == 512
    rows = pq.read_metadata(SAMPLE).num_rows
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["rows"] == rows

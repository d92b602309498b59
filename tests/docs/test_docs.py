"""The docs: the site builds strictly, every example meant to run runs as written, the generated
command-line reference is current, and the README stays a front door that shows real output."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.docs

DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted([README, *DOCS.rglob("*.md")])
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>[^>]+) -->\n$")
BLOCK = re.compile(r"^```(?P<language>bash|python)\n(?P<code>.*?)^```$", re.S | re.M)


def examples(page: Path) -> list[tuple[str, str]]:
    """The page's bash and python blocks that are meant to run, in page order. A block that is
    not meant to run says why in a ``<!-- not run: REASON -->`` line just above it."""
    text = page.read_text()
    found = []
    for block in BLOCK.finditer(text):
        if NOT_RUN.search(text[: block.start()].rsplit("\n\n", 1)[-1]):
            continue
        found.append((block["language"], block["code"]))
    return found


def run_example(
    language: str, code: str, cwd: Path, *, site: Path | None = None
) -> subprocess.CompletedProcess:
    """One example in ``cwd``, where ``advcli`` and ``python`` are this environment's (with
    the modules of folder ``site`` first, where given)."""
    bin_dir = cwd / ".bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "advcli"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m advcli "$@"\n')
    launcher.chmod(0o755)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{path}",
        "MPLBACKEND": "Agg",
    }
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    command = (
        ["bash", "-euo", "pipefail", "-c", code]
        if language == "bash"
        else [sys.executable, "-c", code]
    )
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "page", [page for page in PAGES if examples(page)], ids=lambda page: str(page.relative_to(ROOT))
)
def test_every_example_runs_as_written(page, tmp_path):
    runnable = examples(page)
    if any("jq" in code for _, code in runnable) and shutil.which("jq") is None:
        pytest.skip("needs jq (.ci/run installs it)")
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data")
    for language, code in runnable:
        result = run_example(language, code, tmp_path)
        assert result.returncode == 0, (code, result.stderr)


def test_blocks_not_run_say_why():
    """A block marked not to run names a reason, and every bash or python block is either run or
    marked (nothing is left out by accident)."""
    for page in PAGES:
        text = page.read_text()
        marked = len(re.findall(r"<!-- not run: \S[^>]* -->\n```(?:bash|python)\n", text))
        assert len(BLOCK.findall(text)) == len(examples(page)) + marked, page


def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "trainers" / "skyrl" / "index.html").exists()


def test_every_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+(\S+\.md)$", config, re.M))
    assert listed == {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}


@pytest.mark.parametrize("front", ["README.md", "docs/index.md"])
def test_every_trainer_page_is_linked_from_the_front_pages(front):
    text = (ROOT / front).read_text()
    prefix = "docs/trainers/" if front == "README.md" else "trainers/"
    missing = [
        page.name
        for page in (DOCS / "trainers").glob("*.md")
        if f"({prefix}{page.name})" not in text
    ]
    assert not missing


def docs_script(name: str):
    """One of the docs' scripts (``docs/NAME.py``) as a module."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_reference_is_current():
    assert (DOCS / "cli.md").read_text() == docs_script("make_cli_reference").reference(), (
        "docs/cli.md is stale: run python docs/make_cli_reference.py"
    )


def test_the_command_line_reference_has_every_command():
    from advcli.cli.app import app

    registered = {command.name for command in app.registered_commands}
    assert set(docs_script("make_cli_reference").COMMANDS) == registered


@pytest.mark.process
def test_the_docs_pictures_are_of_the_report_compare_makes_now(tmp_path):
    """The landing page's screenshot and the README's figure were made from the page whose digest
    docs/images/report-page.sha256 holds: a report whose text changed since (advice, figures,
    tables) fails here until docs/make_images.py redraws them."""
    images = docs_script("make_images")
    page = images.report_page(tmp_path / "report.html")
    assert images.page_digest(page) == images.SOURCE.read_text().strip(), (
        "docs/images are of an older report: run python docs/make_images.py"
    )


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for page in DOCS.rglob("*.md"):
        if "reference" not in page.parts:
            assert f"(docs/{page.relative_to(DOCS)})" in text, f"the README does not link {page}"


def test_the_readme_shows_the_verdict_compare_prints():
    shown = re.search(r"```\n(╭─ Verdict.*?╯)\n```", README.read_text(), re.S)
    assert shown is not None
    result = subprocess.run(
        [sys.executable, "-m", "advcli", "compare", "sample_data/rollouts.parquet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"},
    )
    assert result.returncode == 0, result.stderr
    printed = re.search(r"╭─ Verdict.*?╯", result.stdout + result.stderr, re.S)
    assert printed is not None
    assert [line.rstrip() for line in shown[1].splitlines()] == [
        line.rstrip() for line in printed[0].splitlines()
    ]


def test_the_readme_test_command_is_what_ci_runs():
    command = re.search(r"^apt-get install -y (.*?) && (.*)$", README.read_text(), re.M)
    assert command is not None
    ci = (ROOT / ".ci" / "run").read_text()
    for package in command[1].split():
        assert f'missing="$missing {package}"' in ci, package
    # CI installs quietly, and runs pip as the venv's module.
    ci = ci.replace(" --quiet", "").replace("python -m pip", "pip")
    for step in command[2].split(" && "):
        assert step in ci, step


# The modules each extra of pyproject.toml brings, which a fresh install without it lacks.
EXTRA_MODULES = {"plot": {"matplotlib"}, "torch": {"torch"}, "verl": {"torch"}, "ray": {"ray"}}
LACKING = """
import sys
from importlib.machinery import PathFinder


class Lacking(PathFinder):
    # The extras' modules are not found, as on a machine that never installed them.
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in {lacking!r}:
            return None
        return PathFinder.find_spec(name, path, target)


sys.meta_path[:] = [Lacking if finder is PathFinder else finder for finder in sys.meta_path]
"""


@pytest.mark.parametrize("page", [README, DOCS / "index.md"], ids=["README", "index"])
def test_the_first_commands_run_with_what_the_install_line_installs(page, tmp_path):
    """The front pages' commands run as written after their install line: the modules of the
    extras that line does not install are kept out (as on a fresh machine)."""
    install = re.search(r"^python3 -m venv .* pip install -e (\S+)$", page.read_text(), re.M)
    assert install is not None
    extras = re.fullmatch(r"""["']?\.(?:\[([a-z,]+)\])?["']?""", install[1])
    assert extras is not None, install[1]
    installed = set((extras[1] or "").split(",")) - {""}
    lacking = set().union(*(EXTRA_MODULES[e] for e in EXTRA_MODULES if e not in installed))
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data")
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "sitecustomize.py").write_text(LACKING.format(lacking=lacking))
    for language, code in examples(page):
        if language == "bash":
            result = run_example(language, code, tmp_path, site=tmp_path / "fresh")
            assert result.returncode == 0, (install[1], code, result.stderr)

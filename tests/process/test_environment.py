"""The environment can't crash advcli: bad values of the variables its libraries read are
overridden or ignored with a warning, never a panic or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from advcli.write.sample import sample_table

pytestmark = pytest.mark.process

ADVCLI = [sys.executable, "-m", "advcli"]


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    path = tmp_path / "s.parquet"
    pl.from_arrow(sample_table(groups=3, rollouts=2)).write_parquet(path)
    return path


def run(*args: object, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ADVCLI, *map(str, args)], capture_output=True, text=True, env={**os.environ, **env}
    )


@pytest.mark.parametrize("value", ["0", "-3", "99999999", "two"])
def test_a_bad_polars_thread_count_is_ignored_with_a_warning(dump, tmp_path, value):
    result = run("compute", dump, "-o", tmp_path / "o.parquet", POLARS_MAX_THREADS=value)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"advcli: ignoring POLARS_MAX_THREADS={value!r} (not a whole number from 1 to 1024); "
        "using all cores"
    )
    assert "Traceback" not in result.stderr and "panic" not in result.stderr
    assert pl.read_parquet(tmp_path / "o.parquet").height == pl.read_parquet(dump).height


def test_a_good_polars_thread_count_is_used(dump, tmp_path):
    result = run("compute", dump, "-o", tmp_path / "o.parquet", POLARS_MAX_THREADS="1")
    assert result.returncode == 0, result.stderr
    assert "ignoring" not in result.stderr and "(1 threads)" in result.stderr


def test_a_bad_matplotlib_backend_does_not_stop_the_plot(dump, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bias.png"
    result = run("compare", dump, "--plot", plot, "--quiet", MPLBACKEND="no-such-backend")
    assert result.returncode == 0, result.stderr
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

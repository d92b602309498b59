"""Redraw the pictures the docs show: the report's figure and a screenshot of its HTML page.

Run from the repository root after a change to the report (needs advcli[plot] and chromium):
``python docs/make_images.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"


def main() -> None:
    browser = shutil.which("chromium")
    if browser is None:
        sys.exit("needs chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "report.html"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "advcli",
                "compare",
                str(ROOT / "sample_data" / "rollouts.parquet"),
                "--html",
                str(page),
                "--plot",
                str(IMAGES / "bias.png"),
                "--force",
                "-q",
            ],
            check=True,
        )
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1000,1250",
                f"--screenshot={IMAGES / 'report-page.png'}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
        )


if __name__ == "__main__":
    main()

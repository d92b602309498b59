"""Redraw the pictures the docs show: the report's figure and a screenshot of its HTML page.

Run from the repository root after a change to the report (needs advcli[plot] and chromium):
``python docs/make_images.py``. It also records the digest of the page the pictures were made
from (:data:`SOURCE`), which a test holds to the page ``compare`` makes now: a report whose text
changed fails it until the pictures are redrawn.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
SOURCE = IMAGES / "report-page.sha256"
# The sample, named from the repository's root as the page names its inputs.
SAMPLE = "sample_data/rollouts.parquet"


def page_digest(html: str) -> str:
    """The digest of a report page's text: its embedded pictures left out (their bytes depend on
    the machine's fonts and libraries, not on what the report says)."""
    text = re.sub(r'src="data:[^"]*"', 'src=""', html)
    return hashlib.sha256(text.encode()).hexdigest()


def report_page(page: Path, figure: Path | None = None) -> str:
    """``compare``'s HTML page of the sample at ``page`` (and its figure at ``figure``), run from
    the repository's root; its text."""
    figure_options = ["--plot", str(figure)] if figure is not None else []
    command = [sys.executable, "-m", "advcli", "compare", SAMPLE, "--html", str(page)]
    subprocess.run([*command, *figure_options, "--force", "-q"], check=True, cwd=ROOT)
    return page.read_text(encoding="utf-8")


def main() -> None:
    browser = shutil.which("chromium")
    if browser is None:
        sys.exit("needs chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "report.html"
        html = report_page(page, IMAGES / "bias.png")
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
    SOURCE.write_text(page_digest(html) + "\n")


if __name__ == "__main__":
    main()

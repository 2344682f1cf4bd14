"""Writes docs/img/report.png: the demo's report (``python -m dataprep.demo``) as headless
Chromium draws it at 1024 px wide, the whole page. Needs playwright and Debian's chromium
(the dev extra; ``tests/report/test_report_browser.py`` runs :func:`screenshot` too).

    python docs/img/report_png.py [DEMO_DIR]   # DEMO_DIR default: demo-out (made when absent)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

IMG = Path(__file__).resolve().parent / "report.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the desktop viewport of the picture (CSS pixels)
VIEWPORT = {"width": 1024, "height": 768}


def screenshot(browser: Any, report: Path, out: Path, viewport: dict[str, int] = VIEWPORT) -> None:
    """The whole page of ``report`` once every chart is drawn, as a PNG of 256 colours
    (a fraction of the bytes of a true-colour one; the page has few colours)."""
    from PIL import Image

    page = browser.new_page(viewport=viewport)
    page.goto(report.resolve().as_uri())
    page.wait_for_function("window.__report && window.__report.ready", timeout=60_000)
    raw = out.with_suffix(".raw.png")
    page.screenshot(path=str(raw), full_page=True)
    page.close()
    with Image.open(raw) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    raw.unlink()


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    demo = Path(argv[0] if argv else "demo-out")
    report = demo / "report.html"
    if not report.exists():
        subprocess.run([sys.executable, "-m", "dataprep.demo", str(demo)], check=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        screenshot(browser, report, IMG)
        browser.close()
    print(IMG)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

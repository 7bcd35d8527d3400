"""The README's screenshot of `foco serve`: the quickstart's index and checkpoint, one query with a box.

    python experiments/screenshot_serve.py --run runs/quickstart --out docs/images/serve.png [--reference N]

Starts `foco serve` on a free loopback port, drives Debian's chromium through Playwright (as tests/test_browser.py
does), runs a query, draws a box, and saves the page.
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--out", default="docs/images/serve.png")
    ap.add_argument("--reference", type=int, default=9, help="position in the gallery picker")
    ap.add_argument("--text", default="a cross instead of the crescent")
    a = ap.parse_args()
    run = Path(a.run)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "foco", "serve", "--index", str(run / "index"), "--checkpoint",
                               str(run / "foco"), "--foco-edits", str(run / "foco-edits"), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1000, "height": 1300})
            page.goto(url)
            page.wait_for_selector(".gallery button")
            page.locator(".gallery button").nth(a.reference).click()
            page.wait_for_function("document.getElementById('ref-caption').textContent.includes('Reference')")
            page.fill("#text", a.text)
            page.select_option("#method", "foco-edits")
            page.fill("#k", "8")
            page.click("#submit")
            page.wait_for_function("document.querySelectorAll('.result-tile').length === 8")
            page.wait_for_function("(() => { const h = document.getElementById('heatmap');"
                                   " return !h.hidden && h.complete && h.naturalWidth > 0; })()")
            time.sleep(1.0)  # thumbnails
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=a.out, full_page=True)
            browser.close()
        print(f"saved {a.out}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()

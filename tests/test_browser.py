"""The web page in a real browser: Debian's chromium, driven by Playwright through `executable_path` (Playwright's
own browser download cannot work offline). `foco serve` runs as a subprocess on a free loopback port over an index
of the tiny world. The test chooses a reference, types an instruction, submits, waits for k tiles and the heatmap,
then drags a box on the reference and sees the results change. A screenshot is saved as a test artifact.

`make test` installs chromium with apt-get when it is missing and the user is root; otherwise this test is skipped
with a message that says how to enable it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _chromium() -> str | None:
    for name in (os.environ.get("FOCO_CHROMIUM"), "chromium", "chromium-browser", "chromium-headless-shell"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def server(tiny_world, tmp_path_factory, free_port):
    pytest.importorskip("faiss")
    pytest.importorskip("fastapi")
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.search.build import IndexConfig, build_index
    base = tmp_path_factory.mktemp("browser")
    build_index(IndexConfig(images=str(tiny_world / "images" / "test-single"), backbone="world:pretrained"),
                base / "index")
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256, learn_bias=True)).save(base / "foco", {"backbone": "world:pretrained"})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "foco", "serve", "--index", str(base / "index"), "--checkpoint",
                             str(base / "foco"), "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("foco serve exited:\n" + proc.stdout.read())
            time.sleep(0.3)
    else:
        proc.kill()
        raise RuntimeError("foco serve did not answer /healthz within 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
def test_the_page_searches_and_the_box_changes_the_results(server):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium here: run `make test` as root (it installs Debian's chromium with apt-get), or "
                    "`apt-get install chromium`, or point FOCO_CHROMIUM at a Chromium binary")
    sync_api = pytest.importorskip("playwright.sync_api")
    k = 6
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1100, "height": 1400})
        page.goto(server)
        page.wait_for_selector(".gallery button")
        page.locator(".gallery button").nth(2).click()
        page.wait_for_function("document.getElementById('ref-caption').textContent.includes('Reference')")
        page.fill("#text", "make the circle blue")
        page.select_option("#method", "foco")
        page.fill("#k", str(k))
        page.click("#submit")
        page.wait_for_function(f"document.querySelectorAll('.result-tile').length === {k}")
        page.wait_for_function("(() => { const h = document.getElementById('heatmap');"
                               " return !h.hidden && h.complete && h.naturalWidth > 0; })()")
        first = page.eval_on_selector_all(".result-tile", "els => els.map(e => [e.dataset.id, e.dataset.score])")
        assert len(first) == k

        box = page.locator("#ref-canvas").bounding_box()
        page.mouse.move(box["x"] + 4, box["y"] + 4)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] * 0.4, steps=5)
        page.mouse.up()  # a drawn box searches again
        page.wait_for_function("document.getElementById('status').textContent.includes('with the box')")
        page.wait_for_function(f"document.querySelectorAll('.result-tile').length === {k}")
        second = page.eval_on_selector_all(".result-tile", "els => els.map(e => [e.dataset.id, e.dataset.score])")
        assert second != first
        assert page.input_value("#x1") != ""

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "serve.png"), full_page=True)
        phone = browser.new_page(viewport={"width": 390, "height": 844})  # phone width: nothing overflows
        phone.goto(server)
        phone.wait_for_selector(".gallery button")
        assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        phone.keyboard.press("Tab")  # the controls are reachable from the keyboard
        assert phone.evaluate("document.activeElement.tagName") in ("INPUT", "BUTTON", "SELECT", "CANVAS")
        browser.close()
    assert (ARTIFACTS / "serve.png").stat().st_size > 10_000

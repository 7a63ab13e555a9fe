"""Fixtures of the page tests: the published demo templates and exported web model (once per session), a trace for
the link, and a headless Chromium (skipped with the reason when Chromium, playwright or the npm packages are absent)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ci_deps import import_or_skip, require_or_skip

from .page_driver import CHROMIUM, FLAGS, WEB, publish_page_store

TRACE = "walk110-1.5-0.3"  # a random walk around 1.5 Mbit/s, 1 s segments: the fp16 template takes seconds


@pytest.fixture(scope="session")
def page_store(tmp_path_factory):
    """(store, model dir, demo model, model index) of :func:`publish_page_store`."""
    require_or_skip(
        (WEB / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.min.mjs").is_file(),
        "phone_web's npm packages are not installed (run `npm ci` in phone_web/)",
    )
    return publish_page_store(tmp_path_factory.mktemp("web-edit"))


@pytest.fixture(scope="session")
def link_trace(tmp_path_factory):
    """A synthetic bandwidth trace written by ``sakura traces synth`` (the development set, seed 100)."""
    from sakura_core.cli import main
    from sakura_core.fetch.traces import load_trace

    out = tmp_path_factory.mktemp("traces")
    assert main(["traces", "synth", "--out", str(out)]) == 0
    return load_trace(out / f"{TRACE}.log")


@pytest.fixture
def chromium():
    """A headless Chromium (Debian's, driven by playwright), closed after the test."""
    require_or_skip(
        shutil.which(CHROMIUM) or Path(CHROMIUM).is_file(),
        f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)",
    )
    sync_api = import_or_skip("playwright.sync_api", "the page test needs playwright (pip install 'sakura-kv[test]')")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()

"""Screenshots of the phone page in each of its states, in a phone's viewport (412x915): ``choose`` (templates
listed, the form ready), ``running`` (an edit under way, its progress bar moving: the link held to a slow rate by
CDP), ``result`` (the edited image and the report) and ``error`` (a per-step template asked for other steps).

    PYTHONPATH=. .venv/bin/python -m tests.phone_web.page_screenshots docs/img   # ~1 min; writes phone-*.png

The PNGs are palette-reduced (64 colours) to stay small. ``tests/phone_web/test_page_states.py`` runs the same
steps and checks that no state scrolls sideways."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from PIL import Image

from .loopback import loopback_server
from .page_driver import (
    CHROMIUM,
    FLAGS,
    PER_STEP_ID,
    PHOTO_NAME,
    STEPS,
    TEMPLATE_ID,
    fill_edit,
    finish_edit,
    open_page,
    publish_page_store,
    recording_app,
)

__all__ = ["STATES", "page_states"]

STATES = ("choose", "running", "result", "error")
SLOW_BYTES_PER_S = 40_000  # the link while "running" is taken: the fp16 template's fetch lasts seconds
SHOW = """() => ({state: document.getElementById('status').dataset.state || 'choose',
  scroll: document.documentElement.scrollWidth, width: document.documentElement.clientWidth,
  progress: document.getElementById('progress').value, phase: document.getElementById('phase').textContent})"""


def _shot(page, out: Path, name: str) -> dict:
    path = out / f"phone-{name}.png"
    page.screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)
    return page.evaluate(SHOW) | {"file": str(path)}


def page_states(browser, base: str, out: Path, photo: Path) -> dict[str, dict]:
    """Drive the page at ``base`` through :data:`STATES`, a screenshot of each into ``out``; per state what the page
    showed (``state``, ``scroll`` and ``width`` in CSS px, ``progress``, ``phase``, ``file``)."""
    out.mkdir(parents=True, exist_ok=True)
    page = open_page(browser, f"{base}/phone")
    shown = {"choose": _shot(page, out, "choose")}
    fill_edit(page, photo, TEMPLATE_ID)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {
            "offline": False,
            "latency": 40,
            "downloadThroughput": SLOW_BYTES_PER_S,
            "uploadThroughput": SLOW_BYTES_PER_S,
        },
    )
    page.click("#go")
    page.wait_for_function(
        "document.getElementById('phase').textContent.startsWith('fetched') "
        "&& document.getElementById('progress').value >= 2",
        timeout=60_000,
    )
    shown["running"] = _shot(page, out, "running")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    finish_edit(page)
    shown["result"] = _shot(page, out, "result")
    fill_edit(page, photo, PER_STEP_ID, steps=STEPS + 1)
    page.click("#go")
    page.wait_for_function("document.getElementById('status').dataset.state === 'error'", timeout=60_000)
    shown["error"] = _shot(page, out, "error")
    page.close()
    return shown


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    from sakura_core.models.edit_model import load_image

    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("out", type=Path, help="folder for the PNGs (docs/img)")
    out = args.parse_args(argv).out
    with tempfile.TemporaryDirectory() as tmp:
        store, model_dir, model, _ = publish_page_store(Path(tmp))
        photo = Path(tmp) / PHOTO_NAME
        Image.fromarray(load_image("chelsea", model.spec.image_size)).save(photo)
        with loopback_server(recording_app(store, model_dir, [])) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            try:
                shown = page_states(browser, base, out, photo)
            finally:
                browser.close()
    for name, s in shown.items():
        sys.stdout.write(
            f"{name}: {s['file']} ({Path(s['file']).stat().st_size} B), scroll {s['scroll']}/{s['width']} px\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

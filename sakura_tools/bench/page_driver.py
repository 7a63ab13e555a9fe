"""The phone page driven in headless Chromium for ``sakura bench e2e --mode page``: :class:`PageBench` opens
``/phone`` of a local ``sakura serve --phone-model``, picks a photo, template, steps and policy as a user would, and
runs one edit with the link shaped from a trace (:class:`.page_link.TraceLink`) and the CPU throttled through CDP
(``Emulation.setCPUThrottlingRate``); it returns the page's report (``runEdit``'s: timeline, decisions, busy_s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .page_link import TraceLink

__all__ = ["CHROMIUM", "PageBench"]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise SystemExit(
            f"sakura bench e2e --mode page drives the page with playwright, which is not installed "
            f"({e}): pip install playwright (Chromium itself: {CHROMIUM}, or set $CHROMIUM)"
        ) from e
    if not Path(CHROMIUM).is_file():
        raise SystemExit(
            f"sakura bench e2e --mode page: no Chromium at {CHROMIUM} (apt-get install chromium, or set "
            f"$CHROMIUM to its path)"
        )
    return sync_playwright


class PageBench:
    """One headless Chromium and one phone-sized page at ``url`` (``/phone`` of the server), used for every edit."""

    def __init__(self, url: str, photo: Path, prompt: str, seed: int = 11, timeout_s: float = 600.0):
        self._pw = _sync_playwright()().start()
        try:
            self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            self.page = self.browser.new_page(viewport={"width": 412, "height": 915})
            self.page.goto(url)
            self.page.wait_for_function(
                "document.getElementById('status').dataset.ep || "
                "document.getElementById('status').dataset.state === 'error'",
                timeout=120_000,
            )
            self._check()
            self.page.set_input_files("#photo", str(photo))
            self.page.wait_for_function("document.getElementById('input').dataset.loaded === 'true'", timeout=60_000)
            self.page.fill("#prompt", prompt)
            self.page.fill("#seed", str(seed))
            self.cdp = self.page.context.new_cdp_session(self.page)
        except BaseException:
            self.close()
            raise
        self.timeout_s = timeout_s

    def _check(self) -> None:
        status = self.page.locator("#status")
        if status.get_attribute("data-state") == "error":
            raise RuntimeError(f"the page failed: {status.text_content()}")

    def edit(
        self,
        template_id: str,
        policy: str,
        steps: int,
        trace=None,
        cpu_throttle: float = 4.0,
        latency_ms: float = 40.0,
    ) -> dict:
        """One edit with ``policy`` ("on-device" | "fetch-fp16" | "sakura"); ``trace`` None: an unshaped link."""
        page = self.page
        page.fill("#steps", str(steps))
        page.select_option("#template", template_id)
        page.wait_for_function(
            f"document.getElementById('level').dataset.template === {json.dumps(template_id)}", timeout=30_000
        )
        page.select_option("#policy", policy)
        page.evaluate("document.getElementById('status').dataset.state = 'ready'")
        done = lambda: page.evaluate(  # noqa: E731
            "['done', 'error'].includes(document.getElementById('status').dataset.state)"
        )
        self.cdp.send("Emulation.setCPUThrottlingRate", {"rate": cpu_throttle})
        try:
            if trace is None:
                page.click("#go")
                page.wait_for_function(
                    "['done', 'error'].includes(document.getElementById('status').dataset.state)",
                    timeout=self.timeout_s * 1000,
                )
            else:
                TraceLink(page, self.cdp, trace, latency_ms=latency_ms).run(
                    lambda: page.click("#go"), done, timeout_s=self.timeout_s
                )
        finally:
            self.cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
        self._check()
        return json.loads(page.locator("#report").text_content())

    def close(self) -> None:
        browser = getattr(self, "browser", None)
        if browser is not None:
            browser.close()
        self._pw.stop()

"""A page's link shaped by CDP from a bandwidth trace (the page tests' and ``sakura bench e2e --mode page``'s):
:class:`TraceLink` replays a trace (``sakura traces synth``'s piecewise-constant rates,
:class:`sakura_core.fetch.traces.Trace`) by sending ``Network.emulateNetworkConditions`` at each segment boundary
while the page works, and keeps what it applied (the test reads it back)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sakura_core.fetch.traces import Trace

__all__ = ["TraceLink"]


class _Page(Protocol):
    """What :class:`TraceLink` uses of a Playwright page."""

    def wait_for_timeout(self, timeout: float) -> None: ...


class _Cdp(Protocol):
    """What :class:`TraceLink` uses of a Playwright CDP session."""

    def send(self, method: str, params: dict[str, Any] | None = None) -> Any: ...


@dataclass
class TraceLink:
    """Replays ``trace`` on ``cdp`` (a CDP session of ``page``), one-way ``latency_ms`` on every request, each segment
    lasting ``time_scale`` times its duration (0.25: the trace's rate changes four times as often, so a short edit
    still meets several).

    ``applied`` lists (seconds since start, bytes per second) of each update sent; the trace repeats when the page
    outlives it (as :class:`Trace` does)."""

    page: _Page
    cdp: _Cdp
    trace: Trace
    latency_ms: float = 40.0
    time_scale: float = 1.0
    poll_ms: int = 50
    applied: list[tuple[float, float]] = field(default_factory=list)

    def _send(self, rate_bytes_per_s: float) -> None:
        self.cdp.send(
            "Network.emulateNetworkConditions",
            {
                "offline": False,
                "latency": self.latency_ms,
                "downloadThroughput": rate_bytes_per_s,
                "uploadThroughput": rate_bytes_per_s,
            },
        )

    def run(self, begin: Callable[[], object], done: Callable[[], bool], timeout_s: float = 180.0) -> None:
        """Shape the link segment by segment: ``begin()`` once the first segment holds (press Edit), then until
        ``done()`` (polled every ``poll_ms`` in the page's own event loop, so Playwright's calls stay on this
        thread); the shaping is lifted at the end."""
        self.cdp.send("Network.enable")
        # the shards are immutable and cacheable: from the browser's cache an edit's transfers would skip the link
        self.cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        t0 = time.monotonic()
        segment = 0
        try:
            while True:
                i = segment % len(self.trace.durations_s)
                rate = float(self.trace.rates_bytes_per_s[i])
                self._send(rate)
                self.applied.append((time.monotonic() - t0, rate))
                if segment == 0:
                    begin()
                end = time.monotonic() + float(self.trace.durations_s[i]) * self.time_scale
                while time.monotonic() < end:
                    if done():
                        return
                    if time.monotonic() - t0 > timeout_s:
                        raise TimeoutError(f"the page did not finish within {timeout_s} s of trace {self.trace.name}")
                    self.page.wait_for_timeout(self.poll_ms)
                segment += 1
        finally:
            self.cdp.send(
                "Network.emulateNetworkConditions",
                {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            )
            self.cdp.send("Network.setCacheDisabled", {"cacheDisabled": False})

    def fastest_bytes_per_s(self) -> float:
        """The fastest rate any applied segment allowed (a bound: no transfer beat it)."""
        return max(rate for _, rate in self.applied)

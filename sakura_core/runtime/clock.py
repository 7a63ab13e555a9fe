"""The clock the live runtime reads and waits on (:class:`Clock`), injectable so tests control time: the wall
clock by default (:class:`WallClock`); a test's clock that moves only when the test (or a wait) moves it makes the
times the policies see independent of machine load."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "WallClock"]


class Clock(Protocol):
    """``now()``: seconds on a monotonic clock; ``wait(event, timeout_s)``: wait for ``event`` at most
    ``timeout_s`` seconds of this clock, True when it is set (``threading.Event.wait``'s contract)."""

    def now(self) -> float: ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool: ...


class WallClock:
    """``time.monotonic`` and ``threading.Event.wait``."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(timeout_s)

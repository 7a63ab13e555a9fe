"""A controlled clock for the live pipeline's tests (a ``PipelinedEdit``'s ``RunControls(clock=)``): time moves only
when a test moves it or a wait times out, so what the policies see does not depend on how loaded the machine is."""

from __future__ import annotations

import threading

import pytest


class ManualClock:
    """A :class:`~sakura_core.runtime.clock.Clock` whose time moves only by :meth:`advance` and by waits that time
    out: ``wait(event, timeout_s)`` gives the other threads ``real_slice_s`` of real time to set ``event`` (True,
    the clock unmoved), else moves the clock by ``timeout_s`` at once (False). So a stall of the compute lane lasts
    a whole number of its polls, however long the machine takes to run the lanes."""

    def __init__(self, real_slice_s: float = 0.01) -> None:
        self.real_slice_s = real_slice_s
        self._t = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, dt_s: float) -> None:
        with self._lock:
            self._t += dt_s

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        if event.wait(min(self.real_slice_s, max(timeout_s, 0.0))):
            return True
        self.advance(max(timeout_s, 0.0))
        return False


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()

"""The in-process shaper follows the trace byte for byte (fake clock: no wall-clock assertions)."""

import numpy as np
import pytest

from sakura_core.fetch.shaper import ShaperConfig, TraceShaper
from sakura_core.fetch.traces import Trace


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    async def sleep(self, s):
        assert s >= 0
        self.t += s


async def test_paced_transfer_ends_when_the_trace_has_delivered_the_bytes():
    trace = Trace("step", np.array([1.0, 1.0]), np.array([1000.0, 4000.0]))  # 1 kB/s then 4 kB/s
    clock = FakeClock()
    shaper = TraceShaper(trace, ShaperConfig(burst_bytes=0), clock=clock, sleep=clock.sleep)
    for _ in range(30):  # 3000 bytes in 100-byte chunks
        await shaper.throttle(100)
    assert clock.t == pytest.approx(1.0 + 2000 / 4000)
    assert shaper.bytes_total == 3000


async def test_idle_capacity_is_lost_except_the_burst():
    trace = Trace.constant(0.008)  # 1000 B/s
    clock = FakeClock()
    shaper = TraceShaper(trace, ShaperConfig(burst_bytes=200), clock=clock, sleep=clock.sleep)
    await shaper.throttle(1000)
    assert clock.t == pytest.approx(1.0)
    clock.t += 10.0  # idle: 10 kB of capacity unused
    await shaper.throttle(1200)
    assert clock.t == pytest.approx(11.0 + 1.0)  # only 200 B of burst credit


async def test_start_offset_and_latency():
    trace = Trace("t", np.array([5.0, 5.0]), np.array([100.0, 1000.0]), latency_ms=50)
    clock = FakeClock()
    shaper = TraceShaper(trace, ShaperConfig(start_offset_s=5.0, burst_bytes=0), clock=clock, sleep=clock.sleep)
    await shaper.request_latency()
    assert clock.t == pytest.approx(0.1)
    await shaper.throttle(1000)
    assert clock.t == pytest.approx(1.1)


def test_config_errors_name_the_values():
    with pytest.raises(ValueError, match="must be >= 0"):
        ShaperConfig(rtt_s=-1)

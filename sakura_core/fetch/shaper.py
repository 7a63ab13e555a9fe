"""In-process link shaping: a trace-driven pacer for the client's read loop, plus user-space latency.

``TraceShaper.throttle(nbytes)`` is awaited before each received chunk is counted (``ShardClient`` takes it as
``throttle=``). The link is a FIFO that follows the trace: bytes are delivered no earlier than the trace allows
after the previous bytes, and capacity nobody used is lost (no burst credit beyond ``burst_bytes``). Clock and
sleep are injected, so tests and simulations are deterministic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .traces import Trace

__all__ = ["ShaperConfig", "TraceShaper"]


@dataclass(frozen=True)
class ShaperConfig:
    """Attributes:
    start_offset_s: where in the trace the link starts (seconds).
    burst_bytes: bytes that may pass without waiting after an idle period (token-bucket depth).
    rtt_s: round trip added before each request's first byte when the trace has no latency of its own.
    """

    start_offset_s: float = 0.0
    burst_bytes: int = 16 * 1024
    rtt_s: float = 0.04

    def __post_init__(self) -> None:
        if self.start_offset_s < 0 or self.burst_bytes < 0 or self.rtt_s < 0:
            raise ValueError(
                f"start_offset_s, burst_bytes and rtt_s must be >= 0, got "
                f"{self.start_offset_s}, {self.burst_bytes}, {self.rtt_s}"
            )


class TraceShaper:
    """Paces bytes to follow ``trace``. One shaper = one link (share it between the requests of one device)."""

    def __init__(
        self,
        trace: Trace,
        config: ShaperConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.trace = trace
        self.config = config or ShaperConfig()
        self._clock = clock
        self._sleep = sleep
        self.reset()

    def reset(self) -> None:
        self._t0: float | None = None
        self._busy_until = 0.0  # link time (s since t0) when the last accepted byte is delivered
        self.bytes_total = 0

    @property
    def rtt_s(self) -> float:
        return self.trace.round_trip_s(self.config.rtt_s)

    def _elapsed(self) -> float:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        return now - self._t0

    async def request_latency(self) -> None:
        """Await one round trip (user-space latency: netem is not available)."""
        self._elapsed()
        await self._sleep(self.rtt_s)

    async def throttle(self, nbytes: int) -> None:
        """Wait until the trace has delivered these ``nbytes`` after everything before them."""
        if nbytes <= 0:
            return
        now = self._elapsed()
        off = self.config.start_offset_s
        start = max(now, self._busy_until)
        if start == now and self._busy_until < now:  # idle link: a small burst passes at once
            credit = min(self.config.burst_bytes, self.trace.bytes_between(off + self._busy_until, off + now))
            nbytes_paced = max(0.0, nbytes - credit)
        else:
            nbytes_paced = nbytes
        end = self.trace.finish_time(off + start, nbytes_paced) - off
        self._busy_until = end
        self.bytes_total += nbytes
        if end > now:
            await self._sleep(end - now)

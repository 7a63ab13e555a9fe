"""What a fetch policy may look at: :class:`Context`, one view over the simulator's state and over the live
pipeline's, so the same policy code runs in both. Times are seconds from the start of the edit."""

from __future__ import annotations

import threading
import time

from ..fetch.estimator import ThroughputEstimator
from ..fetch.traces import Trace
from .ladder import Level
from .profiles import DeviceProfile

__all__ = ["Context", "LiveState"]


class Context:
    """What a policy may look at (see fetch/policies.py). Times are seconds from the start of the edit."""

    def __init__(self, sim):  # the simulator (_Sim) or the live pipeline (LiveState)
        self._s = sim

    # static
    @property
    def profile(self) -> DeviceProfile:
        return self._s.profile

    @property
    def num_layers(self) -> int:
        return self._s.L

    @property
    def floor(self) -> int:
        return self._s.floor

    @property
    def estimator(self) -> ThroughputEstimator:
        self._s.flush_observations()
        return self._s.estimator

    @property
    def trace(self) -> Trace:
        return self._s.trace

    def ladder(self, layer: int) -> list[Level]:
        return self._s.ladders[layer]

    @property
    def trace_offset_s(self) -> float:
        """Where on the trace the edit started: the link at edit time ``t`` is the trace at ``offset + t``."""
        return float(getattr(self._s, "start_s", 0.0))

    def link_rate_now(self) -> float:
        """The trace's rate (bytes/s) at ``now``, on the simulator's clock (start offset included)."""
        return self._s.trace.rate_at(self.trace_offset_s + self._s.now)

    # dynamic
    @property
    def now(self) -> float:
        return self._s.now

    @property
    def template_alive(self) -> bool:
        return self._s.template_alive

    @property
    def compute_layer(self) -> int:
        return self._s.compute_layer

    @property
    def latency_target_s(self) -> float | None:
        """The user's latency target for the whole edit (seconds), or None."""
        return self._s.latency_target_s

    def predicted_finish(self, rate: float | None) -> float:
        """Predicted end of the whole edit (all steps) from here, shards at the floor level."""
        p, c = self.profile, self._s.compute_layer
        drop = self.best_drop(c, rate) if self._s.template_alive else c
        step0 = self.predicted_step0_finish(c, drop, rate)
        return step0 + (p.model.steps - 1) * self.num_layers * p.layer_cached_s + p.fixed_s

    @property
    def decided_upto(self) -> int:
        return self._s.next_layer

    def ready(self, layer: int) -> bool:
        got = self._s.got.get(layer)
        return bool(got) and got[0][1] <= self._s.now

    def fetched_levels(self) -> dict[int, int]:
        return {layer: max(lv for lv, _ in got) for layer, got in self._s.got.items() if got}

    def fmt_rate(self, rate: float | None) -> str:
        return "exact trace" if rate is None else f"{rate * 8 / 1e6:.2f} Mbit/s"

    def transfer_end(self, start: float, nbytes: float, rate: float | None) -> float:
        """When ``nbytes`` requested at ``start`` arrive: RTT + bytes at ``rate`` (None = the real trace)."""
        t0 = start + self._s.rtt_s
        if rate is None:  # the trace is read at offset + t, like the simulator's own transfers
            off = self.trace_offset_s
            return self._s.trace.finish_time(off + t0, nbytes) - off
        return t0 + nbytes / rate

    def predict_ready(self, layer: int, level: Level, rate: float | None) -> float:
        arrive = self.transfer_end(max(self._s.link_free, self._s.now), level.nbytes, rate)
        return max(arrive, self._s.decoder_free) + level.decode_s

    def expected_ready(self, layer: int, rate: float | None) -> float:
        """Predicted decode time of ``layer``'s first level (queued behind the shards before it at the floor)."""
        got = self._s.got.get(layer)
        if got:
            return got[0][1]
        if layer in self._s.in_flight:
            return self._s.in_flight[layer]
        t = max(self._s.link_free, self._s.now)
        for x in range(self._s.next_layer, layer + 1):
            t = self.transfer_end(t, self.ladder(x)[self.floor].nbytes, rate)
        return max(t, self._s.decoder_free) + self.ladder(layer)[self.floor].decode_s

    def predicted_step0_finish(self, layer: int, drop: int, rate: float | None) -> float:
        """Predicted end of step 0 if compute (now at ``layer``) keeps the template up to ``drop`` and then uses
        shards; shards not yet requested are fetched from ``drop`` on, back to back, at the floor level."""
        p, s = self.profile, self._s
        t = s.now + (drop - layer) * p.layer_full_s
        link = max(s.link_free, s.now)
        dec = s.decoder_free
        for x in range(drop, self.num_layers):
            got = s.got.get(x)
            if got:
                ready = got[0][1]
            elif x in s.in_flight:
                ready = s.in_flight[x]
            else:
                lv = self.ladder(x)[self.floor]
                link = self.transfer_end(link, lv.nbytes, rate)
                dec = max(link, dec) + lv.decode_s
                ready = dec
            t = max(t, ready) + p.layer_cached_s
        return t

    def best_drop(self, layer: int, rate: float | None) -> int:
        """The drop point (>= ``layer``) with the earliest predicted step-0 finish."""
        finishes = [self.predicted_step0_finish(layer, d, rate) for d in range(layer, self.num_layers + 1)]
        return layer + min(range(len(finishes)), key=finishes.__getitem__)

    def template_eta(self, layer: int) -> float:
        """When compute reaches ``layer`` if it keeps running the template tokens from where it is."""
        return self._s.compute_t + max(0, layer - self._s.compute_layer) * self.profile.layer_full_s

    def deadline(self, layer: int) -> float:
        """When compute reaches ``layer`` running without the template (no stalls), at step 0."""
        p = self.profile
        c = self._s.compute_layer
        extra = p.layer_full_s if self._s.template_alive else p.layer_cached_s
        return self._s.compute_t + (extra if layer > c else 0.0) + max(0, layer - c - 1) * p.layer_cached_s


class LiveState:
    """What Context reads, kept by the running pipeline (times in seconds since the edit started)."""

    def __init__(self, profile, trace, ladders, floor, estimator, rtt_s, latency_target_s=None):
        self.profile, self.trace, self.ladders, self.floor = profile, trace, ladders, floor
        self.L = len(ladders)
        self.estimator, self.rtt_s = estimator, rtt_s
        self.latency_target_s = latency_target_s
        self.start_s = 0.0  # the live link starts its trace at the edit's start
        self.t0 = time.monotonic()
        self.link_free = 0.0
        self.decoder_free = 0.0
        self.next_layer = 0
        self.base_done = False
        self.got: dict[int, list[tuple[int, float]]] = {}
        self.in_flight: dict[int, float] = {}
        self.template_alive = True
        self.compute_t = 0.0
        self.compute_layer = 0
        self.lock = threading.RLock()

    @property
    def now(self) -> float:
        return time.monotonic() - self.t0

    def flush_observations(self) -> None:
        """Live transfers are observed when they complete; nothing is pending."""

"""What a fetch policy may look at: :class:`Context`, one typed view over a :class:`PolicyState` — the simulator's
state or the live pipeline's (:class:`~sakura_core.runtime.live_state.LiveState`) — so the same policy code runs in
both. Times are seconds since the edit started, sizes bytes, rates bytes/s."""

from __future__ import annotations

import numpy as np

from ..fetch.traces import Trace
from .estimator import ThroughputEstimator
from .ladder import Level, fetch_bytes, levels_from, shard_floor
from .state import _STATE_MEMBERS, ComputeCosts, PolicyState

__all__ = ["ComputeCosts", "Context", "PolicyState"]


class Context:
    """What a policy may look at: a read-only, typed view of a :class:`PolicyState` plus the predictions the
    policies share. Times are seconds since the edit started; rates are bytes/s, or None for "exact transfer
    times from the trace" (the oracle)."""

    def __init__(self, state: PolicyState):
        missing = [name for name in _STATE_MEMBERS if not hasattr(state, name)]
        if missing:
            raise TypeError(
                f"{type(state).__name__} is not a PolicyState: it lacks {', '.join(missing)}; "
                "give it those attributes (see sakura_core.policy.context.PolicyState)"
            )
        self._s = state
        self._floor_arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._floor_off: np.ndarray | None = None
        self._per_step: bool | None = None

    # static
    @property
    def profile(self) -> ComputeCosts:
        return self._s.profile

    @property
    def num_layers(self) -> int:
        return len(self._s.ladders)

    @property
    def floor(self) -> int | list[int]:
        """The state's quality floor: one index for every ladder, or one per shard (policies ask :meth:`floor_of`)."""
        return self._s.floor

    def floor_of(self, shard: int) -> int:
        """Index of shard ``shard``'s quality floor in its ladder."""
        return shard_floor(self._s.floor, shard)

    def levels_from_floor(self, shard: int) -> list[int]:
        """The levels a policy may pick for ``shard`` (:func:`~sakura_core.policy.ladder.levels_from`)."""
        return levels_from(self._s.ladders[shard], self.floor_of(shard))

    @property
    def estimator(self) -> ThroughputEstimator:
        """The throughput estimator, fed with every transfer completed by ``now``."""
        self._s.flush_observations()
        return self._s.estimator

    @property
    def trace(self) -> Trace | None:
        return self._s.trace

    @property
    def has_trace(self) -> bool:
        """The link's future is known (a trace: the simulator, or a live link shaped by a trace); False on a live
        link, where a rule that reads the link gets the estimator's rate instead (never a made-up constant)."""
        return self._s.trace is not None

    def ladder(self, layer: int) -> list[Level]:
        """Shard ``layer``'s levels, cheapest first."""
        return self._s.ladders[layer]

    def floor_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(bytes as planned, decode seconds) of every shard's floor level, (shards,) arrays made once; read-only."""
        if self._floor_arrays is None:
            fl, lads = self._s.floor, self._s.ladders
            floor = [lad[shard_floor(fl, g)] for g, lad in enumerate(lads)]
            nb, dec = (np.array([getattr(v, a) for v in floor], dtype=float) for a in ("expected_nbytes", "decode_s"))
            reuse = np.array([lv.reuse for lv in floor], dtype=bool)
            nb.flags.writeable = dec.flags.writeable = reuse.flags.writeable = False
            self._floor_arrays, self._floor_reuse = (nb, dec), reuse
        return self._floor_arrays

    def floor_off_track_bytes(self) -> np.ndarray:
        """(shards,) bytes of every shard's floor when fetched off its twins' track (its reference, the same layer a
        step earlier, not held on that track: computed on the device, or fetched at another level), i.e. the open-loop
        floor :func:`~sakura_core.policy.ladder.fetch_as` takes then; the planned bytes where the floor has no twin."""
        if self._floor_off is None:
            fl, lads = self._s.floor, self._s.ladders
            nb = np.array([fetch_bytes(lad, shard_floor(fl, g), False) for g, lad in enumerate(lads)], dtype=float)
            nb.flags.writeable = False
            self._floor_off = nb
        return self._floor_off

    def off_track(self, step: int, requested: np.ndarray) -> np.ndarray:
        """(layers,) bool: layer l of ``step`` is fetched off its twins' track as things stand — its reference
        (``step - 1``, l) is neither requested (``requested``: (shards,) bool, decoded or on its way; one on its way
        counts as on the track) nor held at its floor level, the track's (a floor fetched on the track is held at
        the floor's own index, off it at the open-loop floor's). Step 0 has no reference: never off."""
        L = self.layers_per_step
        out = np.zeros(L, dtype=bool)
        if not self.per_step or step <= 0:
            return out
        got = self._s.got
        for layer in range(L):
            ref = (step - 1) * L + layer
            held = got.get(ref)
            if held:  # the highest level held is what the next step's twin would be decoded against
                out[layer] = max(lv for lv, _ in held) != self.floor_of(ref)
            else:
                out[layer] = not requested[ref]
        return out

    @property
    def reroots(self) -> bool:
        """The runtime fetches a shard's re-root chain before it where the policy names one
        (:meth:`~sakura_core.policy.base.Policy.reroot_chain`; the simulator and the live lanes do): plans may price
        it. A state without the attribute does not."""
        return bool(getattr(self._s, "reroots", False))

    def floor_reuses(self) -> np.ndarray:
        """(shards,) bool: the shard's floor is a ``reuse`` rung (no request, no round trip, no decode)."""
        self.floor_arrays()  # made there, with the floor arrays
        return self._floor_reuse

    # dynamic
    @property
    def now(self) -> float:
        """Seconds since the edit started."""
        return self._s.now

    @property
    def template_alive(self) -> bool:
        return self._s.template_alive

    @property
    def stalled_s(self) -> float:
        """Seconds the compute lane has waited for shards so far (the wait in progress included)."""
        return float(self._s.stalled_s)

    @property
    def fetch_nothing_s(self) -> float:
        """Predicted latency of the edit fetching nothing: every template KV it uses made on the device, then the
        steps with it (``on-device-cached`` in single mode, ``on-device`` in per-step mode)."""
        p = self.profile
        return self.template_work_s + self.steps * self.layers_per_step * p.layer_cached_s + p.fixed_s

    def resume_pass_s(self, from_layer: int | None = None) -> float:
        """Seconds of the device's fallback template pass: the template tokens from layer ``from_layer`` of the step
        (default: where this step's template was dropped; the device kept their hidden state there) to the last
        layer — not a whole pass."""
        L = self.layers_per_step
        k = self._s.dropped_at if from_layer is None else from_layer
        return self.profile.template_pass_s * (L - min(max(int(k), 0), L)) / L

    @property
    def compute_layer(self) -> int:
        return self._s.compute_layer

    @property
    def latency_target_s(self) -> float | None:
        """The user's latency target for the whole edit (seconds), or None."""
        return self._s.latency_target_s

    @property
    def decided_upto(self) -> int:
        """Shards below this index have had their fetch decision."""
        return self._s.next_layer

    def ready(self, layer: int) -> bool:
        """Shard ``layer`` has a level decoded by ``now``."""
        got = self._s.got.get(layer)
        return bool(got and got[0][1] <= self._s.now)

    def fetched_levels(self) -> dict[int, int]:
        """``layer -> highest level fetched`` (decoded or not: a state whose ``got`` shows decoded levels only
        provides ``fetched_levels()`` itself, with the levels requested and still decoding)."""
        fast = getattr(self._s, "fetched_levels", None)
        if fast is not None:
            return fast()
        return {layer: max(lv for lv, _ in got) for layer, got in self._s.got.items() if got}

    @property
    def layers_per_step(self) -> int:
        """Model layers L (see :attr:`PolicyState.layers_per_step`)."""
        return int(self._s.layers_per_step)

    @property
    def per_step(self) -> bool:
        """The KV is per (step, layer): shard g serves step ``g // L`` only and the template restarts every step."""
        if self._per_step is None:  # fixed for the edit (the ladders and L are)
            self._per_step = len(self._s.ladders) > self.layers_per_step
        return self._per_step

    def step_of(self, shard: int) -> int:
        """The denoising step shard ``shard`` (= step * L + layer) belongs to (0 in single mode)."""
        return shard // self.layers_per_step if self.per_step else 0

    def layer_of(self, shard: int) -> int:
        """The model layer of shard ``shard``."""
        return shard % self.layers_per_step

    @property
    def steps(self) -> int:
        """Denoising steps of the edit."""
        return int(self.profile.model.steps)

    @property
    def template_work_s(self) -> float:
        """Seconds the device needs for every template KV the edit uses: one template pass (single mode), one per
        step (per-step mode)."""
        return self.profile.template_pass_s * (self.steps if self.per_step else 1)

    @property
    def compute_t(self) -> float:
        """When the compute lane starts ``compute_layer``, seconds."""
        return float(self._s.compute_t)

    @property
    def rtt_s(self) -> float:
        """Round trip charged per request in predictions, seconds."""
        return float(self._s.rtt_s)

    @property
    def queued_rtt_s(self) -> float:
        """Round trip a request pays when it follows a transfer in progress: :attr:`rtt_s` when the link sends one
        request at a time, 0 when the lane sends requests ahead (``request_ahead``: a queued request's bytes follow
        the last byte of the one before; a request to an idle link still pays the round trip)."""
        return 0.0 if getattr(self._s, "request_ahead", False) else self.rtt_s

    def known_ready(self, shard: int) -> float | None:
        """Decoded-at time of ``shard``'s first level if decoded by now, else its predicted ready time if it was
        requested, else None (never the true future arrival)."""
        got = self._s.got.get(shard)
        if got and got[0][1] <= self._s.now + 1e-12:
            return float(got[0][1])
        pred = self._s.in_flight.get(shard)
        return None if pred is None else float(pred)

    def known_ready_array(self) -> np.ndarray:
        """:meth:`known_ready` of every shard as a (shards,) array, NaN where None (a fresh array). A state may
        provide it itself (``known_ready_array()``, same meaning) when it can do so without a dict per shard."""
        fast = getattr(self._s, "known_ready_array", None)
        if fast is not None:
            return fast()
        out = np.full(self.num_layers, np.nan)
        now = self._s.now + 1e-12
        for g, t in self._s.in_flight.items():
            out[g] = t
        for g, got in self._s.got.items():
            if got and got[0][1] <= now:
                out[g] = got[0][1]
        return out

    def pending_shards(self) -> list[int]:
        """Shards requested and not decoded by now, in shard order."""
        return sorted(g for g in self._s.in_flight if not self.ready(g))

    def link_progress(self) -> tuple[float, float, float] | None:
        """The transfer in progress: (seconds since requested, bytes received so far, its size), or None (idle link,
        or a state that does not report progress)."""
        fn = getattr(self._s, "link_progress", None)
        return fn() if fn is not None else None

    def slowed(self, rate: float) -> float:
        """``rate`` (bytes/s), lowered to the in-progress transfer's rate when that transfer is overdue under it:
        a stall is seen while it lasts, not only when the transfer finally completes."""
        prog = self.link_progress()
        if prog is None or prog[0] <= self.rtt_s + prog[2] / rate:
            return rate
        return min(rate, max(prog[1], 1.0) / max(prog[0] - self.rtt_s, 1e-3))

    def first_byte_t(self) -> float:
        """When the first byte of a request sent now would come: a round trip from now, and no sooner than the
        transfers requested before it end (plus :attr:`queued_rtt_s`: sent one at a time, it leaves once they end)."""
        return max(self._s.now + self.rtt_s, self.link_busy_until() + self.queued_rtt_s)

    def link_busy_until(self) -> float:
        """Predicted end of the transfers already requested (seconds; ``now`` when none is pending)."""
        busy = [t for t in self._s.in_flight.values() if t > self._s.now]
        return max(busy, default=self._s.now)

    @property
    def trace_offset_s(self) -> float:
        """Where on the trace the edit started: the link at edit time ``t`` is the trace at ``offset + t``."""
        return float(self._s.start_s)

    def link_rate_now(self) -> float:
        """The trace's rate (bytes/s) at ``now``, on the edit's clock (start offset included); without a trace, the
        estimator's harmonic mean (what a client measures)."""
        if self._s.trace is None:
            return self.estimator.harmonic()
        return self._s.trace.rate_at(self.trace_offset_s + self._s.now)

    def fmt_rate(self, rate: float | None) -> str:
        return "exact trace" if rate is None else f"{rate * 8 / 1e6:.2f} Mbit/s"

    def transfer_end(self, start: float, nbytes: float, rate: float | None, rtt_s: float | None = None) -> float:
        """When ``nbytes`` requested at ``start`` (seconds) arrive: RTT (``rtt_s``, default :attr:`rtt_s`) + bytes at
        ``rate`` (None = the real trace). The one place where predictions read the trace."""
        t0 = start + (self._s.rtt_s if rtt_s is None else rtt_s)
        trace = self._s.trace
        if rate is None:  # the trace is read at offset + t, like the simulator's own transfers
            if trace is None:
                raise ValueError("exact transfer times need a trace; this link has none (use an estimated rate)")
            off = self.trace_offset_s
            return trace.finish_time(off + t0, nbytes) - off
        return t0 + nbytes / rate

    def transfer_chain(self, start: float, rtts_s: np.ndarray, nbytes: np.ndarray) -> list[float]:
        """:meth:`transfer_end` with exact transfer times chained: request ``i`` leaves ``rtts_s[i]`` after request
        ``i - 1`` has arrived (the first: after ``start``) and carries ``nbytes[i]``; when each arrives (seconds)."""
        if self._s.trace is None:
            raise ValueError("exact transfer times need a trace; this link has none (use an estimated rate)")
        return self._s.trace.finish_chain(start, rtts_s, nbytes, self.trace_offset_s)

    def predict_ready(self, layer: int, level: Level, rate: float | None) -> float:
        """When ``level`` of shard ``layer`` would be decoded if requested now (seconds): its bytes from
        :meth:`first_byte_t` (and no sooner than the link is free)."""
        start = max(self.first_byte_t(), self._s.link_free + self.rtt_s)
        arrive = self.transfer_end(start, level.expected_nbytes, rate, rtt_s=0.0)
        return max(arrive, self._s.decoder_free) + level.decode_s

    def template_eta(self, layer: int) -> float:
        """When compute reaches ``layer`` (seconds) if it keeps running the template tokens from where it is."""
        return self._s.compute_t + max(0, layer - self._s.compute_layer) * self.profile.layer_full_s

    def deadline(self, layer: int) -> float:
        """When compute reaches ``layer`` (seconds) running without the template from the next layer on (no stalls),
        at step 0: shard ``layer`` must be decoded by then."""
        p = self.profile
        c = self._s.compute_layer
        extra = p.layer_full_s if self._s.template_alive else p.layer_cached_s
        return self._s.compute_t + (extra if layer > c else 0.0) + max(0, layer - c - 1) * p.layer_cached_s

"""Discrete-event simulation of one edit at phone scale: fetch lane, decode lane, compute lane, over a trace.

SIMULATION: device times come from a :class:`~sakura_core.runtime.profiles.DeviceProfile`, shard sizes, decode
costs and distortions from codec measurements (``Level``); the link from a :class:`~sakura_core.fetch.traces.Trace`.
The fetch lane carries one transfer at a time (by default, ``request_ahead``, requests leave ahead of it within a
window of two round trips, so only a request to an idle link pays its RTT; without, one request at a time, each
paying one RTT after the transfer before); the decode lane is one thread; the
compute lane runs step 0 layer by layer (template tokens kept while the policy says so), then steps 1..S-1 with
every layer's KV, using at each step the best level decoded by its start.

KV modes (docs/design.md): ``single`` — one template KV per layer serves every step (step 0 is the hybrid forward,
steps 1..S-1 run cached). ``per-step`` — ``ladders`` has steps x layers shards (g = step * L + layer, execution order):
every step is a hybrid forward with its own split k_s (the template restarts at every step: ``template_alive`` is
true again and ``compute_layer`` = s * L when the compute lane enters step s, then ``keep_template(ctx, g)`` per layer
until it drops), the fetch lane asks ``choose(ctx, g)`` in order and so prefetches later steps' shards while
earlier steps compute; a policy that never fetches runs the template at every step (on-device). The mode follows
from the ladder count (L or steps x L). :func:`kv_mode_view` gives the geometry whose ``layers`` is the shard count
(what the ladders are built for).

What a policy sees (``got``, ``in_flight``) is what a live client knows: levels decoded by ``now``, and for shards
requested but not decoded a predicted ready time (the robust throughput estimate at request time), never the true
future arrival.

Quality is estimated with an additive distortion model: a layer fetched at level ``j`` for a fraction of the steps
contributes that fraction of ``Level.mse`` (the output MSE measured with every layer at level ``j``, divided by
the layer count); device-computed layers contribute nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..fetch.traces import Trace
from ..models.kv_types import KV_MODES
from ..policy.context import Context
from ..policy.estimator import ThroughputEstimator
from ..policy.ladder import Level
from ..policy.policies import Policy
from .deferral import LATE_FALLBACK_REASON, pass_stopped_reason
from .lane_rules import ask_keep_template, late_recheck_s, late_wait_until, pass_makes, pass_stops_after
from .live_profile import LiveProfile
from .pre_lanes import template_image_s
from .profiles import DeviceProfile
from .sim_cpu import PlanClock
from .sim_ladders import CACHEGEN_NO_FLOOR
from .sim_outcome import SimOutcome
from .sim_types import DiscardedEvents, SimConfig, SimResult

__all__ = ["KV_MODES", "SimConfig", "SimResult", "kv_mode_view", "simulate"]


def kv_mode_view(profile: DeviceProfile, kv_mode: str) -> DeviceProfile:
    """The profile the simulator runs for ``kv_mode``: itself for ``single``; for ``per-step`` the same device
    running a flattened model of steps x layers layers and one step (shard s*L + l = step s's KV of layer l)."""
    if kv_mode == "single":
        return profile
    if kv_mode != "per-step":
        raise ValueError(f"unknown kv_mode {kv_mode!r}; choose one of {', '.join(KV_MODES)}")
    g = profile.model
    flat = g.with_fields(name=f"{g.name}/per-step", layers=g.layers * g.steps, steps=1, double_layers=0)
    return profile.with_geometry(flat)


class _Sim(SimOutcome):
    def __init__(self, policy, trace, start_s, profile, ladders, floor, config, image_bytes=0):
        slowdown = float(getattr(profile, "cpu_slowdown", 1.0))
        self.policy = PlanClock(policy, config.planning, config.planning_s, slowdown)
        self.trace, self.profile = trace, profile
        if slowdown != 1.0:  # decode runs on the phone's CPU: its measured times scale with it
            ladders = [[_slowed(lv, slowdown) for lv in lad] for lad in ladders]
        self._init_cpu_share(float(getattr(profile, "dit_cpu_cores", 0)))
        self.ladders, self.floor, self.config = ladders, floor, config
        self.N = len(ladders)
        S, L = profile.model.steps, profile.model.layers
        self.per_step = S > 1 and self.N == S * L
        self.L = L if self.per_step else self.N  # shards of one step
        self.layers_per_step = self.L  # see PolicyState.layers_per_step
        self.rtt_s = trace.round_trip_s(config.rtt_s)
        self.request_ahead = config.request_ahead  # see Context.queued_rtt_s
        self.latency_target_s = config.latency_target_s
        self.estimator = ThroughputEstimator()
        self._start0, self.pre_lanes_s = start_s, self._template_image(trace, start_s, image_bytes)
        self.start_s = start_s + self.pre_lanes_s  # the lanes read the trace from where the template image ended
        self.pending_obs: list[tuple[float, int, float]] = []
        self.now = 0.0
        self.link_free = 0.0  # when the fetch lane makes its next decision (its next request may leave)
        self.wire_free = 0.0  # when the last transfer's bytes have all arrived
        self._wire_q: list[tuple[float, int, float]] = []  # transfers not arrived: (first byte, bytes, arrival)
        self.decoder_free = 0.0
        self.next_layer = 0
        self.base_done = False
        self.forced: list[int] = []
        self.skipped: set[int] = set()
        self.computed: set[int] = set()  # the policy computes them for good (lane_rules.ask_keep_template)
        self.deferred: list[int] = []  # skipped "for now": asked again when the link would idle
        self._got: dict[int, list[tuple[int, float]]] = {}  # layer -> [(level, ready_t)] in fetch order
        self.twins: set[tuple[int, int]] = set()  # (shard, level) fetched as the level's closed-loop twin
        # shard -> (request time + RTT: the earliest its bytes may start, bytes, true arrival), and when they started
        self._pred: dict[int, tuple[float, int, float]] = {}
        self._wire0: dict[int, float] = {}
        self._first_ready = np.full(self.N, np.inf)  # shard -> when its first level is decoded (true)
        self._pending: list[int] = []  # requested shards that may not be decoded yet, in request order
        self._req_t0: list[float] = []  # request times (when each shard's first request leaves), in order
        self._req_g: list[int] = []
        self.template_alive = True
        self.compute_t = 0.0
        self.compute_layer = 0
        self.bytes = 0
        self.events: list[dict] = [] if config.events else DiscardedEvents()
        self.decisions: list[dict] = []
        self.used: dict[int, list[int]] = {}  # layer -> the level it ran with at each step
        self.stall_s = 0.0
        self.split_layer = self.L
        self.splits: list[int] = []
        self.device_all = False  # a fallback template pass made every layer's KV on the device
        self.passed: dict[int, float] = {}  # per-step: shard -> when the compute lane was past it (its KV freed)
        self.step_started_t = 0.0  # when the compute lane entered its running step
        self.room_wait: tuple[int, int] | None = None  # (shard, level) chosen, waiting for prefetch room
        self.device_kv_at: dict[int, float] = {}  # shard -> when a fallback pass made its KV on the device
        self.ctx = Context(self)

    def _template_image(self, trace: Trace, start_s: float, nbytes: int) -> float:
        """Seconds the template image takes before the lanes start (``simulate``'s ``template_image_bytes``), the
        estimator seeded with it as the live edit seeds it (``ThroughputEstimator.seed``)."""
        seconds = template_image_s(trace, start_s, nbytes, self.rtt_s)
        if seconds > 0:
            self.estimator.seed(nbytes, seconds, self.rtt_s)
        return seconds

    @property
    def stalled_s(self) -> float:
        """See PolicyState.stalled_s (the simulator's waits advance in steps; each is added as it ends)."""
        return self.stall_s

    @property
    def dropped_at(self) -> int:
        """Where the compute lane's step dropped its template (``L`` while alive; see PolicyState.dropped_at)."""
        if self.template_alive:
            return self.L
        return self.splits[-1] if self.per_step else self.split_layer

    def run(self) -> SimResult:
        """Single mode: step 0 layer by layer (the split, stalls, a late-shard recompute), then steps 1..S-1 cached.
        Per-step mode: every step layer by layer with its own split; the result."""
        pol = self.policy
        pol.reset()
        if pol.kv_preloaded:
            for g in range(self.N):
                self._got[g] = [(len(self.ladders[g]) - 1, 0.0)]
            self.base_done = True
        if self.per_step:
            for step in range(self.profile.model.steps):
                self.template_alive, self.device_all = True, False
                self.splits.append(self.L)
                for layer in range(self.L):
                    self._step0_layer(step * self.L + layer)
            self.split_layer = self.splits[0]
            return self._result()
        for layer in range(self.L):
            self._step0_layer(layer)
        self.splits = [self.split_layer]
        for step in range(1, self.profile.model.steps):
            self._later_step(step)
        return self._result()

    def _compute(self, seconds: float, layer: int, level: str) -> None:
        """The compute lane runs for ``seconds`` from ``compute_t``."""
        self.events.append(
            {
                "lane": "compute",
                "start": self.compute_t,
                "end": self.compute_t + seconds,
                "layer": layer,
                "level": level,
            }
        )
        if self.cores:  # the busy segments only matter where the DiT shares the CPU (settle_contention)
            self._segs.append((self.compute_t, self.compute_t + seconds))
        self.compute_t += seconds

    def _charge_compute(self, layer: int) -> None:
        """The compute lane's own decision (``keep_template``, ``recompute_late``) took the phone this long."""
        owed = self.policy.take()
        if owed > 0:
            self._compute(owed, layer, "policy decision")

    def _step0_layer(self, layer: int) -> None:
        """Step 0 at ``layer``: keep the template tokens, or use this layer's KV (device-made or fetched)."""
        p, pol = self.profile, self.policy
        if self.per_step and layer > 0:
            self.passed[layer - 1] = self.compute_t  # as the live pipeline: a shard is freed once the lane is past it
        if layer % self.L == 0:
            self.step_started_t = self.compute_t
        self.compute_layer = layer
        self.advance_link(self.compute_t)
        self.settle_contention()
        self.now = self.compute_t
        if self.template_alive:
            keep = ask_keep_template(pol, self.ctx, layer, self.computed)
            self._charge_compute(layer)
            if keep:
                self._compute(p.layer_full_s, layer, "template")
                return
            self.template_alive = False
            self.split_layer = layer
            where = f"step {layer // self.L} layer {layer % self.L}" if self.per_step else f"layer {layer}"
            self.decisions.append(
                {"t": self.compute_t, "layer": layer, "level": "drop", "reason": f"template dropped at {where}"}
            )
            if self.per_step:
                self.splits[-1] = layer % self.L
        if not self.device_all and layer not in self.device_kv_at:
            self._wait_or_recompute(layer)
        if self.device_all or layer in self.device_kv_at:
            self._compute(p.layer_cached_s, layer, "cached")
            return
        self.used.setdefault(layer, []).append(self._level_run(layer))
        self._compute(p.layer_cached_s, layer, "cached")

    def _wait_or_recompute(self, layer: int) -> None:
        """The compute lane needs shard ``layer``: while it is not decoded, ask the policy (at the wait's start and
        again every cached-layer time of waiting, as the live lane: :func:`~.lane_rules.late_wait_until`) whether a
        template pass on the device is sooner; else stall. The simulator sets no ``shard_wait_s``."""
        t0, recheck_s = self.compute_t, late_recheck_s(self.profile.layer_cached_s)
        while not self.ready_by(layer, self.compute_t):
            self.now = self.compute_t
            late = self.policy.recompute_late(self.ctx, layer)
            self._charge_compute(layer)
            if late:
                self._fallback_pass(layer)
                return
            ready = self.wait_for(layer)
            until = min(ready, late_wait_until(t0, self.compute_t, recheck_s))
            if until > self.compute_t:
                self.events.append(
                    {
                        "lane": "stall",
                        "start": self.compute_t,
                        "end": until,
                        "layer": layer,
                        "level": "waiting for shard",
                    }
                )
                self.stall_s += until - self.compute_t
                self.compute_t = until
            self.advance_link(self.compute_t)

    def _fallback_pass(self, layer: int) -> None:
        """The device's template pass for late shard ``layer``: resumed where this step dropped the template tokens
        (their hidden state kept there), one layer at a time while the link keeps fetching. After each layer it stops
        once every shard the step still needs is made by it or decoded (:func:`~.lane_rules.pass_stops_after`): the step goes on with
        fetched KV. Run to the step's end, the device has every layer's KV and the link gives up this step."""
        L, k0 = self.L, self.dropped_at
        base = layer // L * L if self.per_step else 0
        what = f"fallback template pass from layer {k0}"
        self.decisions.append({"t": self.compute_t, "layer": layer, "level": "device", "reason": LATE_FALLBACK_REASON})
        e0, t0, stopped = len(self.events), self.compute_t, False
        for i in range(k0, L):
            self._compute(self.profile.template_pass_s / L, -1, what)
            if pass_makes(i, layer - base):
                self.device_kv_at[base + i] = self.compute_t
            self.advance_link(self.compute_t)
            self.settle_contention()
            self.now = self.compute_t
            if pass_stops_after(i, L, layer, base + L, self.device_kv_at.__contains__, self._ready_now):
                self.decisions.append(
                    {"t": self.compute_t, "layer": layer, "level": "fetched", "reason": pass_stopped_reason(i, L)}
                )
                stopped = True
                break
        # one event for the pass (its layers' events, between the link's, merged)
        self.events[e0:] = [e for e in self.events[e0:] if e["level"] != what]
        self.events.append({"lane": "compute", "start": t0, "end": self.compute_t, "layer": -1, "level": what})
        if stopped:
            return
        self.device_all = True
        if self.per_step:  # this step's KV is on the device now; the link moves on to the next step
            self.next_layer = max(self.next_layer, base + L)
            self.base_done = self.next_layer >= self.N
        else:
            self.base_done = True
            self.next_layer = self.L

    def _ready_now(self, g: int) -> bool:
        return self.ready_by(g, self.compute_t)

    def _later_step(self, step: int) -> None:
        """Steps 1..S-1: every layer with the best level decoded by the step's start (upgrades land between)."""
        p = self.profile
        self.advance_link(self.compute_t)
        self.settle_contention()
        cost = self.L * (p.layer_full_s if self.policy.template_every_step else p.layer_cached_s)
        for layer in range(self.split_layer, self.L):
            if layer in self.used:
                self.used[layer].append(self._level_run(layer))
        self._compute(cost, -1, f"step {step}")

    def _level_run(self, layer: int) -> int:
        """The level shard ``layer`` runs with now (the best decoded by ``compute_t``; the lane waited for one)."""
        level = self.level_at(layer, self.compute_t)
        if level is None:
            raise RuntimeError(f"simulation: shard {layer} runs at t={self.compute_t:.4f} s with no level decoded")
        return level


def _slowed(lv, slowdown: float):
    """``lv`` (and its closed-loop twin) decoded ``slowdown`` times slower."""
    closed = None if lv.closed is None else replace(lv.closed, decode_s=lv.closed.decode_s * slowdown)
    return replace(lv, decode_s=lv.decode_s * slowdown).with_links(closed=closed)


def simulate(
    policy: Policy,
    trace: Trace,
    profile: DeviceProfile | LiveProfile,
    ladders: dict[str, list[list[Level]]],
    floors: dict[str, int],
    start_s: float = 0.0,
    config: SimConfig | None = None,
    template_image_bytes: int = 0,
) -> SimResult:
    """Simulate one edit with ``policy``; ``ladders[family][layer]`` lists that shard's levels, cheapest first.
    ``template_image_bytes``: the template image the edit fetches before its lanes start, as the live edit does
    (``sakura_core.edit.open_template``): one request at the trace's ``start_s``, its bytes a round trip later at the
    trace's rate (:func:`~sakura_core.runtime.pre_lanes.template_image_s`); the lanes start once it has arrived (the
    trace is read from there), its seconds are in the latency (``SimResult.pre_lanes_s``), and it seeds the
    throughput estimator (``ThroughputEstimator.seed``). 0: no image modelled (the lanes start at ``start_s`` on the
    estimator's prior)."""
    if template_image_bytes < 0:
        raise ValueError(f"template_image_bytes must be >= 0 (0: none), got {template_image_bytes}")
    family = policy.family
    if family == CACHEGEN_NO_FLOOR and family not in ladders:  # ladders built by hand: one cachegen, floor as given
        family = "cachegen"
    if family not in ladders:
        raise ValueError(f"policy {policy.name} needs the {family!r} ladder; have {sorted(ladders)}")
    g = profile.model
    if len(ladders[family]) not in (g.layers, g.layers * g.steps):
        raise ValueError(
            f"{family} ladder has {len(ladders[family])} shards; the model needs {g.layers} (single KV mode) or "
            f"{g.layers * g.steps} (per-step: steps x layers); build the ladders for kv_mode_view(profile, kv_mode)"
        )
    fam, floor = ladders[family], floors.get(family, 0)
    return _Sim(policy, trace, start_s, profile, fam, floor, config or SimConfig(), template_image_bytes).run()

"""The simulator's link: the fetch lane (one transfer at a time over the trace, requests sent ahead of it within a
window unless ``SimConfig.request_ahead`` is off, the decoder behind it, deferred shards asked again while the link
would idle, upgrades). What a policy may know of it (levels decoded by now, predicted ready times, the transfer in
progress) is :class:`~sakura_core.runtime.sim_view.SimView`, which it extends. A mixin of
:class:`~sakura_core.runtime.simulate._Sim`, as :class:`~sakura_core.runtime.fetch_lane.FetchLane` is of the live
pipeline; the state lives on the simulation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..policy.ladder import fetch_as, shard_floor, twin_applies
from .deferral import ahead_window_bytes, ask_deferred, drop_made
from .lane_rules import ask_in_order, ask_reroot_chain, ask_upgrade, decode_span, has_prefetch_room, link_passed
from .sim_view import SimView

if TYPE_CHECKING:
    from ..policy.context import Context
    from .live_profile import LiveProfile
    from .profiles import DeviceProfile
    from .sim_cpu import PlanClock
    from .sim_types import SimConfig

__all__ = ["SimLink"]


class SimLink(SimView):
    """Mixin: the link half of a simulated edit (``_got``, ``_pred``, ``link_free``, ``decoder_free``, ``estimator``,
    ``pending_obs``, ``next_layer``, ``deferred``, ``forced``, ...)."""

    # the simulation's state this mixin reads and writes (set in ``_Sim.__init__``; times in seconds, sizes bytes)
    policy: PlanClock
    profile: DeviceProfile | LiveProfile  # a measured live profile: the phone page's replays
    floor: int
    config: SimConfig
    N: int  # shards
    L: int  # shards of one step
    per_step: bool
    ctx: Context
    wire_free: float
    _wire_q: list[tuple[float, int, float]]  # transfers not arrived: (first byte, bytes, arrival)
    decoder_free: float
    next_layer: int
    base_done: bool
    forced: list[int]
    skipped: set[int]
    computed: set[int]  # the policy computes them for good (lane_rules.ask_keep_template)
    deferred: list[int]
    twins: set[tuple[int, int]]
    compute_layer: int
    step_started_t: float
    bytes: int
    events: list[dict]
    decisions: list[dict]
    room_wait: tuple[int, int] | None  # (shard, level) chosen, waiting for prefetch room
    device_kv_at: dict[int, float]
    cpu_busy: Callable[[str, float, float], None]  # CpuShare's

    # the link fetches a shard's re-root chain where the policy names one (Context.reroots)
    reroots = True

    # the trace is read at start_s + t
    def _reference_ready(self, layer: int, level: int) -> tuple[int, float]:
        """A cross-step residual level decodes only after its reference shard (same layer, ``ref_step``): (the level
        to fetch, the earliest decode start). The device's own KV of it serves too (it computed that layer at that
        step: taken as there when the decode starts; or a fallback template pass made it: from the pass's end).
        Without either (not fetched, or not yet) the shard's self-contained exact level is fetched instead, as the
        live runtime does."""
        lv = self.ladders[layer][level]
        if lv.ref_step is None:
            return level, 0.0
        ref = lv.ref_step * self.L + layer % self.L
        done = [t for _, t in self._got.get(ref, [])]
        if done:
            return level, min(done)
        if ref in self.skipped:  # computed on the device at that step
            return level, 0.0
        if ref in self.device_kv_at:  # made by a fallback template pass (kept as the live runtime's HeldKV keeps it)
            return level, self.device_kv_at[ref]
        top = len(self.ladders[layer]) - 1
        reason = f"fallback: level {lv.name} needs shard {ref}, which is not decoded: fetching it exact"
        self.decisions.append({"t": self.now, "layer": layer, "level": top, "reason": reason})
        return top, 0.0

    def _reuse(self, layer: int, level: int, ref_done: float) -> None:
        """A ``reuse`` rung: no request, no decode; the shard's KV is its reference's, there once that is."""
        ready = max(self.now, ref_done)
        self._pred[layer] = (self.now, 0, self.now)  # known at once: nothing is on the link
        self._pending.append(layer)
        if layer not in self._got:
            self._first_ready[layer] = ready
        self._got.setdefault(layer, []).append((level, ready))
        self.events.append({"lane": "decode", "start": ready, "end": ready, "layer": layer, "level": "reuse"})

    def _on_track(self, layer: int, level: int) -> bool:
        """Level ``level`` of shard ``layer`` is fetched as its closed-loop twin: its reference shard is held at the
        same level on that level's track (step 0's level, or the twin), as the live HeldKV.closed_twin decides."""
        lv = self.ladders[layer][level]
        if lv.closed is None or lv.ref_step is None:
            return False
        ref = lv.ref_step * self.L + layer % self.L
        got = self._got.get(ref)
        if not got:
            return False
        held = max(j for j, _ in got)
        return twin_applies(lv, (self.ladders[ref][held].name, (ref, held) in self.twins))

    def _transfer(self, layer: int, level: int, nbytes: int, kind: str) -> None:
        level, ref_done = self._reference_ready(layer, level)
        if self.ladders[layer][level].reuse:
            self._reuse(layer, level, ref_done)
            return
        twin = False
        if kind == "base":  # a closed-loop twin on its track, or off it the open-loop floor (fetch_as)
            level, twin = fetch_as(self.ladders[layer], level, self._on_track(layer, level))
            nbytes = self.ladders[layer][level].fetched(twin).nbytes
        if twin:
            self.twins.add((layer, level))
        sent = self.now  # the request leaves now; its bytes follow one round trip later, or after the transfer before
        t0 = max(self.wire_free, sent + self.rtt_s)
        arrive = self.trace.finish_time(self.start_s + t0, nbytes) - self.start_s
        self.pending_obs.append((arrive, nbytes, arrive - t0))  # known to the estimator only once it has arrived
        if layer not in self._pred:  # what a client knows of a request: when it left, its size (and later its arrival)
            self._pred[layer] = (sent + self.rtt_s, nbytes, arrive)
            self._wire0[layer] = t0  # when its first byte arrives (a client knows it once it has)
            self._pending.append(layer)
            self._req_t0.append(sent + self.rtt_s)
            self._req_g.append(layer)
        lv = self.ladders[layer][level].fetched(twin)
        decode_s = lv.decode_s if kind == "base" else lv.decode_s - self.ladders[layer][level - 1].decode_s
        dec0, dec1 = decode_span(arrive, decode_s, self.decoder_free, ref_done)
        self.decoder_free = dec1
        self.cpu_busy("decode", dec0, dec1)
        if layer not in self._got:
            self._first_ready[layer] = dec1
        self._got.setdefault(layer, []).append((level, dec1))
        self.events.append({"lane": "fetch", "start": sent, "end": arrive, "layer": layer, "level": lv.name})
        self.events.append({"lane": "decode", "start": dec0, "end": dec1, "layer": layer, "level": lv.name})
        self.bytes += nbytes
        self.wire_free = arrive
        self._wire_q.append((t0, nbytes, arrive))
        self.link_free = self._next_request_t(sent)

    def _next_request_t(self, sent: float) -> float:
        """When the lane may send its next request, the last one sent at ``sent``: once the transfers before have
        arrived (``SimConfig.request_ahead`` off), else once the bytes requested and not yet received are within
        :func:`~sakura_core.runtime.deferral.ahead_window_bytes` (a client's read loop counts them; the wire is
        first in, first out), so the next transfer's first byte follows the last one's."""
        if not self.config.request_ahead:
            return self.wire_free
        self.flush_observations()
        window = ahead_window_bytes(self.estimator, self.rtt_s)
        if window is None:
            return self.wire_free
        self._wire_q = [w for w in self._wire_q if w[2] > sent]
        left = [nb - self._received(t0, sent, nb) for t0, nb, _ in self._wire_q]
        excess = sum(left) - window
        if excess <= 0:
            return sent
        for (t0, _, _), rest in zip(self._wire_q, left, strict=True):
            if rest >= excess:  # the window opens while this transfer arrives
                start = max(sent, t0)
                return self.trace.finish_time(self.start_s + start, excess) - self.start_s
            excess -= rest
        return self.wire_free

    def _charge_link(self) -> None:
        """The link-side decision just made took the phone this long: the request it leads to leaves that much
        later, and the planning thread is busy meanwhile."""
        owed = self.policy.take()
        if owed > 0:
            self.cpu_busy("planning", self.now, self.now + owed)
            self.link_free = max(self.link_free, self.now + owed)
            self.now = self.link_free

    def _link_step(self) -> bool:
        """One link action at ``link_free``; False when the link has nothing to do."""
        self.now = self.link_free
        for shards in (self.forced, self.deferred):  # a fallback pass made one meanwhile: not fetched, not asked
            drop_made(shards, self.device_kv_at.__contains__)
        if self.forced:
            layer = self.forced.pop(0)
            fl = shard_floor(self.floor, layer)
            self.decisions.append({"t": self.now, "layer": layer, "level": fl, "reason": "fallback: needed"})
            self._transfer(layer, fl, self.ladders[layer][fl].nbytes, "base")
            return True
        if self.room_wait is not None:  # a chosen later-step shard waits for prefetch room (the lane waits with it)
            if not self._has_room(self.room_wait[0]):
                self.link_free = max(self.link_free, self.compute_t)  # idle while the compute lane runs
                return False
            layer, level = self.room_wait
            self.room_wait = None
            self.link_free = max(self.link_free, self.step_started_t)  # room came when the lane entered this step
            self.now = self.link_free
            self._transfer_rooted(layer, level)
            return True
        if self.deferred and self._retry_deferred():  # a deferred shard the policy now wants goes first
            return True
        if not self.base_done and self.next_layer < self.N:
            layer = self.next_layer
            action, d = ask_in_order(self.policy, self.ctx, layer, layer in self.device_kv_at)
            if d is None:  # "made": a fallback pass made its KV, nothing to fetch
                self.next_layer += 1
                self.skipped.add(layer)
                self.base_done = self.next_layer >= self.N
                return True
            self.decisions.append({"t": self.now, "layer": layer, "level": d.level, "reason": d.reason})
            self._charge_link()
            if action == "stop":
                self.base_done = True
                return True
            self.next_layer += 1
            if action in ("compute", "defer"):
                self.skipped.add(layer)
                if action == "defer":
                    self.deferred.append(layer)
                else:  # "compute"
                    self.computed.add(layer)
                if d.link_idle_until_s is not None:  # the policy's next decision waits (the link stays idle)
                    self.link_free = max(self.link_free, d.link_idle_until_s)
            else:
                assert d.level is not None
                self._fetch_chosen(layer, d.level)
            if self.next_layer >= self.N:
                self.base_done = True
            return True
        if self.config.upgrades and self.base_done:
            up = ask_upgrade(self.policy, self.ctx, self.config.upgrades, self.base_done)
            self._charge_link()
            if up is not None:
                layer, level = up
                lv = self.ladders[layer][level]
                self.decisions.append({"t": self.now, "layer": layer, "level": level, "reason": "upgrade"})
                self._transfer(layer, level, lv.increment_bytes, "upgrade")
                return True
        return False

    def advance_link(self, until: float) -> None:
        retried = False
        while self.link_free <= until:
            if self._link_step():
                continue
            if retried or not self.deferred:
                break
            retried = True  # the link would idle: ask again about the deferred shards, now
            self.link_free = max(self.link_free, until)
            if not self._retry_deferred():
                break

    def _retry_deferred(self) -> bool:
        """Ask the policy again about each deferred shard the compute lane has not reached; fetch the first it
        wants. False when it wants none, or while a chosen shard waits for prefetch room (the lane waits with it)."""
        if self.room_wait is not None:
            return False
        self.now = self.link_free
        pick = ask_deferred(self.policy, self.ctx, self.deferred, self.compute_layer, self.computed)  # about to start
        self._charge_link()
        if pick is None:
            return False
        g, d = pick
        if d.level is None:  # ask_deferred returns fetches only (a level index)
            return False
        self.decisions.append({"t": self.now, "layer": g, "level": d.level, "reason": d.reason})
        self.skipped.discard(g)
        self._fetch_chosen(g, d.level)
        return True

    def _fetch_chosen(self, layer: int, level: int) -> None:
        """Fetch a shard the policy chose, once there is prefetch room for it (:meth:`_has_room`; the live lane's
        ``_room_for``): until then the link waits with it."""
        if self._has_room(layer):
            self._transfer_rooted(layer, level)
        else:
            self.room_wait = (layer, level)

    def _transfer_rooted(self, layer: int, level: int) -> None:
        """Fetch shard ``layer`` at ``level``; at its floor, first the re-root chain the policy names (shards the
        compute lane may have passed, each at its floor, decoded only as the next one's reference:
        :mod:`sakura_core.policy.reroot`), so the shard comes as its closed-loop twin."""
        for g, why in ask_reroot_chain(self.policy, self.ctx, layer, level):
            fl = shard_floor(self.floor, g)
            self.decisions.append({"t": self.now, "layer": g, "level": fl, "reason": why})
            self._transfer(g, fl, self.ladders[g][fl].nbytes, "base")
        self._transfer(layer, level, self.ladders[layer][level].nbytes, "base")

    def _has_room(self, layer: int) -> bool:
        """``SimConfig.prefetch_kv_bytes`` (per-step mode): a shard of a later step than the running one may be
        fetched while the KV of the later steps' shards requested so far, plus this shard's, stays within it (as
        the live lane counts: the KV held, and the shards requested and not yet held)."""
        cap = self.config.prefetch_kv_bytes
        if cap is None or not self.per_step:
            return True
        running_end = (self.compute_layer // self.L + 1) * self.L
        held = sum(1 for g in self._pred if g >= running_end)
        shard_bytes = getattr(self.profile.model, "shard_bytes_fp16", None)  # a measured LiveProfile has no geometry
        if shard_bytes is None:
            raise ValueError(
                "SimConfig.prefetch_kv_bytes needs a DeviceProfile (its geometry's shard_bytes_fp16); "
                f"{type(self.profile).__name__} has none: simulate without prefetch_kv_bytes"
            )
        return has_prefetch_room(layer, running_end, held * shard_bytes, shard_bytes, cap)

    def wait_for(self, layer: int) -> float:
        """Run the link until ``layer`` has a decoded level; returns that time."""
        while not self._got.get(layer):
            if layer in self.skipped or link_passed(layer, self.base_done, self.next_layer):
                if layer not in self.forced:
                    self.forced.append(layer)
            if not self._link_step():
                raise RuntimeError(f"simulation stuck: no way to obtain shard {layer}")
        return self._got[layer][0][1]

    def ready_by(self, layer: int, t: float) -> bool:
        return any(ready <= t for _, ready in self._got.get(layer, []))

    def level_at(self, layer: int, t: float) -> int | None:
        best = None
        for level, ready in self._got.get(layer, []):
            if ready <= t and (best is None or level > best):
                best = level
        return best

"""The fetch lane of :class:`~sakura_core.runtime.pipeline.PipelinedEdit`: the link, as the policy chooses.

Every shard once, in execution order (``choose``); a shard the policy defers ("not now") is asked again before
later shards and while the link would idle, until the compute lane reaches it; then progressive upgrades on the
idle link. The same protocol as the simulator's (:mod:`sakura_core.runtime.simulate`). A failed shard is retried
at the floor level, then left to the device (the compute lane runs a template pass for it).
"""

from __future__ import annotations

import asyncio
import inspect

from ..kv.chain import MissingReferenceError
from ..policy.policies import LEVEL_COMPUTE
from .deferral import ask_deferred

__all__ = ["IDLE_POLL_S", "FetchLane", "takes_on_chunk"]

IDLE_POLL_S = 0.02  # how often an idle fetch lane asks again about deferred shards (seconds)


def takes_on_chunk(fetch_blob) -> bool:
    """Whether ``fetch_blob`` takes ``on_chunk`` (then the policy sees the transfer in progress, as in the
    simulator; a fetcher without it shows a transfer only once it completes)."""
    try:
        return "on_chunk" in inspect.signature(fetch_blob).parameters
    except (TypeError, ValueError):
        return False


class FetchLane:
    """Mixin: the fetch-lane half of a pipelined edit (state lives on the edit: ``st``, ``ctx``, ``policy``,
    ``ladders``, ``reps``, ``kv``, ``ready``, ``deferred``, ...)."""

    async def get_blob(self, digest: str, size: int, layer: int, level_name: str) -> bytes:
        """One blob over the link (not kept: the shard's chain decoder holds what it needs of the blobs before)."""
        t0 = self.st.now
        if self.reports_chunks:
            data = await self.fetch_blob(digest, size, on_chunk=lambda n: self._received(layer, n))
        else:
            data = await self.fetch_blob(digest, size)
        t1 = self.st.now
        self.estimator.observe(len(data), max(t1 - t0, 1e-6))
        self.bytes_fetched += len(data)
        self.event("fetch", t0, t1, layer, level_name)
        return data

    def _received(self, layer: int, nbytes: int) -> None:
        with self.st.lock:
            entry = self.st.receiving.get(layer)
            if entry is not None:
                entry[1] += nbytes

    async def fetch_level(self, layer: int, level: int) -> None:
        """Fetch the chain of ``layer`` up to ``level``, decode it in the pool and publish the KV."""
        st = self.st
        rep = self.reps[layer][level]
        by_digest = {r["digest"]: r for r in self.reps[layer]}
        digests = [*rep.get("requires", []), rep["digest"]]
        name = self.ladders[layer][level].name
        start = self.decoded_prefix(layer, digests)  # an upgrade fetches only the blobs its decoder lacks
        reference = self.reference_for(layer, rep)  # a residual whose reference the device lacks: not fetched
        todo = digests[start:]
        if self.reports_chunks:  # the policy sees this shard's transfer while it lasts (LiveState.link_progress)
            with st.lock:
                st.receiving[layer] = [st.now, 0.0, float(sum(by_digest[d]["bytes"] for d in todo))]
        try:
            chain = [await self.get_blob(d, by_digest[d]["bytes"], layer, name) for d in todo]
        finally:
            with st.lock:
                st.receiving.pop(layer, None)
        k, v = await self._loop.run_in_executor(
            self._pool, self.decode_shard, layer, level, digests, chain, start, reference
        )
        with st.lock:
            cur = self.kv.get(layer)
            if layer < self.released_below:  # used already (per-step): a late upgrade is not kept
                with self.decoder_lock:
                    self.decoders.pop(layer, None)
            elif cur is None or cur[2] < level:
                self.hold_kv(layer, (k[0], v[0], level))
            st.got.setdefault(layer, []).append((level, st.now))
            st.in_flight.pop(layer, None)
            st.decoder_free = st.now
        self.ready[layer].set()

    async def fetch_with_fallback(self, layer: int, level: int) -> None:
        """Fetch at ``level``; on failure retry at the floor (a cross-step residual whose reference the device lacks:
        at its self-contained exact level), then mark the layer for the device."""
        try:
            await self.fetch_level(layer, level)
        except Exception as e:  # noqa: BLE001 - every failure has the same fallback, and it is reported
            name = self.ladders[layer][level].name
            retry = len(self.ladders[layer]) - 1 if isinstance(e, MissingReferenceError) else self.floor
            if level != retry:
                what = "its self-contained exact level" if retry != self.floor else "the floor level"
                self.fallbacks.append(f"shard {layer} level {name}: {e}; retrying at {what}")
                try:
                    await self.fetch_level(layer, retry)
                    return
                except Exception as e2:  # noqa: BLE001
                    e = e2
            self.fallbacks.append(f"shard {layer}: {e}; the device computes this layer's template KV")
            self.failed.add(layer)
            self.ready[layer].set()

    async def fetch_lane(self) -> None:
        """The link: every shard in order (as the policy chooses), then — while it would idle — the shards the policy
        deferred (asked again until the compute lane reaches them) and progressive upgrades."""
        await self.base_fetches()
        self.st.base_done = True
        upgrades = self.cfg.upgrades
        while not self.cancel.is_set() and not self._done.is_set():
            pick = self._decide(base=False)
            if pick is not None:
                await self.fetch_base(*pick)
                continue
            if upgrades:
                upgrades = await self.upgrade_once()
                if upgrades:
                    continue
            if not self.deferred:
                break
            await asyncio.sleep(IDLE_POLL_S)  # deferred shards remain: ask again once the state has moved on

    async def base_fetches(self) -> None:
        """Each shard once, in execution order; a deferred shard that the policy now wants goes first."""
        st = self.st
        while st.next_layer < self.N and not self.cancel.is_set():
            pick = self._decide(base=True)
            if pick == "stop":
                break
            if pick is not None:
                await self.fetch_base(*pick)

    def _decide(self, base: bool):
        """One link decision at one frozen moment (one plan serves it): a deferred shard the policy now wants, else
        (``base``) the next shard in order. Returns ``(shard, level)`` to fetch, None (nothing to fetch now) or
        "stop" (the policy stops fetching)."""
        st = self.st
        with st.lock, st.frozen_now():
            st.link_free = st.now
            again = self._ask_deferred()
            if again is not None or not base:
                return again
            layer = st.next_layer
            d = self.policy.choose(self.ctx, layer)
            self.decisions.append({"t": st.now, "layer": layer, "level": d.level, "reason": d.reason})
            if d.level is None:
                return "stop"
            st.next_layer += 1
            if d.level == LEVEL_COMPUTE:
                if d.defer:
                    self.deferred.append(layer)
                return None
            return layer, d.level

    async def room_for(self, g: int) -> None:
        """Per-step mode with ``prefetch_kv_bytes``: before fetching shard ``g`` of a later step, wait until the
        KV held for later steps leaves room for it (the compute lane frees shards as it passes them). The running
        step's own shards never wait, nor does an upgrade of a shard held already. While the lane waits, the
        running step's deferred shards are fetched only if the compute lane asks for them (late_shards)."""
        cap = self.cfg.prefetch_kv_bytes
        if cap is None or not self.per_step:
            return
        while not self.cancel.is_set() and not self._done.is_set():
            with self.st.lock:
                if g < (max(self.step, 0) + 1) * self.L or g in self.kv:
                    return
                if self.held_ahead_bytes() + self.shard_kv_nbytes <= cap:
                    return
            await asyncio.sleep(IDLE_POLL_S)

    async def fetch_base(self, layer: int, level: int) -> None:
        await self.room_for(layer)
        with self.st.lock:
            self.st.in_flight[layer] = self.ctx.predict_ready(
                layer, self.ladders[layer][level], self.estimator.robust()
            )
        await self.fetch_with_fallback(layer, level)

    def _signature(self) -> tuple:
        """What a deferral depends on besides the clock: compute position, decisions, transfers, samples."""
        st = self.st
        done = sum(len(v) for v in st.got.values())
        return (st.compute_layer, st.template_alive, st.next_layer, done, len(st.in_flight), self.estimator.samples)

    def _ask_deferred(self) -> tuple[int, int] | None:
        """Ask the policy again about each deferred shard the compute lane has not reached (the caller holds the
        lock and a frozen moment); ``(shard, level)`` for the first it wants. The same protocol as the simulator's;
        not asked again until something has happened (a layer, a decision, a transfer) since the last "not now"."""
        st = self.st
        if not self.deferred:
            return None
        sig = self._signature()
        if sig == self._deferred_sig:
            return None
        pick = ask_deferred(self.policy, self.ctx, self.deferred, st.compute_layer)
        if pick is None:
            self._deferred_sig = sig
            return None
        g, d = pick
        self._deferred_sig = None
        self.decisions.append({"t": st.now, "layer": g, "level": d.level, "reason": d.reason})
        return g, d.level

    async def upgrade_once(self) -> bool:
        """One progressive enhancement the policy asks for on the idle link; False when it asks for none (or one
        failed: upgrades are optional, the failure is reported and upgrading stops)."""
        st = self.st
        with st.lock:
            st.link_free = st.now
            up = self.policy.upgrade(self.ctx)
        if up is None:
            return False
        layer, level = up
        await self.room_for(layer)
        self.decisions.append({"t": st.now, "layer": layer, "level": level, "reason": "upgrade"})
        try:
            await self.fetch_level(layer, level)
        except Exception as e:  # noqa: BLE001 - an upgrade is optional: report and stop upgrading
            self.fallbacks.append(f"upgrade of shard {layer} to {self.ladders[layer][level].name} failed: {e}")
            return False
        return True

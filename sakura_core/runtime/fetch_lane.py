"""The fetch lane of a pipelined edit (:class:`~sakura_core.runtime.pipeline.PipelinedEdit`): the link, as the
policy chooses (with ``request_ahead``, requests go ahead of the wire: :mod:`.fetch_wire`). Every shard once, in
execution order (``choose``); a shard the policy defers ("not now") is asked again before later shards and while the
link would idle, until the compute lane reaches it; then progressive upgrades on the idle link. Each transfer's
decode overlaps the next transfer. The same protocol as the simulator's (:mod:`sakura_core.runtime.simulate`). A
failed shard is retried at the floor level, then left to the device (the compute lane runs a template pass for it).
A cross-step residual whose reference the device neither holds nor will make (:mod:`.reference_wait`) is not
fetched: its self-contained exact level is, and the report says so. A level whose closed-loop twin's reference the
device holds (:meth:`~sakura_core.runtime.held_kv.HeldKV.closed_twin`) is fetched as that twin, one below the
open-loop floor without it at that floor (:func:`~sakura_core.policy.ladder.fetch_as`). Before a shard at its floor,
the re-root chain the policy names is fetched first (:mod:`.fetch_reroot`), as the simulator does.

The lane owns what it fetched (``bytes_fetched``), the shards deferred, and the fetches the compute lane asked for;
it writes the link's part of the live state (``next_layer``, ``in_flight``, ``got``, ``receiving``, ...), decodes
through the :class:`~sakura_core.runtime.decode_lane.DecodeLane` and publishes into
:class:`~sakura_core.runtime.held_kv.HeldKV`. The compute lane reaches it through :meth:`FetchLane.fetch_skipped`
only. A shard whose KV a fallback template pass made already (``HeldKV.device``) is not fetched nor asked about.
"""

from __future__ import annotations

import asyncio
import threading

from ..kv.chain import MissingReferenceError
from ..kv.manifest import Representation
from ..policy.ladder import PlannedRep, fetch_as, self_contained_top
from .decode_lane import DecodeLane
from .fetch_later import LaterAsks
from .fetch_reroot import RerootChains
from .fetch_wire import Turn, Wire, first_of, takes_on_chunk
from .lane_parts import LaneParts
from .lane_rules import ask_in_order, decode_span, has_prefetch_room, link_passed
from .reference_wait import ReferenceWait
from .shard_index import ShardId

__all__ = ["IDLE_POLL_S", "FetchLane", "takes_on_chunk"]

IDLE_POLL_S = 0.02  # how often an idle fetch lane asks again about deferred shards (seconds)


class FetchLane(LaterAsks, RerootChains):
    """The link of one edit (see the module docstring); :meth:`reset` before each run, :meth:`run` is the lane.

    Args:
        fetch_blob: ``async (digest, nbytes[, on_chunk]) -> bytes``.
        parts: what the run's lanes share: the shards, the plan (the policy, its levels, their manifest entries,
            the floor), the live state and the policy's view of it, where decoded shards go (``held``), the
            timeline, the settings and the cancel flag.
        decoder: the decode lane.
    """

    def __init__(self, fetch_blob, parts: LaneParts, decoder: DecodeLane) -> None:
        self.fetch_blob, self.reports_chunks = fetch_blob, takes_on_chunk(fetch_blob)
        self.parts, self.decoder = parts, decoder
        self.reset()

    def reset(self) -> None:
        self.bytes_fetched = 0
        self.deferred: list[int] = []  # shards (g) the policy said "not now" to: asked again while the link would idle
        self._deferred_sig: tuple | None = None  # the state of the last "not now" to all of them
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done = threading.Event()  # the compute lane has finished: nothing more is needed
        self._asked: set[asyncio.Task] = set()  # fetches the compute lane asked for (fetch_skipped)
        # shards (g) with a fetch of this lane chosen and not finished (waiting for room, in flight or retrying):
        # claimed under st.lock with the decision, so the compute lane never asks for a second, concurrent fetch
        self._claimed: set[int] = set()
        self._wire = Wire(self.st)  # request_ahead: the wire the lane's transfers take in turn
        self._fetches: set[asyncio.Task] = set()  # the lane's own fetches still running (transfer, then decode)
        self.refs = ReferenceWait(self.grid, self.held, self.st, lambda: self.cancel.is_set() or self._done.is_set())
        self._requested: set[int] = set()  # shards (g) past their room check and not ended (counted in the room)

    @property
    def ahead(self) -> bool:
        """Whether the lane sends requests ahead of the wire (``RuntimeConfig.request_ahead``, with a fetcher that
        reports its chunks and awaits its turns): the lane's transfers take the wire one at a time, first in first
        out; the next request leaves once the bytes requested and not yet received are within
        :func:`~sakura_core.runtime.deferral.ahead_window_bytes`, so its round trip passes while the ones before
        arrive, and each decode overlaps the transfers after it."""
        return self.cfg.request_ahead and self.reports_chunks and not self._wire.ungated

    # ---- the lane

    async def run(self) -> None:
        """The link: every shard in order (as the policy chooses), then — while it would idle — the shards the policy
        deferred (asked again until the compute lane reaches them) and progressive upgrades."""
        self._loop = asyncio.get_running_loop()
        self.refs.attach(self._loop)
        await self._base_fetches()
        self.st.base_done = True
        upgrades = self.cfg.upgrades
        while not self.cancel.is_set() and not self._done.is_set():
            pick = self._decide(base=False)
            if pick is not None:
                await self._fetch_base(*pick)
                continue
            if upgrades:
                did = await self._upgrade_once()
                if did:
                    continue
                upgrades = did is not None and bool(self._fetches)  # the shards still on their way may want upgrades
            if not self.deferred and not upgrades:
                break
            if self.deferred or not self._fetches:
                await asyncio.sleep(IDLE_POLL_S)  # deferred shards remain: ask again once the state has moved on
            else:  # ask about upgrades again once one of the lane's fetches has ended
                await asyncio.wait(set(self._fetches), return_when=asyncio.FIRST_COMPLETED)

    async def stop(self, task: asyncio.Task) -> None:
        """End the lane's ``task`` and every fetch the compute lane asked for (the edit is over)."""
        self._done.set()
        tasks = [task, *self._asked, *self._fetches]
        for t in tasks:
            if not t.done():
                t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass

    async def _base_fetches(self) -> None:
        """Each shard once, in execution order; a deferred shard that the policy now wants goes first."""
        st = self.st
        while st.next_layer < len(self.grid) and not self.cancel.is_set():
            pick = self._decide(base=True)
            if pick == "stop":
                break
            if pick is not None:
                await self._fetch_base(*pick)

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
            g = st.next_layer
            action, d = ask_in_order(self.policy, self.ctx, g, self.held.device(self.grid[g]) is not None)
            if d is None:  # "made": a fallback template pass made its KV, not fetched
                st.next_layer += 1
                return None
            self.log.decision(st.now, g, d.level, d.reason)
            if action == "stop":
                return "stop"
            st.next_layer += 1
            if action != "fetch":
                if action == "defer":
                    self.deferred.append(g)
                else:  # "compute"
                    st.computed.add(g)
                return None
            assert d.level is not None
            self._claimed.add(g)
            return self.grid[g], d.level

    # ---- what the compute lane may ask (from its thread)

    def fetch_skipped(self, shard: ShardId) -> bool:
        """The compute lane needs ``shard``, which the lane skipped (the policy computes it, or deferred it, and a
        policy may not foresee a drop): fetch it now at the floor level. False when it was not skipped (it is in
        flight, fetched, or not decided yet). Thread-safe."""
        st = self.st
        with st.lock:
            g = shard.g
            skipped = (
                g not in self._claimed
                and g not in st.in_flight
                and not st.got.get(g)
                and link_passed(g, st.base_done, st.next_layer)
            )
            if not skipped:
                return False
            if g in self.deferred:
                self.deferred.remove(g)
            self._claimed.add(g)
        self._lane_loop().call_soon_threadsafe(self._start_asked, shard)
        return True

    def _lane_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop :meth:`run` runs on."""
        if self._loop is None:
            raise RuntimeError("the fetch lane is not running: FetchLane.run() sets its event loop")
        return self._loop

    def _start_asked(self, shard: ShardId) -> None:
        if self._done.is_set():
            return
        task = self._lane_loop().create_task(self._claimed_fetch(shard, self.floor))
        self._asked.add(task)
        task.add_done_callback(self._asked.discard)

    async def _claimed_fetch(self, shard: ShardId, level: int) -> None:
        """Fetch a shard this lane claimed (:attr:`_claimed`), releasing the claim when the fetch has ended (one the
        compute lane waits for: it does not queue for the wire)."""
        try:
            await self._fetch_with_fallback(shard, level, gated=False)
        finally:
            with self.st.lock:
                self._claimed.discard(shard.g)

    # ---- fetching one shard

    async def _room_for(self, shard: ShardId) -> None:
        """Per-step mode with ``prefetch_kv_bytes``: before fetching a shard of a later step, wait until the KV held
        for later steps, with the later steps' shards fetched and not yet held (sent ahead, decoding), leaves room
        for it (the compute lane frees shards as it passes them; until a first shard is decoded its size is not known
        and a later step's shard waits). The running step's own shards never wait, nor does an upgrade of a shard
        held already. While the lane waits, the running step's deferred shards are fetched only if the compute lane
        asks for them (late_shards)."""
        cap = self.cfg.prefetch_kv_bytes
        if cap is None or not self.grid.per_step:
            return
        while not self.cancel.is_set() and not self._done.is_set():
            with self.st.lock:
                running_end = self.grid.step_end(self.grid[self.st.compute_layer].step)
                if self.held.is_held(shard):  # an upgrade of a shard held already
                    return
                size = self.held.shard_kv_nbytes  # 0 until a shard is decoded: then it waits (its step, or a size)
                coming = sum(1 for g in self._requested if g >= running_end and not self.held.is_held(self.grid[g]))
                later = self.held.held_from_bytes(running_end) + coming * size
                if has_prefetch_room(shard.g, running_end, later, size or None, cap):
                    return
            await asyncio.sleep(IDLE_POLL_S)

    async def _fetch_base(self, shard: ShardId, level: int) -> None:
        """A shard :meth:`_decide` chose (and claimed): fetched once there is room for it, in a task (its transfer,
        then its decode). Returns once its transfer has ended (one request at a time: the decode overlaps the next
        transfer, as in the simulator) or, with :attr:`ahead`, once its first blob is requested and the bytes
        requested ahead are within the window. Before the estimator's first sample there is no window: the first
        request is the bandwidth probe, and the decisions after it see its rate."""
        ahead, (sent, landed) = self.ahead, self._wire.expect(shard.g)
        task = asyncio.create_task(self._fetch_claimed_base(shard, level))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)
        try:
            if ahead:
                await self._wire.until_window(task, sent)
            if not task.done() and not self.ahead:  # one request at a time: the next once this transfer has ended
                await first_of(task, landed.wait())
        finally:
            self._wire.forget(shard.g)

    async def _fetch_claimed_base(self, shard: ShardId, level: int) -> None:
        try:
            with self.refs.fetching(shard.g):
                await self._room_for(shard)
                with self.st.lock, self.st.frozen_now():
                    self._requested.add(shard.g)  # the room counts it until it is held (or has failed)
                    self.st.in_flight[shard.g] = self.ctx.predict_ready(
                        shard.g, self.ladders[shard.g][level], self.st.estimator.robust()
                    )
                    chain = self._chain_for(shard, level)  # a re-root: its chain first (fetch_reroot)
                kept = await self._fetch_chain(chain, shard) if chain else []
                try:
                    await self._fetch_with_fallback(shard, level)
                finally:
                    self._drop_chain(kept)
        finally:
            with self.st.lock:
                self._claimed.discard(shard.g)
                self._requested.discard(shard.g)

    async def _fetch_with_fallback(self, shard: ShardId, level: int, gated: bool = True) -> None:
        """Fetch at ``level``; on failure retry at the floor (a cross-step residual whose reference the device lacks:
        at its self-contained exact level), then leave the shard to the device."""
        try:
            await self._fetch_level(shard, level, gated)
        except Exception as e:  # noqa: BLE001 - every failure has the same fallback, and it is reported
            retry = self_contained_top(self.rungs[shard.g]) if isinstance(e, MissingReferenceError) else self.floor
            if retry is not None and level != retry:
                name = self.ladders[shard.g][level].name
                what = "its self-contained exact level" if retry != self.floor else "the floor level"
                self.log.fallback(f"{shard} level {name}: {e}; retrying at {what}")
                try:
                    await self._fetch_level(shard, retry, gated)
                    return
                except Exception as e2:  # noqa: BLE001
                    e = e2
            self.log.fallback(f"{shard}: {e}; the device computes this layer's template KV")
            self.log.decision(self.st.now, shard.g, "device", f"{shard} could not be fetched ({type(e).__name__})")
            self.held.fail(shard)

    async def _fetch_level(self, shard: ShardId, level: int, gated: bool = True, as_chain: bool = False) -> None:
        """Fetch the chain of ``shard`` up to ``level``, decode it in the pool and publish the KV (``gated``: with
        :attr:`ahead`, each blob's bytes wait for the wire, :meth:`_get_blob`). ``as_chain``: a re-root chain shard,
        whose KV is held apart when the compute lane has passed it (:meth:`HeldKV.hold_chain`)."""
        st, g = self.st, shard.g
        planned: PlannedRep = self.rungs[g][level].rep
        rep: Representation = planned
        digests = rep.chain_digests
        start = self.decoder.decoded_prefix(shard, digests)  # an upgrade fetches only the blobs its decoder lacks
        if not start:  # a closed-loop twin on its track, or off it the open-loop floor (policy.ladder.fetch_as)
            await self.refs.fetched(shard, planned)
            twin = self.held.closed_twin(shard, planned)
            level, as_twin = fetch_as(self.ladders[g], level, twin is not None)
            planned = self.rungs[g][level].rep
            rep = twin if as_twin and twin is not None else planned
            digests = rep.chain_digests
            start = self.decoder.decoded_prefix(shard, digests)
        left_out = planned.chain if rep is planned else ()  # (a closed-loop twin has none)
        by_digest = {r.digest: r for r in (*(x.rep for x in self.rungs[g]), *left_out, rep)}  # chain: policy_levels
        name = rep.name
        coming = False  # the reference is made on the device (or fetched) by the end of its step: decoded then
        try:
            reference = self.held.reference_for(shard, rep)  # a residual whose reference the device lacks: not fetched
        except MissingReferenceError:
            coming = not start and self.refs.coming(shard, rep)
            if not start and not coming:
                raise
            reference = None  # an upgrade: its decoder keeps the reference its chain was decoded against (freed here)
        todo = digests[start:]
        if self.reports_chunks:  # the policy sees this shard's transfer while it lasts (LiveState.link_progress)
            with st.lock:
                st.receiving[g] = [st.now, 0.0, float(sum(by_digest[d].nbytes for d in todo))]
        try:
            chain = [await self._get_blob(d, by_digest[d].nbytes, g, name, gated) for d in todo]
        finally:
            with st.lock:
                st.receiving.pop(g, None)
        with st.lock:  # its bytes are here: decoded once the decoder has run (what the simulator's view shows)
            if g in st.in_flight:
                st.in_flight[g] = decode_span(st.now, self.rungs[g][level].level.decode_s, st.decoder_free)[1]
        self._wire.landed(g)  # the link may go on (one request at a time): this shard's transfer has ended
        if coming:
            reference = await self.refs.held_reference(shard, rep)
        kv = await self.decoder.decode(shard, level, digests, chain, start, reference)
        if kv is None:  # an upgrade of a shard the compute lane served meanwhile: of no use any more
            self.log.decision(st.now, g, level, f"{name} not decoded: the compute lane served the shard meanwhile")
            return
        k, v = kv
        blobs = tuple((d, by_digest[d].nbytes) for d in digests)  # the chain the KV was decoded from
        if not self.held.publish(shard, k[0], v[0], level, digests[-1], name, blobs):
            self.decoder.forget(shard)  # used already (per-step): a late upgrade is not kept
            if as_chain:  # a passed re-root chain shard: only the next one's reference
                self.held.hold_chain(shard, k[0], v[0], digests[-1])
        with st.lock:
            st.got.setdefault(g, []).append((level, st.now))
            st.in_flight.pop(g, None)
            st.decoder_free = st.now
        self.held.set_ready(shard)

    async def _get_blob(self, digest: str, size: int, g: int, level_name: str, gated: bool = True) -> bytes:
        """One blob over the link (not kept: the shard's chain decoder holds what it needs of the blobs before).
        With :attr:`ahead` and ``gated``, its bytes wait for the wire (:mod:`.fetch_wire`)."""
        t0 = self.st.now
        turn = self._wire.open(g, size) if gated and self.ahead else None
        try:
            if self.reports_chunks:
                data = await self.fetch_blob(digest, size, on_chunk=lambda n: self._received(g, n, turn))
            else:
                data = await self.fetch_blob(digest, size)
        finally:
            if turn is not None:
                self._wire.close(turn)
        t1 = self.st.now
        t0 = self._wire.observe(turn, t0, t1, len(data))
        self.bytes_fetched += len(data)
        self.log.event("fetch", t0, t1, g, level_name)
        return data

    def _received(self, g: int, nbytes: int, turn: Turn | None = None):
        with self.st.lock:
            entry = self.st.receiving.get(g)
            if entry is not None:
                entry[1] += nbytes
        return None if turn is None else self._wire.received(turn, nbytes)  # the fetcher awaits a turn

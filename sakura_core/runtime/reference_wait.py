"""When a cross-step level's reference is there: :class:`ReferenceWait`, the fetch lane's view of the references
its residual levels decode against (the same layer at an earlier step, as the device holds it: fetched, or made by
the device itself at that step, :meth:`~sakura_core.runtime.held_kv.HeldKV.reference_for`).

Before a residual is fetched, the lane waits for its own fetch of the reference still under way (:meth:`fetched`):
the level, or its closed-loop twin, is chosen against the reference the device will hold. A reference the device
does not hold yet but will — the compute lane has not finished its step (:meth:`coming`) — does not stop the
transfer: the decode waits for it (:meth:`held_reference`), woken when the device hands over its KV at a step's end
(``HeldKV.on_device_kv``), as the simulator's decode waits for its reference. Otherwise the residual is not fetched
and its self-contained exact level is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from ..kv.chain import DecodedReference, MissingReferenceError
from ..kv.manifest import Representation
from ..policy.ladder import PlannedRep
from .held_kv import HeldKV
from .live_state import LiveState
from .shard_index import ShardGrid, ShardId

__all__ = ["ReferenceWait"]

RECHECK_S = 0.02  # a waiting decode looks again this often (a reference fetched, not made, wakes no one)


class ReferenceWait:
    """The references of one edit's residual levels (the module docstring). ``stopped``: the edit is over or
    cancelled (a waiting decode gives up). :meth:`attach` on the lane's event loop before use."""

    def __init__(self, grid: ShardGrid, held: HeldKV, st: LiveState, stopped: Callable[[], bool]) -> None:
        self.grid, self.held, self.st, self.stopped = grid, held, st, stopped
        self.running: dict[int, asyncio.Event] = {}  # shards (g) with a lane fetch under way: set when it has ended
        self._waiters: set[asyncio.Future] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the waiting decodes (on ``loop``) whenever the device offers its own KV (from the compute thread)."""
        self._loop = loop
        self.held.on_device_kv = lambda: loop.call_soon_threadsafe(self._wake)

    @contextlib.contextmanager
    def fetching(self, g: int):
        """Within the block the lane's fetch of shard ``g`` is under way (:meth:`fetched` waits for its end)."""
        done = self.running[g] = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            if self.running.get(g) is done:
                del self.running[g]

    async def fetched(self, shard: ShardId, rep: PlannedRep) -> None:
        """A cross-step level (or its closed-loop twin) of ``shard``: when the lane's fetch of its reference is still
        under way (requests go ahead, or its decode overlaps this transfer), wait until it has ended."""
        ref = rep.ref or (rep.closed_twin.ref if rep.closed_twin is not None else None)
        if ref is None:
            return
        ev = self.running.get(self.grid.at(ref.step, shard.layer).g)
        if ev is not None:
            await ev.wait()

    def coming(self, shard: ShardId, rep: Representation) -> bool:
        """The reference of ``shard``'s cross-step level ``rep`` will be held: the compute lane has not finished the
        reference's step (each layer of a step is fetched, or made on the device and kept at the step's end,
        :meth:`~sakura_core.runtime.held_kv.HeldKV.keep_references`) and not passed ``shard``."""
        ref = rep.ref
        if ref is None:
            return False
        with self.st.lock:
            return self.grid[self.st.compute_layer].step <= ref.step and shard.g >= self.held.released_below

    async def held_reference(self, shard: ShardId, rep: Representation) -> DecodedReference | None:
        """The reference :meth:`coming` said will come, once held; MissingReferenceError once the compute lane has
        finished its step without it, or passed ``shard``, or the edit is over."""
        while True:
            if self._loop is None:
                raise RuntimeError("ReferenceWait.attach(loop) was not called: attach it on the lane's event loop")
            woken = self._loop.create_future()  # before the look: an offer after it wakes this waiter
            self._waiters.add(woken)
            try:
                passed = not self.coming(shard, rep)  # read first: a step's KV is kept before its end shows
                try:
                    return self.held.reference_for(shard, rep)
                except MissingReferenceError:
                    if passed or self.stopped():
                        raise
                await asyncio.wait({woken}, timeout=RECHECK_S)
            finally:
                self._waiters.discard(woken)

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)

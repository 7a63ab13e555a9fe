"""The fetch lane's wire when requests go ahead (``RuntimeConfig.request_ahead``): the lane's transfers take it one
at a time, first in first out, while their requests (and round trips) go ahead of it.

A blob's :class:`Turn` is the awaitable the lane's ``on_chunk`` returns at the blob's first chunk (the fetcher awaits
it: ``ShardClient.fetch_shard`` does); it holds :class:`Wire`'s lock until the blob has ended. :meth:`Wire.until_window`
is when the lane may send its next request: the blobs requested and not yet received within
:func:`~sakura_core.runtime.deferral.ahead_window_bytes` (:func:`~sakura_core.runtime.deferral.request_gate`). A fetcher that does not await its turns reads on: the wire
says so (``ungated``) and the lane goes back to one request at a time."""

from __future__ import annotations

import asyncio
import inspect

from .deferral import request_gate
from .live_state import QUEUED, LiveState

__all__ = ["Turn", "Wire", "first_of", "takes_on_chunk"]


def takes_on_chunk(fetch_blob) -> bool:
    """Whether ``fetch_blob`` takes ``on_chunk`` (then the policy sees the transfer in progress, as in the
    simulator, and requests may go ahead; a fetcher without it shows a transfer only once it completes)."""
    try:
        return "on_chunk" in inspect.signature(fetch_blob).parameters
    except (TypeError, ValueError):
        return False


class Wire:
    """The lock the lane's blobs take in turn, the blobs requested and not ended, the shards whose first blob is
    requested (``expect`` / ``forget``), a wake-up on every chunk, and whether the fetcher turned out not to await
    its turns."""

    def __init__(self, st: LiveState):
        self.st = st
        self.lock = asyncio.Lock()
        self.turns: set[Turn] = set()
        self.sent: dict[int, asyncio.Event] = {}
        self.ended: dict[int, asyncio.Event] = {}
        self.progress = asyncio.Event()
        self.ungated = False

    def expect(self, g: int) -> tuple[asyncio.Event, asyncio.Event]:
        """Events set once shard ``g``'s first blob is requested (:meth:`open`), and once its transfer has ended
        (:meth:`landed`; one request at a time, the next leaves then)."""
        sent, landed = self.sent[g], self.ended[g] = asyncio.Event(), asyncio.Event()
        return sent, landed

    def landed(self, g: int) -> None:
        ev = self.ended.get(g)
        if ev is not None:
            ev.set()

    def forget(self, g: int) -> None:
        self.sent.pop(g, None)
        self.ended.pop(g, None)

    def open(self, g: int, size: int) -> Turn:
        """A blob of ``size`` bytes of shard ``g`` is requested: its turn."""
        turn = Turn(self, g, size)
        self.turns.add(turn)
        ev = self.sent.get(g)
        if ev is not None:
            ev.set()
        return turn

    def close(self, turn: Turn) -> None:
        """The blob has ended (received, failed or cancelled): its turn released."""
        turn.release()
        self.turns.discard(turn)
        self.ungated |= turn.offered and not turn.held  # on_chunk's turn was never awaited
        self.progress.set()

    def received(self, turn: Turn, nbytes: int) -> Turn | None:
        """``nbytes`` more of the blob came; the turn the fetcher must await at its first chunk, else None."""
        turn.left = max(turn.left - nbytes, 0)
        if turn.granted_t is not None:
            turn.after += nbytes
        self.progress.set()
        if turn.held:
            return None
        turn.offered = True
        return turn

    def observe(self, turn: Turn | None, t0: float, t1: float, nbytes: int) -> float:
        """Give the estimator a blob requested at ``t0`` and ended at ``t1``; returns when its transfer began. One
        that waited for the wire is the bytes after its turn, timed from the turn less a round trip (as a request
        sent alone is timed)."""
        est = self.st.estimator
        if turn is None or turn.granted_t is None:
            est.observe(nbytes, max(t1 - t0, 1e-6))
            return t0
        t0 = max(t0, turn.granted_t - self.st.rtt_s)
        if turn.after:
            est.observe(turn.after, max(t1 - t0, 1e-6))
        return t0

    async def until_window(self, task: asyncio.Task, sent: asyncio.Event) -> None:
        """Until ``task`` (a shard's fetch) has requested its first blob and the bytes requested and not received
        are within the window, or it has ended, or the wire turns out ungated. Before the estimator's first sample
        there is no window: the request is the bandwidth probe, and this waits for its end."""
        await first_of(task, sent.wait())
        while not task.done() and not self.ungated:
            if request_gate(self.st.estimator, self.st.rtt_s, sum(t.left for t in self.turns))[0]:
                return
            self.progress.clear()
            await first_of(task, self.progress.wait())


async def first_of(task: asyncio.Task, aw) -> None:
    """Wait until ``task`` ends or ``aw`` completes, whichever is first (``aw`` is cancelled if it did not)."""
    waiter = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class Turn:
    """One blob's turn on the wire (the module docstring); ``left``: its bytes not yet received."""

    def __init__(self, wire: Wire, g: int, size: int):
        self.wire, self.g, self.left = wire, g, size
        self.offered = False  # on_chunk returned it
        self.held = False  # the fetcher awaited it
        self._locked = False
        self.granted_t: float | None = None  # when a blob that waited for the wire got it
        self.after = 0  # its bytes received since (what the estimator is given: those before shared the wire)

    def __await__(self):
        return self._take().__await__()

    async def _take(self) -> None:
        self.held = True  # awaited once: the chunks after it pass (the lock is taken before they come)
        st = self.wire.st
        queued = self.wire.lock.locked()
        if queued:  # waiting for the wire: no transfer in progress to the policy (LiveState.link_progress)
            with st.lock:
                entry = st.receiving.get(self.g)
                if entry is not None:
                    entry[0] = QUEUED
        await self.wire.lock.acquire()
        self._locked = True
        with st.lock:
            st.on_wire = self.g  # the transfer the policy sees in progress
            if queued:  # a blob that waited is timed from its turn less the round trip, as the simulator times it
                self.granted_t = st.now
                entry = st.receiving.get(self.g)
                if entry is not None:
                    entry[0] = self.granted_t - st.rtt_s

    def release(self) -> None:
        if self._locked:
            self._locked = False
            st = self.wire.st
            with st.lock:
                if st.on_wire == self.g:
                    st.on_wire = None
            self.wire.lock.release()

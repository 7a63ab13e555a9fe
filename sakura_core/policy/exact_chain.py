"""The planner's exact transfer times (``Snapshot(rate=None)``: the oracle's search): the chain of requests a plan
sends, back to back on the trace itself, and the round trips its first requests still pay.

A plan's evaluation asks :class:`ExactChain` for its requests' ends; a transfer's end depends only on the one before
it and its own round trip and bytes, so the ends of the longest prefix the last evaluation shares are reused, the
same floats (the oracle's coordinate descent changes one step's split at a time: the steps before it keep theirs)."""

from __future__ import annotations

import numpy as np

from .context import Context

__all__ = ["ExactChain", "lead_rtts"]


class ExactChain:
    """:meth:`Context.transfer_chain` from ``link0`` (one snapshot's moment), the last chain's ends kept."""

    def __init__(self, ctx: Context, link0: float):
        self.ctx, self.link0 = ctx, link0
        self._last: tuple[np.ndarray, np.ndarray, list[float]] | None = None  # round trips, bytes, ends

    def ends(self, gaps: np.ndarray, nb: np.ndarray) -> list[float]:
        """When each request arrives (seconds): request ``i`` leaves ``gaps[i]`` after request ``i - 1`` has arrived
        (the first: after ``link0``) and carries ``nb[i]`` bytes. The arrays are kept: do not change them after."""
        m, prev = 0, self._last
        if prev is not None:
            n = min(gaps.size, prev[0].size)
            differ = np.flatnonzero((gaps[:n] != prev[0][:n]) | (nb[:n] != prev[1][:n]))
            m = int(differ[0]) if differ.size else n
        kept = prev[2][:m] if m and prev is not None else []
        ends = kept + self.ctx.transfer_chain(kept[-1] if kept else self.link0, gaps[m:], nb[m:])
        self._last = (gaps, nb, ends)
        return ends


def lead_rtts(ctx: Context) -> tuple[float, ...]:
    """With requests sent ahead (:attr:`Context.queued_rtt_s` < the round trip), the round trips the chain's first
    requests still pay over the queued one: a request to an idle link pays its own; before the estimator's first
    sample the request after the bandwidth probe leaves only once the probe has arrived (the lanes' rule). The
    exact-transfer search (the oracle's) charges them; with an estimated rate they are left out (at most two round
    trips: the closed-form cut table has no per-request offsets)."""
    q, rtt = ctx.queued_rtt_s, ctx.rtt_s
    if q >= rtt:
        return ()
    busy = ctx.link_busy_until() > ctx.now
    n = (0 if busy else 1) + (1 if ctx.estimator.samples == 0 else 0)
    return (rtt - q,) * n

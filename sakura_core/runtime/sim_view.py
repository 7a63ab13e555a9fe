"""What a policy may know of the simulator's link (:class:`SimView`, a mixin of
:class:`~sakura_core.runtime.sim_link.SimLink`): the levels decoded by ``now`` (``got``), each requested shard's
highest level, the ready times a client predicts for the shards requested and not decoded (``in_flight``: never
the true future arrival), the transfer in progress (``link_progress``) and the throughput samples of the transfers
that have arrived. The live pipeline's :class:`~sakura_core.runtime.live_state.LiveState` shows the same."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..fetch.traces import Trace
    from ..policy.estimator import ThroughputEstimator
    from ..policy.ladder import Level

__all__ = ["SimView"]


class _GotView(Mapping):
    """``got`` as a policy sees it at ``now``: a shard's levels decoded by then (shards with none are absent)."""

    def __init__(self, got: dict[int, list[tuple[int, float]]], now: float):
        self._got, self._now = got, now

    def __getitem__(self, g: int) -> list[tuple[int, float]]:
        v = self._got[g]
        if not v or v[0][1] > self._now:
            raise KeyError(g)
        return [x for x in v if x[1] <= self._now]

    def __iter__(self) -> Iterator[int]:
        return (g for g, v in self._got.items() if v and v[0][1] <= self._now)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class SimView:
    """Mixin: the policy's view of the simulated link (see the module docstring); the state lives on the
    simulation (set in ``_Sim.__init__``; times in seconds, sizes bytes)."""

    trace: Trace
    start_s: float
    ladders: list[list[Level]]
    rtt_s: float
    estimator: ThroughputEstimator
    pending_obs: list[tuple[float, int, float]]
    now: float
    link_free: float
    compute_t: float
    _got: dict[int, list[tuple[int, float]]]  # layer -> [(level, ready_t)] in fetch order
    _pred: dict[int, tuple[float, int, float]]
    _wire0: dict[int, float]
    _first_ready: np.ndarray  # (N,) when each shard's first level is decoded
    _pending: list[int]
    _req_t0: list[float]
    _req_g: list[int]

    @property
    def got(self) -> Mapping[int, list[tuple[int, float]]]:
        """Levels decoded by ``now`` (the policy's view; see the module docstring): a read-only view, O(1) a key."""
        return _GotView(self._got, self.now + 1e-12)

    def fetched_levels(self) -> dict[int, int]:
        """``Context.fetched_levels``: each shard's highest level requested, decoded by now or not (``got`` shows
        the decoded ones only; an upgrade on its way must not be asked for again)."""
        return {g: v[0][0] if len(v) == 1 else max(j for j, _ in v) for g, v in self._got.items() if v}

    def known_ready_array(self) -> np.ndarray:
        """``Context.known_ready`` of every shard at once (NaN where None), without a dict per shard."""
        now = self.now + 1e-12
        first = self._first_ready
        out = np.where(first <= now, first, np.nan)
        for g, t in self.in_flight.items():
            out[g] = t
        return out

    def _pending_now(self, now: float) -> list[int]:
        """Shards requested and not decoded by ``now``, in request order (those decoded before every later
        ``now`` can be, leave the list for good: ``now`` is always >= min(link_free, compute_t))."""
        floor = min(self.link_free, self.compute_t)  # link decisions come at link_free, compute ones at compute_t
        self._pending = [g for g in self._pending if self._first_ready[g] > floor]
        return [g for g in self._pending if self._first_ready[g] > now]

    @property
    def in_flight(self) -> dict[int, float]:
        """Requested, not decoded by ``now``: its decode end once it has arrived, else a prediction from what a
        client knows (request times and sizes, the bytes of the transfer in progress received so far) at the robust
        estimate, lowered to the in-progress rate when that transfer is overdue; never the true future arrival."""
        now = self.now + 1e-12
        out: dict[int, float] = {}
        rate = None
        t = now
        for g in self._pending_now(now):
            t0, nbytes, arrive = self._pred[g]
            got = self._got[g]
            if arrive <= now:
                out[g] = got[0][1]
                continue
            if rate is None:
                self.flush_observations()
                rate = self.estimator.robust()
                prog = self.link_progress()
                if prog is not None and prog[0] > self.rtt_s + prog[2] / rate:  # overdue: the link slowed
                    rate = min(rate, max(prog[1], 1.0) / max(prog[0] - self.rtt_s, 1e-3))
            wire0 = self._wire0[g]
            if wire0 <= now:  # its bytes are arriving (a client sees its first bytes)
                t = now + (nbytes - self._received(wire0, now, nbytes)) / rate
            else:  # sent, its bytes not started (or queued behind the transfer in progress)
                t = max(t, t0) + nbytes / rate
            out[g] = t + self.ladders[g][got[0][0]].decode_s
        return out

    def link_progress(self) -> tuple[float, float, float] | None:
        """The transfer in progress at ``now``: (seconds since it was requested, bytes received so far, its size),
        or None when the link is idle (what a client's read loop knows). The wire carries one transfer at a time:
        the last request sent by ``now``, or while that one (sent ahead) waits its turn, the one arriving."""
        now = self.now
        i = bisect.bisect_right(self._req_t0, now + self.rtt_s) - 1
        if i < 0:
            return None
        while i > 0 and now < self._wire0[self._req_g[i]]:  # sent ahead, queued: one before it is arriving
            i -= 1
        g = self._req_g[i]
        _, nbytes, arrive = self._pred[g]
        wire0 = self._wire0[g]
        if not wire0 - self.rtt_s <= now < arrive:
            return None
        return now - (wire0 - self.rtt_s), self._received(wire0, now, nbytes), float(nbytes)

    def _received(self, wire0: float, now: float, nbytes: int) -> float:
        """Bytes of a transfer whose bytes started at ``wire0`` received by ``now`` (what a client's read loop counts)."""
        if now <= wire0:
            return 0.0
        got = self.trace.delivered(self.start_s + now) - self.trace.delivered(self.start_s + wire0)
        return float(min(max(got, 0.0), nbytes))

    def flush_observations(self) -> None:
        """Feed the estimator the transfers that have completed by ``now`` (never one from the future)."""
        done = [o for o in self.pending_obs if o[0] <= self.now + 1e-12]
        if done:
            self.pending_obs = [o for o in self.pending_obs if o[0] > self.now + 1e-12]
            for _, nbytes, seconds in sorted(done):
                self.estimator.observe(nbytes, seconds)

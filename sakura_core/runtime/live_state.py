""":class:`LiveState`: the :class:`~sakura_core.policy.context.PolicyState` the running pipeline keeps (the
simulator keeps its own), on a clock (:mod:`sakura_core.runtime.clock`, the wall clock by default) that a batch of
decisions can freeze. It is what the lanes share with the policy: each lane writes its own fields (the fetch lane
the link's, the compute lane the compute position and the stalls) under ``lock``."""

from __future__ import annotations

import contextlib
import threading

from ..fetch.traces import Trace
from ..policy.context import ComputeCosts
from ..policy.estimator import ThroughputEstimator
from ..policy.ladder import Level
from .clock import Clock, WallClock
from .pipeline_config import RuntimeConfig

__all__ = ["QUEUED", "LiveState"]

#: a ``receiving`` entry's start while its request waits for the wire behind another transfer (requests ahead)
QUEUED = float("inf")


class LiveState:
    """The :class:`PolicyState` the running pipeline keeps (times in seconds since the edit started; see
    :class:`PolicyState` for every attribute); ``lock`` guards the updates a policy reads mid-decision. ``clock``:
    what ``now`` reads (seconds since the last :meth:`reset`) and the waits of the compute lane use. ``config``: the
    run's settings (its round trip, latency target and throughput estimator's settings)."""

    # the fetch lane fetches a shard's re-root chain where the policy names one (Context.reroots; fetch_reroot)
    reroots = True

    def __init__(
        self,
        profile: ComputeCosts,
        trace: Trace | None,
        ladders: list[list[Level]],
        floor: int,
        config: RuntimeConfig,
        *,
        layers_per_step: int | None = None,
        clock: Clock | None = None,
    ):
        self.profile, self.trace, self.ladders, self.floor = profile, trace, ladders, floor
        self.L = len(ladders)
        self.layers_per_step = layers_per_step or len(ladders)  # see PolicyState.layers_per_step
        self.estimator, self.rtt_s = ThroughputEstimator(config.live.estimator), config.rtt_s
        self.pre_lanes = config.live.pre_lanes  # transfers before the lanes: the estimator's seed at every reset
        self.latency_target_s = config.latency_target_s
        self.request_ahead = False  # the fetch lane sends requests ahead (the pipeline sets it; Context.queued_rtt_s)
        self.start_s = 0.0  # the live link starts its trace at the edit's start
        self.clock = clock or WallClock()
        self.lock = threading.RLock()
        self._frozen = threading.local()  # this thread's frozen clock (see frozen_now)
        self.reset()

    def reset(self) -> None:
        """A fresh edit: the clock starts at 0 now, the estimator has only the transfers made before the lanes
        (``RuntimeConfig.pre_lanes``; none: no sample), nothing is fetched or computed."""
        self.estimator.reset()
        for nbytes, seconds in self.pre_lanes:
            self.estimator.seed(nbytes, seconds, self.rtt_s)
        self.t0 = self.clock.now()
        self.link_free = 0.0
        self.decoder_free = 0.0
        self.next_layer = 0
        self.base_done = False
        self.computed: set[int] = set()  # shards the policy computes for good (lane_rules.ask_keep_template)
        self.got: dict[int, list[tuple[int, float]]] = {}
        self.in_flight: dict[int, float] = {}
        # shards being received: shard -> [requested at, bytes received, bytes] (kept only when the fetcher reports
        # its chunks; see link_progress)
        self.receiving: dict[int, list[float]] = {}
        self.on_wire: int | None = None  # requests ahead: the shard whose bytes hold the wire (see link_progress)
        self.template_alive = True
        self.dropped_at = self.layers_per_step  # see PolicyState.dropped_at
        self.stalls_done_s = 0.0  # waits for shards that have ended
        self.waiting_since: float | None = None  # the wait in progress, if any
        self.compute_t = 0.0
        self.compute_layer = 0

    @property
    def now(self) -> float:
        frozen = getattr(self._frozen, "t", None)
        return self.clock.now() - self.t0 if frozen is None else frozen

    @property
    def stalled_s(self) -> float:
        """See PolicyState.stalled_s: the ended waits plus the one in progress."""
        since = self.waiting_since
        return self.stalls_done_s + (0.0 if since is None else max(self.now - since, 0.0))

    def link_progress(self) -> tuple[float, float, float] | None:
        """The transfer in progress, as the simulator's: (seconds since requested, bytes received so far, its size)
        of the shard whose bytes hold the wire (requests sent ahead wait behind it: ``QUEUED``, not in progress),
        else of the earliest shard being received; None when none is (or the fetcher does not report chunks)."""
        with self.lock:
            entry = self.receiving.get(self.on_wire) if self.on_wire is not None else None
            if entry is None or entry[0] == QUEUED:
                entry = min((e for e in self.receiving.values() if e[0] != QUEUED), default=None)
            if entry is None:
                return None
            t0, got, size = entry
        return self.now - t0, min(got, size), size

    @contextlib.contextmanager
    def frozen_now(self):
        """Within the block, ``now`` stays at its value on entry for the calling thread: a batch of decisions taken
        at one moment sees one moment (and a policy can reuse one plan for all of them); other threads' clocks run
        on."""
        outer = getattr(self._frozen, "t", None)
        self._frozen.t = self.now
        try:
            yield self._frozen.t
        finally:
            self._frozen.t = outer

    def flush_observations(self) -> None:
        """Live transfers are observed when they complete; nothing is pending."""

""":class:`LateShards`: the compute lane waiting for a shard that is not decoded yet — a stall (counted in
``LiveState.stalled_s``), asking the policy at the wait's start and every cached-layer time after whether a template
pass on the device is sooner (``recompute_late``, by the simulator's rule: :func:`~.lane_rules.late_wait_until`),
giving up on the link for the step, or, after ``shard_wait_s``, on the shard. A shard the fetch lane skipped is
fetched at the floor first (a policy may not foresee a drop). The waits run on the live state's clock, so a test's
clock controls them."""

from __future__ import annotations

from .deferral import LATE_FALLBACK_REASON
from .fetch_lane import FetchLane
from .lane_parts import LaneParts, PartsView
from .lane_rules import late_gives_up, late_recheck_s, late_wait_until
from .pipeline_config import Cancelled
from .shard_index import ShardId

__all__ = ["LateShards"]

CANCEL_POLL_S = 0.05  # how often a wait for a shard checks the cancel flag (seconds)


class LateShards(PartsView):
    """How the compute lane waits for a late shard (it keeps no state of its own between waits).

    Args:
        parts: what the run's lanes share: the shards, the plan's policy, the live state and the policy's view of
            it, the shards' state (``held``: ready, failed), the timeline, the settings, the cancel flag.
        fetch: the fetch lane, asked to fetch a skipped shard or to skip a step's shards.
        layer_cached_s: the device's cached-layer time (how often the policy is asked).
    """

    def __init__(self, parts: LaneParts, fetch: FetchLane, layer_cached_s: float) -> None:
        self.parts, self.fetch = parts, fetch
        self.poll_s = late_recheck_s(layer_cached_s)

    def wait_for(self, shard: ShardId, step: int) -> None:
        """Block the compute lane (at ``step``) until ``shard`` is ready (a stall in the timeline) or it is given up
        on (then it is failed: the device computes its KV)."""
        st = self.st
        self.fetch.fetch_skipped(shard)
        t0 = st.now
        with st.lock:
            st.waiting_since = t0
        try:
            self._wait_or_give_up(shard, step, t0)
        finally:
            with st.lock:
                st.stalls_done_s += st.now - t0
                st.waiting_since = None
        self.log.event("stall", t0, st.now, shard.g, f"step {step}")

    def _wait_or_give_up(self, shard: ShardId, step: int, t0: float) -> None:
        """Until the shard is ready, the policy gives up on it (asked at the wait's start and every ``poll_s`` after:
        :func:`~.lane_rules.late_wait_until`), or ``shard_wait_s`` has passed (:func:`~.lane_rules.late_gives_up`)."""
        st, wait_s = self.st, self.cfg.live.shard_wait_s
        while not self.held.is_ready(shard):
            if late_gives_up(t0, st.now, wait_s):
                self.log.fallback(f"{shard} not ready after {wait_s}s; computing it on the device")
                self.log.decision(st.now, shard.g, "device", f"{shard} not ready after {wait_s:g} s")
                self.held.give_up(shard)
                return
            with st.lock:
                st.compute_t = st.now
                late = self.policy.recompute_late(self.ctx, shard.g)
            if late:
                self._give_up_on_link(shard, step)
                return
            if self._wait_or_cancel(shard, late_wait_until(t0, st.now, self.poll_s, wait_s) - st.now):
                return
            if self.cancel.is_set():
                raise Cancelled(f"edit cancelled at step {step}, layer {shard.layer} while waiting for its shard")

    def _wait_or_cancel(self, shard: ShardId, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` (on the live state's clock) for ``shard``, returning early (False) once the edit
        is cancelled."""
        ready, clock = self.held.ready[shard], self.st.clock
        waited = 0.0
        while not self.cancel.is_set() and waited < timeout_s:
            step = min(CANCEL_POLL_S, timeout_s - waited)
            if clock.wait(ready, step):
                return True
            waited += step
        return ready.is_set()

    def _give_up_on_link(self, shard: ShardId, step: int) -> None:
        """The policy says a template pass on the device is sooner than waiting: the shard is given up on, and the
        device's template pass (:meth:`DeviceKV.kv`) makes the KV of this step's layers (every layer's in single
        mode) from there, layer by layer while the link keeps fetching the later shards; it stops once they are
        decoded (:func:`~sakura_core.runtime.deferral.pass_can_stop`)."""
        st = self.st
        self.log.decision(st.now, shard.g, "device", LATE_FALLBACK_REASON)
        where = f"step {step}" if self.grid.per_step else "every layer"
        self.log.fallback(
            f"{shard} late: the device computes the template KV of {where} until the link has the rest (policy: "
            "sooner than waiting)"
        )
        with st.lock:
            self.held.give_up(shard)

"""What the simulated phone's CPU pays besides the DiT: the policy's decisions (:class:`PlanClock`) and, when the DiT
itself runs on the application CPU, the cores that decode and planning threads take from it (:class:`CpuShare`).

Planning: every policy call is charged (``SimConfig.planning``): its CPU time on this host (``time.thread_time``)
x the profile's ``cpu_slowdown``, or a fixed cost per call. A decision on the link side (``choose``, ``upgrade``,
asking deferred shards again) delays the request it leads to; one on the compute lane (``keep_template``,
``recompute_late``) delays the compute lane.

Sharing (profiles with ``dit_cpu_cores`` > 0): while a decode or a link-side planning thread works, the DiT runs
on the other cores, at ``(cores - 1) / cores`` of its speed per such thread. The simulator settles this before
each layer: the overlap of those threads' busy intervals with the compute lane's busy time since the last layer,
divided by ``cores``, is added to the compute lane (the link lane only runs ahead to the compute lane's time, so
every interval that overlaps a finished window is known by then).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..policy.base import Policy

__all__ = ["CpuShare", "PlanClock"]


class PlanClock(Policy):
    """Wraps a policy for the simulator: the same decisions, each charged. ``mode``: "off", "measured" (CPU time x
    ``scale``) or "fixed" (``fixed_s`` per call); ``take()`` returns what was charged since the last ``take``."""

    def __init__(self, inner: Policy, mode: str = "off", fixed_s: float = 0.0, scale: float = 1.0):
        self.inner, self.mode, self.fixed_s, self.scale = inner, mode, fixed_s, scale
        self.name, self.family = inner.name, inner.family
        self.template_every_step, self.kv_preloaded = inner.template_every_step, inner.kv_preloaded
        self.owed = self.total_s = 0.0
        self.calls = 0

    def reset(self) -> None:
        self.inner.reset()
        self.owed = self.total_s = 0.0
        self.calls = 0

    def take(self) -> float:
        owed, self.owed = self.owed, 0.0
        return owed

    def _call(self, method: str, *args):
        if self.mode == "off":
            return getattr(self.inner, method)(*args)
        t0 = time.thread_time()
        out = getattr(self.inner, method)(*args)
        cost = (time.thread_time() - t0) * self.scale if self.mode == "measured" else self.fixed_s
        self.owed += cost
        self.total_s += cost
        self.calls += 1
        return out

    def choose(self, ctx, layer):
        return self._call("choose", ctx, layer)

    def keep_template(self, ctx, layer):
        return self._call("keep_template", ctx, layer)

    def upgrade(self, ctx):
        return self._call("upgrade", ctx)

    def recompute_late(self, ctx, layer):
        return self._call("recompute_late", ctx, layer)

    def worth_asking(self, ctx, shards):
        return self._call("worth_asking", ctx, shards)

    def reroot_chain(self, ctx, layer):
        # not charged: part of the fetch decision just made (its plan is the one choose made)
        return self.inner.reroot_chain(ctx, layer)


class CpuShare:
    """Mixin of the simulation: the compute lane's busy segments, other threads' busy intervals, and the settling
    of what those threads cost the DiT (see the module docstring). Needs ``cores`` (0 = not shared),
    ``compute_t`` and ``_compute``."""

    compute_t: float  # the simulation's compute lane: when it starts its next layer, seconds
    _compute: Callable[[float, int, str], None]  # (seconds, layer, what): the simulation's compute lane runs

    def _init_cpu_share(self, cores: float) -> None:
        self.cores = cores
        self._segs: list[tuple[float, float]] = []  # compute lane busy
        self._busy: dict[str, list[tuple[float, float]]] = {"decode": [], "planning": []}  # each serial
        self._first: dict[str, int] = {"decode": 0, "planning": 0}
        self._settled_t = 0.0
        self.contention_s = 0.0

    def cpu_busy(self, kind: str, t0: float, t1: float) -> None:
        """Another thread (``decode`` / ``planning``) works on the CPU in [t0, t1)."""
        if self.cores and t1 > t0:
            self._busy[kind].append((t0, t1))

    def settle_contention(self) -> None:
        """Charge the DiT, from ``compute_t``, for the threads that shared its cores since the last settle."""
        if not self.cores:
            return
        t_end, t_start = self.compute_t, self._settled_t
        segs, self._segs = self._segs, []  # settled: never read again (a long wait would keep every segment)
        self._settled_t = t_end
        overlap = 0.0
        for kind, intervals in self._busy.items():
            i = self._first[kind]
            while i < len(intervals) and intervals[i][1] <= t_start:
                i += 1
            self._first[kind] = i
            for b0, b1 in intervals[i:]:
                if b0 >= t_end:
                    break
                b0, b1 = max(b0, t_start), min(b1, t_end)
                overlap += sum(max(0.0, min(b1, s1) - max(b0, s0)) for s0, s1 in segs)
        debt = overlap / self.cores
        if debt > 0:
            self.contention_s += debt
            self._compute(debt, -1, "DiT slowed: decode / planning threads on its cores")

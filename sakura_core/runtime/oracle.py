"""The oracle's search and the fixed-split policy it (and the regime map) runs: the best per-step split vector under
exact transfer times, played through the simulator (:mod:`.simulate`); and the fluid lower bound no policy beats.

Fluid lower bound (:func:`fluid_bound`): the link a fluid at the trace's rate from the edit's start (no round trips,
no gaps between requests, the future known), decoding free, any set of layers fetched (not only a split per step),
each fetched at its floor level, and a fetched layer's compute overlapping the arrival of its own bytes (it ends no
sooner than they have arrived). Then fetching the ``m`` smallest floor shards for the last ``m`` layers is best (a
fetched layer later in the order has more time, a smaller one arrives sooner), so the bound is the minimum over
``m`` of ``max(compute, link)``: compute = ``(N - m) full + m cached`` layers, link = for every ``i <= m``, the time
the first ``i`` of those shards take to arrive plus the ``m - i`` cached layers after the ``i``-th; plus the fixed
work (and in single KV mode the cached later steps)."""

from __future__ import annotations

import numpy as np

from ..policy.ladder import shard_floor
from ..policy.planner import Snapshot, best_plan
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy
from .simulate import SimConfig, SimResult, _Sim, simulate

__all__ = ["fixed_split_policy", "fluid_bound", "simulate_oracle"]


class _FixedSplit(Policy):
    """Compute layers < split on the device, fetch the rest at the floor level (at every step in per-step mode; a
    list gives one split per step). Used by the oracle search and the regime map."""

    family = "sakura"

    def __init__(self, split: int | list[int] | tuple[int, ...]):
        self.split = split
        self.name = f"split-{split}"

    def _k(self, ctx, shard: int) -> int:
        if isinstance(self.split, int):
            return self.split
        return self.split[min(ctx.step_of(shard), len(self.split) - 1)]

    def choose(self, ctx, layer):
        if ctx.layer_of(layer) < self._k(ctx, layer):
            return Decision(LEVEL_COMPUTE, "fixed split")
        return Decision(ctx.floor_of(layer), "fixed split: floor level")

    def keep_template(self, ctx, layer):
        return ctx.layer_of(layer) < self._k(ctx, layer)


def fixed_split_policy(split: int | list[int]) -> Policy:
    """A policy that computes layers < ``split`` on the device and fetches the rest at the floor level (``split``:
    one split for every step, or one per step)."""
    return _FixedSplit(split)


def simulate_oracle(policy: Policy, trace, profile, ladders, floors, start_s=0.0, config=None) -> SimResult:
    """The oracle: knows the trace. The best per-step split vector under exact transfer times (coordinate descent
    over each step's split, :func:`~sakura_core.policy.planner.best_plan`), run through the simulator (upgrades in
    the slack included), against the same policy's adaptive run with exact rates in single mode; the fastest wins."""
    fam = ladders[policy.family]
    probe = _Sim(fixed_split_policy(0), trace, start_s, profile, fam, floors.get(policy.family, 0),
                 config or SimConfig())  # fmt: skip
    plan = best_plan(Snapshot(probe.ctx, None))
    best = simulate(fixed_split_policy(list(plan.splits)), trace, profile, ladders, floors, start_s, config)
    if not probe.per_step:
        r = simulate(policy, trace, profile, ladders, floors, start_s, config)
        if r.latency_s < best.latency_s - 1e-9:
            best = r
    best.policy = policy.name
    return best


def fluid_bound(trace, profile, ladders, floors, start_s: float = 0.0, family: str = "sakura") -> float:
    """The fluid lower bound on the edit's latency (seconds; see the module docstring) for ``family``'s floor
    shards. ``ladders`` as :func:`~sakura_core.runtime.simulate.simulate` takes them (the shard count gives the KV
    mode)."""
    lads, floor = ladders[family], floors.get(family, 0)
    g = profile.model
    N, F, C = len(lads), profile.layer_full_s, profile.layer_cached_s
    per_step = N == g.layers * g.steps and g.steps > 1
    tail = profile.fixed_s + (0.0 if per_step else (g.steps - 1) * g.layers * C)
    sizes = np.cumsum(
        np.sort([float(lad[shard_floor(floor, g)].least_nbytes) for g, lad in enumerate(lads)])
    )  # i smallest
    arrive = np.array([trace.finish_time(start_s, b) - start_s for b in sizes])  # (N,) i = 1..N
    m = np.arange(N + 1)
    compute = (N - m) * F + m * C
    # link bound for m: max over i <= m of arrive_i + (m - i) C = m C + max_{i <= m} (arrive_i - i C)
    i = np.arange(1, N + 1)
    best = np.concatenate([[-np.inf], np.maximum.accumulate(arrive - i * C)])
    link = m * C + best
    return float(np.min(np.maximum(compute, link)) + tail)

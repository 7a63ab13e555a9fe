"""The oracle's search and the fixed-split policy it (and the regime map) runs: the best per-step split vector under
exact transfer times, played through the simulator (:mod:`.simulate`); and the fluid lower bound no policy beats.

Fluid lower bound (:func:`fluid_bound`): the link a fluid at the trace's rate from the edit's start (no round trips,
no gaps between requests, the future known), decoding free, every fetched shard at the fewest bytes a fetch at its
floor or above can cost, whatever the track (:func:`~sakura_core.policy.ladder.fewest_fetch_bytes`: a twins'-track
floor as its twin or the open-loop floor, never as its own open-loop residual, which no fetch at the floor takes;
before 2026-12-05 the bound priced it so), and a fetched layer's compute overlapping the arrival of
its own bytes (it ends no sooner than they have arrived). What it keeps of the device: in each step the template's
layers computed on the device are a prefix (layer l's template KV needs the template's hidden state after layer
l - 1: a fallback pass resumes where the step dropped the template and makes every layer up to the one it needs, at
no less than the prefix's cost, since a full layer costs at most a template-pass layer plus a cached one). So an
edit's runs are bounded by the split vectors (k_s: layers < k_s full, the rest cached on fetched KV) with the shards
fetched in the order the compute lane uses them (any other order delays a shard needed sooner). Step s of split k
from lane time t with B bytes fetched before it ends at ``(L - k) cached + max(t + k full, max_j (arrive_j -
(j - k) cached))`` (``arrive_j``: when B plus the step's shards k..j-1 have come); a dynamic programme over the
steps keeps the (end, bytes) pairs no other beats in both. Plus the fixed work (and in single KV mode the cached
later steps). Not modelled, so still optimistic: round trips, decode, CPU sharing, planning, which of a shard's
twin or open-loop floor its track allows."""

from __future__ import annotations

import numpy as np

from ..policy.ladder import fewest_fetch_bytes, shard_floor
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


def simulate_oracle(
    policy: Policy, trace, profile, ladders, floors, start_s=0.0, config=None, template_image_bytes: int = 0
) -> SimResult:
    """The oracle: knows the trace. The best per-step split vector under exact transfer times and bytes (a layer
    computed at a step takes it off the twins' track: the open-loop floor's bytes after; coordinate descent over each
    step's split, :func:`~sakura_core.policy.planner.best_plan`), run through the simulator (upgrades in
    the slack included), against the same policy's adaptive run with exact rates in single mode; the fastest wins.
    ``template_image_bytes``: the image before the lanes, as :func:`~sakura_core.runtime.simulate.simulate` takes it
    (the oracle's plan starts where the lanes start)."""
    fam = ladders[policy.family]
    probe = _Sim(
        fixed_split_policy(0),
        trace,
        start_s,
        profile,
        fam,
        floors.get(policy.family, 0),
        config or SimConfig(),
        template_image_bytes,
    )
    plan = best_plan(Snapshot(probe.ctx, None, track=True))  # off the twins' track a shard costs the open floor
    img = template_image_bytes
    best = simulate(fixed_split_policy(list(plan.splits)), trace, profile, ladders, floors, start_s, config, img)
    if not probe.per_step:
        r = simulate(policy, trace, profile, ladders, floors, start_s, config, img)
        if r.result.latency_s < best.result.latency_s - 1e-9:
            best = r
    best.result.policy = policy.name
    return best


def fluid_bound(
    trace, profile, ladders, floors, start_s: float = 0.0, family: str = "sakura", pre_lanes_s: float = 0.0
) -> float:
    """The fluid lower bound on the edit's latency (seconds; see the module docstring) for ``family``'s floor
    shards. ``profile`` and ``ladders`` as :func:`~sakura_core.runtime.simulate.simulate` takes them (the shard count
    gives the KV mode); not ``kv_mode_view``'s flattened per-step profile, whose one step would stretch the device's
    prefix over the whole edit (a constraint no policy has: the bound went over the oracle). ``pre_lanes_s``: seconds
    before the lanes start (the template image, :func:`~sakura_core.runtime.pre_lanes.template_image_s`, as the
    simulator charges ``simulate(..., template_image_bytes=...)``): the link is read from there, the bound counts
    them."""
    start_s, lead = start_s + pre_lanes_s, pre_lanes_s
    lads, floor = ladders[family], floors.get(family, 0)
    g = profile.model
    if g.name.endswith("/per-step"):
        raise ValueError(
            f"fluid_bound got the flattened per-step profile {g.name!r}: pass the profile itself (as simulate takes "
            "it); the per-step structure comes from its model's steps and layers"
        )
    N, F, C = len(lads), profile.layer_full_s, profile.layer_cached_s
    per_step = N == g.layers * g.steps and g.steps > 1
    S, L = (g.steps, g.layers) if per_step else (1, N)
    tail = profile.fixed_s + (0.0 if per_step else (g.steps - 1) * g.layers * C)
    nbytes = np.array([float(fewest_fetch_bytes(lad, shard_floor(floor, g))) for g, lad in enumerate(lads)])
    nbytes = nbytes.reshape(S, L)
    ts, bs = np.zeros(1), np.zeros(1)  # Pareto front of (the compute lane's time, bytes fetched) at a step's end
    k = np.arange(L + 1)
    j = np.arange(1, L + 1)
    firsts = np.concatenate([[0], np.cumsum(L - k[:-1])[:-1]])  # where split k's pairs start (k < L)
    for s in range(S):
        cum = np.concatenate([[0.0], np.cumsum(nbytes[s])])
        # split k fetches layers k..L-1 in order: the j-th layer (j > k) arrives once cum[j] - cum[k] more bytes have
        # come, and the lane's end is (L - k) C + max(t + k F, max_{j > k} (arrive_j - (j - k) C))
        later = j[None, :] > k[:, None]  # (splits, layers)
        extra = (cum[None, 1:] - cum[k][:, None])[later]  # the (split, layer) pairs with j > k, split by split
        lag = ((j[None, :] - k[:, None]) * C)[later]
        ends = np.empty((ts.size, L + 1))
        for r in range(0, ts.size, _ROWS):  # the states a block at a time ((rows, 1) against the pairs)
            t, b = ts[r : r + _ROWS, None], bs[r : r + _ROWS, None]
            arrive = trace.finish_times(start_s, b + extra) - start_s
            link = np.full((t.shape[0], L + 1), -np.inf)  # split L fetches nothing
            link[:, :L] = np.maximum.reduceat(arrive - lag, firsts, axis=1)
            ends[r : r + _ROWS] = (L - k) * C + np.maximum(t + k * F, link)
        ts, bs = _pareto(ends.ravel(), (bs[:, None] + cum[-1] - cum[k]).ravel())
    return float(lead + ts.min() + tail)


#: states of the fluid bound's front priced in one block (numpy work element by element, memory bounded)
_ROWS = 256


def _pareto(times: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (time, bytes) points no other point beats in both (an earlier lane and fewer bytes on the link ahead of
    the next step's shards can only help), in time order (ties: fewer bytes first; a repeat kept once)."""
    order = np.lexsort((nbytes, times))
    t, b = times[order], nbytes[order]
    least = np.concatenate([[np.inf], np.minimum.accumulate(b)[:-1]])  # the fewest bytes of the points before
    keep = b < least
    return t[keep], b[keep]

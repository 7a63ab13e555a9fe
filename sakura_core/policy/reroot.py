"""Re-rooting a layer on its twins' track (per-step KV on a twins'-track floor, long edits): a layer the device
computed at some steps is off its closed-loop track from then on (the next step's twin is coded against a reference
the device does not hold), and its later shards cost the open-loop floor. Fetching the layer's chain of shards from
the last step held on the track (or from step 0, the tracks' root) puts it back: each chain shard is decoded only as
the reference of the next one, and the shard the plan needs is then fetched as its twin. At 28 / 50 steps a chain is
the step-0 floor (~5 MB) plus ~0.5-1.6 MB a step, where the open-loop floor costs ~24 MB every step.

:func:`chain_of` is the runtime rule (which shards to fetch before a shard; the simulator and the live lanes fetch
them where the state says ``reroots``, both through
:func:`~sakura_core.runtime.lane_rules.ask_reroot_chain`), :func:`chain_bytes` the planner's price of it for a whole
plan at once."""

from __future__ import annotations

import numpy as np

from .context import Context

__all__ = ["chain_bytes", "chain_of", "step_sums"]


def chain_of(ctx: Context, g: int, requested: np.ndarray) -> list[int]:
    """The shards (in fetch order) that put shard ``g``'s layer back on its twins' track before ``g`` is fetched at
    its floor: the same layer at every step since the last one requested (``requested``: (shards,) bool, decoded or
    on the way), back to step 0 when none is. Empty when ``g`` is on its track already (its reference requested),
    when the last one requested is held off the track (at another level: a chain from it cannot be decoded), when a
    chain shard's floor is a ``reuse`` rung, or when the chain and ``g``'s twin cost no less than ``g``'s open-loop
    floor (then ``g`` comes as that floor, as before)."""
    L = ctx.layers_per_step
    step, layer = divmod(g, L)
    chain: list[int] = []
    j = step - 1
    while j >= 0 and not requested[j * L + layer]:
        chain.append(j * L + layer)
        j -= 1
    if not chain:
        return []
    if j >= 0:
        ref = j * L + layer
        if ctx.fetched_levels().get(ref) != ctx.floor_of(ref):
            return []
    if ctx.floor_reuses()[chain].any():
        return []
    nb = ctx.floor_arrays()[0]
    total = 0.0
    for c in chain:  # in order, one by one: as the page's port
        total += float(nb[c])
    if total + float(nb[g]) >= float(ctx.floor_off_track_bytes()[g]):
        return []
    return chain[::-1]


def chain_bytes(nb: np.ndarray, requested: np.ndarray, steps: int, cum: np.ndarray | None = None) -> np.ndarray:
    """(shards,) for every shard the on-track floor bytes of the chain that re-roots its layer before it (the same
    layer at the steps since the last one in ``requested``, back to step 0 when none is; 0 where the step before is
    requested). ``nb``: the on-track floor bytes; ``requested``: (shards,) bool, what is fetched by then (decoded, on
    the way, or planned); ``cum``: :func:`step_sums` of ``nb`` when the caller keeps it (a plan search prices many
    plans on the same bytes). Steps x layers numpy work."""
    if cum is None:
        cum = step_sums(nb, steps)
    req = requested.reshape(steps, -1)
    last = np.maximum.accumulate(np.where(req, np.arange(steps)[:, None], -1), axis=0)
    start = np.zeros(req.shape, dtype=np.intp)  # the first step of each chain: after the last requested before it
    start[1:] = last[:-1] + 1
    return (cum[:-1] - cum[start, np.arange(req.shape[1])[None, :]]).reshape(-1)


def step_sums(nb: np.ndarray, steps: int) -> np.ndarray:
    """(steps + 1, layers): row ``s`` the bytes of each layer's shards at the steps before ``s`` (:func:`chain_bytes`
    reads it)."""
    nbg = nb.reshape(steps, -1)
    return np.vstack([np.zeros((1, nbg.shape[1])), np.cumsum(nbg, axis=0)])

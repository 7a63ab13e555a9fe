"""Which shard the sakura policy's per-step bandwidth probe fetches (the first request of an edit, made before any
throughput sample): :func:`probe_shard`."""

from __future__ import annotations

from .context import Context

__all__ = ["probe_shard"]


def probe_shard(ctx: Context, first: int, L: int) -> int:
    """The shard the per-step bandwidth probe fetches when the running step starts at shard ``first`` (see
    :meth:`~sakura_core.policy.sakura.Sakura._probe_skips`): the next step's first shard with bytes (the first with bytes after the running
    step) where its floor decodes on its own or, a cross-step residual, costs off its twins' track (its reference is
    computed on the device, so a twin floor is fetched at the open-loop one) no more than the running step's last
    shard with bytes after ``first``; else that last shard; else ``first``."""
    reuse, n = ctx.floor_reuses(), ctx.num_layers
    nxt = next((g for g in range(first + L, n) if not reuse[g]), None)
    last = next((g for g in range(first + L - 1, first, -1) if not reuse[g]), None)
    if nxt is None:
        return first if last is None else last
    self_contained = ctx.ladder(nxt)[ctx.floor_of(nxt)].ref_step is None
    if self_contained or last is None or ctx.floor_off_track_bytes()[nxt] <= ctx.floor_arrays()[0][last]:
        return nxt
    return last

"""The piece of the fetch protocol the simulator and the live fetch lane share: asking the policy again about the
shards it deferred ("not now"), and the reason a late-shard fallback is logged with."""

from __future__ import annotations

from ..policy.context import Context
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy

__all__ = ["LATE_FALLBACK_REASON", "ask_deferred"]

LATE_FALLBACK_REASON = "shards late: template pass on the device is sooner"


def ask_deferred(policy: Policy, ctx: Context, deferred: list[int], compute_layer: int) -> tuple[int, Decision] | None:
    """Ask ``policy`` again about each shard of ``deferred`` the compute lane has not reached (``> compute_layer``),
    in order; the first it now wants leaves the list and is returned with its decision. ``deferred`` is updated in
    place: shards already reached, and shards the policy now computes for good (no ``defer``), are dropped. Only the
    shards :meth:`Policy.worth_asking` keeps are asked (those it leaves out, its ``choose`` would defer again)."""
    deferred[:] = [g for g in deferred if g > compute_layer]
    for g in policy.worth_asking(ctx, list(deferred)):
        d = policy.choose(ctx, g)
        if d.level is None or d.level == LEVEL_COMPUTE:
            if not d.defer:
                deferred.remove(g)
            continue
        deferred.remove(g)
        return g, d
    return None

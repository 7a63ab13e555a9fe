"""The pieces of the fetch protocol the simulator and the live runtime share: asking the policy again about the
shards it deferred ("not now", :func:`ask_deferred`), which of them a fallback template pass made (:func:`drop_made`),
the reason a late-shard fallback is logged with, when that fallback template pass stops early
(:func:`pass_can_stop`), and how far requests go ahead of the wire (:func:`ahead_window_bytes`, and the gate on the
next request, :func:`request_gate`; the page's ``phone_web/src/lanes/lane_rules.js`` has the same, held to this one by
conformance vectors)."""

from __future__ import annotations

from collections.abc import Callable

from ..policy.context import Context
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy

__all__ = [
    "AHEAD_WINDOW_RTTS",
    "LATE_FALLBACK_REASON",
    "ahead_window_bytes",
    "ask_deferred",
    "drop_made",
    "pass_can_stop",
    "pass_stopped_reason",
    "request_gate",
]

LATE_FALLBACK_REASON = "shards late: template pass on the device is sooner"

#: requests sent ahead (``request_ahead``) cover this many round trips of the link at the estimator's rate
AHEAD_WINDOW_RTTS = 2.0


def ahead_window_bytes(estimator, rtt_s: float) -> float | None:
    """With requests sent ahead, the next request leaves once the bytes requested and not yet received are at most
    this many (a bandwidth-delay product, :data:`AHEAD_WINDOW_RTTS` round trips at the estimator's harmonic rate:
    enough that the next transfer's first byte follows the last one's, short shards included, and the decision is
    taken as late as that allows). None before the estimator's first sample: the first request is the bandwidth
    probe, and the next leaves only once it has arrived."""
    if not estimator.samples:
        return None
    return AHEAD_WINDOW_RTTS * rtt_s * estimator.harmonic()


def request_gate(estimator, rtt_s: float, left_bytes: float) -> tuple[bool, str]:
    """Whether the fetch lane's next request may leave now, requests going ahead (``request_ahead``), and the
    reason: "probe" (no estimator sample yet: no window, the first request is the bandwidth probe and the next one
    waits for its end), "within-window" (``left_bytes``, the bytes requested and not yet received, are at most
    :func:`ahead_window_bytes`: it leaves) or "beyond-window" (it waits for more of them to arrive)."""
    window = ahead_window_bytes(estimator, rtt_s)
    if window is None:
        return False, "probe"
    if left_bytes <= window:
        return True, "within-window"
    return False, "beyond-window"


def pass_can_stop(late: int, end: int, made: Callable[[int], bool], ready: Callable[[int], bool]) -> bool:
    """The fallback template pass (for the ``late`` shard, given up on) runs layer by layer while the link keeps
    fetching, the late shard's own transfer included; after each layer it stops once every shard the step still
    needs, from the late one to flat index ``end`` (the step's end, every layer in single mode), is made by it
    (``made``) or decoded (``ready``): the step then goes on with the fetched KV. The rule needs no prediction, so
    stopping never costs time: the layers left of the pass would only have made KV that is there already (fetched
    KV is lossy: the error bound of its level holds, as for any fetched shard). A late shard that arrives while the
    pass runs counts: giving up on it bets on the pass, not against the link, so a wrong give-up costs the pass
    only until the link has caught up."""
    return all(made(g) or ready(g) for g in range(late, end))


def pass_stopped_reason(layer: int, end: int) -> str:
    """The decision log's words for a fallback pass that stopped after its ``layer`` (``end``: the step's)."""
    return f"fallback pass stopped after layer {layer} of {end}: every shard still needed is decoded or made by it"


def drop_made(shards: list[int], made: Callable[[int], bool]) -> None:
    """A shard a fallback template pass made (``made``: the device holds its KV) leaves ``shards`` (in place): the
    shards the policy deferred, and the ones the compute lane asked the link for; it is neither asked about again
    nor fetched (the lanes call this before they ask or fetch)."""
    shards[:] = [g for g in shards if not made(g)]


def ask_deferred(
    policy: Policy, ctx: Context, deferred: list[int], first_unreached: int, computed: set[int]
) -> tuple[int, Decision] | None:
    """Ask ``policy`` again about each shard of ``deferred`` the compute lane has not reached (``>= first_unreached``:
    the live lane's ``compute_layer`` is the layer it runs, so one past it; the simulator's is the layer it is about
    to start, not reached while the link catches up to that start), in order; the first it now wants leaves the list
    and is returned with its decision. ``deferred`` is updated in place: shards already reached, and shards the
    policy now computes for good (no ``defer``: added to ``computed``, see
    :func:`~sakura_core.runtime.lane_rules.ask_keep_template`), are dropped. Only the shards
    :meth:`Policy.worth_asking` keeps are asked (those it leaves out, its ``choose`` would defer again)."""
    deferred[:] = [g for g in deferred if g >= first_unreached]
    for g in policy.worth_asking(ctx, list(deferred)):
        d = policy.choose(ctx, g)
        if d.level is None or d.level == LEVEL_COMPUTE:
            if not d.defer:
                deferred.remove(g)
                computed.add(g)
            continue
        deferred.remove(g)
        return g, d
    return None

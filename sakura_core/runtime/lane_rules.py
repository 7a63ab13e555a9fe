"""The lanes' protocol rules that the live lanes (:mod:`.fetch_lane`, :mod:`.late_shards`, :mod:`.device_kv`) and
the simulator (:mod:`.sim_link`, :mod:`.simulate`) both follow, each written once here (the rest are in
:mod:`.deferral`: the deferred shards asked again, the request-ahead window, the fallback pass's stop). Each is a
pure function of what its caller passes: the caller keeps its own state (the live state under its lock, or the
simulation's) and acts on the answer.

- :func:`ask_in_order`: the in-order base ask of the next shard and what the lane does with the answer.
- :func:`ask_keep_template`: the split, asked before each layer while the template runs (not at a shard the policy
  computes for good).
- :func:`decode_span`: when a shard whose bytes have landed is decoded (the ready time the policy sees then).
- :func:`late_recheck_s`, :func:`late_wait_until` and :func:`late_gives_up`: a compute lane waiting for a late shard
  asks ``recompute_late`` at the wait's start and again every cached-layer time, and gives up on the shard after
  ``shard_wait_s``.
- :func:`has_prefetch_room`: whether a later step's shard may be fetched within ``LaneConfig.prefetch_kv_bytes``
  (:func:`prefetch_room`: the same with its reason; the page's ``phone_web/src/lanes/lane_rules.js`` has both).
- :func:`link_passed`: whether the link went past a shard without fetching it (the compute lane then has it
  fetched at the floor level when it needs it).
- :func:`ask_upgrade`: the progressive upgrade the policy asks for on the idle link, once the base fetches are done.
- :func:`ask_reroot_chain`: the re-root chain fetched before a shard chosen at its floor (per-step KV), each chain
  shard with the decision's reason.
- :func:`pass_makes` and :func:`pass_stops_after`: which layers a fallback template pass keeps, and after which it
  stops (:func:`~sakura_core.runtime.deferral.pass_can_stop`, never after the step's last layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from ..policy.context import Context
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy
from .deferral import pass_can_stop

__all__ = [
    "RECHECK_MIN_S",
    "ROOM_GOES",
    "InOrderAction",
    "ask_in_order",
    "ask_keep_template",
    "decode_span",
    "ask_upgrade",
    "ask_reroot_chain",
    "has_prefetch_room",
    "late_gives_up",
    "late_recheck_s",
    "late_wait_until",
    "link_passed",
    "prefetch_room",
    "pass_makes",
    "pass_stops_after",
]

#: what the fetch lane does with the next shard in order: "made" (a fallback template pass made its KV: not asked,
#: not fetched, the lane moves on), "stop" (the policy fetches nothing more), "compute" (the device computes it),
#: "defer" (not now: asked again later, :func:`~sakura_core.runtime.deferral.ask_deferred`), "fetch" (at the
#: decision's level)
InOrderAction = Literal["made", "stop", "compute", "defer", "fetch"]

#: a compute lane waiting for a late shard asks ``recompute_late`` again every cached-layer time, but no more often
#: than this (a client's timer; on a very fast device a multi-second stall would otherwise be millions of asks)
RECHECK_MIN_S = 1e-3


def ask_in_order(policy: Policy, ctx: Context, g: int, made_on_device: bool) -> tuple[InOrderAction, Decision | None]:
    """The in-order base ask of shard ``g`` (every shard once, in execution order): not asked when a fallback pass
    made its KV (``made_on_device``), else the policy's ``choose`` and what the lane does with it. Every action but
    "made" carries the decision (the caller logs it); every action but "stop" moves the lane to the next shard."""
    if made_on_device:
        return "made", None
    d = policy.choose(ctx, g)
    if d.level is None:
        return "stop", d
    if d.level == LEVEL_COMPUTE:
        return ("defer" if d.defer else "compute"), d
    return "fetch", d


#: :func:`prefetch_room`'s reasons that let the shard be fetched now (the others, "size-unknown" and "no-room", wait)
ROOM_GOES = frozenset({"no-cap", "running-step", "room"})


def prefetch_room(g: int, running_end: int, later_bytes: int, shard_bytes: int | None, cap: int | None) -> str:
    """:func:`has_prefetch_room` with its reason: "no-cap" (no limit), "running-step" (a shard of the running step),
    "size-unknown" (no shard decoded yet: it waits), "room" (within the cap) or "no-room" (it waits);
    :data:`ROOM_GOES` are those that fetch."""
    if cap is None:
        return "no-cap"
    if g < running_end:
        return "running-step"
    if shard_bytes is None:
        return "size-unknown"
    return "room" if later_bytes + shard_bytes <= cap else "no-room"


def ask_keep_template(policy: Policy, ctx: Context, g: int, computed: set[int]) -> bool:
    """The split: whether the device keeps computing the template tokens at shard ``g`` (asked before each layer
    while they run). At a shard the policy computes for good (``computed``: asked in order, it said "compute"; or,
    deferred, it said so when asked again, :func:`~sakura_core.runtime.deferral.ask_deferred`) the template is kept
    without asking: no KV of it is coming, and the call (a plan, charged as planning time) is spared."""
    return g in computed or policy.keep_template(ctx, g)


def decode_span(
    landed_s: float, decode_s: float, decoder_free_s: float, reference_s: float = 0.0
) -> tuple[float, float]:
    """When a shard whose bytes landed at ``landed_s`` is decoded: ``(start, end)``, its decode starting once its
    bytes are here, the decoder is free (``decoder_free_s``) and its reference is decoded (``reference_s``, a
    cross-step residual's), and taking ``decode_s``. The end is the shard's ready time the policy sees from then on
    (``in_flight``)."""
    start = max(landed_s, decoder_free_s, reference_s)
    return start, start + decode_s


def has_prefetch_room(g: int, running_end: int, later_bytes: int, shard_bytes: int | None, cap: int | None) -> bool:
    """Per-step mode's prefetch room (``LaneConfig.prefetch_kv_bytes`` = ``cap``): a shard of the running step (flat
    index ``g`` below ``running_end``, the step's end) is always fetched; a later step's shard only while the KV of
    the later steps' shards requested so far (``later_bytes``: held, and requested and not yet held) plus its own
    (``shard_bytes``; None while no shard has been decoded and the size is not known: it waits) stays within
    ``cap``. None: no limit."""
    return prefetch_room(g, running_end, later_bytes, shard_bytes, cap) in ROOM_GOES


def link_passed(g: int, base_done: bool, next_layer: int) -> bool:
    """The link has gone past shard ``g`` in order (the base fetches are done, or the next shard asked is a later
    one): a shard it did not fetch then (the policy computes it, or deferred it) is fetched at the floor level once
    the compute lane needs it (a policy may not foresee a drop)."""
    return base_done or next_layer > g


def ask_upgrade(policy: Policy, ctx: Context, upgrades: bool, base_done: bool) -> tuple[int, int] | None:
    """The progressive upgrade ``(shard, level)`` the policy asks for on the idle link (``LaneConfig.upgrades``),
    asked only once the base fetches are done; None when it asks for none (or upgrades are off)."""
    if not upgrades or not base_done:
        return None
    return policy.upgrade(ctx)


def ask_reroot_chain(policy: Policy, ctx: Context, g: int, level: int) -> list[tuple[int, str]]:
    """Shard ``g`` is about to be fetched at ``level``: the re-root chain fetched before it, in order, each shard at
    its floor with the reason logged for it (:meth:`~sakura_core.policy.base.Policy.reroot_chain`, asked only in
    per-step mode for a shard fetched at its floor, where its twin may serve: :mod:`sakura_core.policy.reroot`).
    Each chain shard is decoded only as the next one's reference; ``g`` then comes as its closed-loop twin."""
    if not ctx.per_step or level != ctx.floor_of(g):
        return []
    return [
        (c, f"re-root: shard {c} as the reference of shard {g}'s twins' track") for c in policy.reroot_chain(ctx, g)
    ]


def pass_makes(layer: int, late_layer: int) -> bool:
    """A fallback template pass resumed at its step's drop runs the layers from there; it keeps (and the fetch lane
    then skips) the KV of the late shard's layer and those after it only."""
    return layer >= late_layer


def pass_stops_after(
    layer: int, layers: int, late: int, end: int, made: Callable[[int], bool], ready: Callable[[int], bool]
) -> bool:
    """The fallback pass for the ``late`` shard stops after its ``layer`` (of ``layers`` in a step) by
    :func:`~sakura_core.runtime.deferral.pass_can_stop` (every shard from ``late`` to ``end`` made or decoded);
    after the step's last layer it has ended anyway, and the device holds the whole step's KV."""
    return layer + 1 < layers and pass_can_stop(late, end, made, ready)


def late_recheck_s(layer_cached_s: float) -> float:
    """How often a compute lane waiting for a late shard asks ``recompute_late``: every cached-layer time (what the
    policies' patience is counted in), at least :data:`RECHECK_MIN_S` apart."""
    return max(layer_cached_s, RECHECK_MIN_S)


def late_wait_until(t0: float, now: float, recheck_s: float, wait_s: float = math.inf) -> float:
    """A compute lane waiting since ``t0`` for a shard asks ``recompute_late`` at the wait's start and, while the
    policy says wait (asked at ``now``), again ``recheck_s`` later (:func:`late_recheck_s`): it waits for the shard
    until the returned time, no later than ``t0 + wait_s`` (``RuntimeConfig.shard_wait_s``; the simulator sets no
    limit), where it gives up on the shard (:func:`late_gives_up`)."""
    return min(now + recheck_s, t0 + wait_s)


def late_gives_up(t0: float, now: float, wait_s: float = math.inf) -> bool:
    """The compute lane has waited ``wait_s`` since ``t0`` for a shard (``RuntimeConfig.shard_wait_s``): it gives up
    on it without asking the policy again (the device computes its KV)."""
    return now - t0 >= wait_s

"""The lanes' protocol rules that the live lanes (:mod:`.fetch_lane`, :mod:`.late_shards`, :mod:`.device_kv`) and
the simulator (:mod:`.sim_link`, :mod:`.simulate`) both follow, each written once here (the rest are in
:mod:`.deferral`: the deferred shards asked again, the request-ahead window, the fallback pass's stop). Each is a
pure function of what its caller passes: the caller keeps its own state (the live state under its lock, or the
simulation's) and acts on the answer.

- :func:`ask_in_order`: the in-order base ask of the next shard and what the lane does with the answer.
- :func:`has_prefetch_room`: whether a later step's shard may be fetched within ``LaneConfig.prefetch_kv_bytes``
  (:func:`prefetch_room`: the same with its reason; the page's ``phone_web/src/lanes/lane_rules.js`` has both).
- :func:`link_passed`: whether the link went past a shard without fetching it (the compute lane then has it
  fetched at the floor level when it needs it).
- :func:`ask_upgrade`: the progressive upgrade the policy asks for on the idle link, once the base fetches are done.
- :func:`pass_makes` and :func:`pass_stops_after`: which layers a fallback template pass keeps, and after which it
  stops (:func:`~sakura_core.runtime.deferral.pass_can_stop`, never after the step's last layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..policy.context import Context
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy
from .deferral import pass_can_stop

__all__ = [
    "ROOM_GOES",
    "InOrderAction",
    "ask_in_order",
    "ask_upgrade",
    "has_prefetch_room",
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

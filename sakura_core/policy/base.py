"""The fetch-policy protocol: :class:`Decision`, the :class:`Policy` base (fetch nothing) and the wording helpers of
decision reasons. A fetch policy says which representation of each shard to fetch, and where to stop running the
template on the device.

All policies answer the same three questions (Puffer-style: state in, decision out, each with a ``reason``):

* ``choose(ctx, layer)`` — at a moment the link is free: fetch shard ``layer`` at which level, skip it (the device
  will compute it), or stop fetching;
* ``keep_template(ctx, layer)`` — the compute lane reached ``layer`` with the template tokens still in the sequence:
  run them through this layer too (compute) or drop them and use the fetched shard;
* ``upgrade(ctx)`` — during later steps, which shard to refine with a progressive enhancement payload.

A policy is deterministic given the trace (no clocks, no randomness). ``ctx`` is a :class:`~sakura_core.policy.
context.Context`: the estimator, the ladders, the device profile, the compute progress and ``now`` (seconds since the
edit started); only the trace-reading rules (cachegen's, the oracle) read ``ctx.trace``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .context import Context

__all__ = ["LEVEL_COMPUTE", "Decision", "Policy"]

LEVEL_COMPUTE = -1  # pseudo level: the device computes this layer's template KV


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def _mbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.2f} Mbit/s"


def _at(ctx: Context, rate: float | None) -> str:
    return "with exact transfer times from the trace" if rate is None else f"at {ctx.fmt_rate(rate)}"


def _time_left(slack_s: float) -> str:
    """Seconds left until a deadline, in words (a passed deadline says so)."""
    if abs(slack_s) < 0.005:
        return "no time left before its deadline"
    if slack_s < 0:
        return f"its deadline passed {-slack_s:.2f} s ago"
    return f"{slack_s:.2f} s to its deadline"


@dataclass(frozen=True)
class Decision:
    """``level``: index into the shard's ladder, LEVEL_COMPUTE, or None = stop fetching.

    ``defer``: with LEVEL_COMPUTE, "not now": the runtime may ask about this shard again while the link would
    otherwise idle, until compute reaches it (a runtime that does not re-ask treats it as computed on the device).

    ``link_idle_until_s``: with LEVEL_COMPUTE, the link takes its next decision no earlier than this time (seconds
    since the edit started; None = at once). CacheGen decides chunk by chunk, so a recomputed chunk holds the link
    until the device has computed it and the next chunk is decided on the rate of that later moment.
    """

    level: int | None
    reason: str
    link_idle_until_s: float | None = None
    defer: bool = False


class Policy:
    """Base: fetch nothing, compute everything once (on-device-cached)."""

    name = "base"
    family = "sakura"  # which ladder this policy fetches from
    template_every_step = False  # on-device: recompute the template at every step
    kv_preloaded = False  # free-kv: the KV is on the device already
    simulation_only = False  # a bound or a reported-once variant: no live run, no runtime

    def reset(self) -> None:
        """Per-run state lives here; the simulator calls it before each run."""

    def choose(self, ctx: Context, layer: int) -> Decision:
        return Decision(None, f"{self.name} never fetches: the device computes the template KV")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return True

    def upgrade(self, ctx: Context) -> tuple[int, int] | None:
        """``(layer, level)`` to refine with its progressive enhancement, or None."""
        return None

    def reroot_chain(self, ctx: Context, layer: int) -> list[int]:
        """Shard ``layer`` is about to be fetched at its floor: shards the compute lane may have passed to fetch
        first (in order, each at its floor), only as references that put the layer back on its twins' track
        (:mod:`sakura_core.policy.reroot`). Asked only by a runtime that fetches them (``Context.reroots``).
        Default: none."""
        return []

    def worth_asking(self, ctx: Context, shards: list[int]) -> list[int]:
        """Of the deferred ``shards`` (in order), those worth asking ``choose`` about again now: a policy may leave
        out shards its ``choose`` would defer again at this moment (an optimisation that never changes a decision:
        a runtime asks each deferred shard again while the link would idle). Default: all of them."""
        return shards

    def recompute_late(self, ctx: Context, layer: int) -> bool:
        """The template is dropped and shard ``layer`` is not ready: give up on the link and run a template-only
        pass on the device (all layers' KV)? Baselines wait."""
        return False

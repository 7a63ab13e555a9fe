"""Fetch policies: which representation of each shard to fetch, and where to stop running the template on the device.

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

__all__ = ["LEVEL_COMPUTE", "POLICIES", "Decision", "Policy", "make_policy"]

LEVEL_COMPUTE = -1  # pseudo level: the device computes this layer's template KV


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def _mbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.2f} Mbit/s"


def _vs_deadline(ready_s: float, deadline_s: float) -> str:
    """``ready_s`` against ``deadline_s`` in words (never "-0.00 s")."""
    slack = deadline_s - ready_s
    if abs(slack) < 0.005:
        return f"on its deadline t={deadline_s:.2f} s"
    side = "before" if slack > 0 else "after"
    return f"{abs(slack):.2f} s {side} its deadline t={deadline_s:.2f} s"


def _at(ctx: Context, rate: float | None) -> str:
    return "with exact transfer times from the trace" if rate is None else f"at {ctx.fmt_rate(rate)}"


def _late(seconds: float) -> str:
    """A positive lateness in words (milliseconds when it would round to 0.00 s)."""
    return f"{seconds:.2f} s late" if seconds >= 0.005 else f"{seconds * 1e3:.1f} ms late"


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

    ``link_idle_until_s``: with LEVEL_COMPUTE, the link takes its next decision no earlier than this time (seconds
    since the edit started; None = at once). CacheGen decides chunk by chunk, so a recomputed chunk holds the link
    until the device has computed it and the next chunk is decided on the rate of that later moment.
    """

    level: int | None
    reason: str
    link_idle_until_s: float | None = None


class Policy:
    """Base: fetch nothing, compute everything once (on-device-cached)."""

    name = "base"
    family = "sakura"  # which ladder this policy fetches from
    template_every_step = False  # on-device: recompute the template at every step
    kv_preloaded = False  # free-kv: the KV is on the device already

    def reset(self) -> None:
        """Per-run state lives here; the simulator calls it before each run."""

    def choose(self, ctx: Context, layer: int) -> Decision:
        return Decision(None, f"{self.name} never fetches: the device computes the template KV")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return True

    def upgrade(self, ctx: Context) -> tuple[int, int] | None:
        """``(layer, level)`` to refine with its progressive enhancement, or None."""
        return None

    def recompute_late(self, ctx: Context, layer: int) -> bool:
        """The template is dropped and shard ``layer`` is not ready: give up on the link and run a template-only
        pass on the device (all layers' KV)? Baselines wait."""
        return False


class OnDevice(Policy):
    name = "on-device"
    template_every_step = True


class OnDeviceCached(Policy):
    name = "on-device-cached"


class FreeKV(Policy):
    """The KV is already on the device (physical lower bound: no transfer, no template compute)."""

    name = "free-kv"
    family = "fp16"
    kv_preloaded = True

    def choose(self, ctx: Context, layer: int) -> Decision:
        return Decision(None, "the KV is preloaded on the device: nothing to fetch")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return False


class FetchFP16(Policy):
    name = "fetch-fp16"
    family = "fp16"

    def choose(self, ctx: Context, layer: int) -> Decision:
        return Decision(0, f"always the exact level {ctx.ladder(layer)[0].name} ({_mb(ctx.ladder(layer)[0].nbytes)})")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return False


class CacheGen(Policy):
    """CacheGen's released selection: per chunk, the first level (high to low) with ``bytes*8/bw < SLO/n_chunks``,
    else recompute; ``bw`` read from the trace at decision time (no estimator). A chunk here is a shard.

    SLO: the latency target when one is set, else the time the device needs to compute the whole template (the
    recompute alternative). Held to the same quality floor as sakura: levels below ``ctx.floor`` are never chosen.
    The trace is read on the simulator's clock (start offset included); a recomputed chunk holds the link until the
    device has computed it, so the next chunk is decided on the rate at that time, not on one early sample.
    """

    name = "cachegen"
    family = "cachegen"

    def reset(self) -> None:
        self.recompute: set[int] = set()

    def choose(self, ctx: Context, layer: int) -> Decision:
        bw = ctx.link_rate_now()  # bytes/s, read from the trace as the released code does (no estimator)
        slo = ctx.latency_target_s if ctx.latency_target_s is not None else ctx.profile.template_pass_s
        budget = slo / ctx.num_layers
        ladder = ctx.ladder(layer)
        for idx in range(len(ladder) - 1, ctx.floor - 1, -1):
            if bw > 0 and ladder[idx].nbytes / bw < budget:
                return Decision(idx, self._why(ladder[idx].name, ladder[idx].nbytes, bw, budget, slo, ctx.num_layers))
        no_fit = f"no level fits {budget:.2f} s per shard (SLO {slo:.2f} s / {ctx.num_layers}) at {_mbit(bw)}"
        if ctx.template_alive:
            self.recompute.add(layer)
            return Decision(
                LEVEL_COMPUTE,
                f"{no_fit}: the device computes layer {layer}",
                link_idle_until_s=ctx.template_eta(layer + 1),
            )
        return Decision(ctx.floor, f"{no_fit} and the template is dropped (no recompute): the floor level")

    @staticmethod
    def _why(name: str, nbytes: int, bw: float, budget: float, slo: float, n: int) -> str:
        per_shard = f"{budget:.2f} s per shard (SLO {slo:.2f} s / {n})"
        return f"level {name}: {_mb(nbytes)} at {_mbit(bw)} = {nbytes / bw:.2f} s < {per_shard}"

    def keep_template(self, ctx: Context, layer: int) -> bool:
        # keep computing while this or a later chunk is marked recompute, or the link has not decided it yet
        if any(lay >= layer for lay in self.recompute):
            return True
        return ctx.decided_upto <= layer and not ctx.ready(layer)


class Throughput(Policy):
    """Rule-based: harmonic-mean estimate; fetch everything (highest level that meets its deadline, else the
    lowest) if the lowest ladder at that rate beats computing the template, else compute everything."""

    name = "throughput"

    def reset(self) -> None:
        self.fetch_all: bool | None = None
        self.plan = ""  # why fetch_all was decided (at the first decision)

    def choose(self, ctx: Context, layer: int) -> Decision:
        rate = ctx.estimator.harmonic()
        if self.fetch_all is None:
            lowest = sum(ctx.ladder(x)[ctx.floor].nbytes for x in range(ctx.num_layers))
            self.fetch_all = lowest / rate < ctx.profile.template_pass_s
            verdict = "<" if self.fetch_all else ">="
            self.plan = (
                f"all shards at the floor: {_mb(lowest)} at {_mbit(rate)} = {lowest / rate:.2f} s {verdict} "
                f"{ctx.profile.template_pass_s:.2f} s to compute the template"
            )
        if not self.fetch_all:
            return Decision(None, f"{self.plan}: the device computes it")
        ladder = ctx.ladder(layer)
        slack = ctx.deadline(layer) - ctx.now
        for idx in range(len(ladder) - 1, ctx.floor - 1, -1):
            if ladder[idx].nbytes / rate <= slack:
                lv = ladder[idx]
                return Decision(
                    idx,
                    f"level {lv.name} (highest in time): {_mb(lv.nbytes)} at {_mbit(rate)} = {lv.nbytes / rate:.2f} s,"
                    f" {_time_left(slack)}",
                )
        return Decision(
            ctx.floor,
            f"no level arrives in time at {_mbit(rate)} ({_time_left(slack)}): floor level {ladder[ctx.floor].name}",
        )

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return not self.fetch_all if self.fetch_all is not None else not ctx.ready(layer)


class Sakura(Policy):
    """Adaptive hybrid: race the template computation against the fetch.

    * Probe: with no throughput sample yet, the first shard is fetched at the floor level (it is the probe).
    * Split: whenever the link is free, predict the step-0 finish for every remaining drop point (compute the
      template up to it, fetch the rest back to back at the floor level) under a conservative (error-discounted)
      throughput estimate, and skip the shards below the best one — so the split layer ``k`` moves with the link
      instead of being fixed up front.
    * Levels: the best level whose predicted ready time meets the shard's deadline while the next ``horizon``
      shards still meet theirs at the floor level (RobustMPC-style lookahead); never below the quality floor. With
      a latency target, the predicted slack under it extends every deadline (quality for time the user allows).
    * Compute: keep the template tokens for this layer if its shard will not be ready before computing it would
      finish.
    * Late shards: once the template is dropped, if waiting for the remaining shards is predicted to take longer
      than one template-only pass on the device, run that pass instead (the link misled the estimate).
    * Upgrades: while later steps run, spend idle link time on enhancement payloads with the largest distortion
      drop per byte.
    """

    name = "sakura"
    horizon = 5

    def rate(self, ctx: Context) -> float | None:
        """Bytes/s the predictions use (None = exact transfer times from the trace)."""
        return ctx.estimator.robust()

    def choose(self, ctx: Context, layer: int) -> Decision:
        rate = self.rate(ctx)
        ladder = ctx.ladder(layer)
        probing = rate is not None and ctx.estimator.samples == 0
        if ctx.template_alive and not probing:  # with no sample yet, the first shard is the bandwidth probe
            drop = ctx.best_drop(ctx.compute_layer, rate)
            if layer < drop:
                split = f"split at layer {drop}" if drop < ctx.num_layers else "no split: the device computes all"
                why = f"earliest step-0 finish: {split}, {_at(ctx, rate)}"
                return Decision(LEVEL_COMPUTE, f"device computes layer {layer} ({why})")
        deadline = ctx.deadline(layer)
        bonus = ""
        if ctx.latency_target_s is not None:  # slack under the user's latency target buys quality
            extra = max(0.0, ctx.latency_target_s - ctx.predicted_finish(rate))
            deadline += extra
            if extra > 0:
                bonus = f", deadline +{extra:.2f} s of slack under the {ctx.latency_target_s:.2f} s target"
        best, why_not_higher = self._best_level(ctx, layer, deadline, rate)
        ready = ctx.predict_ready(layer, ladder[best], rate)
        floor = " (the quality floor)" if best == ctx.floor else ""
        probe = "bandwidth probe (no throughput sample yet): " if probing else ""
        reason = (
            f"{probe}level {ladder[best].name}{floor} ready at t={ready:.2f} s, {_vs_deadline(ready, deadline)}"
            f"{why_not_higher} {_at(ctx, rate)}{bonus}"
        )
        return Decision(best, reason)

    def _best_level(self, ctx: Context, layer: int, deadline: float, rate: float | None) -> tuple[int, str]:
        """The best level ready by ``deadline`` that keeps the next ``horizon`` shards (at the floor) on time, and
        why the next level up was not taken (";" alone when the best is the highest level)."""
        ladder = ctx.ladder(layer)
        best = ctx.floor
        for idx in range(ctx.floor + 1, len(ladder)):
            t = ctx.predict_ready(layer, ladder[idx], rate)
            if t > deadline:
                return best, f"; {ladder[idx].name} would be ready at t={t:.2f} s, {_late(t - deadline)};"
            # lookahead: the next shards must still make their deadlines at the floor level
            t_next = t
            for nxt in range(layer + 1, min(ctx.num_layers, layer + 1 + self.horizon)):
                t_next = ctx.transfer_end(t_next, ctx.ladder(nxt)[ctx.floor].nbytes, rate)
                if t_next > ctx.deadline(nxt):
                    late = _late(t_next - ctx.deadline(nxt))
                    return best, f"; {ladder[idx].name} would make shard {nxt} {late};"
            best = idx
        return best, ";"

    def keep_template(self, ctx: Context, layer: int) -> bool:
        # Dropping the template is irreversible: keep computing unless dropping here has the earliest predicted
        # step-0 finish of all drop points from here on.
        return ctx.best_drop(layer, self.drop_rate(ctx)) != layer

    def drop_rate(self, ctx: Context) -> float | None:
        """Dropping the template cannot be undone cheaply: decide it on the slowest recent throughput."""
        return ctx.estimator.worst()

    def recompute_late(self, ctx: Context, layer: int) -> bool:
        # waiting for every remaining shard vs one template-only pass now and the remaining layers cached
        p = ctx.profile
        wait = ctx.predicted_step0_finish(layer, layer, self.rate(ctx))
        recompute = ctx.now + p.template_pass_s + (ctx.num_layers - layer) * p.layer_cached_s
        return recompute < wait

    def upgrade(self, ctx: Context) -> tuple[int, int] | None:
        best, best_gain = None, 0.0
        for layer, level in ctx.fetched_levels().items():
            ladder = ctx.ladder(layer)
            if level + 1 < len(ladder) and ladder[level + 1].progressive:
                gain = (ladder[level].mse - ladder[level + 1].mse) / max(ladder[level + 1].increment_bytes, 1)
                if gain > best_gain:
                    best, best_gain = (layer, level + 1), gain
        return best


class Oracle(Sakura):
    """Knows the future: transfer times come from the trace itself (ready times are exact, not estimated).

    The simulator additionally tries every fixed split with exact timings and keeps the best run, so the oracle
    is a lower bound over this policy space.
    """

    name = "oracle"

    def rate(self, ctx: Context) -> float | None:
        return None  # None = exact transfer times from the trace

    def drop_rate(self, ctx: Context) -> float | None:
        return None


POLICIES = {p.name: p for p in (OnDevice, OnDeviceCached, FetchFP16, CacheGen, Throughput, Sakura, Oracle, FreeKV)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError as e:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} or 'all'") from e

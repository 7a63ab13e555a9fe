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
from .planner import Plan, Snapshot, best_plan

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
        slo = ctx.latency_target_s if ctx.latency_target_s is not None else ctx.template_work_s
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
        if any(lay >= layer and ctx.step_of(lay) == ctx.step_of(layer) for lay in self.recompute):
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
            self.fetch_all = lowest / rate < ctx.template_work_s
            verdict = "<" if self.fetch_all else ">="
            self.plan = (
                f"all shards at the floor: {_mb(lowest)} at {_mbit(rate)} = {lowest / rate:.2f} s {verdict} "
                f"{ctx.template_work_s:.2f} s to compute the template"
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
    """Receding-horizon plan over the remaining (step, layer) shards (:mod:`sakura_core.policy.planner`).

    * Plan: at every decision, the split k_s of every remaining step (template through layers < k_s on the device,
      shards >= k_s fetched back to back in execution order at the floor level, later steps prefetched) with the
      earliest predicted finish, under an error-discounted throughput (RobustMPC: harmonic mean / (1 + max recent
      error)); re-planned as transfers complete, so an estimation error is corrected at the next decision.
    * Probe: with no throughput sample yet the first shard is fetched at the floor level (free: compute keeps the
      template until a shard is ready).
    * Fetch lane: a shard below its step's planned split is deferred ("not now": the runtime asks again before later
      shards and while the link would idle, until the compute lane reaches it — so a link that turns out faster
      moves the split earlier); otherwise the quality floor, or under a latency target the highest level that
      keeps the predicted finish under it.
    * Compute lane: drop the template at this layer only if the plan made with the slowest recent throughput drops
      here (a wrong drop costs a stall; the template restarts next step, so the risk is one step).
    * Late shards: once dropped, if waiting is predicted to end the step later than a template-only pass on the
      device, run that pass (the link misled the estimate) — after ``late_patience`` of a template pass spent
      waiting for that shard (ski rental: short outages end by themselves; the drop's outage check counts it).
    * Upgrades: once every shard the plan needs is requested, idle link time refines shards not used yet with the
      largest distortion drop per byte.
    """

    name = "sakura"
    # the estimate the fetch plan uses: "robust" (harmonic mean / (1 + max recent error)) or "harmonic"
    plan_estimate = "harmonic"
    # a drop must not lose against keeping the template even if the link is this many times slower than the
    # slowest recent sample
    regret_slowdown = 4.0
    # wait this fraction of a template pass for a late shard before a template pass may replace it
    late_patience = 0.25

    def reset(self) -> None:
        self._plan: Plan | None = None
        self._late_since: dict[int, float] = {}
        self._cache: tuple | None = None

    def rate(self, ctx: Context) -> float | None:
        """Bytes/s the predictions use (None = exact transfer times from the trace): the error-discounted estimate,
        lowered while the transfer in progress is overdue."""
        est = ctx.estimator.harmonic() if self.plan_estimate == "harmonic" else ctx.estimator.robust()
        return ctx.slowed(est)

    def drop_rate(self, ctx: Context) -> float | None:
        """Dropping the template is irreversible within a step: decide it on the slowest recent throughput."""
        return ctx.slowed(ctx.estimator.worst())

    def _replan(self, ctx: Context, rate: float | None) -> tuple[Plan, Snapshot]:
        """The plan (and the snapshot it was made on) for this moment; reused while the moment is the same (a batch
        of decisions at one time: the runtime asks about several deferred shards at once)."""
        key = (ctx.now, ctx.compute_layer, ctx.template_alive, rate, ctx.decided_upto, ctx.link_busy_until())
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        snap = Snapshot(ctx, rate)
        init = None
        prev = getattr(self, "_plan", None)
        if prev is not None and prev.first_step <= snap.cs < prev.first_step + len(prev.splits):
            init = prev.splits[snap.cs - prev.first_step :]
        plan = best_plan(snap, init)
        self._plan, self._cache = plan, (key, plan, snap)
        return plan, snap

    @staticmethod
    def _why(ctx: Context, plan: Plan, rate: float | None) -> str:
        L = ctx.layers_per_step
        parts = []
        for i, k in enumerate(plan.splits):
            what = f"split at layer {k}" if k < L else "no split: the device computes all"
            parts.append(f"step {plan.first_step + i} {what}" if ctx.per_step else what)
        return f"plan: {'; '.join(parts)}; predicted finish t={plan.finish_s:.2f} s {_at(ctx, rate)}"

    def choose(self, ctx: Context, layer: int) -> Decision:
        rate = self.rate(ctx)
        ladder = ctx.ladder(layer)
        if rate is not None and ctx.estimator.samples == 0:
            return Decision(
                ctx.floor, f"bandwidth probe (no throughput sample yet): floor level {ladder[ctx.floor].name}"
            )
        if layer < ctx.compute_layer:
            return Decision(LEVEL_COMPUTE, f"compute is already past shard {layer}")
        plan, snap = self._replan(ctx, rate)
        step, lay = ctx.step_of(layer), ctx.layer_of(layer)
        k = plan.split(step) if (step > snap.cs or ctx.template_alive) else snap.l0
        why = self._why(ctx, plan, rate)
        if lay < k:  # not now: asked again (before later shards, and while the link would idle) until compute is here
            return Decision(LEVEL_COMPUTE, f"device computes step {step} layer {lay} for now, asked again until the "
                            f"compute lane reaches it ({why})", defer=True)  # fmt: skip
        best = self._level_under_target(ctx, layer, plan, rate)
        if best == ctx.floor:
            return Decision(best, f"step {step} layer {lay}: level {ladder[best].name} (the quality floor; idle link "
                            f"time refines it later); {why}")  # fmt: skip
        slack = f"slack under the {ctx.latency_target_s:.2f} s target"
        return Decision(best, f"step {step} layer {lay}: level {ladder[best].name} ({slack}); {why}")

    def _level_under_target(self, ctx: Context, layer: int, plan: Plan, rate: float | None) -> int:
        """The highest level that keeps the predicted finish under the user's latency target, at the estimate and at
        the slowest recent rate; the floor without a target. (Taking more than the floor because the link looks
        idle now spends the margin a later slowdown needs; quality beyond the floor comes from upgrades once every
        shard the plan needs is on its way.)"""
        target = ctx.latency_target_s
        if target is None or target <= plan.finish_s:
            return ctx.floor
        snap = Snapshot(ctx, rate, layer)  # with this shard as the next one fetched (its level is the question)
        worst = self.drop_rate(ctx)
        slow = Snapshot(ctx, worst, layer) if worst is not None and worst != rate else None
        ladder, best = ctx.ladder(layer), ctx.floor
        for idx in range(ctx.floor + 1, len(ladder)):
            lv = ladder[idx]
            if snap.finish(plan.splits, lv.nbytes, lv.decode_s) > target:
                break
            if slow is not None and slow.finish(plan.splits, lv.nbytes, lv.decode_s) > target:
                break
            best = idx
        return best

    def keep_template(self, ctx: Context, layer: int) -> bool:
        rate = self.drop_rate(ctx)
        plan, snap = self._replan(ctx, rate)
        if plan.splits[0] != ctx.layer_of(layer):
            return True
        if rate is None:
            return False
        # bounded regret: drop only if this step still ends no later than keeping the template to its end even
        # when the link delivers 1/regret_slowdown of the slowest recent rate (that estimation error costs nothing)
        p, left = ctx.profile, ctx.layers_per_step - snap.l0
        keep_all = snap.ct + left * p.layer_full_s
        drop_end = snap.finish(plan.splits, upto_step=snap.cs)
        if Snapshot(ctx, rate / self.regret_slowdown).finish(plan.splits, upto_step=snap.cs) > keep_all:
            return True
        # outage: if the link died now, a template pass on the device would redo this step's KV; the drop must
        # gain at least what it would then lose (unless every shard it needs is decoded already)
        needed = range(layer, snap.c - snap.l0 + ctx.layers_per_step)
        if all(ctx.ready(g) for g in needed):
            return False
        outage_loss = snap.ct + (1 + self.late_patience) * p.template_pass_s + left * p.layer_cached_s - keep_all
        return keep_all - drop_end < outage_loss

    def recompute_late(self, ctx: Context, layer: int) -> bool:
        since = self._late_since.setdefault(layer, ctx.now)
        p = ctx.profile
        if ctx.now - since < self.late_patience * p.template_pass_s:
            return False
        snap = Snapshot(ctx, self.rate(ctx))
        wait = snap.finish([snap.l0] * (snap.S - snap.cs), upto_step=snap.cs)
        recompute = ctx.now + p.template_pass_s + (ctx.layers_per_step - ctx.layer_of(layer)) * p.layer_cached_s
        return recompute < wait

    def upgrade(self, ctx: Context) -> tuple[int, int] | None:
        if ctx.per_step:  # never ahead of a shard the plan still needs
            plan, snap = self._replan(ctx, self.rate(ctx))
            if snap.pending(plan.splits):
                return None
        best, best_gain = None, 0.0
        for shard, level in ctx.fetched_levels().items():
            if ctx.per_step and shard <= ctx.compute_layer:
                continue  # used already (per-step KV serves one step only)
            ladder = ctx.ladder(shard)
            if level + 1 < len(ladder) and ladder[level + 1].progressive:
                gain = (ladder[level].mse - ladder[level + 1].mse) / max(ladder[level + 1].increment_bytes, 1)
                if gain > best_gain:
                    best, best_gain = (shard, level + 1), gain
        return best


class Oracle(Sakura):
    """Knows the future: transfer times come from the trace itself (ready times are exact, not estimated).

    The simulator additionally searches the per-step split vector with exact timings and keeps the best run, so
    the oracle is a lower bound over this policy space.
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

"""The fetch policies by name: the baselines (on-device, on-device-cached, fetch-fp16, CacheGen's rule, a
throughput rule, free KV) here, ``sakura`` and ``oracle`` in :mod:`.sakura`; the protocol they share
(:class:`Decision`, :class:`Policy`) in :mod:`.base`. :func:`make_policy` builds one by name."""

from __future__ import annotations

from .base import LEVEL_COMPUTE, Decision, Policy, _mb, _mbit, _time_left
from .context import Context
from .sakura import Oracle, Sakura

__all__ = ["LEVEL_COMPUTE", "POLICIES", "Decision", "Oracle", "Policy", "Sakura", "make_policy"]


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
    simulation_only = True

    def choose(self, ctx: Context, layer: int) -> Decision:
        return Decision(None, "the KV is preloaded on the device: nothing to fetch")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return False


class FetchFP16(Policy):
    name = "fetch-fp16"
    family = "fp16"

    def choose(self, ctx: Context, layer: int) -> Decision:
        level = ctx.ladder(layer)[0]
        if level.name != "fp16":  # a serving-profile store keeps no fp16: its nearest rung is the top one
            return Decision(
                0,
                f"the exact level fp16 is not in this store (store profile serving): the nearest it "
                f"holds, {level.name} ({_mb(level.nbytes)})",
            )
        return Decision(0, f"always the exact level {level.name} ({_mb(level.nbytes)})")

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return False


class CacheGen(Policy):
    """CacheGen's released selection: per chunk, the first level (high to low) with ``bytes*8/bw < SLO/n_chunks``,
    else recompute; ``bw`` read from the trace at decision time (no estimator). A chunk here is a shard.

    SLO: the latency target when one is set, else the time the device needs to compute the whole template (the
    recompute alternative). On a live link without a trace the rate is the estimator's (there is nothing to read).
    Held to the same quality floor as sakura: levels below a shard's ``ctx.floor_of`` are never chosen; when none of
    its own levels reaches the floor its ladder's floor is the exact level (``held_to_floor`` in the simulator,
    ``policy_levels`` live), which it fetches when it fits the budget and recomputes otherwise.
    The trace is read on the simulator's clock (start offset included); a recomputed chunk holds the link until the
    device has computed it, so the next chunk is decided on the rate at that time, not on one early sample.
    """

    name = "cachegen"
    family = "cachegen"

    def reset(self) -> None:
        self.recompute: set[int] = set()

    def choose(self, ctx: Context, layer: int) -> Decision:
        bw = ctx.link_rate_now()  # bytes/s, read from the trace as the released code does (live, no trace: estimated)
        slo = ctx.latency_target_s if ctx.latency_target_s is not None else ctx.template_work_s
        budget = slo / ctx.num_layers
        ladder = ctx.ladder(layer)
        for idx in reversed(ctx.levels_from_floor(layer)):
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
        return Decision(ctx.floor_of(layer), f"{no_fit} and the template is dropped (no recompute): the floor level")

    @staticmethod
    def _why(name: str, nbytes: int, bw: float, budget: float, slo: float, n: int) -> str:
        per_shard = f"{budget:.2f} s per shard (SLO {slo:.2f} s / {n})"
        return f"level {name}: {_mb(nbytes)} at {_mbit(bw)} = {nbytes / bw:.2f} s < {per_shard}"

    def keep_template(self, ctx: Context, layer: int) -> bool:
        # keep computing while this or a later chunk is marked recompute, or the link has not decided it yet
        if any(lay >= layer and ctx.step_of(lay) == ctx.step_of(layer) for lay in self.recompute):
            return True
        return ctx.decided_upto <= layer and not ctx.ready(layer)


class CacheGenNoFloor(CacheGen):
    """CacheGen's rule on its ladder as measured: its floor the best level even when that is under the quality floor
    (the old behaviour, before CacheGen was held to sakura's floor; reported once beside it). Simulation only."""

    name = "cachegen-no-floor"
    family = "cachegen-no-floor"
    simulation_only = True


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
            lowest = sum(ctx.ladder(x)[ctx.floor_of(x)].nbytes for x in range(ctx.num_layers))
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
        for idx in reversed(ctx.levels_from_floor(layer)):
            if ladder[idx].nbytes / rate <= slack:
                lv = ladder[idx]
                return Decision(
                    idx,
                    f"level {lv.name} (highest in time): {_mb(lv.nbytes)} at {_mbit(rate)} = {lv.nbytes / rate:.2f} s,"
                    f" {_time_left(slack)}",
                )
        fl = ctx.floor_of(layer)
        return Decision(
            fl, f"no level arrives in time at {_mbit(rate)} ({_time_left(slack)}): floor level {ladder[fl].name}"
        )

    def keep_template(self, ctx: Context, layer: int) -> bool:
        return not self.fetch_all if self.fetch_all is not None else not ctx.ready(layer)


POLICIES = {
    p.name: p
    for p in (OnDevice, OnDeviceCached, FetchFP16, CacheGen, Throughput, Sakura, Oracle, FreeKV, CacheGenNoFloor)
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError as e:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} or 'all'") from e

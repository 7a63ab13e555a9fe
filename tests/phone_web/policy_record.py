"""Records what a fetch policy sees and decides, for the page's policy conformance suite (``policy_vectors.py``):
:class:`Recorder` wraps a policy (the simulator calls it like the policy itself) and writes one case per call — the
policy state as the policy's :class:`~sakura_core.policy.context.Context` reads it (the clock, the lanes' state,
what is decoded and on its way, the transfer in progress, the estimator's samples) and the decision, with a reason
code. The calls of one run form a sequence: the JS policy replays them in order with one instance, as its own
per-run state (the previous plan, a late shard's first ask) depends on the calls before."""

from __future__ import annotations

import json
import math

from sakura_core.policy.context import Context
from sakura_core.policy.ladder import Level
from sakura_core.policy.sakura import Sakura

__all__ = ["CHOOSE_CODES", "REPEATS", "Recorder", "choose_code", "level_json"]

REPEATS = 8  # cases of one code kept per sequence where a call changes no per-run state

# the reason code of a ``choose`` decision, by how its reason starts (first match)
CHOOSE_CODES = (
    ("bandwidth probe", "probe"),
    ("step ", "probe-waits"),  # refined below: "waits for the bandwidth probe"
    ("compute is already past", "past-compute"),
    ("device computes step", "defer"),
    ("later layers of step", "later-first"),
    ("always the exact level", "fp16-exact"),
    ("the exact level fp16 is not in this store", "fp16-nearest"),
)


def choose_code(reason: str) -> str:
    """The rule a ``choose`` reason names (the conformance suite counts them; every one must be present)."""
    if reason.endswith("never fetches: the device computes the template KV"):
        return "never-fetches"
    if "waits for the bandwidth probe" in reason:
        return "probe-waits"
    if "(the quality floor;" in reason:
        return "floor"
    if "slack under the" in reason:
        return "target"
    for prefix, code in CHOOSE_CODES:
        if reason.startswith(prefix) and code != "probe-waits":
            return code
    raise ValueError(f"a choose reason no code names: {reason!r}; add its rule to CHOOSE_CODES")


def level_json(lv: Level) -> dict:
    return {
        "name": lv.name,
        "nbytes": lv.nbytes,
        "increment_bytes": lv.increment_bytes,
        "decode_s": lv.decode_s,
        "mse": lv.mse,
        "progressive": lv.progressive,
        "ref_step": lv.ref_step,
        "reuse": lv.reuse,
        "closed": None if lv.closed is None else level_json(lv.closed),
        "off_track": lv.off_track,
    }


def _num(x):
    """A float for JSON: NaN as None (JSON has no NaN)."""
    return None if isinstance(x, float) and math.isnan(x) else x


def _keep_rule(policy, ctx: Context, layer: int, keep: bool) -> str:
    """Which of sakura's template rules answered ``keep_template`` (re-derived after the call; pure)."""
    if not isinstance(policy, Sakura):
        return "always-keep" if keep else "never-keep"
    rate = policy.drop_rate(ctx)
    if Sakura._drop_cannot_pay(ctx, layer, rate):
        return "cannot-pay"
    plan = policy._plan
    if plan.splits[0] != ctx.layer_of(layer):
        return "plan-keeps"
    if not keep:
        return "drop"
    snap = policy.snapshot(ctx, rate)
    keep_all = snap.ct + (ctx.layers_per_step - snap.l0) * ctx.profile.layer_full_s
    late = policy.snapshot(ctx, rate / policy.regret_slowdown).finish(plan.splits, upto_step=snap.cs) > keep_all
    return "regret" if late else "outage"


class Recorder:
    """Duck-types a :class:`~sakura_core.policy.base.Policy`: every call recorded into ``sink`` (a list of
    sequences, one per ``reset``; the first ``max_cases`` of each), then answered by ``inner``. ``header``: what
    names the run."""

    def __init__(self, inner, sink: list, header: dict, max_cases: int = 10**9):
        self.inner, self.sink, self.header, self.max_cases = inner, sink, header, max_cases
        self.name, self.family = inner.name, inner.family
        self.template_every_step, self.kv_preloaded = inner.template_every_step, inner.kv_preloaded
        self.seq: dict | None = None

    def reset(self) -> None:
        self.inner.reset()
        self.seq = {**self.header, "policy": self.inner.name, "static": None, "cases": []}
        self.seen: dict[str, int] = {}
        self.sink.append(self.seq)

    def _static(self, ctx: Context) -> dict:
        s = ctx._s
        table, of = [], []
        for lad in s.ladders:
            j = json.dumps([level_json(lv) for lv in lad], sort_keys=True)
            if j not in table:
                table.append(j)
            of.append(table.index(j))
        p = s.profile
        e = s.estimator.config
        return {
            "profile": {
                "layer_full_s": p.layer_full_s,
                "layer_cached_s": p.layer_cached_s,
                "template_pass_s": p.template_pass_s,
                "fixed_s": p.fixed_s,
                "steps": int(p.model.steps),
                "dit_cpu_cores": int(getattr(p, "dit_cpu_cores", 0)),
            },
            "ladders": [json.loads(t) for t in table],
            "ladder_of": of,
            "floor": s.floor if isinstance(s.floor, int) else [int(x) for x in s.floor],
            "layers_per_step": int(s.layers_per_step),
            "rtt_s": float(s.rtt_s),
            "request_ahead": bool(getattr(s, "request_ahead", False)),
            "start_s": float(s.start_s),
            "latency_target_s": s.latency_target_s,
            "has_trace": s.trace is not None,
            "reroots": bool(getattr(s, "reroots", False)),
            "estimator_config": {
                "window": e.window,
                "min_sample_bytes": e.min_sample_bytes,
                "prior_bytes_per_s": e.prior_bytes_per_s,
            },
        }

    def _state(self, ctx: Context) -> dict:
        s = ctx._s
        est = ctx.estimator  # flushed to now, as the policy sees it
        prog = ctx.link_progress()
        return {
            "now": s.now,
            "link_free": s.link_free,
            "decoder_free": s.decoder_free,
            "compute_layer": s.compute_layer,
            "compute_t": float(s.compute_t),
            "template_alive": bool(s.template_alive),
            "dropped_at": int(s.dropped_at),
            "next_layer": s.next_layer,
            "stalled_s": float(s.stalled_s),
            "got": [[g, [[lv, t] for lv, t in v]] for g, v in s.got.items()],
            "in_flight": [[g, t] for g, t in s.in_flight.items()],
            "known_ready": [_num(float(x)) for x in ctx.known_ready_array()],
            "fetched_levels": [[g, lv] for g, lv in ctx.fetched_levels().items()],
            "link_progress": None if prog is None else [float(x) for x in prog],
            "estimator": {
                "samples": list(est._samples),
                "errors": list(est._errors),
                "last_prediction": est._last_prediction,
                "pooled": list(est._pooled),
            },
        }

    def _record(self, ctx: Context, call: dict) -> dict:
        """The case of this call (its ``want`` filled in after it); past ``max_cases`` a case not kept: the sequence
        is cut at its end, so the calls before it replay as they ran."""
        if len(self.seq["cases"]) >= self.max_cases:
            return {}
        if self.seq["static"] is None:
            self.seq["static"] = self._static(ctx)
        case = {**call, "state": self._state(ctx)}
        self.seq["cases"].append(case)
        return case

    def _thin(self, case: dict) -> None:
        """Drop ``case`` (just decided) when its sequence has ``REPEATS`` of its code already and the call changed
        no per-run state of the policy (a baseline's, or sakura's deferral before the probe, or its re-root rule: no
        plan made), so the calls kept still replay as they ran."""
        stateless = ("probe-waits", "reroot", "no-reroot")
        if "state" not in case or (isinstance(self.inner, Sakura) and case["want"]["code"] not in stateless):
            return
        seen = self.seen.setdefault(case["want"]["code"], 0)
        self.seen[case["want"]["code"]] = seen + 1
        if seen >= REPEATS and self.seq["cases"][-1] is case:
            self.seq["cases"].pop()

    def choose(self, ctx, layer):
        case = self._record(ctx, {"call": "choose", "shard": layer})
        d = self.inner.choose(ctx, layer)
        case["want"] = {
            "level": d.level,
            "reason": d.reason,
            "defer": d.defer,
            "link_idle_until_s": d.link_idle_until_s,
            "code": choose_code(d.reason),
        }
        self._thin(case)
        return d

    def keep_template(self, ctx, layer):
        case = self._record(ctx, {"call": "keep_template", "shard": layer})
        keep = self.inner.keep_template(ctx, layer)
        if case:
            case["want"] = {"keep": bool(keep), "code": _keep_rule(self.inner, ctx, layer, keep)}
        self._thin(case)
        return keep

    def recompute_late(self, ctx, layer):
        case = self._record(ctx, {"call": "recompute_late", "shard": layer})
        late = self.inner.recompute_late(ctx, layer)
        case["want"] = {"recompute": bool(late), "code": "recompute" if late else "wait"}
        self._thin(case)
        return late

    def upgrade(self, ctx):
        case = self._record(ctx, {"call": "upgrade"})
        up = self.inner.upgrade(ctx)
        case["want"] = {"upgrade": None if up is None else list(up), "code": "no-upgrade" if up is None else "upgrade"}
        self._thin(case)
        return up

    def reroot_chain(self, ctx, layer):
        case = self._record(ctx, {"call": "reroot_chain", "shard": layer})
        out = self.inner.reroot_chain(ctx, layer)
        case["want"] = {"chain": [int(g) for g in out], "code": "reroot" if out else "no-reroot"}
        self._thin(case)
        return out

    def worth_asking(self, ctx, shards):
        case = self._record(ctx, {"call": "worth_asking", "shards": list(shards)})
        out = self.inner.worth_asking(ctx, shards)
        case["want"] = {"shards": [int(g) for g in out], "code": "worth-asking"}
        self._thin(case)
        return out

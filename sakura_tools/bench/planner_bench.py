"""How long the ``sakura`` policy takes to decide, per decision and per edit, as the edit grows (steps x layers).

Each case simulates one per-step edit of the FLUX.2 [klein] 4B-like geometry (25 layers) at ``steps`` denoising
steps on the phone-CPU profile over a seeded synthetic link, with every policy call (``choose``, ``keep_template``,
``recompute_late``, ``upgrade``, ``worth_asking``) timed on this CPU: CPU seconds of the deciding thread
(``time.thread_time``: the machine is shared, wall clock would count waiting for a core; the wall clock is kept in
the JSON too). The simulator charges nothing for planning here (``SimConfig`` default): the timings are this
machine's, not a phone's. The ladder is a stated
synthetic one (:data:`BENCH_LADDER`), so the figures do not depend on a codec measurement.
"""

from __future__ import annotations

import statistics
import time

from sakura_core.fetch.synth import random_walk
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import Policy, make_policy
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import kv_mode_view, simulate

__all__ = ["BENCH_LADDER", "DECISION_METHODS", "TimedPolicy", "bench_case", "format_planner_table"]

# (name, bytes as a fraction of the fp16 shard, output PSNR dB with every shard at it): cheapest first; the floor
# (>= 35 dB) is "s2". Roughly the SAKURA ladder's shape at klein scale (a stated shape, not a measurement).
BENCH_LADDER = (
    ("s1", 1 / 10, 32.0),
    ("s2", 1 / 7, 37.0),
    ("s3", 1 / 5, 41.0),
    ("s4", 1 / 3, 46.0),
    ("fp16", 1.0, 99.0),
)
DECISION_METHODS = ("choose", "keep_template", "recompute_late", "upgrade", "worth_asking")


class _Abort(Exception):
    """Raised by :class:`TimedPolicy` once ``max_decisions`` calls have been timed."""


class TimedPolicy(Policy):
    """Wraps a policy; times every decision call into ``calls[method]`` (CPU seconds of this thread) and
    ``wall[method]`` (seconds, ``time.perf_counter``)."""

    def __init__(self, inner: Policy, max_decisions: int | None = None):
        self.inner, self.max_decisions = inner, max_decisions
        self.name, self.family = inner.name, inner.family
        self.template_every_step, self.kv_preloaded = inner.template_every_step, inner.kv_preloaded
        self.calls: dict[str, list[float]] = {m: [] for m in DECISION_METHODS}
        self.wall: dict[str, list[float]] = {m: [] for m in DECISION_METHODS}

    def reset(self) -> None:
        self.inner.reset()

    def _timed(self, method: str, *args):
        t0, w0 = time.thread_time(), time.perf_counter()
        out = getattr(self.inner, method)(*args)
        self.calls[method].append(time.thread_time() - t0)
        self.wall[method].append(time.perf_counter() - w0)
        if self.max_decisions is not None and self.decisions >= self.max_decisions:
            raise _Abort
        return out

    @property
    def decisions(self) -> int:
        return sum(len(v) for v in self.calls.values())

    def choose(self, ctx, layer):
        return self._timed("choose", ctx, layer)

    def keep_template(self, ctx, layer):
        return self._timed("keep_template", ctx, layer)

    def recompute_late(self, ctx, layer):
        return self._timed("recompute_late", ctx, layer)

    def upgrade(self, ctx):
        return self._timed("upgrade", ctx)

    def worth_asking(self, ctx, shards):
        return self._timed("worth_asking", ctx, shards)


def _ladders(shard_fp16: int, shards: int, decode_bytes_per_s: float = 6e8) -> tuple[dict, dict]:
    levels, prev = [], 0
    for name, frac, psnr in BENCH_LADDER:
        nbytes = int(shard_fp16 * frac)
        prog = name != "fp16"
        levels.append(
            Level(
                name,
                nbytes,
                nbytes - prev if prog else nbytes,
                shard_fp16 / decode_bytes_per_s,
                4 * 10 ** (-psnr / 10) / shards,
                prog,
            )
        )
        prev = nbytes if prog else prev
    return {"sakura": [levels] * shards}, {"sakura": 1}


def bench_case(
    steps: int,
    policy: str = "sakura",
    profile: str = "snapdragon-8-elite-cpu",
    geometry: str = "klein4b-512-ref1024",
    seed: int = 7,
    mean_mbit: float = 30.0,
    max_decisions: int | None = None,
) -> dict:
    """One per-step edit of ``geometry`` at ``steps`` steps with every decision timed; the row of the table."""
    prof = get_profile(profile, geometry)
    prof = prof.with_geometry(prof.model.with_fields(steps=steps))
    flat = kv_mode_view(prof, "per-step").model
    ladders, floors = _ladders(prof.model.shard_bytes_fp16, flat.layers)
    trace = random_walk(seed, mean_mbit, 0.3, seconds=900)
    timed = TimedPolicy(make_policy(policy), max_decisions)
    t0 = time.perf_counter()
    latency_s, complete = None, True
    try:
        latency_s = simulate(timed, trace, prof, ladders, floors).result.latency_s
    except _Abort:
        complete = False
    wall_s = time.perf_counter() - t0
    every = [x for v in timed.calls.values() for x in v]
    planning_s = sum(every)
    row = {
        "steps": steps,
        "layers": prof.model.layers,
        "shards": flat.layers,
        "policy": policy,
        "trace": trace.name,
        "complete": complete,
        "decisions": len(every),
        "by_method": {
            m: {"calls": len(v), "ms_mean": 1e3 * sum(v) / max(len(v), 1), "ms_max": 1e3 * max(v, default=0)}
            for m, v in timed.calls.items()
        },
        "ms_per_decision_mean": 1e3 * planning_s / max(len(every), 1),
        "ms_per_decision_p50": 1e3 * statistics.median(every) if every else 0.0,
        "ms_per_decision_p99": 1e3 * sorted(every)[int(0.99 * (len(every) - 1))] if every else 0.0,
        "ms_per_decision_max": 1e3 * max(every, default=0.0),
        "planning_s_per_edit": planning_s,
        "wall_ms_per_decision_mean": 1e3 * sum(x for v in timed.wall.values() for x in v) / max(len(every), 1),
        "sim_wall_s": wall_s,
        "simulated_latency_s": latency_s,
        "planning_share_of_latency": None if latency_s is None else planning_s / latency_s,
    }
    return row


def format_planner_table(rows: list[dict]) -> str:
    """One line per case: shards, decisions, ms per decision (mean / p99 / max), planning s per edit, share."""
    head = (
        f"{'steps x layers':>15}{'decisions':>10}{'ms/dec mean':>12}{'p99':>8}{'max':>8}{'plan s/edit':>12}"
        f"{'edit s (sim)':>13}{'plan share':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        share = "-" if r["planning_share_of_latency"] is None else f"{100 * r['planning_share_of_latency']:.2f} %"
        edit = "-" if r["simulated_latency_s"] is None else f"{r['simulated_latency_s']:.1f}"
        plan = f"{r['planning_s_per_edit']:.2f}" + ("" if r["complete"] else "*")
        lines.append(
            f"{r['steps']:>9} x {r['layers']:<3}{r['decisions']:>10}{r['ms_per_decision_mean']:>12.2f}"
            f"{r['ms_per_decision_p99']:>8.2f}{r['ms_per_decision_max']:>8.2f}{plan:>12}{edit:>13}{share:>11}"
        )
    if any(not r["complete"] for r in rows):
        lines.append("* stopped after --max-decisions decisions: planning s counts those only, no edit latency")
    return "\n".join(lines)

"""What one simulated edit costs this machine as the edit grows (``sakura bench scale``): per policy (the oracle
included) and for the fluid lower bound, the CPU seconds to simulate a per-step edit of 4, 28 or 50 steps, and the
process's peak resident memory after each.

Each case is one per-step edit of the FLUX.2 [klein] 4B-like geometry (25 layers) at ``steps`` steps on the
phone-CPU profile over a seeded synthetic link (:func:`~sakura_core.fetch.synth.random_walk`), on a stated synthetic
ladder per family (:data:`SCALE_LADDERS`: no codec measurement, so the figures depend on the simulator alone). CPU
seconds: ``time.process_time`` (the machine is shared: wall clock would count waiting for a core); memory:
``resource.getrusage``'s peak RSS of this process (it only grows, so a row is the peak up to that case).

With ``ladders_dir`` (``sakura bench scale --ladders DIR``) a case runs on the geometry's committed per-step ladders
instead, stretched to the step count, and sakura's per-step ladders measured or modelled for it
(:mod:`.step_ladders`; every rung held, a full store): what ``sakura bench e2e --edit-steps`` simulates.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

from sakura_core.fetch.synth import random_walk
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import POLICIES, make_policy
from sakura_core.runtime.oracle import fluid_bound, simulate_oracle
from sakura_core.runtime.pre_lanes import template_image_s
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import SimConfig, kv_mode_view, simulate

__all__ = [
    "SCALE_LADDERS",
    "TEMPLATE_IMAGE_BYTES",
    "format_scale_table",
    "measured_ladders",
    "peak_rss_bytes",
    "scale_case",
    "scale_ladders",
]

# family -> ((name, bytes as a fraction of the fp16 shard, edit PSNR dB with every shard at it, progressive), ...),
# cheapest first, and the floor's index (the cheapest level >= 35 dB). A stated shape, not a measurement.
SCALE_LADDERS = {
    "sakura": ((("s1", 1 / 10, 32.0, True), ("s2", 1 / 7, 37.0, True), ("s3", 1 / 5, 41.0, True),
                ("s4", 1 / 3, 46.0, True), ("fp16", 1.0, 99.0, False)), 1),
    "cachegen": ((("c0", 1 / 6, 26.0, False), ("c1", 1 / 4, 36.0, False)), 1),
    "fp16": ((("fp16", 1.0, 99.0, False),), 0),
}  # fmt: skip # keep: a ladder table: one rung a tuple


#: the template image each case fetches before its lanes (``simulate``'s ``template_image_bytes``): a 1024 x 1024
#: photograph as PNG (~1.5 bytes a pixel), the reference of the ref1024 geometries. A stated size, not a measurement.
TEMPLATE_IMAGE_BYTES = 1536 * 1024


def scale_ladders(shard_fp16: int, shards: int, decode_bytes_per_s: float = 6e8) -> tuple[dict, dict]:
    """(ladders, floors) of every family in :data:`SCALE_LADDERS`, every shard alike; the no-floor CacheGen (when
    the simulator has that policy) reads the cachegen ladder."""
    ladders, floors = {}, {}
    for family, (spec, floor) in SCALE_LADDERS.items():
        levels, prev = [], 0
        for name, frac, psnr, prog in spec:
            nbytes = int(shard_fp16 * frac)
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
        ladders[family], floors[family] = [levels] * shards, floor
    return ladders, floors


def measured_ladders(profile, ladders_dir: str | Path) -> tuple[dict, dict]:
    """(ladders, floors) of a per-step edit of ``profile``'s geometry at its step count from the committed ladder
    file in ``ladders_dir``, as ``sakura bench e2e --edit-steps`` builds them (a full store)."""
    from sakura_core.runtime.sim_ladders import ShardLadders

    from .e2e import sim_ladders
    from .e2e_ladders import ladder_file
    from .step_ladders import per_step_data, stretch_ladders

    g = profile.model
    path = ladder_file(ladders_dir, g.name, "per-step")
    if not path.is_file():
        raise ValueError(
            f"no {path}: measure it with sakura bench e2e --ladders {ladders_dir} --geometry {g.name} "
            "--kv-mode per-step"
        )
    lad = stretch_ladders(ShardLadders.from_dict(json.loads(path.read_text())), g.steps)
    return sim_ladders(lad, "per-step", g, "measured", per_step_data(g.steps))


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (bytes; Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def scale_case(
    steps: int,
    policies: list[str] | None = None,
    profile: str = "snapdragon-8-elite-cpu",
    geometry: str = "klein4b-512-ref1024",
    seed: int = 7,
    mean_mbit: float = 30.0,
    ladders_dir: str | Path | None = None,
    template_image_bytes: int = TEMPLATE_IMAGE_BYTES,
) -> dict:
    """One per-step edit at ``steps`` steps simulated with each of ``policies`` (default: every one) and the fluid
    bound, each timed; the row of the table. Every run (the oracle's and the bound included) fetches the template
    image of ``template_image_bytes`` before its lanes (0: none), which seeds its estimator."""
    prof = get_profile(profile, geometry)
    prof = prof.with_geometry(prof.model.with_fields(steps=steps))
    shards = kv_mode_view(prof, "per-step").model.layers
    if ladders_dir is None:
        ladders, floors = scale_ladders(prof.model.shard_bytes_fp16, shards)
    else:
        ladders, floors = measured_ladders(prof, ladders_dir)
    trace = random_walk(seed, mean_mbit, 0.3, seconds=900)
    cpu_s, latency_s = {}, {}
    t0 = time.process_time()
    config = SimConfig()
    pre_lanes_s = template_image_s(trace, 0.0, template_image_bytes, trace.round_trip_s(config.rtt_s))
    latency_s["fluid-bound"] = fluid_bound(trace, prof, ladders, floors, pre_lanes_s=pre_lanes_s)
    cpu_s["fluid-bound"] = time.process_time() - t0
    for name in policies or list(POLICIES):
        sim = simulate_oracle if name == "oracle" else simulate
        t0 = time.process_time()
        r = sim(
            make_policy(name), trace, prof, ladders, floors, config=config, template_image_bytes=template_image_bytes
        )
        latency_s[name] = float(r.result.latency_s)
        cpu_s[name] = time.process_time() - t0
    return {
        "steps": steps,
        "layers": prof.model.layers,
        "shards": shards,
        "trace": trace.name,
        "template_image_bytes": template_image_bytes,
        "cpu_s": cpu_s,
        "latency_s": latency_s,
        "cpu_s_total": sum(cpu_s.values()),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def format_scale_table(rows: list[dict], before: list[dict] | None = None) -> str:
    """One line per case: CPU seconds of the edit with every policy, of sakura, the oracle and the bound, and the
    peak RSS; with ``before`` (an earlier run's rows, matched by steps) the same figures in brackets."""
    old = {r["steps"]: r for r in before or []}
    head = (
        f"{'steps x layers':>15}{'all policies s':>22}{'sakura s':>18}{'oracle s':>18}{'bound s':>16}{'RSS MiB':>16}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        b = old.get(r["steps"])

        def cell(get, width, digits=2, r=r, b=b):
            now = f"{get(r):.{digits}f}"
            return format(now + (f" ({get(b):.{digits}f})" if b is not None else ""), f">{width}")

        lines.append(
            f"{r['steps']:>9} x {r['layers']:<3}"
            + cell(lambda x: x["cpu_s_total"], 22)
            + cell(lambda x: x["cpu_s"]["sakura"], 18)
            + cell(lambda x: x["cpu_s"]["oracle"], 18)
            + cell(lambda x: x["cpu_s"]["fluid-bound"], 16)
            + cell(lambda x: x["peak_rss_bytes"] / 2**20, 16, 0)
        )
    if before:
        lines.append("(in brackets: the --before run)")
    return "\n".join(lines)

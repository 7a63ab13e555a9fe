"""The page's policy conformance vectors: every call of the ``on-device``, ``fetch-fp16`` and ``sakura`` policies in
simulated edits (``sakura_core.runtime.simulate``) over synthetic links (``sakura_core.fetch.synth``, the generator of
``sakura traces synth``, at seeds other than the development one; never ../shared/traces), recorded by
:class:`~tests.phone_web.policy_record.Recorder` with what the policy saw and decided. Runs cover single and per-step
KV, three device profiles, a progressive ladder (upgrades), a store without fp16 (``serving``), closed-loop twins
(one world whose open-loop floor costs far more than the twins: the long-edit rule),
``reuse`` rungs, a latency target, requests one at a time, and links that die after the drop (late shards).

``python -m tests.phone_web.policy_vectors OUT`` writes ``OUT/policy_cases.json``; ``phone_web/test/run_policy.mjs``
replays it through the page's policy."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from sakura_core.fetch.synth import development_set
from sakura_core.fetch.traces import Trace
from sakura_core.policy.estimator import EstimatorConfig, ThroughputEstimator
from sakura_core.policy.ladder import CrossStepLinks, Level, with_track_floor
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import SimConfig, kv_mode_view, simulate

from .policy_record import Recorder
from .policy_situations import situations

__all__ = ["SEEDS", "VECTORS_FILE", "estimator_streams", "format_cases", "generate", "write_policy_vectors"]

VECTORS_FILE = "policy_cases.json"
SEEDS = (300, 301)  # synthetic links of every kind, fresh seeds (100 is the development set)
GEOMETRY = "klein4b-512-ref1024"
# cases kept per simulated edit (its first ones): the baselines keep no per-run state and repeat themselves (a stalled
# fetch-fp16 edit is asked about its late shard every millisecond)
MAX_CASES = {"sakura": 700, "on-device": 40, "fetch-fp16": 60}
ALL = ("sakura", "on-device", "fetch-fp16")
PROFILES = ("snapdragon-8-elite-cpu", "snapdragon-8-elite-gpu", "snapdragon-8-elite-npu")


def _three_levels(fp: int) -> list[Level]:
    """A cheap base, the floor refining it progressively (~4.7x smaller than fp16), fp16 (as the simulator tests)."""
    return [
        Level("l1", fp // 11, fp // 11, 0.05, 1e-3),
        Level("l3", fp // 5, fp // 5 - fp // 11, 0.09, 1e-6, True),
        Level("fp16", fp, fp, 0.06, 0.0),
    ]


def _twins(fp: int, steps: int, L: int, twin_div: int = 8, open_div: int = 4) -> tuple[list[list[Level]], int]:
    """Cross-step levels with closed-loop twins at steps >= 1 (floor on the twins' track: ``fp / twin_div`` bytes;
    off it the open-loop ``hi``, ``fp / open_div``) and fp16."""
    n = steps * L
    out = []
    for g in range(n):
        step = g // L
        ref = None if step == 0 else step - 1
        tb = fp // twin_div
        twin = None if step == 0 else Level("lo+cl", tb, tb, 0.02, 1e-5 / n, links=CrossStepLinks(ref_step=ref))
        out.append(
            [
                Level("lo", fp // 16, fp // 16, 0.02, 1e-4 / n, links=CrossStepLinks(ref_step=ref, closed=twin)),
                Level("hi", fp // open_div, fp // open_div, 0.03, 2e-5 / n, links=CrossStepLinks(ref_step=ref)),
                Level("fp16", fp, fp, 0.06, 0.0),
            ]
        )
    return with_track_floor(out, "hi"), 0


def _reuse(fp: int, steps: int, L: int) -> tuple[list[list[Level]], list[int]]:
    """Step 0 at a quantised level; later steps start with a zero-byte reuse rung (their floor)."""
    q, exact = Level("q", fp // 6, fp // 6, 0.03, 1e-5), Level("fp16", fp, fp, 0.06, 0.0)
    out, floor = [], []
    for g in range(steps * L):
        step = g // L
        if step == 0:
            out.append([q, exact])
        else:
            out.append(
                [Level("reuse", 0, 0, 0.0, 2e-6, links=CrossStepLinks(ref_step=step - 1, reuse=True)), q, exact]
            )
        floor.append(0)
    return out, floor


def _worlds():
    """(name, profile as simulated, ladders by family, floors by family, SimConfig, traces, policies)."""
    links = [t for seed in SEEDS for t in development_set(seed)]
    for pname in PROFILES:
        base = get_profile(pname, GEOMETRY)
        for mode in ("per-step", "single"):
            S, L = base.model.steps, base.model.layers
            n = S * L if mode == "per-step" else L
            fp = kv_mode_view(base, "per-step").model.shard_bytes_fp16
            exact = [[Level("fp16", fp, fp, 0.06, 0.0)]] * n
            ladders = {"sakura": [_three_levels(fp)] * n, "fp16": exact}
            # fetch-fp16 on a fast device stalls for seconds, asked every millisecond: simulated on the CPU only
            pols = ALL if pname.endswith("-cpu") else ("sakura", "on-device")
            yield f"{pname}/{mode}", base, ladders, {"sakura": 1, "fp16": 0}, SimConfig(), links[::17], pols
    base = get_profile("snapdragon-8-elite-cpu", GEOMETRY)
    S, L = base.model.steps, base.model.layers
    fp = kv_mode_view(base, "per-step").model.shard_bytes_fp16
    serving = [[Level("sakura-l6", fp // 3, fp // 3, 0.05, 1e-7)]] * (S * L)
    yield (
        "serving-store",
        base,
        {"fp16": serving, "sakura": [_three_levels(fp)] * (S * L)},
        {"fp16": 0, "sakura": 1},
        SimConfig(request_ahead=False),
        links[1::17],
        ALL,
    )
    tw, fl = _twins(fp, S, L)
    yield (
        "twins",
        base,
        {"sakura": tw, "fp16": [[tw[0][-1]]] * (S * L)},
        {"sakura": fl, "fp16": 0},
        SimConfig(),
        links[2::17],
        ALL,
    )
    # the long-edit rule (planner.track_priced): an open-loop floor 32x the twins, over 8 steps
    far = base.with_geometry(base.model.with_fields(steps=8))
    tw, fl = _twins(fp, 8, L, twin_div=64, open_div=2)
    yield (
        "twins-far",
        far,
        {"sakura": tw, "fp16": [[tw[0][-1]]] * (8 * L)},
        {"sakura": fl, "fp16": 0},
        SimConfig(),
        links[5::17],
        ALL,
    )
    ru, fl = _reuse(fp, S, L)
    yield (
        "reuse",
        base,
        {"sakura": ru, "fp16": [[ru[0][-1]]] * (S * L)},
        {"sakura": fl, "fp16": 0},
        SimConfig(),
        links[3::17],
        ALL,
    )
    lad = {"sakura": [_three_levels(fp)] * (S * L), "fp16": [[_three_levels(fp)[-1]]] * (S * L)}
    for target in (30.0, 1000.0):
        yield (
            f"target-{target:g}s",
            base,
            lad,
            {"sakura": 1, "fp16": 0},
            SimConfig(latency_target_s=target),
            links[4::25],
            ("sakura",),
        )
    single = kv_mode_view(base, "single")
    dies = [
        Trace("dies-10", [6.0, 1e5], [10e6 / 8, 0.0]),
        Trace("dies-20", [3.0, 1e5], [20e6 / 8, 0.0]),
        Trace("slumps-20", [4.0, 30.0, 1e5], [20e6 / 8, 0.05e6 / 8, 20e6 / 8]),
    ]
    lad1 = {"sakura": [_three_levels(fp)] * L, "fp16": [[_three_levels(fp)[-1]]] * L}
    yield "dying-links/single", single, lad1, {"sakura": 1, "fp16": 0}, SimConfig(), dies, ("sakura", "on-device")
    yield "dying-links/per-step", base, lad, {"sakura": 1, "fp16": 0}, SimConfig(), dies, ("sakura", "on-device")


def generate() -> list[dict]:
    """Every recorded sequence: one per simulated edit (a trace's edit starts at its index x 37 s), then the
    hand-made situations of the Python policy tests."""
    seqs: list[dict] = []
    for world, profile, ladders, floors, config, traces, policies in _worlds():
        for i, trace in enumerate(traces):
            start = float(i * 37 % 400)
            for name in policies:
                header = {"world": world, "trace": trace.name, "start_s": start}
                rec = Recorder(make_policy(name), seqs, header, MAX_CASES[name])
                simulate(rec, trace, profile, ladders, floors, start_s=start, config=config)
    return [s for s in seqs if s["cases"]] + situations()


def _plain(x):
    """numpy scalars (a policy may answer with one) as Python's."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON: record plain numbers")


def estimator_streams(seed: int = 47) -> list[dict]:
    """Observation streams (bytes, seconds: small transfers pooled, zeros ignored) with Python's estimates after each
    observation (harmonic, robust, worst, samples), for three configurations; each stream first seeded with transfers
    made before the lanes (bytes, seconds, round trip: ``ThroughputEstimator.seed``; none for the first, a manifest
    and an image, small and round-trip bound ones too, for the others), the estimates after each seed given."""
    rng = np.random.default_rng(seed)
    out = []
    configs = (
        EstimatorConfig(),
        EstimatorConfig(window=3, min_sample_bytes=1, prior_bytes_per_s=1e5),
        EstimatorConfig(min_sample_bytes=64 * 1024, seed_rtt_share=0.3),
    )
    for i, config in enumerate(configs):
        est = ThroughputEstimator(config)
        seeds = [
            (float(rng.choice([0, 3000, 40000, 1.5e6]) * rng.uniform(0.5, 1.5)), float(rng.uniform(0, 3)), rtt)
            for rtt in (0.0, 0.04, 0.3, 2.0)[: 2 * i]
        ]
        obs = [
            (float(rng.choice([0, 500, 4000, 20000, 3e5, 2e6]) * rng.uniform(0.5, 1.5)), float(rng.uniform(0, 2)))
            for _ in range(200)
        ]
        after_seed = []
        for nbytes, seconds, rtt in seeds:
            est.seed(nbytes, seconds, rtt)
            after_seed.append([est.harmonic(), est.robust(), est.worst(), est.samples])
        after = []
        for nbytes, seconds in obs:
            est.observe(nbytes, seconds)
            after.append([est.harmonic(), est.robust(), est.worst(), est.samples])
        out.append(
            {
                "config": {
                    "window": config.window,
                    "min_sample_bytes": config.min_sample_bytes,
                    "prior_bytes_per_s": config.prior_bytes_per_s,
                    "seed_rtt_share": config.seed_rtt_share,
                },
                "seed": seeds,
                "after_seed": after_seed,
                "observe": obs,
                "after": after,
            }
        )
    return out


def format_cases(seed: int = 47) -> list[list]:
    """Numbers and Python's ``:.2f`` of them: exact binary ties (0.125, 2.5e-3 ...), values just off them, negatives,
    -0.0, large and random ones (the page's reasons must read as Python's)."""
    rng = np.random.default_rng(seed)
    xs = [k / 8 for k in range(-40, 41)] + [0.005, 0.015, 2.675, 1.005, -0.0, -0.001, 1e6 / 3, 123456789.125, 1e-9]
    xs += [float(x) for x in rng.uniform(-50, 50, 300)] + [float(x) for x in rng.exponential(3, 300)]
    return [[x, f"{x:.2f}"] for x in xs]


def write_policy_vectors(out: Path) -> dict:
    """Write ``out/policy_cases.json``; the counts: cases, by call, by policy and by reason code, the estimator's
    observations and the numbers formatted."""
    seqs = generate()
    cases = [c for s in seqs for c in s["cases"]]
    counts = {
        "sequences": len(seqs),
        "cases": len(cases),
        "calls": dict(Counter(c["call"] for c in cases)),
        "policies": dict(Counter(s["policy"] for s in seqs for _ in s["cases"])),
        "codes": dict(Counter(c["want"]["code"] for c in cases)),
    }
    streams, formats = estimator_streams(), format_cases()
    counts["estimator_observations"] = sum(len(x["observe"]) for x in streams)
    counts["estimator_seeds"] = sum(len(x["seed"]) for x in streams)
    counts["formats"] = len(formats)
    out.mkdir(parents=True, exist_ok=True)
    data = {"counts": counts, "sequences": seqs, "estimator": streams, "formats": formats}
    (out / VECTORS_FILE).write_text(json.dumps(data, default=_plain), encoding="utf-8")
    return counts


if __name__ == "__main__":
    print(json.dumps(write_policy_vectors(Path(sys.argv[1])), indent=1))  # noqa: T201

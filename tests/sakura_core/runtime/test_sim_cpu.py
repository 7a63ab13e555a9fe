"""What the simulated phone's CPU pays besides the DiT (planning charged per decision, decode threads on the DiT's
cores) and the fluid lower bound, on small worlds with every number by hand."""

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import POLICIES, make_policy
from sakura_core.runtime.geometry import DitGeometry
from sakura_core.runtime.oracle import fixed_split_policy, fluid_bound, simulate_oracle
from sakura_core.runtime.profiles import PROFILES
from sakura_core.runtime.simulate import SimConfig, simulate

# 2 layers, 1 step (single mode), template tokens == request tokens: a cached layer costs c, a full one 2c + ...
GEO = DitGeometry.of(
    name="tiny", layers=2, heads=1, head_dim=64, image_tokens=64, template_tokens=64, text_tokens=0, steps=1
)
CPU = PROFILES["snapdragon-8-elite-cpu"].with_geometry(GEO).with_fields(fixed_s=0.0, layer_overhead_s=1.0)
MB = 1_000_000


def _ladders(decode_s: float) -> tuple[dict, dict]:
    lv = [Level("q", MB, MB, decode_s, 1e-4)]
    return {"sakura": [lv, lv], "fp16": [lv, lv]}, {"sakura": 0, "fp16": 0}


def test_planning_charged_per_decision_delays_the_lane_that_decided():
    # on-device-cached: on the link, one choose ("never fetches") and one upgrade ask (none); before each of the
    # 2 layers a keep_template (compute lane): 2 x 0.1 s on the compute lane; the link's 0.2 s delays nothing when
    # the DiT has the cores to itself, and costs it 0.2 / 8 when it shares them (the planning thread overlaps it)
    lad, fl = _ladders(0.0)
    cfg = SimConfig(planning="fixed", planning_s=0.1)
    alone = CPU.with_fields(dit_cpu_cores=0)
    free = simulate(make_policy("on-device-cached"), Trace.constant(8), alone, lad, fl)
    paid = simulate(make_policy("on-device-cached"), Trace.constant(8), alone, lad, fl, config=cfg)
    assert paid.result.latency_s == pytest.approx(free.result.latency_s + 0.2)
    assert paid.cpu.decisions_timed == 4 and paid.cpu.planning_s == pytest.approx(0.4)
    shared = simulate(make_policy("on-device-cached"), Trace.constant(8), CPU, lad, fl, config=cfg)
    assert shared.cpu.contention_s == pytest.approx(0.2 / 8) and shared.result.latency_s == pytest.approx(
        paid.result.latency_s + 0.025
    )


def test_a_fetch_decision_delays_its_request():
    # fetch-fp16 at 8 Mbit/s: a 1 MB shard takes 1.0 s + 0.04 s RTT; the second request leaves when the first
    # arrives. Charging 0.5 s per decision: shard 0 leaves at 0.5 and arrives at 1.54, shard 1 leaves at 2.04 (its
    # decision after the first arrival) and arrives 3.08; layers (cached 1.0 s + the tiny FLOPs) start at arrival
    lad, fl = _ladders(0.0)
    r = simulate(
        make_policy("fetch-fp16"), Trace.constant(8), CPU, lad, fl, config=SimConfig(planning="fixed", planning_s=0.5)
    )
    fetches = [e for e in r.result.events if e["lane"] == "fetch"]
    assert [round(e["end"], 6) for e in fetches] == [1.54, 3.08]


def test_decode_threads_slow_the_dit_on_its_cores():
    # fetch-fp16 on an 800 Mbit/s link: both 1 MB shards arrive by ~0.06 s; each decodes 0.8 s (0.04-0.84,
    # 0.85-1.65). Layer 0 waits for 0.84 and runs to ~1.84, overlapping shard 1's whole decode (0.8 s): the DiT
    # loses 0.8 / 8 cores = 0.1 s before layer 1. The NPU profile's DiT shares nothing.
    lad, fl = _ladders(0.8)
    r = simulate(make_policy("fetch-fp16"), Trace.constant(800), CPU, lad, fl)
    decodes = [e for e in r.result.events if e["lane"] == "decode"]
    overlap = decodes[1]["end"] - decodes[1]["start"]
    assert r.cpu.contention_s == pytest.approx(overlap / 8)
    npu = CPU.with_fields(dit_cpu_cores=0)
    r0 = simulate(make_policy("fetch-fp16"), Trace.constant(800), npu, lad, fl)
    assert r0.cpu.contention_s == 0.0 and r.result.latency_s == pytest.approx(r0.result.latency_s + overlap / 8)
    # a measured, fractional figure (the phone page's, `sakura bench e2e --mode page`) is charged as it is
    page = simulate(make_policy("fetch-fp16"), Trace.constant(800), CPU.with_fields(dit_cpu_cores=1.5), lad, fl)
    assert page.cpu.contention_s == pytest.approx(overlap / 1.5)


def test_the_cpu_slowdown_scales_decode_and_planning():
    lad, fl = _ladders(0.8)
    slow = CPU.with_fields(cpu_slowdown=2.0, dit_cpu_cores=0)
    r = simulate(make_policy("fetch-fp16"), Trace.constant(800), slow, lad, fl)
    d = [e["end"] - e["start"] for e in r.result.events if e["lane"] == "decode"]
    assert d == pytest.approx([1.6, 1.6])


def test_the_fluid_bound_by_hand_and_below_every_policy():
    # 4 layers (per-step: 2 steps x 2), full 3.0 s, cached 1.0 s (overhead 1 s dominates), 1 MB shards at 8 Mbit/s
    # (1.0 s each, no RTT in the bound): m = 4: compute 4.0, link max_i (i + (4 - i)) = 4.0 -> 4.0;
    # m = 3: compute 3 + 3 = 6.0; so 4.0 s
    geo = GEO.with_fields(steps=2)
    prof = CPU.with_geometry(geo).with_fields(layer_overhead_s=1.0)
    lad = {"sakura": [[Level("q", MB, MB, 0.0, 1e-4)]] * 4}
    assert prof.layer_cached_s == pytest.approx(1.0, abs=1e-3)
    assert fluid_bound(Trace.constant(8), prof, lad, {"sakura": 0}) == pytest.approx(4 * prof.layer_cached_s, rel=1e-6)
    # at 2 Mbit/s (4.0 s a shard): fetching only the last one: 3 full + 1 cached vs its arrival 4.0 + 0
    b = fluid_bound(Trace.constant(2), prof, lad, {"sakura": 0})
    assert b == pytest.approx(
        min(
            4 * prof.layer_full_s,
            3 * prof.layer_full_s + prof.layer_cached_s,
            max(2 * prof.layer_full_s + 2 * prof.layer_cached_s, 8.0),
        ),
        rel=1e-6,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_policy_beats_the_fluid_bound(seed):
    rng = np.random.default_rng(seed)
    trace = Trace(f"r{seed}", np.full(300, 1.0), rng.uniform(0.0, 60.0, 300) * 1e6 / 8)
    prof = PROFILES["snapdragon-8-elite-cpu"].with_geometry(GEO.with_fields(layers=6, steps=3, heads=4))
    lads = [[Level("a", int(MB * rng.uniform(0.5, 2)), MB, 0.01, 1e-4)] for _ in range(18)]
    ladders, floors = {"sakura": lads, "fp16": lads, "cachegen": lads}, {"sakura": 0, "fp16": 0, "cachegen": 0}
    bound = fluid_bound(trace, prof, ladders, floors, 5.0)
    for name in POLICIES:
        sim = simulate_oracle if name == "oracle" else simulate
        if name == "free-kv":
            continue  # preloaded KV: not bound by the link
        assert sim(make_policy(name), trace, prof, ladders, floors, 5.0).result.latency_s >= bound - 1e-9, name


def test_the_fluid_bound_keeps_the_template_pass_a_prefix():
    # one step of 2 layers: layer 0's shard 1 MB, layer 1's 100 MB at 8 Mbit/s (1 MB/s). Fetching only the small
    # shard would need the device to compute layer 1 without layer 0's template hidden state: no split does that.
    # Splits: k = 2 (all on the device) 2 full; k = 1: full + max(cached, arrival of 100 MB); k = 0: both fetched
    geo = GEO.with_fields(steps=1)
    prof = CPU.with_geometry(geo).with_fields(layer_overhead_s=1.0)
    F, C = prof.layer_full_s, prof.layer_cached_s
    lad = {"sakura": [[Level("q", MB, MB, 0.0, 1e-4)], [Level("q", 100 * MB, 100 * MB, 0.0, 1e-4)]]}
    expect = min(2 * F, C + max(F, 100.0), 2 * C + max(0.0, 1.0 - C, 101.0 - 2 * C))
    assert fluid_bound(Trace.constant(8), prof, lad, {"sakura": 0}) == pytest.approx(expect, rel=1e-6)
    assert expect == pytest.approx(2 * F)  # the small shard alone buys nothing: it is layer 0's
    on_device = simulate(make_policy("on-device"), Trace.constant(8), prof, lad, {"sakura": 0})
    assert on_device.result.latency_s == pytest.approx(expect, rel=1e-6)  # the bound is tight here


@pytest.mark.parametrize("seed", [4, 5])
def test_the_fluid_bound_under_every_fixed_split_of_a_per_step_edit(seed):
    """Below the simulated latency of every per-step split vector (and the oracle, which searches them), on a
    varying link with uneven shards."""
    rng = np.random.default_rng(seed)
    trace = Trace(f"r{seed}", np.full(200, 1.0), rng.uniform(0.0, 40.0, 200) * 1e6 / 8)
    prof = PROFILES["snapdragon-8-elite-cpu"].with_geometry(GEO.with_fields(layers=3, steps=2, heads=4))
    lads = [[Level("a", int(MB * rng.uniform(0.2, 3)), MB, 0.01, 1e-4)] for _ in range(6)]
    ladders, floors = {"sakura": lads}, {"sakura": 0}
    bound = fluid_bound(trace, prof, ladders, floors, 3.0)
    runs = [
        simulate(fixed_split_policy([a, b]), trace, prof, ladders, floors, 3.0).result.latency_s
        for a in range(4)
        for b in range(4)
    ]
    assert min(runs) >= bound - 1e-9
    assert simulate_oracle(make_policy("oracle"), trace, prof, ladders, floors, 3.0).result.latency_s >= bound - 1e-9


def test_the_fluid_bound_refuses_the_flattened_per_step_profile():
    from sakura_core.runtime.simulate import kv_mode_view

    prof = PROFILES["snapdragon-8-elite-cpu"].with_geometry(GEO.with_fields(layers=2, steps=2))
    lad = {"sakura": [[Level("q", MB, MB, 0.0, 1e-4)]] * 4}
    with pytest.raises(ValueError, match="flattened per-step profile"):
        fluid_bound(Trace.constant(8), kv_mode_view(prof, "per-step"), lad, {"sakura": 0})
    assert fluid_bound(Trace.constant(8), prof, lad, {"sakura": 0}) > 0

"""Discrete-event simulation of the policies: physical bounds, regimes, determinism, reasons."""

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import POLICIES, make_policy
from sakura_core.runtime.oracle import simulate_oracle
from sakura_core.runtime.profiles import PHONE_DIT, PROFILES
from sakura_core.runtime.simulate import simulate

FP = PHONE_DIT.shard_bytes_fp16
CPU, NPU = PROFILES["snapdragon-8-elite-cpu"], PROFILES["snapdragon-8-elite-npu"]


def _ladder(ratios, decode_bytes_per_s, mses, progressive):
    out, prev = [], 0
    for i, (r, m) in enumerate(zip(ratios, mses, strict=True)):
        n = int(FP / r)
        out.append(Level(f"l{i}", n, n - prev if progressive else n, FP / decode_bytes_per_s, m / 24, progressive))
        prev = n
    return out


FP16 = Level("fp16", FP, FP, FP / 3e9, 0.0)
LADDERS = {
    "sakura": [_ladder([12, 8, 6, 4], 6e8, [4e-3, 1e-3, 3e-4, 1e-4], True) + [FP16]] * 24,
    "cachegen": [_ladder([4.5, 3.5, 2.8], 2e7, [2e-3, 4e-4, 1e-4], False)] * 24,
    "fp16": [[FP16]] * 24,
}
FLOORS = {"sakura": 1, "cachegen": 0, "fp16": 0}


def run(name, trace, profile=CPU, start_s=0.0):
    pol = make_policy(name)
    sim = simulate_oracle if name == "oracle" else simulate
    return sim(pol, trace, profile, LADDERS, FLOORS, start_s)


def _varying(seed):
    rng = np.random.default_rng(seed)
    return Trace(f"rand{seed}", np.full(200, 1.0), rng.uniform(0.2, 40, 200) * 1e6 / 8)


@pytest.mark.parametrize("trace", [Trace.constant(1), Trace.constant(20), _varying(1), _varying(2)])
def test_physical_bounds_hold_on_every_trace(trace):
    res = {name: run(name, trace) for name in POLICIES}
    for name, r in res.items():
        assert r.result.latency_s >= res["free-kv"].result.latency_s - 1e-9, name
        # the template is dropped once, where the result says (never when the device ran every layer)
        assert [d["layer"] for d in r.result.decisions if d["level"] == "drop"] == (
            [r.result.split_layer] if r.result.split_layer < 24 else []
        ), name
        # bytes cross the link only for a decision to fetch a level, and every decision says why
        fetches = [d for d in r.result.decisions if isinstance(d["level"], int) and d["level"] >= 0]
        assert (r.result.bytes_fetched > 0) == bool(fetches) and all(d["reason"] for d in r.result.decisions), name
    assert (
        res["fetch-fp16"].result.bytes_fetched == 24 * FP and res["fetch-fp16"].result.split_layer == 0
    )  # each shard once
    assert res["on-device"].result.bytes_fetched == res["on-device-cached"].result.bytes_fetched == 0
    assert res["oracle"].result.latency_s <= res["sakura"].result.latency_s + 1e-9
    assert res["sakura"].result.latency_s <= res["on-device-cached"].result.latency_s + 1e-9
    assert res["on-device-cached"].result.latency_s < res["on-device"].result.latency_s


def test_fast_link_on_a_slow_device_fetches_almost_everything():
    r = run("sakura", Trace.constant(500))
    free = run("free-kv", Trace.constant(500))
    assert r.result.split_layer <= 2
    assert r.result.latency_s < 1.05 * free.result.latency_s
    assert r.psnr_db >= 35


def test_slow_link_computes_and_npu_never_fetches():
    slow = run("sakura", Trace.constant(0.2))
    cached = run("on-device-cached", Trace.constant(0.2))
    # at most the last shards are worth it; the bandwidth probe (one floor shard) is decoded on the DiT's cores,
    # which costs the CPU profile's DiT the shard's decode time / 8 cores and nothing else
    probe = LADDERS["sakura"][0][FLOORS["sakura"]].decode_s / CPU.dit_cpu_cores
    assert slow.result.split_layer >= 20 and slow.result.latency_s <= cached.result.latency_s + probe + 1e-9
    assert slow.cpu.contention_s == pytest.approx(probe)
    npu = run("sakura", Trace.constant(50), NPU)
    assert npu.result.split_layer == 24


def test_hybrid_split_beats_both_extremes_on_a_middling_link():
    trace = Trace.constant(2)
    r, cached, fetch = run("oracle", trace), run("on-device-cached", trace), run("fetch-fp16", trace)
    assert 0 < r.result.split_layer < 24
    assert r.result.latency_s < cached.result.latency_s and r.result.latency_s < fetch.result.latency_s


def test_runs_are_deterministic_and_decisions_have_reasons():
    a, b = run("sakura", _varying(3), start_s=7.0), run("sakura", _varying(3), start_s=7.0)
    assert a.result.latency_s == b.result.latency_s and a.result.decisions == b.result.decisions
    assert all(d["reason"] for d in a.result.decisions)


def test_sakura_upgrades_progressively_while_later_steps_run():
    r = run("sakura", Trace.constant(8))
    assert any(d["reason"] == "upgrade" for d in r.result.decisions)
    from sakura_core.runtime.simulate import SimConfig

    no_up = simulate(make_policy("sakura"), Trace.constant(8), CPU, LADDERS, FLOORS, config=SimConfig(upgrades=False))
    assert r.psnr_db > no_up.psnr_db
    assert r.result.latency_s == pytest.approx(no_up.result.latency_s)  # upgrades use idle link time only


def test_cachegen_rule_picks_high_levels_on_fast_links_and_recomputes_on_slow_ones():
    fast = run("cachegen", Trace.constant(1000))
    assert fast.result.split_layer == 0
    assert all(d["level"] == 2 for d in fast.result.decisions if d["level"] != "drop")
    assert [d["layer"] for d in fast.result.decisions if d["level"] == "drop"] == [
        0
    ]  # the template dropped at layer 0
    slow = run("cachegen", Trace.constant(0.5))
    assert slow.result.split_layer == 24 and slow.result.bytes_fetched == 0


def test_unknown_policy_is_explained():
    with pytest.raises(ValueError, match="unknown policy 'x'"):
        make_policy("x")


def test_latency_target_buys_quality_with_slack_and_is_cachegens_slo():
    from sakura_core.runtime.simulate import SimConfig

    trace = Trace.constant(8)
    strict = simulate(make_policy("sakura"), trace, CPU, LADDERS, FLOORS, config=SimConfig(upgrades=False))
    target = strict.result.latency_s * 1.3
    relaxed = simulate(
        make_policy("sakura"), trace, CPU, LADDERS, FLOORS, config=SimConfig(upgrades=False, latency_target_s=target)
    )
    assert relaxed.psnr_db > strict.psnr_db
    assert relaxed.result.latency_s <= target
    slow = Trace.constant(1)
    assert run("cachegen", slow).result.bytes_fetched == 0  # default SLO (the template pass): recompute
    cg = simulate(make_policy("cachegen"), slow, CPU, LADDERS, FLOORS, config=SimConfig(latency_target_s=2000))
    assert cg.result.bytes_fetched > 0  # a generous SLO: its rule fetches

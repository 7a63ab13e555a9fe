"""sakura against the oracle and on-device on fresh synthetic links (seed 900: not the development seed 100, never
../shared/traces), klein-like geometry, phone-CPU profile, per-step KV: a regression guard on the policy's quality
(the previous policy's median was ~1.35x the oracle on links like these); and a link that dies right after the drop
(the late-shard fallback against fetching nothing)."""

import statistics

import pytest

from sakura_core.fetch.synth import WALKS, random_walk
from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import simulate_oracle
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import kv_mode_view, simulate

PROFILE = get_profile("snapdragon-8-elite-cpu", "klein4b-512-ref1024")
FP = kv_mode_view(PROFILE, "per-step").model.shard_bytes_fp16
# a 3-level ladder shaped like the measured one: a cheap base, the floor (~4.7x fp16) refining it, fp16
LADDER = [
    Level("l1", FP // 11, FP // 11, 0.05, 1e-3),
    Level("l3", FP // 5, FP // 5 - FP // 11, 0.09, 1e-6, True),
    Level("fp16", FP, FP, 0.06, 0.0),
]
LADDERS, FLOORS = {"sakura": [LADDER] * 100}, {"sakura": 1}


def test_sakura_tracks_the_oracle_and_never_loses_to_on_device_on_fresh_random_walks():
    ratios = []
    for i, (mean, sigma) in enumerate(WALKS):
        if i % 2:
            continue  # every other kind of walk: 8 links, a few seconds
        trace = random_walk(900 + i, mean, sigma)
        sakura = simulate(make_policy("sakura"), trace, PROFILE, LADDERS, FLOORS)
        oracle = simulate_oracle(make_policy("oracle"), trace, PROFILE, LADDERS, FLOORS)
        device = simulate(make_policy("on-device"), trace, PROFILE, LADDERS, FLOORS)
        assert sakura.result.latency_s <= 1.02 * device.result.latency_s, trace.name
        assert sakura.psnr_db >= 35.0, trace.name
        ratios.append(sakura.result.latency_s / oracle.result.latency_s)
    assert statistics.median(ratios) <= 1.10 and max(ratios) <= 1.4, ratios


@pytest.mark.parametrize("mbit", [10, 20])
def test_a_link_that_dies_after_the_drop_costs_at_most_two_percent_over_fetching_nothing(mbit):
    # single KV mode, a steady link until 3 s after sakura drops the template, then nothing: the late shards are given
    # up on within the edit's waiting allowance (1.5 %) and the template pass resumes at the drop layer, so the edit
    # costs what fetching nothing costs plus that wait. (Restarting the pass from layer 0 would cost 1.10-1.21x.)
    ladders = {"sakura": [LADDER] * PROFILE.model.layers}
    steady = simulate(make_policy("sakura"), Trace.constant(mbit), PROFILE, ladders, FLOORS)
    drop = next(d for d in steady.result.decisions if d["level"] == "drop")
    dies = Trace("dies", [drop["t"] + 3.0, 1e5], [mbit * 1e6 / 8, 0.0])
    sakura = simulate(make_policy("sakura"), dies, PROFILE, ladders, FLOORS)
    nothing = simulate(make_policy("on-device-cached"), dies, PROFILE, ladders, FLOORS)
    k = sakura.splits[0]
    assert k == steady.splits[0] >= 5  # dropped as on the steady link, after several template layers
    assert [e["level"] for e in sakura.result.events if "fallback" in str(e["level"])] == [
        f"fallback template pass from layer {k}"
    ]
    assert sakura.stall_s <= 0.015 * nothing.result.latency_s + PROFILE.layer_cached_s  # the allowance (+ one poll)
    assert sakura.result.latency_s <= 1.02 * nothing.result.latency_s

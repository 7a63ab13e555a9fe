"""sakura against the oracle and on-device on fresh synthetic links (seed 900: not the development seed 100, never
../shared/traces), klein-like geometry, phone-CPU profile, per-step KV: a regression guard on the policy's quality
(the previous policy's median was ~1.35x the oracle on links like these)."""

import statistics

from sakura_core.fetch.synth import WALKS, random_walk
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import simulate_oracle
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import kv_mode_view, simulate

PROFILE = get_profile("snapdragon-8-elite-cpu", "klein4b-512-ref1024")
FP = kv_mode_view(PROFILE, "per-step").model.shard_bytes_fp16
# a 3-level ladder shaped like the measured one: a cheap base, the floor (~4.7x fp16) refining it, fp16
LADDER = [Level("l1", FP // 11, FP // 11, 0.05, 1e-3), Level("l3", FP // 5, FP // 5 - FP // 11, 0.09, 1e-6, True),
          Level("fp16", FP, FP, 0.06, 0.0)]  # fmt: skip
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
        assert sakura.latency_s <= 1.02 * device.latency_s, trace.name
        assert sakura.psnr_db >= 35.0, trace.name
        ratios.append(sakura.latency_s / oracle.latency_s)
    assert statistics.median(ratios) <= 1.10 and max(ratios) <= 1.4, ratios

"""The template image before the lanes (``simulate``'s ``template_image_bytes``): the simulator fetches it from the
trace's start as the live edit does, starts the lanes once it is in, charges its time in the latency, and seeds the
estimator with it; the oracle and the fluid bound charge it the same way."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import fluid_bound, simulate_oracle
from sakura_core.runtime.pre_lanes import template_image_s
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
FP = G.shard_bytes_fp16
Q = Level("q", FP // 6, FP // 6, 1e-3, 1e-4 / 12)
LADDERS = {"sakura": [[Q, Level("fp16", FP, FP, 1e-3, 0.0)]] * 12}
FLOORS = {"sakura": 0}
IMAGE = 125_000  # 1 s at 1 Mbit/s


def test_the_image_time_comes_from_the_trace_after_one_round_trip():
    assert template_image_s(Trace.constant(1.0), 0.0, IMAGE, 0.05) == pytest.approx(1.05)
    assert template_image_s(Trace.constant(1.0), 3.0, 0, 0.05) == 0.0  # no image, no time
    with pytest.raises(ValueError, match="nbytes >= 0 and rtt_s >= 0"):
        template_image_s(Trace.constant(1.0), 0.0, -1, 0.05)


def test_the_image_is_charged_in_the_latency_of_every_policy_and_the_lanes_start_after_it():
    trace = Trace.constant(1.0)
    for name in ("on-device", "sakura"):
        bare = simulate(make_policy(name), trace, P, LADDERS, FLOORS, config=SimConfig(rtt_s=0.05))
        img = simulate(
            make_policy(name), trace, P, LADDERS, FLOORS, config=SimConfig(rtt_s=0.05), template_image_bytes=IMAGE
        )
        assert img.pre_lanes_s == pytest.approx(1.05) and bare.pre_lanes_s == 0.0
        assert img.start_s == 0.0  # the edit's own start on the trace, not the lanes'
        if name == "on-device":  # nothing on the link: the same lanes, one image later
            assert img.result.latency_s == pytest.approx(bare.result.latency_s + 1.05)


def test_the_image_seeds_the_estimator_so_the_first_decision_is_no_bandwidth_probe():
    trace = Trace.constant(8.0)
    bare = simulate(make_policy("sakura"), trace, P, LADDERS, FLOORS)
    img = simulate(make_policy("sakura"), trace, P, LADDERS, FLOORS, template_image_bytes=IMAGE)
    assert "bandwidth probe" in bare.result.decisions[0]["reason"]
    assert not any("probe" in d["reason"] for d in img.result.decisions)
    assert any("at 8.00 Mbit/s" in d["reason"] for d in img.result.decisions[:3])  # the image's rate, round trip off


def test_the_oracle_and_the_bound_see_the_same_image():
    trace = Trace.constant(0.5)
    pre = template_image_s(trace, 0.0, IMAGE, SimConfig().rtt_s)
    bare = simulate_oracle(make_policy("sakura"), trace, P, LADDERS, FLOORS)
    img = simulate_oracle(make_policy("sakura"), trace, P, LADDERS, FLOORS, template_image_bytes=IMAGE)
    assert img.pre_lanes_s == pytest.approx(pre) and img.result.latency_s == pytest.approx(bare.result.latency_s + pre)
    bound = fluid_bound(trace, P, LADDERS, FLOORS)
    assert fluid_bound(trace, P, LADDERS, FLOORS, pre_lanes_s=pre) == pytest.approx(bound + pre)
    assert fluid_bound(trace, P, LADDERS, FLOORS, pre_lanes_s=pre) <= img.result.latency_s + 1e-9


def test_a_negative_image_is_refused():
    with pytest.raises(ValueError, match="template_image_bytes must be >= 0"):
        simulate(make_policy("sakura"), Trace.constant(1.0), P, LADDERS, FLOORS, template_image_bytes=-1)

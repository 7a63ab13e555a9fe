"""The zero-byte ``reuse`` rung of a cross-step template in the simulator and the planner: a level like any other
when its PSNR meets the floor (then it is the floor of the later steps' shards); it takes no request and no decode,
it needs its reference (the same layer of the step before) held, and a shard without one is fetched exact."""

import json
from pathlib import Path

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.metrics import psnr_from_mse
from sakura_core.policy.ladder import CrossStepLinks, Level, levels_from
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.geometry import GEOMETRIES
from sakura_core.runtime.oracle import fixed_split_policy
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.sim_ladders import ShardLadders
from sakura_core.runtime.simulate import SimConfig, simulate
from sakura_tools.bench.e2e import PSNR_TARGET_DB, cross_step_sakura
from sakura_tools.bench.per_step_ladders import load

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
FP = G.shard_bytes_fp16
EXACT = Level("fp16", FP, FP, 1e-3, 0.0)
Q = Level("q", FP // 6, FP // 6, 1e-3, 1e-5)
NO_RTT = SimConfig(rtt_s=0.0)


def _reuse(step: int, mse: float = 2e-6) -> Level:
    return Level("reuse", 0, 0, 0.0, mse, links=CrossStepLinks(ref_step=step - 1, reuse=True))


def _ladders(ref_step=None):
    later = [
        [
            _reuse(s)
            if ref_step is None
            else Level("reuse", 0, 0, 0.0, 2e-6, links=CrossStepLinks(ref_step=ref_step, reuse=True)),
            Q,
            EXACT,
        ]
        for s in (1, 2)
    ]
    return {"sakura": [[Q, EXACT]] * 4 + [later[0]] * 4 + [later[1]] * 4}


FLOORS = {"sakura": [0] * 4 + [0] * 8}  # step 0 at q, steps 1-2 at the reuse rung


def test_a_reuse_rung_fetches_nothing_and_costs_its_share_of_the_error():
    r = simulate(fixed_split_policy(0), Trace.constant(100.0), P, _ladders(), FLOORS, config=NO_RTT)
    assert r.result.bytes_fetched == 4 * Q.nbytes  # step 0 only
    fetched = sorted(e["layer"] for e in r.result.events if e["lane"] == "fetch")
    assert fetched == [0, 1, 2, 3]
    assert r.psnr_db == pytest.approx(psnr_from_mse(4 * 1e-5 + 8 * 2e-6))


def test_a_reuse_rung_is_ready_no_sooner_than_its_reference():
    r = simulate(fixed_split_policy(0), Trace.constant(100.0), P, _ladders(), FLOORS, config=NO_RTT)
    dec = {e["layer"]: e for e in r.result.events if e["lane"] == "decode"}
    assert all(dec[4 + i]["end"] >= dec[i]["end"] and dec[8 + i]["end"] >= dec[4 + i]["end"] for i in range(4))


def test_a_reuse_rung_without_its_reference_is_fetched_exact():
    r = simulate(fixed_split_policy(0), Trace.constant(100.0), P, _ladders(ref_step=2), FLOORS, config=NO_RTT)
    # step 1's rung names step 2 (never there when step 1 is decided): exact; step 2's rung reuses step 2: exact too
    assert r.result.bytes_fetched == 4 * Q.nbytes + 8 * EXACT.nbytes


def test_sakura_drops_the_later_steps_template_for_the_free_rung():
    link = Trace.constant(20.0)  # a q shard takes 3.4 layer times: step 0 is computed, later steps fetch a bit
    base = simulate(make_policy("sakura"), link, P, {"sakura": [[Q, EXACT]] * 12}, {"sakura": 0}, config=NO_RTT)
    with_reuse = simulate(make_policy("sakura"), link, P, _ladders(), FLOORS, config=NO_RTT)
    assert min(base.splits[1:]) > 0  # without the rung the device computes part of the later steps' template
    assert with_reuse.splits[1:] == [0, 0]  # with it every later layer takes the rung
    assert (
        with_reuse.result.latency_s < base.result.latency_s
        and with_reuse.result.bytes_fetched < base.result.bytes_fetched
    )
    assert {e["level"] for e in with_reuse.result.events if e["lane"] == "decode" and e["layer"] >= 4} == {"reuse"}


def _geometry_ladders(geometry) -> ShardLadders:
    path = Path(__file__).parents[3] / "docs" / "results" / "ladders" / f"{geometry.name}.per-step.json"
    return ShardLadders.from_dict(json.loads(path.read_text()))


def test_the_shipped_reuse_rung_is_below_the_floor_and_stays_out():
    data = load()
    assert data["reuse"]["psnr_db"] < PSNR_TARGET_DB
    g = GEOMETRIES["klein4b-512-ref1024"]
    ladders, floor = cross_step_sakura(_geometry_ladders(g), g)
    assert isinstance(floor, int) and not any(lv.reuse for lad in ladders for lv in lad)


def test_a_reuse_rung_at_the_floor_joins_the_later_steps_as_their_floor():
    data = load()
    data["reuse"] = {**data["reuse"], "psnr_db": PSNR_TARGET_DB + 1.0}
    g = GEOMETRIES["klein4b-512-ref1024"]
    ladders, floor = cross_step_sakura(_geometry_ladders(g), g, data)
    L = g.layers
    assert floor[:L] == [floor[0]] * L and floor[0] > 0 and floor[L:] == [0] * (len(ladders) - L)
    assert not any(lv.reuse for lad in ladders[:L] for lv in lad)
    rung = ladders[L][0]
    assert rung.reuse and rung.nbytes == 0 and rung.ref_step == 0 and ladders[3 * L][0].ref_step == 2
    assert [lv.name for lv in ladders[L][1:]] == [lv.name for lv in ladders[0]]


def test_the_free_rung_costs_no_round_trip_in_the_plan():
    # a 50 ms RTT is 5 template layers: a plan that charged the rung a round trip would keep the template
    cfg = SimConfig(rtt_s=0.05)
    r = simulate(make_policy("sakura"), Trace.constant(50.0), P, _ladders(), FLOORS, config=cfg)
    assert (
        r.splits[2] == 0 and r.result.bytes_fetched == Q.nbytes
    )  # the probe; then the rung for every later layer used


def test_above_a_reuse_floor_only_levels_no_worse_than_the_rung_may_be_picked():
    worse = Level("q0", FP // 50, FP // 50, 1e-3, 5e-6)  # cheaper than q, worse than the rung (2e-6)
    ladder = [_reuse(1), worse, Q, EXACT]
    assert levels_from(ladder, 0) == [0, 3]  # q (1e-5) is worse than the rung too
    assert levels_from([worse, Q, EXACT], 0) == [0, 1, 2]  # no rung: the floor and everything above it

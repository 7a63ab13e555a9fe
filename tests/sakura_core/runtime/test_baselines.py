"""Baseline fixes (issue 13): CacheGen reads the link on the simulator's clock, its recompute decisions advance the
link clock, it is held to sakura's quality floor; the oracle's exact transfer times honour the start offset.
Each test fails on the behaviour before the fix."""

from types import SimpleNamespace

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import LEVEL_COMPUTE, make_policy
from sakura_core.runtime.profiles import PHONE_DIT, PROFILES
from sakura_core.runtime.simulate import simulate
from sakura_tools.bench.e2e import quality_floor

FP = PHONE_DIT.shard_bytes_fp16
CPU = PROFILES["snapdragon-8-elite-cpu"]
MBIT = 1e6 / 8  # bytes/s per Mbit/s


def _cachegen_ladders(floor: int):
    levels = [
        Level(f"c{i}", int(FP / r), int(FP / r), 0.001, m / 24)
        for i, (r, m) in enumerate([(8.0, 1e-2), (5.0, 1e-3), (3.0, 1e-4)])
    ]
    return {"cachegen": [levels] * 24}, {"cachegen": floor}


def _dead_then_fast(dead_s: float, fast_mbit: float, tail_s: float = 1000.0) -> Trace:
    """0 bit/s for ``dead_s``, then ``fast_mbit`` for ``tail_s``."""
    return Trace("dead-then-fast", np.array([dead_s, tail_s]), np.array([0.0, fast_mbit * MBIT]))


def test_cachegen_reads_the_link_at_the_simulators_clock_with_the_start_offset():
    ladders, floors = _cachegen_ladders(0)
    trace = _dead_then_fast(30.0, 1000.0)
    # the edit starts 40 s into the trace, where the link is fast: the old code read rate_at(0) == 0 and recomputed
    r = simulate(make_policy("cachegen"), trace, CPU, ladders, floors, start_s=40.0)
    assert r.result.bytes_fetched > 0
    assert r.result.split_layer == 0
    assert r.result.decisions[0]["level"] == 2


def test_cachegen_recompute_decisions_advance_the_link_clock():
    ladders, floors = _cachegen_ladders(0)
    # dead for 3 s, then fast: the first chunks are recomputed, later ones decided on the fast rate and fetched
    r = simulate(make_policy("cachegen"), _dead_then_fast(3.0, 1000.0), CPU, ladders, floors)
    levels = [d["level"] for d in r.result.decisions if d["level"] != "drop"]
    assert levels[0] == LEVEL_COMPUTE
    assert r.result.bytes_fetched > 0  # old: one sample at t=0 decided every chunk -> recompute all, 0 bytes
    assert 0 < r.result.split_layer < 24
    times = [d["t"] for d in r.result.decisions if d["level"] != "drop"]
    assert times[1] > times[0]  # the second chunk is decided later than the first


def test_cachegen_is_held_to_the_quality_floor():
    # a rate at which level c0 (FP/8 bytes) fits the per-chunk budget and c1 (FP/5) does not: with floor 1 it must
    # not pick c0
    budget = CPU.template_pass_s / 24
    rate = FP / 8 / (0.8 * budget)
    assert FP / 5 / rate > budget
    trace = Trace.constant(rate / MBIT)
    free = simulate(make_policy("cachegen"), trace, CPU, *_cachegen_ladders(0))
    assert {d["level"] for d in free.result.decisions if d["level"] != "drop"} == {0}
    held = simulate(make_policy("cachegen"), trace, CPU, *_cachegen_ladders(1))
    assert all(d["level"] != 0 for d in held.result.decisions)  # old: level 0 (below the floor) everywhere


def test_bench_floor_rule_is_the_cheapest_level_meeting_the_target():
    assert quality_floor([20.0, 30.0, 36.0, 40.0], 35.0) == 2
    assert quality_floor([20.0, 26.0, 31.0], 35.0) == 2  # none meets it: the best one


def _state(**fields):
    """A PolicyState with the given fields; the ones this test does not read are inert."""
    from sakura_core.policy.context import _STATE_MEMBERS

    base = {name: None for name in _STATE_MEMBERS}
    base["flush_observations"] = lambda: None
    return SimpleNamespace(**{**base, **fields})


def test_oracle_transfer_end_honours_the_start_offset():
    trace = _dead_then_fast(10.0, 8.0)  # 1 MB/s after 10 s
    ctx = Context(_state(trace=trace, start_s=10.0, rtt_s=0.0, now=0.0))
    assert ctx.transfer_end(0.0, 1e6, None) == pytest.approx(1.0)  # old: 11 s (read from t=0 of the trace)
    assert ctx.transfer_end(0.0, 1e6, 2e6) == pytest.approx(0.5)
    assert ctx.link_rate_now() == pytest.approx(1e6)

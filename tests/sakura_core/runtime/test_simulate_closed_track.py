"""Closed-loop twins in the ladders the policies and the simulator read: ``fetch_as`` (a twin on its track when the
level's own quality is below the floor or the twin is no larger; off the track the open-loop floor), the simulator's
substitution with its bytes and MSE, and the floor on the twins' track."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.metrics import psnr_from_mse
from sakura_core.policy.ladder import (
    CrossStepLinks,
    Level,
    feeds_twin,
    fetch_as,
    fetch_bytes,
    twin_applies,
    with_track_floor,
)
from sakura_core.runtime.oracle import fixed_split_policy
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
FP = G.shard_bytes_fp16
N = 12


def _ladder(step: int) -> list[Level]:
    """lo (open quality below the target; at steps >= 1 a twin of 1/8 fp16 with 10x less error), hi (the open-loop
    floor), fp16."""
    ref = None if step == 0 else step - 1
    twin = None if step == 0 else Level("lo+cl", FP // 8, FP // 8, 1e-3, 1e-5 / N, links=CrossStepLinks(ref_step=ref))
    return [
        Level("lo", FP // 16, FP // 16, 1e-3, 1e-4 / N, links=CrossStepLinks(ref_step=ref, closed=twin)),
        Level("hi", FP // 4, FP // 4, 1e-3, 2e-5 / N, links=CrossStepLinks(ref_step=ref)),
        Level("fp16", FP, FP, 1e-3, 0.0),
    ]


LADDERS = [_ladder(g // G.layers) for g in range(N)]


def test_fetch_as_takes_the_twin_on_its_track_and_the_open_floor_off_it():
    lad = with_track_floor([_ladder(1)], "hi")[0]
    assert lad[0].off_track == 1 and lad[1].off_track is None
    assert fetch_as(lad, 0, True) == (0, True)
    assert fetch_as(lad, 0, False) == (1, False)
    assert fetch_as(lad, 1, True) == fetch_as(lad, 1, False) == (1, False)  # no twin
    plain = _ladder(1)  # no track floor: a twin larger than its level is not worth it
    assert fetch_as(plain, 0, True) == (0, False)
    cheap = [plain[0].with_links(closed=plain[0].closed.__class__(**{**plain[0].closed.__dict__, "nbytes": FP // 32}))]
    assert fetch_as(cheap, 0, True) == (0, True)
    assert lad[0].expected_nbytes == FP // 8 and plain[0].expected_nbytes == FP // 16
    assert fetch_bytes(lad, 0, True) == FP // 8 and fetch_bytes(lad, 0, False) == FP // 4  # never lo's own FP // 16


def test_twin_applies_on_the_same_level_and_track():
    lv = _ladder(1)[0]
    assert twin_applies(lv, ("lo", False))  # step 0 (ref_step 0) at the level: the track's root
    assert not twin_applies(lv, ("hi", False)) and not twin_applies(lv, None)
    later = _ladder(2)[0]
    assert twin_applies(later, ("lo", True)) and not twin_applies(later, ("lo", False))  # step >= 1: the twin only


def test_an_upgrade_of_a_tracks_reference_is_flagged():
    assert feeds_twin(_ladder(0), 0, _ladder(1))  # step 0 at lo: step 1's lo twin decodes against it
    assert not feeds_twin(_ladder(0), 1, _ladder(1))  # hi has no twin
    assert not feeds_twin(
        _ladder(0), 0, [Level("lo", 1, 1, 0.0, 0.0, links=CrossStepLinks(ref_step=0))]
    )  # no twin there


@pytest.mark.parametrize(("splits", "off_track_shards"), [(0, 0), ([1, 0, 0], 2)])
def test_the_simulator_fetches_twins_on_the_track_and_the_open_floor_off_it(splits, off_track_shards):
    ladders = {"sakura": with_track_floor(LADDERS, "hi")}
    r = simulate(fixed_split_policy(splits), Trace.constant(1000), P, ladders, {"sakura": 0}, config=SimConfig())
    fetched_step0 = G.layers - (1 if off_track_shards else 0)
    twins = 2 * G.layers - off_track_shards
    assert r.result.bytes_fetched == fetched_step0 * (FP // 16) + twins * (FP // 8) + off_track_shards * (FP // 4)
    names = [e["level"] for e in r.result.events if e["lane"] == "fetch"]
    assert names.count("lo+cl") == twins and names.count("hi") == off_track_shards
    # on the track, step 0's shards too count at the track's error (the device's layer: exact)
    mse = fetched_step0 * 1e-5 / N + twins * 1e-5 / N + off_track_shards * 2e-5 / N
    assert r.psnr_db == pytest.approx(psnr_from_mse(mse))


def _probe_snapshot(rate: float | None = 1e6):
    """A track-priced snapshot at the edit's start, where the runtime does not re-root (the live lanes; the
    simulator's re-roots: tests/sakura_core/policy/test_reroot.py)."""
    from sakura_core.policy.planner import Snapshot
    from sakura_core.runtime.simulate import _Sim

    ladders = with_track_floor(LADDERS, "hi")
    sim = _Sim(fixed_split_policy(0), Trace.constant(8), 0.0, P, ladders, 0, SimConfig())
    sim.reroots = False
    return sim, Snapshot(sim.ctx, rate, track=True)


def test_the_planner_prices_a_layer_off_its_track_at_the_open_floor():
    """A plan that computes a layer at some step takes it off the twins' track for every later step (the track is
    rooted at step 0): the planner with ``track`` (the oracle's search) charges those shards the open-loop floor's
    bytes, as the fetch will; without it (sakura's plans) every shard is priced on its track."""
    _, snap = _probe_snapshot()
    L = G.layers
    on = snap._planned_bytes([0, 0, 0])
    assert list(on) == [FP // 16] * L + [FP // 8] * (2 * L)  # step 0 at lo, later steps as twins
    one = snap._planned_bytes([1, 0, 0])  # layer 0 computed at step 0: off at steps 1 and 2
    assert [one[s * L] for s in (1, 2)] == [FP // 4] * 2 and list(one[L + 1 : 2 * L]) == [FP // 8] * (L - 1)
    late = snap._planned_bytes([0, 2, 0])  # layers 0-1 computed at step 1: off at step 2 only
    assert list(late[L : 2 * L]) == [FP // 8] * L and list(late[2 * L : 2 * L + 2]) == [FP // 4] * 2
    # the plan's finish pays for it: computing step 0 makes the later steps' transfers 2x longer on a slow link
    track_aware = snap.finish([L, 0, 0])
    assert snap.finish([0, 0, 0]) == pytest.approx(_with_track_ignored(snap).finish([0, 0, 0]))  # all on the track
    assert _with_track_ignored(snap).finish([L, 0, 0]) < track_aware  # the planner before: every twin at hand
    from sakura_core.policy.planner import Snapshot

    assert list(Snapshot(snap.ctx, 1e6)._planned_bytes([L, 0, 0])) == list(on)  # sakura's own plans


def _with_track_ignored(snap):
    import copy

    out = copy.copy(snap)
    out.nb_off = snap.nb
    return out


def test_off_track_reads_what_the_device_holds():
    """A reference held at the floor's own level (the track) keeps the next step's layer on it; held at another
    level, or not requested (computed on the device), takes it off; one on its way counts as on the track."""
    import numpy as np

    sim, _ = _probe_snapshot()
    L = G.layers
    sim._got = {0: [(0, 0.0)], 1: [(1, 0.0)]}
    sim._first_ready[0] = sim._first_ready[1] = 0.0
    requested = np.zeros(N, dtype=bool)
    requested[[0, 1, 2]] = True  # layer 2 on its way
    assert list(sim.ctx.off_track(1, requested)) == [False, True, False, True]
    assert not sim.ctx.off_track(0, requested).any()  # step 0 has no reference
    assert list(sim.ctx.floor_off_track_bytes()[L : 2 * L]) == [FP // 4] * L


def test_the_fluid_bound_prices_a_track_floor_as_its_twin_or_the_open_floor():
    """A floor below the open-loop floor is fetched as its twin (on the track) or as the open-loop floor (off it),
    never as its own open-loop residual: the bound takes the fewer of those two, and no split run is under it."""
    from sakura_core.policy.ladder import fewest_fetch_bytes
    from sakura_core.runtime.oracle import fluid_bound

    ladders = with_track_floor(LADDERS, "hi")
    assert fewest_fetch_bytes(ladders[0], 0) == FP // 16  # step 0: no twin, the level itself
    assert fewest_fetch_bytes(ladders[G.layers], 0) == FP // 8  # not lo's own FP // 16
    trace = Trace.constant(20)
    bound = fluid_bound(trace, P, {"sakura": ladders}, {"sakura": 0})
    runs = [
        simulate(fixed_split_policy([a, b, c]), trace, P, {"sakura": ladders}, {"sakura": 0}).result.latency_s
        for a in (0, 2, 4)
        for b in (0, 2, 4)
        for c in (0, 4)
    ]
    assert min(runs) >= bound - 1e-9
    loose = {"sakura": [[lv.with_links(off_track=None) for lv in lad] for lad in ladders]}
    assert fluid_bound(trace, P, loose, {"sakura": 0}) < bound  # priced at lo's own bytes, as before


def test_the_benchs_fluid_bound_is_under_every_run_of_a_per_step_edit():
    """``run_sim``'s fluid-bound rows (what the e2e tables divide by) on a per-step edit with twins, no round trips and
    free decode (where the bound is tight): every policy's run at or above it. The bound once ran on the simulator's
    flattened view, one prefix over the whole edit, and went over the oracle, whose splits ([2, 2, 2] at 30 Mbit/s)
    are a prefix per step."""
    from dataclasses import replace

    from sakura_tools.bench.e2e import FLUID_BOUND, run_sim

    free = [
        [replace(lv, decode_s=0.0).with_links(closed=lv.closed and replace(lv.closed, decode_s=0.0)) for lv in lad]
        for lad in LADDERS
    ]
    ladders = {"sakura": with_track_floor(free, "hi")}
    for mbit in (20, 30, 40, 60):
        runs = run_sim(
            [Trace.constant(mbit)],
            ["sakura", "oracle", "on-device"],
            P,
            ladders,
            {"sakura": 0},
            1,
            kv_mode="per-step",
            config=SimConfig(rtt_s=0.0),
        )
        bound = next(r["latency_s"] for r in runs if r["policy"] == FLUID_BOUND)
        for r in runs:
            assert r["latency_s"] >= bound - 1e-9, (mbit, r["policy"], r["latency_s"], bound)

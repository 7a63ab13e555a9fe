"""Re-rooting a layer on its twins' track (``policy/reroot.py``): a layer the device computed comes back on its
closed-loop track by its chain of shards from the last step requested (or step 0), so its later shards come as twins
instead of the open-loop floor. The world is ``test_planner_track``'s far one: 6 steps x 4 layers, step 0's floor
``lo`` (fp16 / 16), its twins fp16 / 64, the open-loop ``hi`` fp16 / 2."""

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.planner import Snapshot
from sakura_core.policy.policies import make_policy
from sakura_core.policy.reroot import chain_bytes, chain_of
from sakura_core.runtime.sim_link import SimLink
from sakura_core.runtime.simulate import SimConfig, simulate

from .test_planner_track import FAR, FP, NEAR, G, P, _ctx

L, S = G.layers, G.steps


def test_chain_bytes_sum_the_steps_since_the_last_one_requested():
    nb = np.arange(1.0, S * L + 1)  # every shard a different size: the sums name their shards
    req = np.zeros(S * L, dtype=bool)
    req[[0 * L + 1, 3 * L + 1]] = True  # layer 1 requested at steps 0 and 3; layer 0 never
    out = chain_bytes(nb, req, S).reshape(S, L)
    g = nb.reshape(S, L)
    assert out[0].tolist() == [0.0] * L  # step 0 has no chain
    assert out[1, 1] == 0.0 and out[4, 1] == 0.0  # the step before is requested
    assert out[3, 1] == g[1, 1] + g[2, 1]  # back to step 0's request
    assert out[5, 1] == g[4, 1]
    assert out[5, 0] == g[:5, 0].sum()  # never requested: back to step 0, the tracks' root


def test_the_chain_of_a_layer_the_device_computed_starts_at_step_0():
    ctx = _ctx(FAR)
    req = np.zeros(S * L, dtype=bool)
    g = 2 * L + 3  # step 2, layer 3; steps 0 and 1 computed it
    assert chain_of(ctx, g, req) == [3, L + 3]
    req[3] = True  # held since step 0 (not decoded yet: fetched_levels says nothing): cannot tell its level
    assert chain_of(ctx, g, req) == []
    assert chain_of(ctx, L + 3, req) == []  # the reference is requested: on the track already
    assert chain_of(ctx, 3, np.zeros(S * L, dtype=bool)) == []  # step 0: the root itself


def test_no_chain_where_it_costs_more_than_the_open_loop_floor():
    """Near world: a twin is fp16 / 8, the open-loop floor fp16 / 4; step 0's root (fp16 / 16) and two twins cost
    more than the open-loop floor from step 3 on (1/16 + 2/8 + 1/8 > 1/4)."""
    ctx = _ctx(NEAR)
    req = np.zeros(S * L, dtype=bool)
    assert chain_of(ctx, L, req) == [0]  # 1/16 + 1/8 < 1/4
    assert chain_of(ctx, 3 * L, req) == []


def test_the_planner_prices_the_chain_where_the_runtime_re_roots():
    """A plan computing layer 0 at step 0: with re-roots its step-1 shard costs the chain (step 0's root) and the
    twin, and step 2 is back on the track; without, both cost the open-loop floor (fp16 / 2)."""
    plan = [1] + [0] * (S - 1)
    on = Snapshot(_ctx(FAR), 1e6, track=True)._planned_bytes(plan)
    assert on[L] == FP // 16 + FP // 64 and on[2 * L] == FP // 64 and on[L + 1] == FP // 64
    off = Snapshot(_ctx(FAR, reroots=False), 1e6, track=True)._planned_bytes(plan)
    assert off[L] == FP // 2 and off[2 * L] == FP // 2


def test_one_snapshot_prices_plan_after_plan_as_fresh_ones_do():
    # a snapshot keeps the step sums of its floor bytes and the last plan's needed shards across evaluations: plans
    # one after another (a step's split changed at a time, as the search makes them) are priced as on a new snapshot
    rng = np.random.default_rng(6)
    snap, plan = Snapshot(_ctx(FAR), 1e6, track=True), [0] * S
    for _ in range(40):
        plan[int(rng.integers(S))] = int(rng.integers(L + 1))
        fresh = Snapshot(_ctx(FAR), 1e6, track=True)
        assert snap._planned_bytes(plan).tolist() == fresh._planned_bytes(plan).tolist()
        assert snap.finish(plan) == fresh.finish(plan)
    assert chain_bytes(np.arange(1.0, S * L + 1), np.zeros(S * L, dtype=bool), S)[-1] == sum(range(L, S * L, L))


def _slow_start() -> Trace:
    """2 Mbit/s for 30 ms (step 0 runs on the device while its shards are on their way), then 25 Mbit/s."""
    return Trace("slow-start", np.array([0.03, 1e5]), np.array([2e6 / 8, 25e6 / 8]))


def _edit(reroots: bool, monkeypatch):
    monkeypatch.setattr(SimLink, "reroots", reroots)
    return simulate(make_policy("sakura"), _slow_start(), P, {"sakura": FAR}, {"sakura": 0}, config=SimConfig())


@pytest.mark.parametrize("reroots", [True, False])
def test_a_layer_computed_early_comes_back_on_its_track(reroots, monkeypatch):
    """The device computes step 0 on the slow start; with re-roots the link fetches each such layer's chain and
    every later shard comes as its twin (no open-loop ``hi``); without, the layers it computed stay off the track."""
    r = _edit(reroots, monkeypatch)
    chains = [d for d in r.result.decisions if str(d["reason"]).startswith("re-root")]
    fetched = [e["level"] for e in r.result.events if e["lane"] == "fetch"]
    if reroots:
        assert chains and "hi" not in fetched
        assert {d["layer"] // L for d in chains} <= set(range(S - 1))  # references: never the last step
    else:
        assert not chains


def test_re_roots_end_the_edit_sooner(monkeypatch):
    assert _edit(True, monkeypatch).result.latency_s < _edit(False, monkeypatch).result.latency_s


def test_the_oracle_and_a_context_without_re_roots_name_no_chain():
    ctx = _ctx(FAR, reroots=False)
    assert make_policy("sakura").reroot_chain(ctx, 2 * L) == []
    assert make_policy("oracle").reroot_chain(_ctx(FAR), 2 * L) == []  # exact transfer times: its plans as before
    assert make_policy("sakura").reroot_chain(_ctx(NEAR), L) == []  # below the long-edit rule
    assert make_policy("sakura").reroot_chain(_ctx(FAR), L) == [0]

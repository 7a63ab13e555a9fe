"""Re-roots in the live lanes (``runtime/fetch_reroot.py``): a layer the device computed at step 0 comes back on its
closed-loop twins' track by its chain (the same layer at step 0, at the floor, decoded only as the next one's
reference), so its later shards come as twins instead of the open-loop floor — as the simulator does
(tests/sakura_core/policy/test_reroot.py). The world is ``test_closed_twins_live``'s: a random-weight per-step demo
template, the floor ``sakura-l1`` on the twins' track, the open-loop floor ``sakura-l3``."""

import asyncio

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import rungs_with_track_floor
from sakura_core.policy.plan import FetchPlan, plan_fetch
from sakura_core.runtime.held_kv import HeldKV
from sakura_core.runtime.lane_parts import EditInputs
from sakura_core.runtime.live_state import LiveState
from sakura_core.runtime.pipeline import LiveSettings, PipelinedEdit, RuntimeConfig
from sakura_core.runtime.simulate import SimConfig, simulate

from .cross_step_edits import StepLevels, cross_step_setup
from .fetchers import blob_fetcher

STEPS = 3
FLOOR, OPEN = "sakura-l1", "sakura-l3"
REROOT = "re-root"


@pytest.fixture(scope="module")
def setup():
    return cross_step_setup("tpl-rr", STEPS)


class _Rerooting(StepLevels):
    """:class:`StepLevels` at the floor every step, the device computing layers < ``splits[s]``; it names the chain
    of a shard whose layer is off its track: the same layer at each step since the last one requested (or step 0),
    as :func:`~sakura_core.policy.reroot.chain_of` counts them — the bytes aside (the random-weight template's sizes
    are not the codec's)."""

    def reroot_chain(self, ctx, g):
        if not ctx.reroots:
            return []
        L, requested = ctx.layers_per_step, ~np.isnan(ctx.known_ready_array())
        chain, j = [], g - L
        while j >= 0 and not requested[j]:
            chain.append(j)
            j -= L
        return chain[::-1]


def _plan(setup):
    """The sakura plan with the floor at ``FLOOR`` on the twins' track (``OPEN`` off it)."""
    pre = setup[3]
    plan = plan_fetch(pre.manifest, "sakura")
    rungs = rungs_with_track_floor(plan.rungs, OPEN)
    floor = [r.level.name for r in rungs[0]].index(FLOOR)
    return rungs, floor


def _edit(setup, splits, swap=None, **config):
    """The live edit (50 Mbit/s, no upgrades) and what the fetch lane published and held apart: shard g -> (k, v,
    name) of each publish, and the chain shards held apart."""
    model, tpl, usr, pre, profile = setup
    rungs, floor = _plan(setup)
    swap = swap or {}
    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        blob_fetcher(lambda d: pre.blobs[swap.get(d, d)]),
        FetchPlan(_Rerooting(floor, splits), rungs, floor),
        profile,
        trace=Trace.constant(50.0),
        config=RuntimeConfig(upgrades=False, **config, live=LiveSettings(steps=STEPS)),
    )
    published, apart = {}, []
    held = edit.held
    publish, hold_chain = held.publish, held.hold_chain

    def spy_publish(shard, k, v, level, digest=None, name=None, blobs=()):
        published[shard.g] = (k.clone(), v.clone(), name)
        return publish(shard, k, v, level, digest, name, blobs)

    def spy_hold(shard, k, v, digest):
        apart.append(shard.g)
        return hold_chain(shard, k, v, digest)

    held.publish, held.hold_chain = spy_publish, spy_hold
    rep = asyncio.run(edit.run())
    return rep, edit, published, apart


def _fetched(rep):
    """Shard -> the level names its fetches came as (a live level's blobs are one event each: named once), and the
    shards in fetch order."""
    events = [e for e in rep.result.events if e["lane"] == "fetch"]
    by: dict[int, dict[str, None]] = {}
    for e in events:
        by.setdefault(e["layer"], {})[e["level"]] = None
    return {g: list(names) for g, names in by.items()}, [e["layer"] for e in events]


def test_a_layer_the_device_computed_comes_back_on_its_track_by_its_chain(setup):
    """Step 0 computes layers 0-1 (the later steps' room only once the lane is in their step: the chain shards are
    passed, held apart): each is fetched at the floor before step 1's shard of its layer, which comes as its twin, and
    step 2 follows the track; the re-rooted shard's KV is the twin's, decoded exactly as on a track never left."""
    model = setup[0]
    L = model.adapter.num_layers
    rep, edit, published, apart = _edit(setup, [2, 0, 0], prefetch_kv_bytes=0)
    assert not rep.fallbacks, rep.fallbacks
    assert edit.ctx.reroots  # the live lanes fetch chains: the policy may name them
    chains = [d for d in rep.result.decisions if str(d["reason"]).startswith(REROOT)]
    assert [d["layer"] for d in chains] == [0, 1]
    by, order = _fetched(rep)
    for layer in (0, 1):
        assert by[layer] == [FLOOR] and by[L + layer] == by[2 * L + layer] == [FLOOR + "+cl"]
        assert order.index(layer) < order.index(L + layer)  # the chain first
    assert set(apart) == {0, 1}  # passed by the compute lane: held apart as references only
    # the chain buffers are freed: the count is back to what is held, nothing apart
    assert not edit.held.chain_kv and edit.held.kv_bytes == edit.held.held_bytes()
    _, _, track_published, _ = _edit(setup, [0, 0, 0])  # never off the track
    for g in (L, L + 1, 2 * L):
        k, v, name = published[g]
        k0, v0, name0 = track_published[g]
        assert name == name0 == FLOOR + "+cl"
        assert (k - k0).abs().max().item() == 0.0 and (v - v0).abs().max().item() == 0.0  # the same arithmetic


def test_without_re_roots_the_layer_stays_off_its_track(setup, monkeypatch):
    monkeypatch.setattr(LiveState, "reroots", False)
    L = setup[0].adapter.num_layers
    rep, *_ = _edit(setup, [2, 0, 0])
    by, _ = _fetched(rep)
    assert not [d for d in rep.result.decisions if str(d["reason"]).startswith(REROOT)]
    assert by[L] == by[2 * L] == [OPEN] and 0 not in by


def test_a_corrupt_chain_shard_falls_back_to_the_open_loop_floor(setup):
    """Step 0 layer 0's floor blob is served misplaced (another layer's): the chain ends, the fallback says so, and
    step 1's shard of that layer comes as the open-loop floor (off its track, as any such shard); layer 1 is re-rooted
    as before; the edit completes."""
    pre = setup[3]
    L = setup[0].adapter.num_layers
    rungs, floor = _plan(setup)
    bad, good = rungs[0][floor].rep.digest, rungs[2][floor].rep.digest
    rep, edit, _, _ = _edit(setup, [2, 0, 0], swap={bad: good})
    assert any("re-root of" in f and "shard" in f and "open-loop floor" in f for f in rep.fallbacks), rep.fallbacks
    by, _ = _fetched(rep)
    assert by[L] == by[2 * L] == [OPEN]
    assert by[L + 1] == [FLOOR + "+cl"]
    assert not edit.held.chain_kv and edit.held.kv_bytes == edit.held.held_bytes()
    assert pre.blobs[bad] != pre.blobs[good]


def test_the_live_and_simulated_edits_name_the_same_chains(setup):
    """The same policy on the same fixed link: the simulator and the live lanes name the same chains, in the same
    order, at the same levels with the same reasons, and fetch every shard as the same level."""
    profile = setup[4]
    rungs, floor = _plan(setup)
    ladders = [[r.level for r in lad] for lad in rungs]
    pol = _Rerooting(floor, [2, 1, 0])
    sim = simulate(pol, Trace.constant(50.0), profile, {"sakura": ladders}, {"sakura": floor}, config=SimConfig())
    rep, *_ = _edit(setup, [2, 1, 0])

    def chains(decisions):
        return [(d["layer"], d["level"], d["reason"]) for d in decisions if str(d["reason"]).startswith(REROOT)]

    assert chains(sim.result.decisions) == chains(rep.result.decisions) != []
    assert _fetched(sim)[0] == _fetched(rep)[0]


def test_held_kv_serves_a_chain_shard_as_a_reference_until_dropped(setup):
    import torch

    pre = setup[3]
    rungs, floor = _plan(setup)
    from sakura_core.runtime.shard_index import ShardGrid

    L = pre.manifest["num_layers"]
    grid = ShardGrid.for_edit(L, STEPS, True)
    held = HeldKV(grid, [[r.level for r in lad] for lad in rungs])
    ref, shard = grid.at(0, 0), grid.at(1, 0)
    rep = rungs[shard.g][floor].rep
    k = torch.zeros(1, 8, 2, 4)
    held.release_before(L)  # the compute lane has passed step 0
    assert held.closed_twin(shard, rep) is None
    held.hold_chain(ref, k, k, rungs[ref.g][floor].rep.digest)
    assert held.closed_twin(shard, rep) is rep.closed_twin
    assert held.reference_for(shard, rep.closed_twin) is not None
    assert held.kv_bytes == held.held_bytes() == 2 * k.nbytes
    held.drop_chain(ref)
    assert held.kv_bytes == held.held_bytes() == 0 and held.closed_twin(shard, rep) is None

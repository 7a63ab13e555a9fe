"""The pipelined runtime and closed-loop twins: a level of a step >= 1 is fetched as its twin exactly when the device
holds the reference shard's representation on that level's track (HeldKV.closed_twin); after a level change, or for
a layer the device computed, the open-loop level (below the open-loop floor: that floor) serves — never a twin against
another reference."""

import pytest
import torch

from sakura_core.kv.chain import MissingReferenceError
from sakura_core.policy.plan import plan_fetch
from sakura_core.runtime.held_kv import HeldKV
from sakura_core.runtime.shard_index import ShardGrid

from .cross_step_edits import StepLevels, cross_step_setup, run_levels

STEPS = 3


@pytest.fixture(scope="module")
def setup():
    return cross_step_setup("tpl-cl", STEPS)


def _run(setup, policy, open_floor="sakura-l3", **config):
    """The edit with the floor on the twins' track and ``open_floor`` the open-loop floor (levels below it with a
    twin fetch ``open_floor`` off their track), whatever the random-weight template's PSNRs."""
    return run_levels(setup, policy, STEPS, open_floor=open_floor, **config)


def test_a_layer_kept_at_one_level_follows_its_track(setup):
    rep = _run(setup, StepLevels([1, 1, 1], [0, 0, 0]))
    assert not rep.fallbacks, rep.fallbacks
    by_step = rep.levels_by_step()
    assert set(by_step["step 0"]) == {"sakura-l1"}
    assert set(by_step["step 1"]) == set(by_step["step 2"]) == {"sakura-l1+cl"}


def test_a_level_change_leaves_the_track_for_the_open_loop_floor(setup):
    rep = _run(setup, StepLevels([1, 2, 2], [0, 0, 0]))
    assert not rep.fallbacks, rep.fallbacks
    by_step = rep.levels_by_step()
    # step 0 held at sakura-l1: no sakura-l2 track to follow, and open-loop sakura-l2 is below the open floor
    assert set(by_step["step 1"]) == {"sakura-l3"}
    assert set(by_step["step 2"]) == {"sakura-l3"}  # step 1 held open-loop: still off the track
    rep = _run(setup, StepLevels([1, 4, 4], [0, 0, 0]))  # above the open floor: that level itself
    assert set(rep.levels_by_step()["step 1"]) == {"sakura-l4"}


def test_a_layer_the_device_computed_takes_the_open_loop_level(setup):
    model = setup[0]
    rep = _run(setup, StepLevels([1, 1, 1], [2, 0, 0]), prefetch_kv_bytes=0)
    assert not rep.fallbacks, rep.fallbacks
    step1, step2 = rep.levels_by_step()["step 1"], rep.levels_by_step()["step 2"]
    assert step1[:2] == step2[:2] == ["sakura-l3", "sakura-l3"]  # off the track: the open-loop floor
    assert step1[2:] == step2[2:] == ["sakura-l1+cl"] * (model.adapter.num_layers - 2)


def test_held_kv_offers_a_twin_only_against_its_own_reference(setup):
    _, _, _, pre, _ = setup
    plan = plan_fetch(pre.manifest, "sakura")
    L = pre.manifest["num_layers"]
    grid = ShardGrid.for_edit(L, STEPS, True)
    held = HeldKV(grid, plan.ladders)
    names = [lv.name for lv in plan.ladders[L]]
    l1, l2 = names.index("sakura-l1"), names.index("sakura-l2")
    ref_shard, shard = grid.at(0, 2), grid.at(1, 2)
    rep1, kv = plan.rungs[shard.g][l1].rep, (torch.zeros(4), torch.zeros(4))
    twin = rep1.closed_twin
    assert plan.ladders[shard.g][l1].closed.name == "sakura-l1+cl" == twin.name
    assert held.closed_twin(shard, rep1) is None  # nothing held
    held.publish(ref_shard, *kv, l2, plan.rungs[ref_shard.g][l2].rep.digest, "sakura-l2")
    assert held.closed_twin(shard, rep1) is None  # another level held
    with pytest.raises(MissingReferenceError, match=r"closed-loop level sakura-l1\+cl .* holds another"):
        held.reference_for(shard, twin)
    held.reset()
    held.publish(ref_shard, *kv, l1, plan.rungs[ref_shard.g][l1].rep.digest, "sakura-l1")
    assert held.closed_twin(shard, rep1) is twin
    assert held.closed_twin(shard, plan.rungs[shard.g][l2].rep) is None  # the held level's track only
    held.reset()
    held.hold_device({ref_shard: kv})  # the device's own KV: exact, but not the representation the twin needs
    assert held.closed_twin(shard, rep1) is None
    with pytest.raises(MissingReferenceError, match="holds its own KV of it"):
        held.reference_for(shard, twin)

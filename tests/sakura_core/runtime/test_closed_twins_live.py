"""The pipelined runtime and closed-loop twins: a level of a step >= 1 is fetched as its twin exactly when the device
holds the reference shard's representation on that level's track (HeldKV.closed_twin); after a level change, or for
a layer the device computed, the open-loop level serves — never a twin against another reference."""

import asyncio
import dataclasses

import pytest
import torch

from sakura_core.fetch.traces import Trace
from sakura_core.kv.chain import MissingReferenceError
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.policy.ladder import with_track_floor
from sakura_core.policy.plan import plan_fetch
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy
from sakura_core.precompute import precompute_template
from sakura_core.runtime.held_kv import HeldKV
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import RuntimeConfig, run_pipelined_edit
from sakura_core.runtime.shard_index import ShardGrid

STEPS = 3


@pytest.fixture(scope="module")
def setup():
    model = load_demo_model(weights=None)
    size = model.spec.image_size
    tpl, usr = load_image("astronaut", size), load_image("chelsea", size)
    pre = precompute_template(model, tpl, "tpl-cl", held_out_probes=1, psnr_steps=1, kv_mode="per-step", steps=STEPS)
    L = model.adapter.num_layers
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=L, steps=STEPS)
    return model, tpl, usr, pre, profile


class _StepLevels(Policy):
    """Fetch step s's shards at ladder index ``levels[s]``; the device computes layers < ``splits[s]``."""

    family = "sakura"

    def __init__(self, levels, splits):
        self.levels, self.splits = levels, splits

    def choose(self, ctx, g):
        if ctx.layer_of(g) < self.splits[ctx.step_of(g)]:
            return Decision(LEVEL_COMPUTE, "the device computes it")
        return Decision(self.levels[ctx.step_of(g)], "fixed level")

    def keep_template(self, ctx, g):
        return ctx.layer_of(g) < self.splits[ctx.step_of(g)]


def _run(setup, policy, open_floor="sakura-l3", **config):
    """The edit with the floor on the twins' track and ``open_floor`` the open-loop floor (levels below it with a
    twin fetch ``open_floor`` off their track), whatever the random-weight template's PSNRs."""
    model, tpl, usr, pre, profile = setup
    plan = plan_fetch(pre.manifest, "sakura")
    plan = dataclasses.replace(plan, ladders=with_track_floor(plan.ladders, open_floor))

    async def fetch_blob(digest, nbytes):
        return pre.blobs[digest]

    return asyncio.run(
        run_pipelined_edit(model, pre.manifest, fetch_blob, usr, "p", policy=policy, ladders=plan.ladders,
                           reps=plan.reps, floor=plan.floor, profile=profile, template_image=tpl,
                           trace=Trace.constant(50.0), config=RuntimeConfig(steps=STEPS, upgrades=False, **config))
    )  # fmt: skip


def test_a_layer_kept_at_one_level_follows_its_track(setup):
    rep = _run(setup, _StepLevels([1, 1, 1], [0, 0, 0]))
    assert not rep.fallbacks, rep.fallbacks
    by_step = rep.levels_by_step()
    assert set(by_step["step 0"]) == {"sakura-l1"}
    assert set(by_step["step 1"]) == set(by_step["step 2"]) == {"sakura-l1+cl"}


def test_a_level_change_leaves_the_track_for_the_open_loop_floor(setup):
    rep = _run(setup, _StepLevels([1, 2, 2], [0, 0, 0]))
    assert not rep.fallbacks, rep.fallbacks
    by_step = rep.levels_by_step()
    # step 0 held at sakura-l1: no sakura-l2 track to follow, and open-loop sakura-l2 is below the open floor
    assert set(by_step["step 1"]) == {"sakura-l3"}
    assert set(by_step["step 2"]) == {"sakura-l3"}  # step 1 held open-loop: still off the track
    rep = _run(setup, _StepLevels([1, 4, 4], [0, 0, 0]))  # above the open floor: that level itself
    assert set(rep.levels_by_step()["step 1"]) == {"sakura-l4"}


def test_a_layer_the_device_computed_takes_the_open_loop_level(setup):
    model = setup[0]
    rep = _run(setup, _StepLevels([1, 1, 1], [2, 0, 0]), prefetch_kv_bytes=0)
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
    rep1, kv = plan.reps[shard.g][l1], (torch.zeros(4), torch.zeros(4))
    twin = rep1["closed_twin"]
    assert plan.ladders[shard.g][l1].closed.name == "sakura-l1+cl" == twin["name"]
    assert held.closed_twin(shard, rep1) is None  # nothing held
    held.publish(ref_shard, *kv, l2, plan.reps[ref_shard.g][l2]["digest"], "sakura-l2")
    assert held.closed_twin(shard, rep1) is None  # another level held
    with pytest.raises(MissingReferenceError, match=r"closed-loop level sakura-l1\+cl .* holds another"):
        held.reference_for(shard, twin)
    held.reset()
    held.publish(ref_shard, *kv, l1, plan.reps[ref_shard.g][l1]["digest"], "sakura-l1")
    assert held.closed_twin(shard, rep1) is twin
    assert held.closed_twin(shard, plan.reps[shard.g][l2]) is None  # the held level's track only
    held.reset()
    held.hold_device({ref_shard: kv})  # the device's own KV: exact, but not the representation the twin needs
    assert held.closed_twin(shard, rep1) is None
    with pytest.raises(MissingReferenceError, match="holds its own KV of it"):
        held.reference_for(shard, twin)

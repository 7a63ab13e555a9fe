"""The pipelined runtime on a cross-step per-step template: step s's residual shards decode against step s-1's KV as
the device holds it; a residual whose reference the device lacks, and a shard served in another step's slot, fall
back to the device and the report says so."""

import asyncio
import copy
import types
from collections import Counter

import pytest
import torch
from typed_manifests import unchecked_manifest

from sakura_core.fetch.traces import Trace
from sakura_core.kv import decode_template
from sakura_core.kv.chain import MissingReferenceError
from sakura_core.kv.manifest import parse_manifest
from sakura_core.policy.plan import FetchPlan, plan_fetch
from sakura_core.precompute import precompute_template
from sakura_core.runtime.decode_lane import DecodeLane
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.held_kv import HeldKV
from sakura_core.runtime.lane_parts import EditInputs
from sakura_core.runtime.pipeline import LiveSettings, PipelinedEdit, RuntimeConfig, run_pipelined_edit
from sakura_core.runtime.run_log import RunLog
from sakura_core.runtime.shard_index import ShardGrid

from .cross_step_edits import StepLevels, cross_step_setup, run_levels

STEPS = 2


@pytest.fixture(scope="module")
def setup():
    return cross_step_setup("tpl-xs", STEPS)


@pytest.fixture(scope="module")
def progressive_setup(setup):
    """The same template with progressive residual chains (``PROGRESSIVE_RESIDUALS`` on; shipped off: one direct
    blob per residual level, never upgraded): the case where an upgrade extends a residual's chain."""
    from sakura_core.precompute import cross_step

    model, tpl, usr, _, profile = setup
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cross_step, "PROGRESSIVE_RESIDUALS", True)
        pre = precompute_template(
            model, tpl, "tpl-xp", held_out_probes=1, psnr_steps=1, kv_mode="per-step", steps=STEPS
        )
    return model, tpl, usr, pre, profile


def _run(setup, policy, swap=None, open_floor=None, chunks=False, **config):
    return run_levels(setup, policy, STEPS, swap, open_floor, chunks, **config)


def _rep(pre, step, layer, name):
    sh = next(s for s in pre.manifest["shards"] if s["step"] == step and s["layers"][0] == layer)
    return next(r for r in sh["representations"] if r["name"] == name)


def test_the_manifest_states_each_residuals_reference_and_a_zero_byte_reuse_rung(setup):
    _, _, _, pre, _ = setup
    assert pre.manifest["per_step_coding"] == "cross-step"
    res, reuse, exact0 = _rep(pre, 1, 2, "sakura-l1"), _rep(pre, 1, 2, "reuse"), _rep(pre, 0, 2, "fp16")
    assert res["ref"] == {"mode": "residual", "step": 0, "digest": exact0["digest"]}
    assert reuse["bytes"] == 0 and reuse["digest"] is None and reuse["ref"]["step"] == 0 and "psnr_db" in reuse
    assert "ref" not in _rep(pre, 0, 2, "sakura-l1") and "ref" not in _rep(pre, 1, 2, "fp16")


def test_residual_levels_decode_against_the_previous_steps_kv(setup):
    model, tpl, usr, pre, _ = setup
    rep = _run(setup, StepLevels(1, [0] * STEPS), open_floor="sakura-l3")
    assert not rep.fallbacks, rep.fallbacks
    # every layer kept at one level: each later step is fetched as the level's closed-loop twin, decoded against
    # the step before it as the device holds it (step 0's level, then the twins)
    L = model.adapter.num_layers
    assert {tuple(v) for g, v in rep.levels_used.items() if g >= L} == {("sakura-l1+cl",)}
    kv = decode_template(pre.manifest, pre.blobs, "sakura-l1+cl")
    expected = run_edit(model, usr, "p", steps=STEPS, kv_source=kv, kv_mode="per-step")
    assert (rep.tokens - expected.tokens).abs().max() <= 1e-5


def test_the_devices_own_kv_of_a_layer_serves_as_the_next_steps_reference(setup):
    model, tpl, usr, pre, _ = setup
    # step 0 computes layers 0-1 on the device: their KV (kept at the end of step 0) is the reference. Nothing is
    # prefetched here (a shard of step 1 fetched while step 0 still computes waits for its reference:
    # test_a_residual_fetched_before_the_device_made_its_reference_waits_for_it)
    rep = _run(setup, StepLevels(1, [2, 0]), prefetch_kv_bytes=0)
    assert not rep.fallbacks, rep.fallbacks
    # one fetch per shard: a shard the fetch lane chose (waiting for room while step 0 computes) is not asked for a
    # second time by the compute lane (a second fetch raced the first to its decoder and reference, and lost)
    decodes = Counter(e["layer"] for e in rep.result.events if e["lane"] == "decode")
    assert set(decodes.values()) == {1}, decodes
    step1 = rep.levels_by_step()["step 1"]  # residual levels everywhere (a late shard may come at the floor)
    assert len(step1) == model.adapter.num_layers and all(n.startswith("sakura-l") for n in step1), step1
    on_device = run_edit(
        model,
        usr,
        "p",
        steps=STEPS,
        split_layer=model.adapter.num_layers,
        template_image=tpl,
        template_every_step=True,
        kv_mode="per-step",
    )
    assert (rep.tokens - on_device.tokens).abs().max() < 0.5  # a lossy level, but never a residual used as KV


@pytest.mark.parametrize("ahead", [False, True], ids=["one-request-at-a-time", "requests-ahead"])
def test_a_residual_fetched_before_the_device_made_its_reference_waits_for_it(setup, ahead):
    """Step 0 computes layers 0-1 on the device and its KV of them is kept at the end of step 0; with no bound on the
    prefetch, step 1's residuals of those layers arrive while step 0 still computes: their decode waits for the
    device's reference (as the simulator's does), they are not fetched again at their exact level; and the link
    goes on meanwhile (the other shards are not held up)."""
    model, *_ = setup
    L = model.adapter.num_layers
    for attempt in range(3):  # the timing checks below are ms apart at this ~25 ms edit: a held link fails every run
        rep = _run(setup, StepLevels(1, [2, 0]), chunks=ahead, request_ahead=ahead)
        assert not rep.fallbacks, rep.fallbacks
        timing = _residual_wait_timing(rep, L)
        if timing is None or attempt == 2:
            break
    assert timing is None, timing
    decodes = Counter(e["layer"] for e in rep.result.events if e["lane"] == "decode")
    assert set(decodes.values()) == {1}, decodes  # one fetch and decode per shard: no exact refetch
    step1 = rep.levels_by_step()["step 1"]
    assert len(step1) == L and all(n.startswith("sakura-l") for n in step1), step1


def _residual_wait_timing(rep, L: int) -> tuple | None:
    """None when a residual came before its reference, was decoded only once the reference was made, and the link
    went on meanwhile (every shard's fetch started before the reference was made); else what was seen."""
    # step 0's KV is handed over once its last layer has run: after that layer's compute started
    last = next(e["start"] for e in rep.result.events if e["lane"] == "compute" and e["layer"] == L - 1)
    fetched = {e["layer"]: e["end"] for e in rep.result.events if e["lane"] == "fetch"}
    early = [g for g in (L, L + 1) if fetched[g] < last]
    if not early:  # the case under test: a residual came before its reference was made
        return ("no early residual", fetched, last)
    decoded = {e["layer"]: e["start"] for e in rep.result.events if e["lane"] == "decode"}
    assert all(decoded[g] >= last for g in early), (decoded, last)  # never decoded before its reference (any run)
    started = {}
    for e in rep.result.events:
        if e["lane"] == "fetch":
            started[e["layer"]] = min(started.get(e["layer"], e["start"]), e["start"])
    return None if max(started.values()) < last else ("a fetch started after the reference", started, last)


def test_a_residual_without_its_reference_is_not_decoded(setup):
    model, tpl, usr, pre, profile = setup
    plan = plan_fetch(pre.manifest, "sakura")

    async def fetch_blob(digest, nbytes):
        return pre.blobs[digest]

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(StepLevels(1, [0, 0]), plan.rungs, plan.floor),
        profile,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
    )
    L = model.adapter.num_layers
    residual = plan.rungs[L + 2][1].rep
    with pytest.raises(MissingReferenceError, match="coded against step 0 layer 2, which the device does not hold"):
        edit.held.reference_for(edit.grid[L + 2], residual)  # nothing decoded yet: it would not be fetched
    assert edit.held.reference_for(edit.grid[L + 2], plan.rungs[L + 2][-1].rep) is None  # the exact level needs none


def test_a_residual_whose_manifest_names_another_reference_falls_back_and_the_report_says_so(setup):
    model, tpl, usr, pre, profile = setup
    L = model.adapter.num_layers
    manifest = copy.deepcopy(pre.manifest)
    sh = next(s for s in manifest["shards"] if s["step"] == 1 and s["layers"][0] == 2)
    for r in sh["representations"]:
        if (r.get("ref") or {}).get("mode") == "residual":
            r["ref"]["digest"] = _rep(pre, 0, 3, "fp16")["digest"]  # layer 3's: a mixed-up manifest
        if (r.get("ref") or {}).get("mode") == "closed":  # its twins' too (else a twin serves: see below)
            r["ref"]["digest"] = _rep(pre, 0, 3, r["name"].removesuffix("+cl"))["digest"]
    manifest = unchecked_manifest(manifest)  # (the parse refuses it: mixed up past the parse, the lanes must too)
    plan = plan_fetch(manifest, "sakura")

    async def fetch_blob(digest, nbytes):
        return pre.blobs[digest]

    rep = asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            manifest,
            fetch_blob,
            FetchPlan(StepLevels(1, [0, 0]), plan.rungs, plan.floor),
            profile,
            trace=Trace.constant(50.0),
            config=RuntimeConfig(upgrades=False, live=LiveSettings(steps=STEPS)),
        )
    )
    refused = [f for f in rep.fallbacks if f.startswith(f"shard {L + 2}")]
    assert refused and all("reference" in f for f in refused[:-1]), rep.fallbacks
    assert rep.levels_by_step()["step 1"][2] == "device" and len(refused) == len(rep.fallbacks)


def test_a_shard_served_in_another_steps_slot_is_refused(setup):
    model, *_ = setup
    pre = setup[3]
    L = model.adapter.num_layers
    step1, step0 = _rep(pre, 1, 3, "fp16")["digest"], _rep(pre, 0, 3, "fp16")["digest"]
    rep = _run(setup, StepLevels(len(plan_fetch(pre.manifest, "sakura").ladders[0]) - 1, [0] * STEPS), {step1: step0})
    (refused,) = rep.fallbacks  # the misplaced blob is refused, the floor level of the right slot taken instead
    assert refused.startswith(f"shard {L + 3} level fp16:") and "step 0 (expected 1)" in refused
    assert rep.levels_by_step()["step 1"][3] == plan_fetch(pre.manifest, "sakura").floor_name


def test_an_upgrade_of_a_residual_keeps_its_reference_once_the_device_has_freed_it(progressive_setup):
    # step 1 layer 0 decoded at sakura-l0 against step 0 layer 0; the device then frees that reference (the shard is
    # decoded: no dependent left) and the idle link upgrades the shard to sakura-l1: decoded on the decoder's own
    # reference, equal to sakura-l1 decoded from nothing (a live run's upgrade failed here with "does not hold")
    _, _, _, pre, _ = progressive_setup
    plan = plan_fetch(pre.manifest, "sakura")
    L = pre.manifest["num_layers"]
    grid = ShardGrid.for_edit(L, STEPS, True)
    held, st = HeldKV(grid, plan.ladders), types.SimpleNamespace(now=0.0)
    lane = DecodeLane(parse_manifest(pre.manifest), plan.rungs, st, RunLog(), threads=1)
    names = [lv.name for lv in plan.ladders[L]]
    l0, l1, exact = names.index("sakura-l0"), names.index("sakura-l1"), len(names) - 1
    ref_shard, shard = grid.at(0, 0), grid.at(1, 0)
    exact_rep = plan.rungs[ref_shard.g][exact].rep
    k, v = lane.decode_now(ref_shard, exact, [exact_rep.digest], [pre.blobs[exact_rep.digest]])
    held.publish(ref_shard, k[0], v[0], exact)
    held.set_ready(ref_shard)

    def chain(level):
        rep = plan.rungs[shard.g][level].rep
        return rep.chain_digests, rep

    d0, rep0 = chain(l0)
    lane.decode_now(shard, l0, d0, [pre.blobs[d] for d in d0], reference=held.reference_for(shard, rep0))
    d1, rep1 = chain(l1)
    want = DecodeLane(parse_manifest(pre.manifest), plan.rungs, st, RunLog(), threads=1).decode_now(
        shard, l1, d1, [pre.blobs[d] for d in d1], reference=held.reference_for(shard, rep1)
    )
    held.set_ready(shard)
    held.release_before(shard.g)  # the reference's only dependent is decoded: freed
    with pytest.raises(MissingReferenceError):
        held.reference_for(shard, rep1)
    start = lane.decoded_prefix(shard, d1)
    assert start == len(d0)
    k1, v1 = lane.decode_now(shard, l1, d1, [pre.blobs[d] for d in d1[start:]], start, reference=None)
    assert torch.equal(k1, want[0]) and torch.equal(v1, want[1])

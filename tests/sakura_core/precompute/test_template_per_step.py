"""precompute_template in ``per-step`` KV mode: manifest (kv_mode, schedule, shards keyed by (step, layers)),
exact fp16 shards per step, the schedule check, and manifests without ``kv_mode`` read as single."""

import copy
import json

import pytest
import torch

from sakura_core.kv import (
    ManifestError,
    ScheduleMismatchError,
    check_schedule,
    decode_kv,
    decode_template,
    level_chains,
    manifest_kv_mode,
    shards_for_step,
    validate_manifest,
)
from sakura_core.models.kv_types import KVMismatchError, PerStepTemplateKV
from sakura_core.precompute import ProbeConfig, precompute_template
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.schedule import flow_timesteps

STEPS, SHIFT = 3, 2.0


@pytest.fixture(scope="module")
def per_step(demo_model, demo_template):
    return precompute_template(
        demo_model,
        demo_template,
        "astro-ps",
        codec="int8",
        shard_layers=2,
        probes=ProbeConfig(num_probes=2),
        held_out_probes=1,
        psnr_steps=1,
        kv_mode="per-step",
        steps=STEPS,
        shift=SHIFT,
    )


@pytest.fixture(scope="module")
def exact(demo_model, demo_template):
    ref = demo_model.template_tokens(demo_template)
    return demo_model.adapter.extract_per_step_kv(ref, demo_model.spec.grid, flow_timesteps(STEPS, SHIFT)[:-1])


def test_manifest_names_mode_schedule_and_step_keyed_shards(per_step, demo_model):
    m = per_step.manifest
    validate_manifest(m)
    assert json.loads(json.dumps(m)) == m and manifest_kv_mode(m) == "per-step"
    sched = m["schedule"]
    assert sched["steps"] == STEPS and sched["shift"] == SHIFT and sched["guidance"] is None
    assert sched["timesteps"] == pytest.approx(flow_timesteps(STEPS, SHIFT)[:-1].tolist())
    layers = [[0, 1], [2, 3], [4, 5]]
    assert [(s["step"], s["layers"]) for s in m["shards"]] == [(st, ly) for st in range(STEPS) for ly in layers]
    assert [s["layers"] for s in shards_for_step(m, 2)] == layers
    assert all(s["step"] == 2 for s in shards_for_step(m, 2))
    with pytest.raises(IndexError, match="steps 0..2"):
        shards_for_step(m, 3)


def test_fp16_shards_of_every_step_are_that_steps_exact_kv(per_step, exact, demo_model):
    m = per_step.manifest
    for s in range(STEPS):
        decoded = decode_kv(level_chains(shards_for_step(m, s), per_step.blobs, "fp16"))
        assert torch.equal(decoded, exact.kv[s].half()), s
    # and the steps really differ: shards are not shared across steps
    step0 = {r["digest"] for sh in shards_for_step(m, 0) for r in sh["representations"]}
    step1 = {r["digest"] for sh in shards_for_step(m, 1) for r in sh["representations"]}
    assert not step0 & step1


def test_edit_from_fetched_fp16_per_step_kv_matches_on_device(per_step, exact, demo_model, demo_template):
    """The phone path in per-step mode: fp16 shards of each step injected == template computed at every step."""
    m = per_step.manifest
    fetched = torch.stack(
        [decode_kv(level_chains(shards_for_step(m, s), per_step.blobs, "fp16")).float() for s in range(STEPS)]
    )
    kv = decode_template(m, per_step.blobs, "fp16")  # the manifest's mode and schedule, decoded
    assert isinstance(kv, PerStepTemplateKV) and torch.equal(kv.kv, fetched) and kv.timesteps == exact.timesteps
    single = _single_manifest(per_step)
    assert torch.equal(decode_template(single, per_step.blobs, "fp16").kv, fetched[0])  # reads as single
    user = demo_template[::-1].copy()
    run = dict(steps=STEPS, shift=SHIFT, seed=1, kv_mode="per-step")
    on_device = run_edit(demo_model, user, "a photo", split_layer=6, template_image=demo_template, **run).tokens
    from_exact = run_edit(demo_model, user, "a photo", kv_source=exact, **run).tokens
    from_fp16 = run_edit(demo_model, user, "a photo", kv_source=kv, **run).tokens
    hybrid = run_edit(
        demo_model, user, "a photo", split_layer=3, template_image=demo_template, kv_source=exact, **run
    ).tokens
    assert (from_exact - on_device).abs().max() <= 1e-5
    assert (hybrid - on_device).abs().max() <= 1e-5
    assert (from_fp16 - on_device).abs().max() <= 1e-2  # fp16 storage only
    single_kv = demo_model.adapter.extract_template_kv(demo_model.template_tokens(demo_template), demo_model.spec.grid)
    single_mode = run_edit(demo_model, user, "a photo", steps=STEPS, shift=SHIFT, seed=1, kv_source=single_kv)
    assert (single_mode.tokens - on_device).abs().max() > 1e-3  # the modes are different computations
    with pytest.raises(KVMismatchError, match="t=1 .*t=0"):  # step 0's KV in a single-mode edit is refused
        run_edit(demo_model, user, "a photo", steps=STEPS, shift=SHIFT, kv_source=exact.at_step(0))


def test_schedule_check_refuses_another_schedule_naming_both(per_step, exact, demo_model):
    m = per_step.manifest
    times = flow_timesteps(STEPS, SHIFT)[:-1].tolist()
    check_schedule(m, STEPS, SHIFT, times)
    step_count = r"precomputed for 3 steps \(shift 2.*asks 4 — set steps to 3 .*--steps 4"
    with pytest.raises(ScheduleMismatchError, match=step_count):
        check_schedule(m, 4, SHIFT)
    with pytest.raises(ScheduleMismatchError, match=r"shift 2.*shift 1"):
        check_schedule(m, STEPS, 1.0)
    with pytest.raises(ScheduleMismatchError, match="t="):
        check_schedule(m, STEPS, SHIFT, [1.0, 0.5, 0.1])
    check_schedule(_single_manifest(per_step), 50, 7.0)  # single-mode KV fits any schedule
    with pytest.raises(Exception, match="4 steps"):  # the edit refuses per-step KV of another schedule
        run_edit(
            demo_model,
            demo_model.unpack_tokens(torch.zeros(1, 256, 48)),
            "x",
            steps=4,
            kv_source=exact,
            kv_mode="per-step",
        )


def _single_manifest(per_step):
    """Step 0's shards as a single-mode manifest (no kv_mode-specific fields)."""
    m = copy.deepcopy(per_step.manifest)
    step0 = shards_for_step(m, 0)
    m.pop("schedule")
    m["kv_mode"] = "single"
    m["shards"] = [{k: v for k, v in sh.items() if k != "step"} for sh in step0]
    return m


def test_manifest_without_kv_mode_reads_as_single(per_step):
    m = _single_manifest(per_step)
    validate_manifest(m)
    del m["kv_mode"]
    validate_manifest(m)
    assert manifest_kv_mode(m) == "single" and len(shards_for_step(m, 7)) == 3


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda m: m.update(kv_mode="both"), "kv_mode"),
        (lambda m: m.pop("schedule"), "schedule"),
        (lambda m: m["schedule"].update(steps=0), "schedule.steps"),
        (lambda m: m["schedule"].update(timesteps=[0.1, 0.5, 0.9]), "schedule.timesteps"),
        (lambda m: m["schedule"].update(shift=0), "schedule.shift"),
        (lambda m: m["schedule"].update(guidance="high"), "schedule.guidance"),
        (lambda m: m["shards"][4].pop("step"), r"shards\[4\].step"),
        (lambda m: m["shards"][8].update(step=5), "step-major"),
        (lambda m: m["shards"].reverse(), "step-major"),
        (lambda m: m["shards"].pop(4), "shards of step 1"),
        (lambda m: m.update(shards=m["shards"][:6]), "no shard for step 2"),
    ],
)
def test_validate_per_step_manifest_names_the_bad_field(per_step, mutate, field):
    m = copy.deepcopy(per_step.manifest)
    mutate(m)
    with pytest.raises(ManifestError, match=field):
        validate_manifest(m)


def test_single_manifest_rejects_steps_and_schedules(per_step):
    m = _single_manifest(per_step)
    m["shards"][1]["step"] = 0
    with pytest.raises(ManifestError, match=r"shards\[1\].step.*single"):
        validate_manifest(m)
    m = _single_manifest(per_step)
    m["schedule"] = per_step.manifest["schedule"]
    with pytest.raises(ManifestError, match="only for kv_mode 'per-step'"):
        validate_manifest(m)


def test_a_template_four_times_the_edit_is_precomputed_and_exact(demo_model):
    """A 128 px template for the 64 px demo edit: 1024 template tokens vs 256 request tokens (4x), per-step."""
    from sakura_core.models.edit_model import load_image

    big = load_image("astronaut", 128)
    result = precompute_template(
        demo_model,
        big,
        "astro-128",
        codec="int8",
        shard_layers=3,
        probes=ProbeConfig(num_probes=1),
        held_out_probes=1,
        psnr_steps=0,
        kv_mode="per-step",
        steps=2,
    )
    m = result.manifest
    validate_manifest(m)
    assert m["token_grid"] == [32, 32] and 32 * 32 >= 2.5 * demo_model.spec.num_tokens
    fetched = torch.stack(
        [decode_kv(level_chains(shards_for_step(m, s), result.blobs, "fp16")).float() for s in range(2)]
    )
    times = tuple(m["schedule"]["timesteps"])
    kv = PerStepTemplateKV(fetched, m["model_id"], (32, 32), m["rope_layout"], times)
    user = load_image("coffee", 64)
    run = dict(steps=2, seed=4, kv_mode="per-step")
    on_device = run_edit(demo_model, user, "a photo", split_layer=6, template_image=big, **run).tokens
    hybrid = run_edit(demo_model, user, "a photo", split_layer=2, template_image=big, kv_source=kv, **run).tokens
    fetched_only = run_edit(demo_model, user, "a photo", kv_source=kv, **run).tokens
    assert (hybrid - on_device).abs().max() <= 1e-2 and (fetched_only - on_device).abs().max() <= 1e-2  # fp16 KV
    small = run_edit(demo_model, user, "a photo", split_layer=6, template_image=load_image("astronaut", 64), **run)
    assert (small.tokens - on_device).abs().max() > 1e-2  # the larger template is really used

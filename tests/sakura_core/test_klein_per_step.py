"""A per-step template of the tiny klein folder through the one edit entry (``run_template_edit``): the folder model's
own schedule (``runtime.schedule.edit_times``: the pipeline's shifted sigmas, not ``flow_timesteps``) is the one the
KV is precomputed for, checked against and run at, so the edit runs (it was refused before) and its fetched fp16 KV
gives the edit with the stored KV bit for bit; another step count is refused with the fix."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sakura_core import edit
from sakura_core.kv import ScheduleMismatchError, decode_template
from sakura_core.kv.manifest import blob_digests
from sakura_core.runtime.live_profile import LiveProfile

TID = "klein-ps"
STEPS = 2
PROMPT = "swap the face"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def published(tmp_path_factory, klein_folder):
    from cloud_server.store import LocalStore
    from sakura_core.cli import main

    root = tmp_path_factory.mktemp("klein-ps-store")
    rc = main(
        [
            "precompute",
            "--store-profile",
            "full",
            "--store",
            str(root),
            "--model",
            str(klein_folder),
            "--image",
            "astronaut",
            "--id",
            TID,
            "--kv-mode",
            "per-step",
            "--steps",
            str(STEPS),
        ]
    )
    assert rc == 0
    return root, LocalStore(root)


def _blobs(store, manifest) -> dict[str, bytes]:
    out = {}
    for digest in blob_digests(manifest):  # a cross-step template's reuse rung has no blob
        f, _ = store.open_shard(digest)
        with f:
            out[digest] = f.read()
    return out


def _edit(model, root, steps: int, policy: str):
    from sakura_core.fetch.sources import StoreSource

    opened = asyncio.run(edit.open_template(StoreSource(str(root)), TID, model))
    user = np.asarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3)), np.uint8)
    settings = edit.EditSettings(PROMPT, steps=steps, seed=4, fetch=edit.FetchSettings(policy, "fixed:50"))
    profile = LiveProfile(0.01, 0.005, model.adapter.num_layers, steps)
    return (
        opened,
        user,
        asyncio.run(edit.run_template_edit(model, opened, user, settings, profile=profile)),
    )


def test_the_manifest_holds_the_models_own_schedule_not_the_flow_one(published, klein_model):
    from sakura_core.runtime.schedule import edit_times, flow_timesteps

    _, store = published
    times = store.get_manifest(TID)["schedule"]["timesteps"]
    assert times == pytest.approx([float(t) for t in edit_times(klein_model, STEPS)[:-1]])
    assert abs(times[0] - float(flow_timesteps(STEPS)[0])) > 1e-3  # what the checks compared it with before


def test_fetched_per_step_kv_edits_as_the_stored_kv(published, klein_model):
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.denoise import run_edit

    root, store = published
    _, user, outcome = _edit(klein_model, root, STEPS, "fetch-fp16")
    report = outcome.report
    assert report["kv_mode"] == "per-step" and not report["fallbacks"] and report["bytes_fetched"] > 0
    assert report["split_layers"] == [0] * STEPS  # every step's every layer from fetched KV
    manifest = store.get_manifest(TID)
    kv = decode_template(manifest, _blobs(store, manifest), "fp16")
    size = klein_model.spec.image_size
    stored = run_edit(
        klein_model, load_image(user, size), PROMPT, steps=STEPS, seed=4, kv_source=kv, kv_mode="per-step"
    )
    np.testing.assert_array_equal(outcome.image, stored.image)


def test_on_device_policy_runs_the_template_at_the_models_times(published, klein_model):
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.denoise import run_edit

    root, _ = published
    opened, user, outcome = _edit(klein_model, root, STEPS, "on-device")
    size, L = klein_model.spec.image_size, klein_model.adapter.num_layers
    ref = run_edit(
        klein_model,
        load_image(user, size),
        PROMPT,
        steps=STEPS,
        seed=4,
        split_layer=L,
        template_image=opened.template_image(size),
        template_every_step=True,
        kv_mode="per-step",
    )
    assert outcome.report["bytes_fetched"] == 0
    assert float((outcome.run.tokens - ref.tokens).abs().max()) == 0.0


def test_another_step_count_is_refused_with_the_fix(published, klein_model):
    root, _ = published
    with pytest.raises(ScheduleMismatchError, match=f"precomputed for {STEPS} steps .*asks 3 — set steps to {STEPS}"):
        _edit(klein_model, root, 3, "fetch-fp16")

"""The phone path in per-step KV mode: a job against a per-step template gives the image of the on-device edit with
that template's KV (exactly, at the fp16 level), for the demo model and for the tiny klein folder (whose own schedule
the KV is computed for and checked against), and a step count the template was not computed for is refused with the
fix."""

from __future__ import annotations

import numpy as np
import pytest

from android_bridge.agent import AgentConfig, create_app
from android_bridge.client import PhoneClient, PhoneError, PhoneJob
from sakura_core.kv import decode_template
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.live_profile import LiveProfile

from .conftest import PHONE_TOKEN, PROMPT, RecordingCloud

pytestmark = pytest.mark.slow

STEPS = 2
TEMPLATE = "tpl-astro-ps"


@pytest.fixture(scope="module")
def per_step_cloud(tmp_path_factory, demo_model):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_image

    store = LocalStore(tmp_path_factory.mktemp("per-step-store"))
    tpl = load_image("astronaut", demo_model.spec.image_size)
    published = publish_template(
        store, demo_model, tpl, TEMPLATE, kv_mode="per-step", steps=STEPS, store_profile="full"
    )
    with RecordingCloud(store) as cloud:
        yield cloud, store, published.manifest, tpl


def _blobs(store, manifest):
    out = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep["digest"] is None:  # the zero-byte reuse rung of a cross-step template: no blob
                continue
            f, _ = store.open_shard(rep["digest"])
            with f:
                out[rep["digest"]] = f.read()
    return out


async def _job(
    aiohttp_server, model, cloud_url, user_image, steps, policy="fetch-fp16", template=TEMPLATE, layer_s=(0.01, 0.005)
):
    profile = LiveProfile(*layer_s, model.adapter.num_layers, steps)
    server = await aiohttp_server(
        create_app(AgentConfig(token=PHONE_TOKEN, port=0), model=model, live_profile=profile)
    )
    client = PhoneClient.connect(str(server.make_url("")).rstrip("/"), PHONE_TOKEN, check=False)
    try:
        job = PhoneJob(
            cloud_url=cloud_url,
            template_id=template,
            prompt=PROMPT,
            steps=steps,
            seed=0,
            policy=policy,
            bandwidth="fixed:100",
        )
        return await client.arun_job(user_image, job)
    finally:
        client.close()


async def test_phone_run_per_step_equals_the_on_device_edit(aiohttp_server, per_step_cloud, demo_model, user_image):
    cloud, store, manifest, tpl = per_step_cloud
    image, report = await _job(aiohttp_server, demo_model, cloud.url, user_image, STEPS)
    assert report["kv_mode"] == "per-step" and report["template"]["schedule"] == f"{STEPS} steps, shift 1"
    assert report["split_layers"] == [0] * STEPS and not report["fallbacks"]
    kv = decode_template(manifest, _blobs(store, manifest), "fp16")
    stored = run_edit(demo_model, user_image, PROMPT, steps=STEPS, kv_source=kv, kv_mode="per-step")
    np.testing.assert_array_equal(image, stored.image)  # the on-device edit with the stored fp16 KV, bit for bit
    L = demo_model.adapter.num_layers
    on_device = run_edit(
        demo_model,
        user_image,
        PROMPT,
        steps=STEPS,
        split_layer=L,
        template_image=tpl,
        template_every_step=True,
        kv_mode="per-step",
    )
    assert np.abs(image.astype(int) - on_device.image.astype(int)).max() <= 2  # fp16 storage of the KV only


async def test_phone_run_at_a_lossy_cross_step_level_is_within_its_measured_psnr(
    aiohttp_server, per_step_cloud, demo_model, user_image
):
    from sakura_core.metrics import psnr_from_mse

    cloud, store, manifest, tpl = per_step_cloud
    assert manifest["per_step_coding"] == "cross-step"
    # a phone-slow device (1 s a layer, as the policy is told): fetching the cross-step levels beats computing even at
    # the estimator's cautious prior (the demo's shards are below its sample size, so it never leaves the prior)
    image, report = await _job(
        aiohttp_server, demo_model, cloud.url, user_image, STEPS, policy="sakura", layer_s=(1.0, 0.5)
    )
    assert not report["fallbacks"], report["fallbacks"]
    used = {n for names in report["levels_used"].values() for n in names} - {"template", "device"}
    assert used and used != {"fp16"}, used  # a lossy level, residual for step 1
    psnr = {r["name"]: r["psnr_db"] for sh in manifest["shards"] for r in sh["representations"]}
    on_device = run_edit(
        demo_model,
        user_image,
        PROMPT,
        steps=STEPS,
        split_layer=demo_model.adapter.num_layers,
        template_image=tpl,
        template_every_step=True,
        kv_mode="per-step",
    )
    err = ((image.astype(float) - on_device.image.astype(float)) / 127.5) ** 2
    assert psnr_from_mse(float(err.mean())) >= min(psnr[n] for n in used) - 3.0  # another edit than the manifest's


async def test_a_step_count_the_template_was_not_computed_for_is_refused(
    aiohttp_server, per_step_cloud, demo_model, user_image
):
    cloud, *_ = per_step_cloud
    with pytest.raises(PhoneError, match=f"precomputed for {STEPS} steps.*asks 3.*set steps to {STEPS}"):
        await _job(aiohttp_server, demo_model, cloud.url, user_image, 3)


@pytest.fixture(scope="module")
def klein_cloud(tmp_path_factory, klein_model):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_image

    store = LocalStore(tmp_path_factory.mktemp("klein-per-step-store"))
    tpl = load_image("astronaut", klein_model.spec.image_size)
    published = publish_template(
        store, klein_model, tpl, "tpl-klein-ps", kv_mode="per-step", steps=STEPS, store_profile="full"
    )
    with RecordingCloud(store) as cloud:
        yield cloud, store, published.manifest


async def test_phone_run_of_a_klein_per_step_template_equals_the_stored_kv_edit(
    aiohttp_server, klein_cloud, klein_model, user_image
):
    """Refused before: the agent's edit checked the folder's per-step KV against ``flow_timesteps``."""
    cloud, store, manifest = klein_cloud
    image, report = await _job(aiohttp_server, klein_model, cloud.url, user_image, STEPS, template="tpl-klein-ps")
    assert report["kv_mode"] == "per-step" and report["split_layers"] == [0] * STEPS and not report["fallbacks"]
    kv = decode_template(manifest, _blobs(store, manifest), "fp16")
    stored = run_edit(klein_model, user_image, PROMPT, steps=STEPS, kv_source=kv, kv_mode="per-step")
    np.testing.assert_array_equal(image, stored.image)
    with pytest.raises(PhoneError, match=f"precomputed for {STEPS} steps.*asks 3.*set steps to {STEPS}"):
        await _job(aiohttp_server, klein_model, cloud.url, user_image, 3, template="tpl-klein-ps")

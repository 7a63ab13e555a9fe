"""The phone path with a template of two reference images (person + garment): the phone fetches both images and the
KV from the cloud itself, its image equals the on-device edit with the stored fp16 KV bit for bit, computing the
template itself (both references) it equals the local edit from the two images, and the report lists both."""

from __future__ import annotations

import numpy as np
import pytest

from android_bridge.agent import AgentConfig, create_app
from android_bridge.client import PhoneClient, PhoneJob
from sakura_core.kv import decode_template
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.live_profile import LiveProfile

from .conftest import PHONE_TOKEN, PROMPT, RecordingCloud

pytestmark = pytest.mark.slow

TEMPLATE = "tpl-try-on-pair"
STEPS = 2


@pytest.fixture(scope="module")
def pair_cloud(tmp_path_factory, demo_model):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_image

    store = LocalStore(tmp_path_factory.mktemp("pair-store"))
    refs = [load_image("astronaut", demo_model.spec.image_size), load_image("coffee", demo_model.spec.image_size)]
    manifest = publish_template(
        store, demo_model, refs, TEMPLATE, reference_names=["person", "garment"], store_profile="full"
    ).manifest
    with RecordingCloud(store) as cloud:
        yield cloud, store, manifest, refs


async def _job(aiohttp_server, model, cloud_url, user_image, policy):
    profile = LiveProfile(0.01, 0.005, model.adapter.num_layers, STEPS)
    server = await aiohttp_server(
        create_app(AgentConfig(token=PHONE_TOKEN, port=0), model=model, live_profile=profile)
    )
    client = PhoneClient.connect(str(server.make_url("")).rstrip("/"), PHONE_TOKEN, check=False)
    try:
        job = PhoneJob(
            cloud_url=cloud_url,
            template_id=TEMPLATE,
            prompt=PROMPT,
            steps=STEPS,
            seed=0,
            policy=policy,
            bandwidth="fixed:100",
        )
        return await client.arun_job(user_image, job)
    finally:
        client.close()


async def test_phone_edits_against_both_references(aiohttp_server, pair_cloud, demo_model, user_image):
    cloud, store, manifest, refs = pair_cloud
    image, report = await _job(aiohttp_server, demo_model, cloud.url, user_image, "fetch-fp16")
    assert [(r["name"], r["tokens"]) for r in report["template"]["references"]] == [("person", 256), ("garment", 256)]
    assert not report["fallbacks"]
    paths = {r["path"] for r in cloud.records}
    assert all(f"/v1/shards/{r['image']['digest']}" in paths for r in manifest["references"])  # the phone fetched both
    blobs = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            f, _ = store.open_shard(rep["digest"])
            with f:
                blobs[rep["digest"]] = f.read()
    kv = decode_template(manifest, blobs, "fp16")
    assert kv.rope_layout == "flux2-ref-t10-x2" and kv.num_tokens == 2 * demo_model.spec.num_tokens
    stored = run_edit(demo_model, user_image, PROMPT, steps=STEPS, kv_source=kv)
    np.testing.assert_array_equal(image, stored.image)  # the on-device edit with the stored fp16 KV, bit for bit
    computed, _ = await _job(aiohttp_server, demo_model, cloud.url, user_image, "on-device-cached")
    L = demo_model.adapter.num_layers
    local = run_edit(demo_model, user_image, PROMPT, steps=STEPS, split_layer=L, template_image=refs)
    np.testing.assert_array_equal(computed, local.image)  # the phone computed both references from their images

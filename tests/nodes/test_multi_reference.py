"""A template of two reference images through the nodes (stand-in API): the Template KV Loader lists both (name,
size, token grid, tokens), and the sampler edits with their fetched KV as it does computing both on the device."""

from __future__ import annotations

import json

import numpy as np
import pytest

TID = "try-on-pair"


@pytest.fixture(scope="module")
def pair_store(tmp_path_factory, demo_model):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_image

    root = tmp_path_factory.mktemp("pair-store")
    refs = [load_image("astronaut", 64), load_image("rocket", 64)]
    publish_template(LocalStore(root), demo_model, refs, TID, reference_names=["person", "garment"])
    return root


def test_the_loader_lists_the_references(comfy, node_classes, demo_model, pair_store):
    loader = node_classes["SakuraTemplateLoader"].PREPARE_CLASS_CLONE({comfy.io.Hidden.unique_id: "2"})
    out = loader.execute(model=demo_model, template_id=TID, source="local store", server_url="", token="",
                         store_dir=str(pair_store))  # fmt: skip
    text = out.ui["text"]
    assert "references: 2 (512 tokens, attending to each other), 6 layers" in text
    assert "  1. person: 64 px, 16x16 = 256 tokens" in text and "  2. garment: 64 px, 16x16 = 256 tokens" in text


def test_fetched_kv_of_two_references_edits_as_computing_them(flow, demo_model, pair_store, user):
    template = flow.load_template(demo_model, template_id=TID, source="local store", store_dir=str(pair_store))
    images = {}
    for policy in ("fetch-fp16", "on-device-cached"):
        stream = flow.make_stream(template, policy=policy, bandwidth="fixed Mbit/s", mbit=100.0)
        image, report_json, _ = flow.sample(demo_model, stream, user, steps=2, seed=1)
        report = json.loads(report_json)
        assert [r["name"] for r in report["template"]["references"]] == ["person", "garment"]
        images[policy] = image.numpy()
    err = float(np.abs(images["fetch-fp16"] - images["on-device-cached"]).max())
    assert err <= 2 / 255 + 1e-6  # fp16 storage of the KV: at most 2 levels of the 8-bit image

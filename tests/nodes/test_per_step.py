"""A per-step template in the nodes: the loader shows its KV mode and schedule, the sampler refuses a step count it
was not precomputed for (naming the fix) and runs the one it was."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

TEMPLATE = "face-swap-astronaut-per-step"


@pytest.fixture(scope="module")
def per_step_store(tmp_path_factory, examples, demo_model):
    root = tmp_path_factory.mktemp("per-step-store")
    examples.publish_examples(root, demo_model, [TEMPLATE], store_profile="full")  # the test fetches fp16
    return root


def test_loader_shows_mode_and_schedule_and_the_sampler_checks_steps(
    comfy, node_classes, flow, demo_model, per_step_store, user
):
    err = comfy.nodes._common.SakuraNodeError  # the loaded pack's class
    clone = node_classes["SakuraTemplateLoader"].PREPARE_CLASS_CLONE({comfy.io.Hidden.unique_id: "7"})
    out = clone.execute(
        model=demo_model,
        template_id=TEMPLATE,
        source="local store",
        server_url="",
        token="",
        store_dir=str(per_step_store),
    )
    (template,) = out.args
    assert template.kv_mode == "per-step" and template.schedule == "4 steps, shift 1"
    assert out.ui == {
        "text": [
            f"template: {TEMPLATE}",
            "KV mode: per-step (one KV per step and layer): 4 steps, shift 1; the sampler must run 4 steps",
            f"references: 1 (256 tokens), {demo_model.adapter.num_layers} layers",
            "  1. reference 1: 64 px, 16x16 = 256 tokens",
            f"from: store:{per_step_store}",
        ]
    }
    manifest = template.manifest.to_json()
    assert len(manifest["shards"]) == 4 * demo_model.adapter.num_layers

    stream = flow.make_stream(template, policy="fetch-fp16", bandwidth="fixed Mbit/s", mbit=100.0)
    with pytest.raises(err, match="precomputed for 4 steps .*asks 3 — set steps to 4 or precompute"):
        flow.sample(demo_model, stream, user, steps=3)

    image, report_text, _ = flow.sample(demo_model, stream, user, steps=4)
    report = json.loads(report_text)
    assert report["kv_mode"] == "per-step" and report["template"]["schedule"] == "4 steps, shift 1"
    assert report["template"]["num_layers"] == demo_model.adapter.num_layers
    assert set(report["levels_used"]) == {f"step {s}" for s in range(4)} and not report["fallbacks"]

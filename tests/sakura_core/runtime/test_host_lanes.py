"""``sakura_core.runtime.host_lanes``: the runtime's fetch and decode lanes serving a host's own forward (the
ComfyUI MODEL patch with a Bandwidth-Adaptive Fetch): the policy's levels reach the host exactly, the host's
computed layers are kept and not fetched, a layer the policy left to a host that can no longer compute it is
fetched on demand, and the report says which was which. The lanes in ComfyUI 0.29: ``tests/nodes``."""

from __future__ import annotations

import pytest
import torch

from sakura_core.runtime.host_lanes import HostLanes
from sakura_core.runtime.pipeline_config import LiveSettings, RuntimeConfig

from ..conftest import FP16_TEMPLATE_ID

TEMPLATE_ID = FP16_TEMPLATE_ID
STEPS = 3


@pytest.fixture(scope="module")
def published(published_fp16):
    return published_fp16


def _lanes(published, policy: str) -> HostLanes:
    source, manifest = published
    config = RuntimeConfig(live=LiveSettings(steps=STEPS, shard_wait_s=60.0))
    return HostLanes(source, manifest, policy, "fixed:1000", manifest.num_layers, config)


def test_fetched_layers_are_the_exact_fp16_kv_at_every_step(published, demo_kv):
    lanes = _lanes(published, "fetch-fp16")
    layers = lanes.grid.layers
    lanes.start(template_in_sequence=False)
    try:
        for step in range(STEPS):
            for layer in range(layers):
                lanes.at_layer(step, layer)
                k, v = lanes.kv(step, layer)
                assert torch.equal(k, demo_kv.layer(layer)[0][0].half())
                assert torch.equal(v, demo_kv.layer(layer)[1][0].half())
        report = lanes.report()
    finally:
        lanes.reset()
    assert report["policy"] == "fetch-fp16" and report["split_layer"] == 0 and report["computed_here"] == []
    assert report["levels_used"] == {str(g): ["fp16"] * STEPS for g in range(layers)}
    assert report["bytes_used"] == report["bytes_fetched"] > 0
    assert report["decisions"] and all("reason" in d for d in report["decisions"])


def test_layers_the_host_computes_are_kept_for_later_steps_and_not_used_from_the_link(published):
    lanes = _lanes(published, "on-device")  # keeps the template: the host computes every layer at step 0
    layers = lanes.grid.layers
    lanes.start(template_in_sequence=True)
    try:
        made = {}
        for layer in range(layers):
            lanes.at_layer(0, layer)
            assert lanes.keep_template(layer)
            made[layer] = (torch.full((4, 2, 8), float(layer)), torch.full((4, 2, 8), -float(layer)))
            lanes.hold_computed(layer, *made[layer])
        for step in range(1, STEPS):
            for layer in range(layers):
                lanes.at_layer(step, layer)
                k, v = lanes.kv(step, layer)
                assert k is made[layer][0] and v is made[layer][1]
        report = lanes.report()
    finally:
        lanes.reset()
    assert report["split_layer"] == layers and report["computed_here"] == list(range(layers))
    assert report["bytes_used"] == 0 and report["waits"] == 0


def test_a_layer_left_to_compute_is_fetched_when_the_host_cannot_compute_it(published, demo_kv):
    """on-device decides to compute every layer; without the reference tokens in its sequence the host asks for
    each, and the lane fetches it at once (at the floor) instead of the run failing or hanging."""
    lanes = _lanes(published, "on-device")
    lanes.start(template_in_sequence=False)
    try:
        for layer in range(lanes.grid.layers):
            lanes.at_layer(0, layer)
            assert not lanes.keep_template(layer)
            k, _ = lanes.kv(0, layer)
            assert torch.equal(k, demo_kv.layer(layer)[0][0].half())
        report = lanes.report()
    finally:
        lanes.reset()
    assert report["waits"] == lanes.grid.layers and report["bytes_used"] > 0 and report["computed_here"] == []


def test_a_template_of_another_shape_is_named(published):
    source, manifest = published
    with pytest.raises(ValueError, match=f"template {TEMPLATE_ID} has {manifest.num_layers} shards"):
        HostLanes(
            source, manifest, "sakura", "live", manifest.num_layers + 1, RuntimeConfig(live=LiveSettings(steps=STEPS))
        )


def test_a_source_that_cannot_be_opened_fails_the_layer_naming_it(published, tmp_path):
    from sakura_core.fetch.sources import StoreSource

    _, manifest = published
    gone = StoreSource(str(tmp_path / "gone"))
    lanes = HostLanes(
        gone, manifest, "fetch-fp16", "live", manifest.num_layers, RuntimeConfig(live=LiveSettings(steps=STEPS))
    )
    lanes.start(template_in_sequence=False)
    try:
        with pytest.raises(RuntimeError, match=f"template {TEMPLATE_ID}: fetch failed"):
            lanes.kv(0, 0)
    finally:
        lanes.reset()

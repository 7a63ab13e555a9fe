"""``sakura_core.template_feed``: a template's KV streamed layer by layer to a host's forward (the ComfyUI MODEL
patch's fetch): exact fp16 K/V per layer, waiting for a layer not decoded yet (interruptible), reset between runs,
ComfyUI's block names and sampler sigmas mapped to SAKURA's layers and per-step steps."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from sakura_core.template_feed import TemplateKVFeed, layer_index, step_of_sigma

from .conftest import FP16_TEMPLATE_ID

TEMPLATE_ID = FP16_TEMPLATE_ID


def test_layer_index_follows_execution_order():
    assert [layer_index("double", i, 2) for i in range(2)] == [0, 1]
    assert [layer_index("single", i, 2) for i in range(3)] == [2, 3, 4]
    with pytest.raises(ValueError, match="'triple'"):
        layer_index("triple", 0, 2)


def test_step_of_sigma_names_the_schedule_when_no_step_matches():
    timesteps = (1.0, 0.75, 0.5, 0.25)
    assert [step_of_sigma(t, timesteps) for t in timesteps] == [0, 1, 2, 3]
    assert step_of_sigma(0.50004, timesteps) == 2
    with pytest.raises(ValueError, match=r"sigma 0\.6, .*\(1, 0\.75, 0\.5, 0\.25\)"):
        step_of_sigma(0.6, timesteps)


@pytest.fixture(scope="module")
def published(published_fp16):
    return published_fp16


class _GatedSource:
    """A source whose shard fetches wait for ``gate`` after the first ``free`` blobs."""

    def __init__(self, inner, free: int):
        self.inner, self.free, self.gate, self.label = inner, free, threading.Event(), "gated"

    def open(self):
        outer = self

        class _Shards:
            async def __aenter__(self):
                self.shards = await outer.inner.open().__aenter__()
                self.count = 0
                return self

            async def __aexit__(self, *exc):
                await self.shards.__aexit__(*exc)

            async def fetch_shard(self, digest, **kw):
                self.count += 1
                if self.count > outer.free:
                    await asyncio.to_thread(outer.gate.wait, 30)
                return await self.shards.fetch_shard(digest, **kw)

        return _Shards()


def test_feed_gives_every_layer_the_exact_fp16_kv(published, demo_kv):
    source, manifest = published
    feed = TemplateKVFeed(source, manifest)
    feed.start()
    try:
        for layer in range(manifest.num_layers):
            k, v = feed.kv(0, layer)
            assert k.dtype == torch.float16 and k.shape == demo_kv.layer(layer)[0].shape[1:]
            assert torch.equal(k, demo_kv.layer(layer)[0][0].half())
            assert torch.equal(v, demo_kv.layer(layer)[1][0].half())
        assert feed.stats.shards == manifest.num_layers and feed.stats.bytes > 0
    finally:
        feed.reset()
    with pytest.raises(RuntimeError, match="not started or was reset"):
        feed.kv(0, 0)


def test_a_layer_not_decoded_yet_waits_and_the_wait_can_be_interrupted(published):
    source, manifest = published
    gated = _GatedSource(source, free=1)
    feed = TemplateKVFeed(gated, manifest)
    feed.start()
    try:
        feed.kv(0, 0)  # the first shard came through
        calls = []

        def interrupt():
            calls.append(1)
            if len(calls) >= 3:
                raise KeyboardInterrupt("interrupted")

        with pytest.raises(KeyboardInterrupt):
            feed.kv(0, 1, check=interrupt, poll_s=0.01)
        gated.gate.set()
        k, _ = feed.kv(0, manifest.num_layers - 1)
        assert k.dtype == torch.float16 and feed.stats.waits >= 1 and feed.stats.wait_s > 0
    finally:
        gated.gate.set()
        feed.reset()


def test_a_representation_the_template_lacks_is_named(published):
    source, manifest = published
    feed = TemplateKVFeed(source, manifest, representation="sakura-l9")
    feed.start()
    try:
        with pytest.raises(RuntimeError, match="no representation 'sakura-l9'.*it has: fp16"):
            feed.kv(0, 0)
    finally:
        feed.reset()

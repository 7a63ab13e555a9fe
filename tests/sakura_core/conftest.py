"""Fixtures shared by the sakura_core tests."""

import asyncio

import pytest
import torch


@pytest.fixture(scope="session")
def demo_model():
    """The demo model with its seeded random init: tests must not depend on the trained weights."""
    from sakura_core.models.edit_model import load_demo_model

    torch.set_num_threads(1)
    return load_demo_model(weights=None)


@pytest.fixture(scope="session")
def demo_template(demo_model):
    from sakura_core.models.edit_model import load_image

    return load_image("astronaut", demo_model.spec.image_size)


@pytest.fixture(scope="session")
def demo_kv(demo_model, demo_template):
    return demo_model.adapter.extract_template_kv(demo_model.template_tokens(demo_template), demo_model.spec.grid)


#: the demo template published with fp16 KV in a local store (one per session): its id
FP16_TEMPLATE_ID = "demo-astronaut-fp16"


@pytest.fixture(scope="session")
def published_fp16(tmp_path_factory, demo_model, demo_template):
    """(a ``StoreSource`` over a local store holding the demo template as :data:`FP16_TEMPLATE_ID` with fp16 KV, its
    manifest)."""
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.fetch.sources import StoreSource

    folder = tmp_path_factory.mktemp("fp16-store")
    publish_template(LocalStore(folder), demo_model, demo_template, FP16_TEMPLATE_ID, codec="fp16")
    source = StoreSource(str(folder))

    async def manifest():
        async with source.open() as shards:
            return await shards.get_manifest(FP16_TEMPLATE_ID)

    return source, asyncio.run(manifest())

"""Shared fixtures of the cloud-server tests: a local store holding a synthetic template, and an app factory."""

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel, make_synthetic_template, synthetic_precompute

MODEL_ID = "ab" * 32
WRITE_TOKEN = "write-token-0123"
READ_TOKEN = "read-token-4567"


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


@pytest.fixture
def manifest(store):
    return make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(100, 4096, 8192))


@pytest.fixture
def make_app(store):
    """``make_app(**config_overrides)`` -> app over ``store`` serving a synthetic model with the synthetic codec."""

    def make(**overrides):
        kwargs = dict(store_dir=store.root, model=None, write_token=WRITE_TOKEN)
        kwargs.update(overrides)
        cfg = ServerConfig(**kwargs)
        return create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=synthetic_precompute)

    return make

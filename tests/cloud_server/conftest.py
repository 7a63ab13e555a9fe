"""Shared fixtures of the cloud-server tests: a store holding a synthetic template, and an app factory.

``store`` is parametrised: every test that uses it runs on a ``LocalStore`` and on an ``S3Store`` in a bucket of a
real S3 server (Ceph's radosgw, one per test session: ``radosgw``). Without Ceph the S3 half skips with the reason,
and fails instead under ``CI=true`` (``.ci/run`` installs Ceph).
"""

import itertools
import os
import uuid

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore
from cloud_server.synthetic import SyntheticModel, make_synthetic_template, synthetic_precompute

MODEL_ID = "ab" * 32
WRITE_TOKEN = "write-token-0123"
READ_TOKEN = "read-token-4567"
S3_BUCKET = "sakura-tests"

_prefixes = itertools.count()


def unavailable(reason: str):
    """Skip with ``reason``; under CI (``CI=true``) fail instead: CI installs every server these tests need."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: .ci/run installs it, so this is a failure)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def radosgw(tmp_path_factory):
    """A real S3 server for the session: mon + memstore OSD + radosgw on 127.0.0.1, its credentials in the
    process environment (so ``sakura`` subprocesses find them too) and the bucket ``sakura-tests``."""
    from cloud_server.radosgw import RadosGateway, RadosGatewayError, missing_ceph_binaries

    missing = missing_ceph_binaries()
    if missing:
        unavailable(f"Ceph radosgw is not installed (missing {', '.join(missing)}; apt-get install ceph-mon ceph-osd "
                    "radosgw ceph-common): S3 store tests skipped")  # fmt: skip
    pytest.importorskip("boto3", reason="the S3 store needs boto3 (pip install 'sakura-kv[cloud]')")
    gw = RadosGateway(tmp_path_factory.mktemp("radosgw"))
    try:
        gw.start()
    except RadosGatewayError as e:
        unavailable(f"the radosgw cluster did not start: {e}")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in gw.env().items():
            mp.setenv(key, value)
        from cloud_server.s3_store import S3Store

        S3Store(f"s3://{S3_BUCKET}").create_bucket()
        try:
            yield gw
        finally:
            gw.stop()


def new_s3_store(radosgw, name: str = "t"):
    """An ``S3Store`` under a fresh prefix of the session bucket (tests never see each other's objects)."""
    from cloud_server.s3_store import S3Store

    return S3Store(
        f"s3://{S3_BUCKET}/{name}{next(_prefixes)}-{uuid.uuid4().hex[:8]}", endpoint_url=radosgw.endpoint_url
    )


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return new_s3_store(request.getfixturevalue("radosgw"))


@pytest.fixture
def store_arg(store) -> str:
    """What ``--store`` takes for ``store``: its folder or its ``s3://`` URL."""
    return str(store.root) if isinstance(store, LocalStore) else str(store.location)


@pytest.fixture
def store_cfg(store) -> dict:
    """``ServerConfig`` keyword arguments naming ``store``."""
    if isinstance(store, LocalStore):
        return {"store_dir": store.root}
    return {"store_url": str(store.location), "s3_endpoint": store.endpoint_url}


@pytest.fixture
def stored(store):
    """``stored(relative)``: the bytes ``store`` holds under a name relative to its root (``templates/<id>/...``),
    or ``stored(digest=...)`` a shard's."""

    def read(relative: str | None = None, *, digest: str | None = None) -> bytes:
        if digest is not None:
            relative = f"shards/{digest[:2]}/{digest}"
        if isinstance(store, LocalStore):
            return (store.root / relative).read_bytes()
        return store.read_object(store.key(relative))

    return read


@pytest.fixture
def manifest(store):
    return make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(100, 4096, 8192))


@pytest.fixture
def make_app(store, store_cfg):
    """``make_app(**config_overrides)`` -> app over ``store`` serving a synthetic model with the synthetic codec."""

    def make(**overrides):
        kwargs = dict(**store_cfg, model=None, write_token=WRITE_TOKEN)
        kwargs.update(overrides)
        cfg = ServerConfig(**kwargs)
        return create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=synthetic_precompute)

    return make

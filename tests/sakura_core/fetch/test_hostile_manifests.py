"""A hostile or broken manifest is a ``ManifestError`` naming the problem, from the HTTP client and from a local
store alike (issue 28): a nesting bomb (json.loads raised RecursionError), NaN, a grid past the bounds; and the
client does not retry it."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings

from cloud_server.store import LocalStore
from sakura_core import limits
from sakura_core.fetch.client import ClientConfig, FetchError, ManifestError, ShardClient
from sakura_core.fetch.local_source import LocalShardSource
from sakura_core.fetch.store_layout import MANIFEST_FILE
from sakura_core.kv.manifest import ManifestLimitError
from sakura_core.template_check import ModelKey, check_template

from ...manifest_fuzz import FUZZ_RSS_BOUND_BYTES, RssPeak, hostile_manifest_bytes
from ...synthetic_templates import build_synthetic, make_synthetic_template

MODEL_ID = "ab" * 32
BOMB = b"[" * 50_000 + b"]" * 50_000


def _good() -> dict:
    manifest = build_synthetic("tpl", model_id=MODEL_ID, num_layers=2).manifest
    return {**manifest, "template_image": {"digest": "ab" * 32, "bytes": 1000}}


def _bodies() -> dict[str, bytes]:
    return {
        "bomb": BOMB,
        "nan": json.dumps({**_good(), "heads": float("nan")}).encode(),  # json.dumps writes NaN
        "huge": json.dumps({**_good(), "token_grid": [100_000, 100_000]}).encode(),
    }


@pytest.fixture
async def hostile(aiohttp_server):
    """A stand-in cloud whose manifest of template KIND is the body ``_bodies()[KIND]``; records each request."""
    hits: list[str] = []
    bodies = _bodies()

    async def manifest(request: web.Request) -> web.Response:
        hits.append(request.match_info["tid"])
        return web.Response(body=bodies[request.match_info["tid"]], content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/templates/{tid}/manifest", manifest)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), hits


@pytest.mark.parametrize(
    "kind, error, says",
    [
        ("bomb", ManifestError, "nested 50000 deep"),
        ("nan", ManifestError, "NaN is not a JSON number"),
        ("huge", ManifestLimitError, "'token_grid[0]' is 100000, over the limit"),
    ],
)
async def test_the_client_refuses_with_a_manifest_error_and_does_not_retry(hostile, kind, error, says):
    url, hits = hostile
    cfg = ClientConfig(backoff_initial_s=0.01, backoff_max_s=0.02)
    async with ShardClient(url, config=cfg) as client:
        with pytest.raises(error) as info:
            await client.get_manifest(kind)
    assert says in str(info.value)
    assert hits == [kind]  # asked once: a bad manifest is not transient


@pytest.mark.parametrize(
    "kind, says",
    [("bomb", "nested 50000 deep"), ("nan", "NaN is not a JSON number"), ("huge", "over the limit of 256")],
)
async def test_a_local_store_refuses_the_same_way(tmp_path, kind, says):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl", model_id=MODEL_ID)
    (store.root / "templates" / "tpl" / MANIFEST_FILE).write_bytes(_bodies()[kind])
    async with LocalShardSource(store.root) as source:
        with pytest.raises(ManifestError, match=says):
            await source.get_manifest("tpl")


# ---- a hypothesis fuzz of manifests through the HTTP client: only the client's own errors, never a raw one -------
_FUZZ = settings(
    max_examples=150, deadline=timedelta(seconds=20), derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


async def _get_over_http(body: bytes):
    async def manifest(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/templates/{tid}/manifest", manifest)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with ShardClient(
            f"http://127.0.0.1:{port}", config=ClientConfig(max_retries=0, retry_window_s=0.0, max_attempts=1)
        ) as client:
            return await client.get_manifest("tpl", expected_model_id=MODEL_ID)
    finally:
        await runner.cleanup()


def test_fuzzed_manifests_give_the_client_s_errors_only():
    outcomes = {"parsed": 0, "refused": 0}

    @_FUZZ
    @given(body=hostile_manifest_bytes(_good()))
    def run(body):
        try:
            manifest = asyncio.run(_get_over_http(body))
        except (ManifestError, FetchError):
            outcomes["refused"] += 1
            return
        rows, cols = manifest.token_grid  # what parsed is within the bounds
        assert rows * cols <= limits.MAX_TEMPLATE_TOKENS and manifest.heads <= limits.MAX_HEADS
        try:  # and the phone agent's next check (the template against the model it holds)
            check_template(manifest, "tpl", ModelKey(MODEL_ID, (16, 16), (2, 1, 1)))
        except ManifestError:
            outcomes["refused"] += 1
            return
        outcomes["parsed"] += 1

    with RssPeak() as rss:
        run()
    assert outcomes["refused"] > 50 and outcomes["parsed"] > 0, outcomes
    logging.getLogger(__name__).info(f"client fuzz: peak RSS growth {rss.growth_bytes / 2**20:.1f} MiB")
    assert rss.growth_bytes < FUZZ_RSS_BOUND_BYTES, f"peak RSS grew {rss.growth_bytes / 2**20:.1f} MiB"


async def test_a_local_store_s_unreadable_files_are_fetch_errors(tmp_path):
    from sakura_core.fetch.client import ShardUnavailableError

    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl", model_id=MODEL_ID)
    digest = manifest["shards"][0]["representations"][0]["digest"]
    path = store.shard_path(digest)
    path.unlink()
    path.mkdir()  # a folder in the shard's place
    (store.root / "templates" / "tpl" / MANIFEST_FILE).unlink()
    (store.root / "templates" / "tpl" / MANIFEST_FILE).symlink_to(tmp_path / "elsewhere.json")
    async with LocalShardSource(store.root) as source:
        with pytest.raises(ShardUnavailableError, match="it is not a regular file"):
            await source.fetch_shard(digest)
        with pytest.raises(FetchError, match="it is a symbolic link"):
            await source.get_manifest("tpl")

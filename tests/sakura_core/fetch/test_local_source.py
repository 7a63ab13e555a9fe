"""A store folder read directly (``LocalShardSource``, ``StoreSource``): the same manifests and blobs as the HTTP
client gets from a server over that store, the same checks (digest, size, schema, model), the link hooks per
chunk, and no server or HTTP session anywhere on the way (an edit against a local store included)."""

from __future__ import annotations

import asyncio

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore
from sakura_core.fetch.client import (
    ClientConfig,
    ManifestError,
    ModelMismatchError,
    ShardIntegrityError,
    ShardNotFoundError,
    TemplateNotFoundError,
)
from sakura_core.fetch.local_source import LocalShardSource
from sakura_core.fetch.sources import ServerSource, StoreSource
from sakura_core.kv.manifest import blob_digests

from ...synthetic_templates import build_cross_step_synthetic, make_synthetic_template

MODEL_ID = "ab" * 32


@pytest.fixture
def store(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(5000, 70_000))
    return store


def _reps(manifest):
    return [r for shard in manifest["shards"] for r in shard["representations"]]


async def test_reads_what_the_http_client_gets_from_a_server_over_the_same_store(store, aiohttp_server):
    server = await aiohttp_server(create_app(ServerConfig(store_dir=store.root, model=None), store=store))
    async with ServerSource(str(server.make_url("/"))).open() as http, StoreSource(str(store.root)).open() as local:
        assert isinstance(local, LocalShardSource)
        over_http, direct = await http.get_manifest("tpl-a"), await local.get_manifest("tpl-a")
        assert direct == over_http and direct.to_json() == over_http.to_json() == store.get_manifest("tpl-a")
        for rep in _reps(direct.to_json()):
            blob = await local.fetch_shard(rep["digest"], expected_bytes=rep["bytes"])
            assert blob == await http.fetch_shard(rep["digest"], expected_bytes=rep["bytes"])
        assert [t["id"] for t in (await local.get_catalog())["templates"]] == ["tpl-a"]


async def test_manifest_checks(store):
    async with LocalShardSource(store.root) as local:
        assert (await local.get_manifest("tpl-a", expected_model_id=MODEL_ID)).template_id == "tpl-a"
        with pytest.raises(ModelMismatchError, match="cd" * 32):
            await local.get_manifest("tpl-a", expected_model_id="cd" * 32)
        with pytest.raises(TemplateNotFoundError, match="'tpl-b'"):
            await local.get_manifest("tpl-b")
        with pytest.raises(ValueError, match="invalid template id"):
            await local.get_manifest("../etc")
        good = store.get_manifest("tpl-a")
        (store.template_dir("tpl-a") / "manifest.json").write_text('{"version": 1, ')
        with pytest.raises(ManifestError, match="invalid JSON"):
            await local.get_manifest("tpl-a")
        store.put_manifest("tpl-a", {**good, "num_layers": 9})
        with pytest.raises(ManifestError, match="num_layers"):
            await local.get_manifest("tpl-a")


async def test_shards_are_verified_and_reported_per_chunk(store):
    rep = max(_reps(store.get_manifest("tpl-a")), key=lambda r: r["bytes"])
    chunks, throttled = [], []

    async def throttle(n):
        throttled.append(n)

    async with LocalShardSource(store.root, config=ClientConfig(chunk_bytes=16_384)) as local:
        blob = await local.fetch_shard(
            rep["digest"], expected_bytes=rep["bytes"], on_chunk=chunks.append, throttle=throttle
        )
        assert len(blob) == rep["bytes"] == 70_000
        assert chunks == throttled == [16_384] * 4 + [70_000 - 4 * 16_384]
        with pytest.raises(ShardIntegrityError, match="the store holds 70000 bytes, the manifest 69999"):
            await local.fetch_shard(rep["digest"], expected_bytes=69_999)
        with pytest.raises(ShardNotFoundError):
            await local.fetch_shard("0" * 64)
        with pytest.raises(ValueError, match="invalid shard digest"):
            await local.fetch_shard("../../etc/passwd")
        path = store.shard_path(rep["digest"])
        path.write_bytes(b"\0" * rep["bytes"])  # same size, other bytes: bit rot
        with pytest.raises(ShardIntegrityError, match="hash to"):
            await local.fetch_shard(rep["digest"], expected_bytes=rep["bytes"])
        assert local.stats.shards == 1 and local.stats.integrity_failures == 1


def test_a_folder_that_is_no_store_says_how_to_make_one(tmp_path):
    with pytest.raises(ValueError, match="is not a SAKURA store .*`sakura precompute --store"):
        StoreSource(str(tmp_path)).open()


@pytest.mark.slow
def test_an_edit_against_a_local_store_starts_no_server_and_no_http_session(
    tmp_path, monkeypatch, demo_model, demo_template
):
    import aiohttp
    from aiohttp import web

    from cloud_server.precompute import publish_template
    from sakura_core import edit
    from sakura_core.runtime.live_profile import LiveProfile

    publish_template(
        LocalStore(tmp_path), demo_model, demo_template, "tpl-local", store_profile="full"
    )  # fetches fp16

    def refuse(*args, **kwargs):
        raise AssertionError("a local store needs no server and no HTTP")

    monkeypatch.setattr(web.TCPSite, "start", refuse)
    monkeypatch.setattr(aiohttp.ClientSession, "__init__", refuse)
    source = StoreSource(str(tmp_path))
    opened = asyncio.run(edit.open_template(source, "tpl-local", demo_model))
    settings = edit.EditSettings("place it", steps=1, seed=0, fetch=edit.FetchSettings("fetch-fp16", "fixed:200"))
    profile = LiveProfile(0.01, 0.005, demo_model.adapter.num_layers, 1)
    out = asyncio.run(edit.run_template_edit(demo_model, opened, demo_template, settings, profile=profile))
    assert out.report["bytes_fetched"] > 0 and not out.report["fallbacks"]
    assert out.report["template"]["source"] == f"store:{tmp_path}"


async def test_a_cross_step_template_reads_with_its_blob_less_reuse_rungs(tmp_path):
    """The local store holds no blob for a zero-byte reuse rung: the manifest parses as stored, and every blob the
    manifest names (``blob_digests``) is read and verified."""
    store = LocalStore(tmp_path / "xs")
    t = build_cross_step_synthetic("tpl-xs", model_id=MODEL_ID)
    for digest, blob in t.blobs.items():
        store.put_shard(digest, blob)
    store.put_manifest("tpl-xs", t.manifest)
    async with StoreSource(str(store.root)).open() as local:
        manifest = await local.get_manifest("tpl-xs", expected_model_id=MODEL_ID)
        reuse = [r for r in _reps(manifest.to_json()) if (r.get("ref") or {}).get("mode") == "reuse"]
        assert manifest.kv_mode == "per-step" and len(reuse) == 2 and all(r["digest"] is None for r in reuse)
        sizes = {r["digest"]: r["bytes"] for r in _reps(manifest.to_json())}
        for digest in blob_digests(manifest.to_json()):
            assert await local.fetch_shard(digest, expected_bytes=sizes[digest]) == t.blobs[digest]
        store.put_manifest("tpl-xs", {**t.manifest, "version": 1})  # published before shard format 2
        with pytest.raises(ManifestError, match="republish it"):
            await local.get_manifest("tpl-xs")

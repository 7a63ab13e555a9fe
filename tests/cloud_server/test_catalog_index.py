"""The served catalog (``cloud_server.catalog_index``): rebuilt incrementally (only changed manifests are read, on a
folder and on an S3 store), paginated with a stable order and a cursor, bad parameters refused, and its first build
off the event loop."""

import asyncio
import json
import threading
from collections import Counter

import pytest

from cloud_server.catalog_index import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    CatalogConfig,
    CatalogIndex,
    CatalogSnapshot,
    parse_page_query,
)
from cloud_server.state import STATE_KEY
from cloud_server.store import LocalStore, StoreError
from sakura_core.fetch.store_layout import MANIFEST_FILE

from ..synthetic_templates import make_synthetic_template
from .conftest import MODEL_ID

LOCAL_ONLY = pytest.mark.parametrize("store", ["local"], indirect=True)


def _count_reads(monkeypatch, store) -> Counter:
    """Count ``store.get_manifest_bytes`` calls by template id."""
    reads: Counter = Counter()
    real = store.get_manifest_bytes

    def spy(template_id):
        reads[template_id] += 1
        return real(template_id)

    monkeypatch.setattr(store, "get_manifest_bytes", spy)
    return reads


def _unpublish(store, template_id: str) -> None:
    if isinstance(store, LocalStore):
        (store.template_dir(template_id) / MANIFEST_FILE).unlink()
    else:
        store.delete_object(store.template_key(template_id, MANIFEST_FILE))


async def _ids(client, path="/v1/templates") -> list[str]:
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    return [t["id"] for t in (await resp.json())["templates"]]


async def test_a_rebuild_reads_only_changed_and_new_manifests(aiohttp_client, make_app, store, monkeypatch):
    for tid in ("tpl-a", "tpl-b", "tpl-c", "tpl-d"):
        make_synthetic_template(store, tid, model_id=MODEL_ID, num_layers=2)
    make_synthetic_template(store, "other-model", model_id="cd" * 32, num_layers=2)
    reads = _count_reads(monkeypatch, store)
    client = await aiohttp_client(make_app(catalog_ttl_s=0))  # every request lists the store again
    assert await _ids(client) == ["tpl-a", "tpl-b", "tpl-c", "tpl-d"]
    assert sum(reads.values()) == 5
    assert await _ids(client) == ["tpl-a", "tpl-b", "tpl-c", "tpl-d"]
    assert sum(reads.values()) == 5  # nothing changed: no manifest read (on a folder: lstat; on S3: one LIST)

    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID, num_layers=3)  # changed
    make_synthetic_template(store, "tpl-e", model_id=MODEL_ID, num_layers=2)  # new
    _unpublish(store, "tpl-c")  # removed
    resp = await client.get("/v1/templates")
    listed = {t["id"]: t for t in (await resp.json())["templates"]}
    assert sorted(listed) == ["tpl-a", "tpl-b", "tpl-d", "tpl-e"]
    assert listed["tpl-b"]["num_layers"] == 3 and listed["tpl-b"]["shards"] == 3
    assert reads == Counter({"tpl-a": 1, "tpl-b": 2, "tpl-c": 1, "tpl-d": 1, "other-model": 1, "tpl-e": 1})


@LOCAL_ONLY  # the folder store's version key (the S3 one: the test above)
async def test_a_corrupt_manifest_is_not_read_again_until_it_changes(aiohttp_client, make_app, store, monkeypatch):
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, num_layers=2)
    (store.template_dir("tpl-b")).mkdir()
    (store.template_dir("tpl-b") / MANIFEST_FILE).write_bytes(b'{"version": 2, ')
    reads = _count_reads(monkeypatch, store)
    client = await aiohttp_client(make_app(catalog_ttl_s=0))
    assert await _ids(client) == ["tpl-a"]
    assert await _ids(client) == ["tpl-a"]
    assert reads["tpl-b"] == 1
    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID, num_layers=2)  # repaired: read and listed
    assert await _ids(client) == ["tpl-a", "tpl-b"]
    assert reads["tpl-b"] == 2


async def test_a_rebuild_that_failed_part_way_is_not_lost(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, num_layers=2)
    index = CatalogIndex(store, CatalogConfig(ttl_s=0))
    assert (await index.snapshot(None)).ids == ("tpl-a",)
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, num_layers=3)  # read first, then...
    make_synthetic_template(store, "tpl-c", model_id=MODEL_ID, num_layers=2)  # ... this read fails (S3 down)
    real = store.get_manifest_bytes

    def failing(template_id):
        if template_id == "tpl-c":
            raise StoreError("the store is unreachable")
        return real(template_id)

    monkeypatch.setattr(store, "get_manifest_bytes", failing)
    with pytest.raises(StoreError, match="unreachable"):
        await index.snapshot(None)
    _unpublish(store, "tpl-c")
    snap = await index.snapshot(None)  # nothing left to read: tpl-a's new summary is listed all the same
    assert snap.ids == ("tpl-a",) and json.loads(snap.entries[0])["num_layers"] == 3


async def test_pages_follow_the_id_order_and_the_cursor(aiohttp_client, make_app, store):
    ids = ["m-3", "a-1", "z-9", "b-2", "c-0", "k-5", "a-0"]
    for tid in ids:
        make_synthetic_template(store, tid, model_id=MODEL_ID, num_layers=1, level_bytes=(64,))
    client = await aiohttp_client(make_app())
    whole = await (await client.get("/v1/templates")).json()
    assert set(whole) == {"model_id", "templates"}  # the response clients without parameters always had
    assert [t["id"] for t in whole["templates"]] == sorted(ids)
    pages, after = [], None
    for _ in range(10):
        resp = await client.get("/v1/templates", params={"limit": "3", **({"after": after} if after else {})})
        assert resp.status == 200 and resp.headers["ETag"]
        page = await resp.json()
        assert page["model_id"] == MODEL_ID and len(page["templates"]) <= 3
        pages.append([t["id"] for t in page["templates"]])
        after = page["next"]
        if after is None:
            break
    assert pages == [["a-0", "a-1", "b-2"], ["c-0", "k-5", "m-3"], ["z-9"]]
    assert [t for p in pages for t in p] == [t["id"] for t in whole["templates"]]
    between = await (await client.get("/v1/templates?after=d&limit=2")).json()  # an id that is not published
    assert [t["id"] for t in between["templates"]] == ["k-5", "m-3"] and between["next"] == "m-3"
    past = await (await client.get("/v1/templates?after=zz")).json()
    assert past["templates"] == [] and past["next"] is None
    full = await (await client.get(f"/v1/templates?limit={MAX_PAGE_LIMIT}")).json()
    assert [t["id"] for t in full["templates"]] == sorted(ids) and full["next"] is None
    assert full["templates"] == whole["templates"]


def test_a_page_without_limit_holds_the_default_number():
    listed = [(f"t-{i:04d}", json.dumps({"id": f"t-{i:04d}"}).encode()) for i in range(DEFAULT_PAGE_LIMIT + 5)]
    snap = CatalogSnapshot.build("m", listed, 0, 0.0)
    assert json.loads(snap.body)["templates"][0] == {"id": "t-0000"}
    after, limit = parse_page_query({"after": "a"})
    page = json.loads(snap.page(after, limit)[0])
    assert len(page["templates"]) == DEFAULT_PAGE_LIMIT and page["next"] == f"t-{DEFAULT_PAGE_LIMIT - 1:04d}"
    rest = json.loads(snap.page(page["next"], limit)[0])
    assert len(rest["templates"]) == 5 and rest["next"] is None


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("limit=0", ["limit '0'", f"1 to {MAX_PAGE_LIMIT}"]),
        (f"limit={MAX_PAGE_LIMIT + 1}", [f"limit '{MAX_PAGE_LIMIT + 1}'", "?limit="]),
        ("limit=abc", ["limit 'abc'", "whole number"]),
        ("limit=-5", ["limit '-5'"]),
        ("limit=2.5", ["limit '2.5'"]),
        ("limit=", ["limit ''"]),
        ("after=UPPER", ["'UPPER'", "next"]),
        ("after=a/b", ["'a/b'"]),
        ("limit=2&limit=3", ["limit is given 2 times"]),
    ],
)
async def test_bad_page_parameters_are_a_400_naming_the_value(aiohttp_client, make_app, manifest, query, names):
    client = await aiohttp_client(make_app())
    resp = await client.get(f"/v1/templates?{query}")
    assert resp.status == 400
    assert resp.content_type == "application/json"
    error = (await resp.json())["error"]
    for name in names:
        assert name in error, error


@LOCAL_ONLY  # the build runs in a worker thread whatever the store
async def test_the_first_build_blocks_neither_the_loop_nor_other_routes(
    aiohttp_client, make_app, store, manifest, monkeypatch
):
    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID, num_layers=2)
    release, arrived = threading.Event(), threading.Event()
    real = store.get_manifest_bytes

    def slow(template_id):
        if template_id == "tpl-b":
            arrived.set()
            release.wait(30)
        return real(template_id)

    monkeypatch.setattr(store, "get_manifest_bytes", slow)
    app = make_app()
    app[STATE_KEY].catalog_index.config = CatalogConfig(wait_s=0.2, retry_after_s=3)
    client = await aiohttp_client(app)
    try:
        first = asyncio.ensure_future(client.get("/v1/templates"))
        await asyncio.to_thread(arrived.wait, 10)
        assert arrived.is_set()
        assert (await client.get("/healthz")).status == 200  # other routes go on meanwhile
        assert (await client.get("/v1/templates/tpl-a/manifest")).status == 200
        resp = await asyncio.wait_for(first, 10)
        assert resp.status == 503 and resp.headers["Retry-After"] == "3"
        assert "1 of 2 manifests read" in (await resp.json())["error"]
    finally:
        release.set()
    for _ in range(50):  # bounded: the build finishes once released
        resp = await client.get("/v1/templates")
        if resp.status == 200:
            break
        await asyncio.sleep(0.1)
    assert [t["id"] for t in (await resp.json())["templates"]] == ["tpl-a", "tpl-b"]


@LOCAL_ONLY
async def test_a_warm_server_answers_its_last_catalog_during_a_long_rebuild(
    aiohttp_client, make_app, store, manifest, monkeypatch
):
    app = make_app(catalog_ttl_s=0)
    app[STATE_KEY].catalog_index.config = CatalogConfig(ttl_s=0, wait_s=0.2)
    client = await aiohttp_client(app)
    assert await _ids(client) == ["tpl-a"]
    release = threading.Event()
    real = store.get_manifest_bytes
    monkeypatch.setattr(store, "get_manifest_bytes", lambda tid: release.wait(30) and real(tid))
    make_synthetic_template(store, "tpl-b", model_id=MODEL_ID, num_layers=2)
    try:
        assert await _ids(client) == ["tpl-a"]  # the rebuild reading tpl-b is slow: the last complete catalog
    finally:
        release.set()
    for _ in range(50):
        if await _ids(client) == ["tpl-a", "tpl-b"]:
            break
        await asyncio.sleep(0.1)
    assert await _ids(client) == ["tpl-a", "tpl-b"]


def test_catalog_config_names_a_bad_value():
    with pytest.raises(ValueError, match="wait_s"):
        CatalogConfig(wait_s=-1)
    with pytest.raises(ValueError, match="retry_after_s"):
        CatalogConfig(retry_after_s=0)

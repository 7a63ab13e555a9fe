"""The aiohttp app in-process (pytest-aiohttp): read path, HTTP caching semantics, auth, limits, metrics (the write
path: test_app_upload.py)."""

import asyncio
import hashlib
import io
import json

import pytest

from cloud_server.app import parse_range
from cloud_server.store import LocalStore

from ..synthetic_templates import make_synthetic_template
from .conftest import MODEL_ID, READ_TOKEN, WRITE_TOKEN

AUTH_W = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def _rep(manifest, shard=0, level=2):
    """Level 2 of the conftest template: the 8192-byte representation."""
    return manifest["shards"][shard]["representations"][level]


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def test_catalog_lists_templates_of_the_served_model_only(aiohttp_client, make_app, store, manifest):
    make_synthetic_template(store, "other-model", model_id="cd" * 32)
    client = await aiohttp_client(make_app())
    resp = await client.get("/v1/templates")
    assert resp.status == 200
    assert resp.headers["Cache-Control"] == "public, no-cache"
    body = await resp.json()
    assert body["model_id"] == MODEL_ID
    assert [t["id"] for t in body["templates"]] == ["tpl-a"]
    entry = body["templates"][0]
    assert entry["bytes_by_level"] == {"0": 4 * 100, "1": 4 * 4096, "2": 4 * 8192}
    assert entry["shards"] == 4 and entry["manifest_url"] == "/v1/templates/tpl-a/manifest"
    again = await client.get("/v1/templates", headers={"If-None-Match": resp.headers["ETag"]})
    assert again.status == 304


async def test_manifest_roundtrip_etag_and_model_check(aiohttp_client, make_app, store, manifest):
    make_synthetic_template(store, "other-model", model_id="cd" * 32)
    client = await aiohttp_client(make_app())
    resp = await client.get("/v1/templates/tpl-a/manifest")
    assert resp.status == 200
    assert json.loads(await resp.read()) == manifest
    etag = resp.headers["ETag"]
    assert (await client.get("/v1/templates/tpl-a/manifest", headers={"If-None-Match": etag})).status == 304
    assert (await client.get("/v1/templates/nope/manifest")).status == 404
    resp = await client.get("/v1/templates/other-model/manifest")
    assert resp.status == 409
    err = (await resp.json())["error"]
    assert "cd" * 32 in err and MODEL_ID in err


async def test_shard_full_body_and_cache_headers(aiohttp_client, make_app, store, manifest):
    rep = _rep(manifest)
    client = await aiohttp_client(make_app())
    resp = await client.get(f"/v1/shards/{rep['digest']}")
    assert resp.status == 200
    body = await resp.read()
    assert hashlib.sha256(body).hexdigest() == rep["digest"] and len(body) == rep["bytes"]
    assert resp.headers["ETag"] == f'"{rep["digest"]}"'
    assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["Content-Type"] == "application/octet-stream"
    assert int(resp.headers["Content-Length"]) == rep["bytes"]
    head = await client.head(f"/v1/shards/{rep['digest']}")
    assert head.status == 200 and int(head.headers["Content-Length"]) == rep["bytes"]


@pytest.mark.parametrize(
    "header, expected",
    [
        ("bytes=0-99", (0, 100)),
        ("bytes=100-", (100, 8092)),
        ("bytes=-10", (8182, 10)),
        ("bytes=8000-99999", (8000, 192)),
        ("bytes=-99999", (0, 8192)),
    ],
)
async def test_single_range_206(aiohttp_client, make_app, stored, manifest, header, expected):
    rep = _rep(manifest)
    full = stored(digest=rep["digest"])
    client = await aiohttp_client(make_app())
    resp = await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": header})
    assert resp.status == 206
    start, count = expected
    assert await resp.read() == full[start : start + count]
    assert resp.headers["Content-Range"] == f"bytes {start}-{start + count - 1}/8192"
    assert resp.headers["ETag"] == f'"{rep["digest"]}"'


@pytest.mark.parametrize("header", ["bytes=8192-", "bytes=9000-9100", "bytes=-0", "bytes=0-1,x", "bytes=x-1"])
async def test_unsatisfiable_or_malformed_range_416(aiohttp_client, make_app, manifest, header):
    rep = _rep(manifest)
    client = await aiohttp_client(make_app())
    resp = await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": header})
    assert resp.status == 416
    assert resp.headers["Content-Range"] == "bytes */8192"
    assert "Cache-Control" not in resp.headers


async def test_if_range_with_another_etag_sends_the_whole_shard(aiohttp_client, make_app, manifest):
    rep = _rep(manifest)
    client = await aiohttp_client(make_app())
    resp = await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert resp.status == 200 and len(await resp.read()) == 8192
    resp = await client.get(
        f"/v1/shards/{rep['digest']}", headers={"Range": "bytes=0-9", "If-Range": f'"{rep["digest"]}"'}
    )
    assert resp.status == 206 and len(await resp.read()) == 10
    resp = await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": "items=0-9"})
    assert resp.status == 200  # unknown range unit: ignored


async def test_conditional_requests_304_and_412(aiohttp_client, make_app, manifest):
    rep = _rep(manifest)
    url = f"/v1/shards/{rep['digest']}"
    client = await aiohttp_client(make_app())
    for inm in (f'"{rep["digest"]}"', f'W/"{rep["digest"]}"', '"x", ' + f'"{rep["digest"]}"', "*"):
        resp = await client.get(url, headers={"If-None-Match": inm})
        assert resp.status == 304, inm
        assert await resp.read() == b""
        assert resp.headers["ETag"] == f'"{rep["digest"]}"'
        assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert (await client.get(url, headers={"If-None-Match": '"other"'})).status == 200
    assert (await client.get(url, headers={"If-Match": '"other"'})).status == 412
    for im in (f'"{rep["digest"]}"', '"x", ' + f'"{rep["digest"]}"', "*"):
        assert (await client.get(url, headers={"If-Match": im})).status == 200, im
    # If-Match compares strongly (RFC 9110 13.1.1): a weak tag of the same value does not match
    for im in (f'W/"{rep["digest"]}"', '"x", ' + f'W/"{rep["digest"]}"'):
        resp = await client.get(url, headers={"If-Match": im})
        assert resp.status == 412, im
        assert "does not match" in (await resp.json())["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/shards/..%2F..%2Fetc%2Fpasswd",
        "/v1/shards/%2e%2e",
        "/v1/shards/" + "A" * 64,
        "/v1/shards/" + "0" * 63,
        "/v1/shards/" + "0" * 63 + "g",
        "/v1/shards/..",
        "/v1/templates/..%2F..%2Fshards/manifest",
        "/v1/templates/UPPER/manifest",
        "/v1/templates/" + "a" * 65 + "/manifest",
        "/v1/templates/a.b/manifest",
        "/v1/templates/%2e%2e/manifest",
        "/v1/templates/a%5Cb/manifest",
    ],
)
async def test_traversal_and_bad_names_get_400(aiohttp_server, make_app, manifest, path):
    server = await aiohttp_server(make_app())
    status, body = await _raw_get(server.port, path)
    assert status == 400, (path, status)
    assert "error" in json.loads(body)


async def _raw_get(port: int, path: str) -> tuple[int, bytes]:
    """Send the request line byte for byte (HTTP clients normalise dot segments away)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_traversal_never_touches_files_outside_the_store(aiohttp_server, make_app, store, manifest, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret")
    server = await aiohttp_server(make_app())
    for path in (
        "/v1/shards/..%2F..%2Fsecret",
        "/v1/templates/..%2F..%2Fsecret/manifest",
        "/v1/shards/../../secret",
        "/v1/shards/%2e%2e/%2e%2e/secret",
        "/../../secret",
    ):
        status, body = await _raw_get(server.port, path)
        assert status == 400, (path, status)
        assert b"top secret" not in body


async def test_unknown_shard_404(aiohttp_client, make_app, manifest):
    client = await aiohttp_client(make_app())
    resp = await client.get("/v1/shards/" + "0" * 64)
    assert resp.status == 404


async def test_read_token(aiohttp_client, make_app, manifest):
    rep = _rep(manifest)
    client = await aiohttp_client(make_app(read_token=READ_TOKEN))
    url = f"/v1/shards/{rep['digest']}"
    resp = await client.get(url)
    assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await client.get(url, headers={"Authorization": "Bearer wrong-token-xx"})).status == 401
    assert (await client.get(url, headers={"Authorization": f"Bearer {READ_TOKEN}"})).status == 200
    assert (await client.get(url, headers=AUTH_W)).status == 200  # the write token reads too
    assert (await client.get("/v1/templates")).status == 401
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/healthz")).status == 200


async def test_header_limits(aiohttp_client, make_app, manifest):
    client = await aiohttp_client(make_app(max_header_bytes=1024))
    resp = await client.get("/healthz", headers={"X-Big": "a" * 4000})
    assert resp.status in (400, 431)


async def test_metrics_count_requests_bytes_errors(aiohttp_client, make_app, manifest):
    rep = _rep(manifest)
    client = await aiohttp_client(make_app())
    for _ in range(3):
        await (await client.get(f"/v1/shards/{rep['digest']}")).read()
    await (await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": "bytes=0-9"})).read()
    await client.get("/v1/shards/" + "0" * 64)
    await client.get("/v1/shards/bad")
    text = await (await client.get("/metrics")).text()
    m = _metrics(text)
    assert m['sakura_requests_total{route="shard"}'] == 6
    assert m["sakura_bytes_sent_total"] == 3 * rep["bytes"] + 10
    assert m["sakura_client_errors_total"] == 2
    assert m["sakura_errors_total"] == 0
    assert m["sakura_in_flight"] == 1  # this request
    assert m['sakura_responses_total{code="2xx"}'] == 4


async def test_object_store_without_files_is_streamed(aiohttp_client, tmp_path):
    """A store whose shards have no file descriptor (an object store) is served by copying, same bytes."""
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    class MemoryStore(LocalStore):
        def open_shard(self, digest):
            f, size = super().open_shard(digest)
            with f:
                return io.BytesIO(f.read()), size

    store = MemoryStore(tmp_path / "mem")
    manifest = make_synthetic_template(store, "m", model_id=MODEL_ID, level_bytes=(300_000,))
    rep = _rep(manifest, level=0)
    cfg = ServerConfig(store_dir=store.root, model=None, send_chunk_bytes=4096)
    client = await aiohttp_client(create_app(cfg, store=store))
    body = await (await client.get(f"/v1/shards/{rep['digest']}")).read()
    assert hashlib.sha256(body).hexdigest() == rep["digest"]
    resp = await client.get(f"/v1/shards/{rep['digest']}", headers={"Range": "bytes=1000-1999"})
    assert resp.status == 206 and await resp.read() == store.shard_path(rep["digest"]).read_bytes()[1000:2000]


def test_parse_range_table():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-0", 10) == (0, 1)
    assert parse_range(" bytes = 2-4 ", 10) == (2, 3)
    assert parse_range("BYTES=9-", 10) == (9, 1)
    assert parse_range("lines=1-2", 10) is None

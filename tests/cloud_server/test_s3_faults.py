"""An S3 store failing or misbehaving, on a real radosgw behind the test gate: every read bounded before it is read
(an oversized manifest refused from its length, and not read again while unchanged), S3 faults answered like the
folder store's (JSON, ``Sakura-Retry``, the store named, one log line per kind, no traceback), a stalled object
delaying only its own requests, and a body S3 cuts short logged as the store's fault, not the client's."""

import asyncio
import json
import logging
import os
import uuid

import pytest
from aiohttp import web
from botocore.response import StreamingBody

from cloud_server.config import ServerConfig
from cloud_server.s3_store import S3Store
from sakura_core.limits import MAX_JSON_BYTES

from ..synthetic_templates import SyntheticModel, make_synthetic_template, synthetic_precompute
from .conftest import MODEL_ID, S3_BUCKET


def _s3_store(endpoint: str, *, quick: bool = False) -> S3Store:
    """A store under a fresh prefix; ``quick``: its client waits 1 s to connect and 1 s for bytes, 2 tries."""
    client = None
    if quick:
        import boto3
        from botocore.config import Config

        cfg = Config(
            connect_timeout=1,
            read_timeout=1,
            retries={"total_max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
        )
        client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=cfg)
    return S3Store(f"s3://{S3_BUCKET}/faults-{uuid.uuid4().hex[:10]}", endpoint_url=endpoint, client=client)


def _app(store: S3Store, **overrides):
    from cloud_server.app import create_app

    cfg = ServerConfig(store_url=str(store.location), s3_endpoint=store.endpoint_url, model=None, **overrides)
    return create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=synthetic_precompute)


def _digests(manifest: dict) -> list[str]:
    return [r["digest"] for s in manifest["shards"] for r in s["representations"]]


@pytest.fixture
def body_bytes_read(monkeypatch) -> list[int]:
    """Bytes read from S3 response bodies (botocore's ``StreamingBody``) since the test began: ``[n]``."""
    count, real = [0], StreamingBody.read

    def read(self, amt=None):
        data = real(self, amt)
        count[0] += len(data)
        return data

    monkeypatch.setattr(StreamingBody, "read", read)
    return count


# ---- 1: bounded reads -----------------------------------------------------------------------------------------
async def test_an_oversized_manifest_object_is_refused_from_its_length_and_not_read_again(
    radosgw, aiohttp_client, body_bytes_read
):
    store = _s3_store(radosgw.endpoint_url)
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    key = store.key("templates/big/manifest.json")
    await asyncio.to_thread(store.put_object, key, b" " * (MAX_JSON_BYTES + 1), "application/json")
    client = await aiohttp_client(_app(store, catalog_ttl_s=0))
    body_bytes_read[0] = 0
    r = await client.get("/v1/templates/big/manifest")
    body = await r.json()
    assert body_bytes_read[0] == 0  # refused from its Content-Length: not one byte of its body read
    assert r.status == 500 and r.headers["Sakura-Retry"] == "no", body
    assert f"is {MAX_JSON_BYTES + 1} bytes, over the limit of {MAX_JSON_BYTES}" in body["error"]
    assert str(store.location) in body["error"]
    for _ in range(3):  # each catalog rebuild (TTL 0) meets the refused object: a conditional GET, no body read
        r = await client.get("/v1/templates")
        assert r.status == 200 and [t["id"] for t in (await r.json())["templates"]] == ["tpl-a"]
    assert body_bytes_read[0] < 1 << 20  # tpl-a's manifest, read 3 times; never a byte of the 64 MiB object
    fixed = {**manifest, "template_id": "big"}  # replaced (a new ETag): read and listed again
    await asyncio.to_thread(store.put_object, key, json.dumps(fixed).encode(), "application/json")
    r = await client.get("/v1/templates")
    assert [t["id"] for t in (await r.json())["templates"]] == ["big", "tpl-a"]
    assert (await client.get("/v1/templates/big/manifest")).status == 200


def test_a_body_without_a_length_is_read_no_further_than_the_limit():
    from cloud_server.s3_io import read_bounded
    from cloud_server.store import StoreFaultError

    class Endless:
        pulled, closed = 0, False

        def read(self, n):
            self.pulled += n
            return b"x" * n

        def close(self):
            self.closed = True

    body = Endless()
    with pytest.raises(StoreFaultError, match="over the limit of 1000 bytes"):
        read_bounded("s3://b", "object k", {"Body": body}, 1000, deadline_s=60)
    assert body.pulled == 1001 and body.closed
    declared = Endless()  # a body running past its declared length: read up to that length only
    assert read_bounded("s3://b", "object k", {"Body": declared, "ContentLength": 10}, 1000, 60) == b"x" * 10
    assert declared.pulled == 10 and declared.closed


# ---- 2: S3 faults answered as store faults --------------------------------------------------------------------
async def _refuse_credentials(gate, request, body):  # radosgw's own 403: the request arrives unsigned
    status, headers, payload = await gate.forward(request, body, drop=("authorization",))
    return web.Response(status=status, headers=headers, body=payload)


async def _server_error(gate, request, body):
    xml = b'<?xml version="1.0"?><Error><Code>InternalError</Code><Message>boom</Message></Error>'
    return web.Response(status=500, body=xml, content_type="application/xml")


@pytest.mark.parametrize(
    "fault, status, kind",
    [
        ("unreachable", 503, "S3 endpoint unreachable"),
        ("forbidden", 502, "S3 access denied"),
        ("server-error", 503, "S3 server error"),
        ("timeout", 503, "S3 timeout"),
    ],
)
async def test_s3_faults_are_json_store_faults_on_every_route(
    radosgw, s3_gate, aiohttp_client, caplog, fault, status, kind
):
    store = _s3_store(s3_gate.url, quick=True)
    manifest = await asyncio.to_thread(make_synthetic_template, store, "tpl-a", model_id=MODEL_ID)
    client = await aiohttp_client(_app(store))  # started (the bucket checked) before S3 fails
    if fault == "unreachable":
        await s3_gate.stop_listening()
    elif fault == "forbidden":
        s3_gate.answer("GET", f"/{S3_BUCKET}", _refuse_credentials)
    elif fault == "server-error":
        s3_gate.answer("GET", f"/{S3_BUCKET}", _server_error)
    else:
        s3_gate.hold("GET", f"/{S3_BUCKET}", every=True)
    caplog.set_level(logging.INFO)
    caplog.clear()
    for path in ("/v1/templates/tpl-a/manifest", f"/v1/shards/{_digests(manifest)[0]}", "/v1/templates"):
        r = await asyncio.wait_for(client.get(path), 60)
        assert r.status == status and r.content_type == "application/json", (path, await r.text())
        body = await r.json()
        assert str(store.location) in body["error"] and body["retry"] == (status == 503), (path, body)
        assert r.headers["Sakura-Retry"] == ("yes" if status == 503 else "no")
        assert (r.headers.get("Retry-After") is not None) == (status == 503)
    assert not [rec for rec in caplog.records if rec.exc_info], "no traceback for an expected store fault"
    lines = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("store fault: ")]
    assert len(lines) == 1 and lines[0].startswith(f"store fault: {kind}: GET /v1/templates/tpl-a/manifest"), lines
    if fault == "timeout":  # every request met its deadline: 2 tries each, both held, then the answer
        assert s3_gate.holds[0].count == 3 * 2


# ---- 3: a stalled object delays only its own requests ---------------------------------------------------------
async def test_a_stalled_shard_does_not_delay_a_healthy_one(radosgw, s3_gate, aiohttp_client):
    store = _s3_store(s3_gate.url)
    manifest = await asyncio.to_thread(make_synthetic_template, store, "tpl-a", model_id=MODEL_ID)
    stalled, healthy = _digests(manifest)[:2]
    client = await aiohttp_client(_app(store))
    hold = s3_gate.hold("GET", stalled, every=True)
    # more requests of the stalled shard than asyncio's default executor has threads
    n = min(32, (os.cpu_count() or 1) + 4) + 2
    waiting = [asyncio.create_task(client.get(f"/v1/shards/{stalled}")) for _ in range(n)]
    await asyncio.wait_for(hold.arrived.wait(), 30)
    await asyncio.sleep(0.2)  # every stalled request has reached the store (or waits for a slot)
    r = await asyncio.wait_for(client.get(f"/v1/shards/{healthy}"), 20)
    assert r.status == 200 and len(await r.read()) > 0
    assert not any(t.done() for t in waiting), "the stalled requests are still held while the healthy one is served"
    assert hold.count <= 4  # one object holds at most store_threads_per_object threads
    hold.release()
    for resp in await asyncio.wait_for(asyncio.gather(*waiting), 60):
        assert resp.status == 200
        await resp.read()


async def test_a_stalled_object_ends_at_its_deadline(radosgw, s3_gate, aiohttp_client):
    from cloud_server.s3_io import S3Config

    config = S3Config(connect_timeout_s=1, read_timeout_s=1, max_attempts=2)
    store = S3Store(f"s3://{S3_BUCKET}/faults-{uuid.uuid4().hex[:10]}", endpoint_url=s3_gate.url, config=config)
    manifest = await asyncio.to_thread(make_synthetic_template, store, "tpl-a", model_id=MODEL_ID)
    client = await aiohttp_client(_app(store))
    hold = s3_gate.hold("GET", _digests(manifest)[0], every=True)
    r = await asyncio.wait_for(client.get(f"/v1/shards/{_digests(manifest)[0]}"), 60)
    assert r.status == 503 and "timed out" in (await r.json())["error"]
    assert hold.count == config.max_attempts and not hold._released.is_set()  # answered while still stalled
    assert config.deadline_s == 2 * (1 + 1) + 1 + 5


# ---- 8: a body S3 cuts short is the store's fault ---------------------------------------------------------------
async def _cut_short(gate, request, body):
    status, headers, payload = await gate.forward(request, body)
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = len(payload)
    await resp.prepare(request)
    await resp.write(payload[: len(payload) // 2])
    request.transport.close()
    return resp


async def test_a_body_cut_short_by_s3_is_logged_as_a_store_fault(radosgw, s3_gate, sakura_serve):
    import aiohttp

    store = _s3_store(s3_gate.url)
    big = {"level_bytes": (100, 4096, 2 << 20)}
    manifest = await asyncio.to_thread(make_synthetic_template, store, "tpl-a", model_id=MODEL_ID, **big)
    digest = max((r["bytes"], r["digest"]) for s in manifest["shards"] for r in s["representations"])[1]
    proc, port = await sakura_serve(str(store.location), "--model", "none", endpoint=s3_gate.url)
    s3_gate.answer("GET", digest, _cut_short)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.get(f"http://127.0.0.1:{port}/v1/shards/{digest}") as r:
                await r.read()
    await sakura_serve.stop(proc)
    log = (await proc.stderr.read()).decode()
    assert "store fault: S3 connection broken: GET /v1/shards/" in log, log[-3000:]
    assert "malformed request" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize(
    "field, value",
    [
        ("s3_read_timeout_s", 0),
        ("s3_connect_timeout_s", 601),
        ("s3_max_attempts", 0),
        ("store_threads_per_object", 33),
    ],
)
def test_store_io_settings_are_validated_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ServerConfig(store_url=f"s3://{S3_BUCKET}/x", model=None, **{field: value})
    cfg = ServerConfig(store_url=f"s3://{S3_BUCKET}/x", model=None, s3_read_timeout_s=3, s3_max_attempts=3)
    assert (cfg.s3_config.read_timeout_s, cfg.s3_config.max_attempts) == (3, 3)

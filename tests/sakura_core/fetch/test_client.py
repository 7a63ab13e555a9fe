"""ShardClient against the real app and against scripted faulty servers (all on 127.0.0.1).

The invariant under every fault: the client returns the exact bytes of the digest or raises a specific error.
"""

import asyncio
import hashlib
import socket
import struct

import numpy as np
import pytest
from aiohttp import web

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore
from sakura_core.fetch.client import (
    AuthError,
    ClientConfig,
    FetchError,
    ManifestError,
    ModelMismatchError,
    ServerUnreachableError,
    ShardClient,
    ShardIntegrityError,
    ShardNotFoundError,
    ShardUnavailableError,
    TemplateNotFoundError,
)
from sakura_core.kv import parse_manifest

from ...synthetic_templates import make_synthetic_template

MODEL_ID = "ab" * 32
FAST = ClientConfig(
    backoff_initial_s=0.001, backoff_max_s=0.01, read_timeout_s=5, connect_timeout_s=2, retry_window_s=0
)


def _blob(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


@pytest.fixture
def manifest(store):
    return make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(5000, 200_000))


class _NoSleep:
    """A fake clock for backoff: records the waits instead of sleeping."""

    def __init__(self):
        self.waits = []

    async def __call__(self, s):
        self.waits.append(s)
        await asyncio.sleep(0)


# ---- against the real app -------------------------------------------------------------------------------------
async def test_catalog_manifest_and_shards_from_the_real_app(aiohttp_server, store, manifest):
    app = create_app(ServerConfig(store_dir=store.root, model=None), store=store)
    server = await aiohttp_server(app)
    async with ShardClient(str(server.make_url("/")), config=FAST) as client:
        catalog = await client.get_catalog()
        assert [t["id"] for t in catalog["templates"]] == ["tpl-a"]
        got = await client.get_manifest("tpl-a", expected_model_id=MODEL_ID)
        assert got.to_json() == manifest
        with pytest.raises(ModelMismatchError, match="cd" * 32):
            await client.get_manifest("tpl-a", expected_model_id="cd" * 32)
        with pytest.raises(TemplateNotFoundError):
            await client.get_manifest("missing")
        with pytest.raises(ValueError, match="invalid template id"):
            await client.get_manifest("../etc")
        for shard in manifest["shards"]:
            for rep in shard["representations"]:
                seen = []
                data = await client.fetch_shard(rep["digest"], expected_bytes=rep["bytes"], on_chunk=seen.append)
                assert hashlib.sha256(data).hexdigest() == rep["digest"]
                assert sum(seen) == rep["bytes"]
        with pytest.raises(ShardNotFoundError):
            await client.fetch_shard("0" * 64)
        with pytest.raises(ValueError, match="invalid shard digest"):
            await client.fetch_shard("../../etc/passwd")


async def test_throttle_runs_before_each_chunk_is_counted(aiohttp_server, store, manifest):
    rep = manifest["shards"][0]["representations"][1]  # 200 kB: many chunks
    server = await aiohttp_server(create_app(ServerConfig(store_dir=store.root, model=None), store=store))
    events = []

    async def throttle(n):
        events.append(("throttle", n))
        await asyncio.sleep(0)

    cfg = ClientConfig(chunk_bytes=16 * 1024)
    async with ShardClient(str(server.make_url("/")), config=cfg) as client:
        data = await client.fetch_shard(
            rep["digest"], throttle=throttle, on_chunk=lambda n: events.append(("chunk", n))
        )
    assert len(data) == rep["bytes"]
    assert all(n <= 16 * 1024 for _, n in events)
    assert [e[0] for e in events] == ["throttle", "chunk"] * (len(events) // 2)
    assert [n for kind, n in events if kind == "throttle"] == [n for kind, n in events if kind == "chunk"]


async def test_read_token_is_sent_and_missing_token_is_an_auth_error(aiohttp_server, store, manifest):
    app = create_app(ServerConfig(store_dir=store.root, model=None, read_token="read-token-1"), store=store)
    server = await aiohttp_server(app)
    rep = manifest["shards"][0]["representations"][0]
    async with ShardClient(str(server.make_url("/")), config=FAST) as anon:
        with pytest.raises(AuthError):
            await anon.fetch_shard(rep["digest"])
        with pytest.raises(AuthError):
            await anon.get_catalog()
    async with ShardClient(str(server.make_url("/")), token="read-token-1", config=FAST) as client:
        assert len(await client.fetch_shard(rep["digest"])) == rep["bytes"]


async def test_server_restart_mid_fetch_resumes_with_range(store, unused_tcp_port):
    """Stop the real server while a 24 MiB shard streams, start it again on the same port: the client resumes."""
    blob = _blob(24 * 2**20, seed=3)
    digest = hashlib.sha256(blob).hexdigest()
    store.put_shard(digest, blob)
    cfg = ServerConfig(store_dir=store.root, model=None, port=unused_tcp_port, shutdown_timeout_s=0.1)

    async def start():
        runner = web.AppRunner(create_app(cfg, store=store), shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
        return runner

    runners = [await start()]
    restarted = asyncio.Event()

    async def throttle(n):
        if not restarted.is_set():
            restarted.set()
            await runners[0].cleanup()
            await asyncio.sleep(0.05)  # the server is down: the client's next connect would be refused
            runners.append(await start())

    try:
        client_cfg = ClientConfig(backoff_initial_s=0.02, backoff_max_s=0.2, chunk_bytes=64 * 1024)
        async with ShardClient(f"http://127.0.0.1:{unused_tcp_port}", config=client_cfg) as client:
            data = await client.fetch_shard(digest, expected_bytes=len(blob), throttle=throttle)
            assert data == blob
            assert client.stats.resumes >= 1, client.stats
            assert client.stats.bytes_received < 2 * len(blob)
    finally:
        await runners[-1].cleanup()


# ---- scripted faulty servers ----------------------------------------------------------------------------------
class FaultServer:
    """Serves one blob; each request follows the next entry of ``script`` (then ``ok``); records Range headers."""

    def __init__(self, blob: bytes, script: list[str]):
        self.blob = blob
        self.digest = hashlib.sha256(blob).hexdigest()
        self.script = list(script)
        self.ranges: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/shards/{digest}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = self.script.pop(0) if self.script else "ok"
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        if kind in ("503", "404"):
            return web.json_response({"error": kind}, status=int(kind))
        offset = int(rng.removeprefix("bytes=").rstrip("-")) if rng and kind != "ignore-range" else 0
        body = self.blob[offset:]
        if kind == "corrupt":
            body = body[:10] + bytes([body[10] ^ 0xFF]) + body[11:]
        etag = '"' + ("f" * 64 if kind == "wrong-etag" else self.digest) + '"'
        resp = web.StreamResponse(status=206 if offset else 200, headers={"ETag": etag})
        if offset:
            start = offset + 1 if kind == "bad-content-range" else offset
            resp.headers["Content-Range"] = f"bytes {start}-{len(self.blob) - 1}/{len(self.blob)}"
        resp.content_length = len(body) + (100 if kind == "wrong-size" else 0)
        await resp.prepare(request)
        if kind in ("reset", "truncate"):
            await resp.write(body[: len(body) // 2])
            await asyncio.sleep(0.1)  # let the client read the first half
            if kind == "reset":
                sock = request.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                request.transport.abort()  # RST
            else:
                request.transport.close()  # FIN before Content-Length bytes
            return resp
        if kind == "stall":  # half the body, then silence (a dead link): the client's read timeout must fire
            await resp.write(body[: len(body) // 2])
            await asyncio.sleep(1.0)
            request.transport.close()
            return resp
        if kind == "wrong-size":
            await resp.write(body)
            request.transport.close()
            return resp
        await resp.write(body)
        await resp.write_eof()
        return resp


async def _client_for(aiohttp_server, fault: FaultServer, **cfg):
    server = await aiohttp_server(fault.app())
    sleep = _NoSleep()
    config = ClientConfig(**{**FAST.__dict__, **cfg})
    return ShardClient(str(server.make_url("/")), config=config, sleep=sleep), sleep


@pytest.mark.parametrize("fault", ["reset", "truncate"])
async def test_broken_connection_mid_shard_resumes_with_range(aiohttp_server, fault):
    blob = _blob(400_000, seed=1)
    srv = FaultServer(blob, [fault, fault])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest, expected_bytes=len(blob)) == blob
    assert srv.ranges[0] is None
    resumed = [int(r.removeprefix("bytes=").rstrip("-")) for r in srv.ranges[1:]]
    assert resumed[0] > 0, srv.ranges  # resumed where the first body broke, not from 0
    assert resumed == sorted(resumed)
    assert client.stats.resumes == 2
    assert client.stats.bytes_received == len(blob)


async def test_stalled_body_times_out_and_resumes(aiohttp_server):
    blob = _blob(400_000, seed=11)
    srv = FaultServer(blob, ["stall"])
    client, _ = await _client_for(aiohttp_server, srv, read_timeout_s=0.2)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert srv.ranges[0] is None and int(srv.ranges[1].removeprefix("bytes=").rstrip("-")) > 0
    assert client.stats.errors


async def test_corrupt_bytes_are_never_returned(aiohttp_server):
    blob = _blob(50_000, seed=2)
    srv = FaultServer(blob, ["corrupt"] * 5)
    client, _ = await _client_for(aiohttp_server, srv, integrity_retries=1)
    async with client:
        with pytest.raises(ShardIntegrityError, match=srv.digest):
            await client.fetch_shard(srv.digest)
    assert len(srv.ranges) == 2  # one full refetch, then a clear error


async def test_corrupt_once_then_recovered_by_a_whole_refetch(aiohttp_server):
    blob = _blob(50_000, seed=2)
    srv = FaultServer(blob, ["corrupt"])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert srv.ranges == [None, None]


async def test_corrupt_resumed_range_is_caught(aiohttp_server):
    """A good first half and a corrupt resumed second half: the spliced blob fails its digest, refetched whole."""
    blob = _blob(300_000, seed=4)
    srv = FaultServer(blob, ["truncate", "corrupt"])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert srv.ranges[0] is None and srv.ranges[1].startswith("bytes=") and srv.ranges[2] is None


async def test_server_ignoring_range_restarts_from_zero(aiohttp_server):
    blob = _blob(300_000, seed=5)
    srv = FaultServer(blob, ["truncate", "ignore-range"])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert client.stats.restarts == 1


async def test_wrong_content_range_is_not_spliced(aiohttp_server):
    blob = _blob(300_000, seed=6)
    srv = FaultServer(blob, ["truncate", "bad-content-range"])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert srv.ranges[-1] is None  # started over after the misplaced range


async def test_persistent_503_gives_up_with_a_clear_error(aiohttp_server):
    blob = _blob(10_000, seed=7)
    srv = FaultServer(blob, ["503"] * 100)
    client, sleep = await _client_for(aiohttp_server, srv, max_retries=3)
    async with client:
        with pytest.raises(ShardUnavailableError, match="4 attempt") as info:
            await client.fetch_shard(srv.digest)
    assert info.value.attempts == 4 and len(srv.ranges) == 4
    assert sleep.waits == sorted(sleep.waits) and len(sleep.waits) == 3  # exponential backoff, bounded


async def test_503_then_ok(aiohttp_server):
    blob = _blob(10_000, seed=8)
    srv = FaultServer(blob, ["503", "503"])
    client, sleep = await _client_for(aiohttp_server, srv)
    async with client:
        assert await client.fetch_shard(srv.digest) == blob
    assert len(sleep.waits) == 2


async def test_404_is_not_retried(aiohttp_server):
    srv = FaultServer(_blob(100), ["404"])
    client, sleep = await _client_for(aiohttp_server, srv)
    async with client:
        with pytest.raises(ShardNotFoundError):
            await client.fetch_shard(srv.digest)
    assert len(srv.ranges) == 1 and sleep.waits == []


async def test_size_and_etag_mismatches_are_integrity_errors(aiohttp_server):
    blob = _blob(1000, seed=9)
    srv = FaultServer(blob, ["ok", "wrong-etag"])
    client, _ = await _client_for(aiohttp_server, srv)
    async with client:
        with pytest.raises(ShardIntegrityError, match="manifest 999"):
            await client.fetch_shard(srv.digest, expected_bytes=999)
        with pytest.raises(ShardIntegrityError, match="ETag"):
            await client.fetch_shard(srv.digest)


async def test_connection_refused_is_bounded(unused_tcp_port):
    sleep = _NoSleep()
    client = ShardClient(f"http://127.0.0.1:{unused_tcp_port}", config=FAST, sleep=sleep)
    async with client:
        with pytest.raises(ShardUnavailableError, match="attempt") as shard_error:
            await client.fetch_shard("0" * 64)
        assert len(sleep.waits) == FAST.max_retries
        with pytest.raises(ServerUnreachableError) as catalog_error:
            await client.get_catalog()
    # readable, without aiohttp's internals (ClientConnectorError(ConnectionKey(host=..., ...)))
    url = f"http://127.0.0.1:{unused_tcp_port}"
    assert str(catalog_error.value) == (
        f"catalog: cannot reach the SAKURA server at {url} (connection refused) — is `sakura serve` running?"
    )
    assert f"cannot reach the SAKURA server at {url} (connection refused)" in str(shard_error.value)
    assert "ConnectionKey" not in str(shard_error.value) + str(catalog_error.value)


def test_connection_problem_names_the_cause():
    from sakura_core.fetch.errors import connection_problem

    class Connector(Exception):  # aiohttp.ClientConnectorError carries the OSError as .os_error
        def __init__(self, os_error):
            self.os_error = os_error

    assert connection_problem(Connector(ConnectionRefusedError(111, "Connect call failed"))) == "connection refused"
    assert connection_problem(Connector(socket.gaierror(-2, "Name or service not known"))) == "unknown host"
    assert connection_problem(Connector(OSError(113, "No route to host"))) == "No route to host"
    assert connection_problem(asyncio.TimeoutError()) == "timed out"
    assert connection_problem(ValueError("x")) is None


# ---- manifest checks ------------------------------------------------------------------------------------------
def _good_manifest():
    from ...synthetic_templates import build_synthetic

    return build_synthetic("t", model_id=MODEL_ID, num_layers=2, level_bytes=(5, 10)).manifest


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda m: m.update(version=3), "version"),
        (lambda m: m.update(version=1), "version.*republish"),
        (lambda m: m.pop("model_id"), "model_id"),
        (lambda m: m.update(template_id="../x"), "template_id"),
        (lambda m: m.update(token_grid=[16]), "token_grid"),
        (lambda m: m.update(shards=[]), "shards"),
        (lambda m: m["shards"][1].update(layers=[2, 2]), "shards[1].layers"),
        (lambda m: m["shards"][0]["representations"][0].update(digest="../../x"), "digest"),
        (lambda m: m["shards"][0]["representations"][0].update(bytes=-1), "bytes"),
        (lambda m: m["shards"][0]["representations"][0].update(distortion=float("nan")), "distortion"),
        (lambda m: m["shards"][0]["representations"][1].update(requires=["f" * 64]), "requires"),
        (lambda m: m.update(num_layers=3), "num_layers"),
        (lambda m: m.update(template_image={"digest": "x", "bytes": 1}), "template_image"),
    ],
)
def test_parse_manifest_names_the_bad_field(mutate, field):
    m = _good_manifest()
    assert parse_manifest(m, template_id="t", model_id=MODEL_ID).to_json() == m
    mutate(m)
    with pytest.raises(ManifestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_manifest(m)


def test_parse_manifest_ids():
    m = _good_manifest()
    with pytest.raises(ModelMismatchError, match="cd" * 32):
        parse_manifest(m, model_id="cd" * 32)
    with pytest.raises(ManifestError, match="was asked for"):
        parse_manifest(m, template_id="other")


def test_client_config_validates():
    with pytest.raises(ValueError, match="max_attempts"):
        ClientConfig(max_attempts=0)
    with pytest.raises(ValueError, match="base_url"):
        ShardClient("ftp://x")


async def test_a_large_json_body_is_read_whole_and_the_limit_still_holds(aiohttp_server):
    """A per-step manifest runs to hundreds of KB: one ``content.read(n)`` returns only what has arrived, so the
    client must read to the end (it once parsed a truncated manifest: 'Unterminated string')."""
    templates = [{"id": f"t-{i:05d}", "model_id": "ab" * 32, "note": "x" * 200} for i in range(2000)]  # ~0.5 MB

    async def catalog(request):
        return web.json_response({"model_id": "ab" * 32, "templates": templates})

    app = web.Application()
    app.router.add_get("/v1/templates", catalog)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    async with ShardClient(url, config=ClientConfig(max_attempts=1)) as client:
        got = await client.get_catalog()
    assert len(got["templates"]) == 2000 and got["templates"][-1]["id"] == "t-01999"
    async with ShardClient(url, config=ClientConfig(max_attempts=1, max_json_bytes=100_000)) as client:
        with pytest.raises(FetchError, match="over the client's limit"):
            await client.get_catalog()

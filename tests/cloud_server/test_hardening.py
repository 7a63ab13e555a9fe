"""Bad input against the cloud server (issue 15): Range forms, multipart bodies, token bytes, cache headers behind
a read token, admission under concurrent uploads, client disconnects; plus a hypothesis fuzz that never sees a 5xx.
"""

import asyncio
import io
import socket
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from cloud_server.app import create_app, parse_range
from cloud_server.config import ServerConfig
from cloud_server.http_util import _Unsatisfiable

from ..synthetic_templates import SyntheticModel, make_synthetic_template, synthetic_precompute
from .conftest import MODEL_ID, READ_TOKEN, WRITE_TOKEN

AUTH_W = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def _png(side=40, seed=0) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


# ---- Range ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        "bytes=¹-²",  # superscript digits: str.isdigit() accepts them, int() does not (was a 500)
        "bytes=٣-٥",  # Arabic-Indic digits: int() accepts them, RFC 9110 does not (was a 206)
        "bytes=" + "9" * 5000 + "-",  # over Python's int-digits limit (was a 500)
        "bytes=" + "9" * 5000 + "-" + "9" * 5000,
        "bytes=1-x",
        "bytes=-",
        "bytes=0-1,x",
    ],
)
def test_parse_range_refuses_non_ascii_and_huge_numbers(header):
    with pytest.raises(_Unsatisfiable):
        parse_range(header, 8192)


def test_parse_range_clamps_huge_ends_and_ignores_several_ranges():
    assert parse_range("bytes=0-" + "9" * 5000, 8192) == (0, 8192)
    assert parse_range("bytes=-" + "9" * 5000, 8192) == (0, 8192)
    assert parse_range("bytes=0-1,5-9", 8192) is None  # several ranges: the whole shard, 200
    assert parse_range("bytes=0-1, 5-", 8192) is None


async def test_bad_ranges_over_http(aiohttp_client, make_app, manifest):
    digest = manifest["shards"][0]["representations"][2]["digest"]
    client = await aiohttp_client(make_app())
    url = f"/v1/shards/{digest}"
    for header in ("bytes=٣-٥", "bytes=" + "1" * 5000 + "-"):
        resp = await client.get(url, headers={"Range": header})
        body = await resp.json()
        assert resp.status == 416 and len(body["error"]) < 200, body  # the header is not echoed whole
    resp = await client.get(url, headers={"Range": "bytes=0-1,5-9"})
    assert resp.status == 200 and len(await resp.read()) == 8192
    resp = await client.get(url, headers=[("Range", "bytes=0-9"), ("Range", "bytes=100-199")])
    assert resp.status == 416 and "2 Range header fields" in (await resp.json())["error"]
    metrics = await (await client.get("/metrics")).text()
    assert "sakura_errors_total 0" in metrics


# ---- tokens, cache headers -------------------------------------------------------------------------------------
async def _raw_request(port: int, request: bytes) -> int:
    """Send raw bytes, return the response's status code (0 when the server closed without answering)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
    finally:
        writer.close()
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


async def test_non_utf8_authorization_gets_401(aiohttp_server, make_app, manifest):
    server = await aiohttp_server(make_app(read_token=READ_TOKEN))
    for path in (b"/v1/templates", b"/v1/jobs/" + b"0" * 32):
        req = (
            b"GET "
            + path
            + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3(\r\nConnection: close\r\n\r\n"
        )
        assert await _raw_request(server.port, req) == 401


async def test_read_token_makes_shards_and_manifests_private(aiohttp_client, make_app, manifest):
    digest = manifest["shards"][0]["representations"][0]["digest"]
    auth = {"Authorization": f"Bearer {READ_TOKEN}"}
    client = await aiohttp_client(make_app(read_token=READ_TOKEN))
    resp = await client.get(f"/v1/shards/{digest}", headers=auth)
    assert resp.status == 200 and resp.headers["Cache-Control"].startswith("private")
    assert "public" not in resp.headers["Cache-Control"]
    resp = await client.get("/v1/templates/tpl-a/manifest", headers=auth)
    assert resp.status == 200 and resp.headers["Cache-Control"] == "private, no-cache"
    open_client = await aiohttp_client(make_app())
    resp = await open_client.get(f"/v1/shards/{digest}")
    assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"


# ---- multipart, image errors -------------------------------------------------------------------------------------
_BOUNDARY = "xyzzy"
_MP = {"Content-Type": f"multipart/form-data; boundary={_BOUNDARY}", **AUTH_W}


def _form(*chunks: bytes) -> bytes:
    return b"".join(chunks)


MALFORMED_FORMS = {
    "truncated after a part header": _form(
        b"--xyzzy\r\n", b'Content-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n', b"\x89PNG"
    ),
    "no closing boundary": _form(b"--xyzzy\r\n", b'Content-Disposition: form-data; name="id"\r\n\r\nabc\r\n'),
    "garbage before the first boundary only": b"hello world",
    "part header without a blank line": _form(b'--xyzzy\r\nContent-Disposition: form-data; name="id"\r\n'),
    "nested multipart": _form(
        b"--xyzzy\r\n",
        b"Content-Type: multipart/mixed; boundary=inner\r\n\r\n",
        b"--inner\r\n\r\nx\r\n--inner--\r\n",
        b"--xyzzy--\r\n",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_FORMS))
async def test_malformed_multipart_gets_400(aiohttp_client, make_app, store, name):
    client = await aiohttp_client(make_app())
    resp = await client.post("/v1/templates", data=MALFORMED_FORMS[name], headers=_MP)
    assert resp.status == 400, (name, await resp.text())
    resp = await client.post(
        "/v1/templates", data=MALFORMED_FORMS[name], headers={**_MP, "Content-Type": "multipart/form-data"}
    )  # no boundary at all
    assert resp.status == 400
    assert store.list_templates() == []


async def test_unreadable_image_message_names_no_python_object(aiohttp_client, make_app):
    client = await aiohttp_client(make_app())
    resp = await client.post(
        "/v1/templates?id=x", data=b"\x89PNG\r\n\x1a\n" + b"\0" * 64, headers={"Content-Type": "image/png", **AUTH_W}
    )
    error = (await resp.json())["error"]
    assert resp.status == 400 and "object at 0x" not in error and "_io." not in error, error


# ---- admission --------------------------------------------------------------------------------------------------
def _gated_app(store, store_cfg, gate: threading.Event, **overrides):
    def slow(model, image, template_id, **kw):
        gate.wait(60)  # holds the precompute worker, so accepted jobs stay pending
        return synthetic_precompute(model, image, template_id, **kw)

    cfg = ServerConfig(**store_cfg, model=None, write_token=WRITE_TOKEN, shutdown_timeout_s=5, **overrides)
    return create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=slow)


async def test_concurrent_uploads_respect_the_pending_limit(aiohttp_client, store, store_cfg):
    gate = threading.Event()
    client = await aiohttp_client(_gated_app(store, store_cfg, gate, max_pending_jobs=4))
    try:
        posts = [
            client.post(f"/v1/templates?id=t{i}", data=_png(seed=i), headers={"Content-Type": "image/png", **AUTH_W})
            for i in range(8)
        ]
        statuses = sorted([r.status for r in await asyncio.gather(*posts)])
        assert statuses == [202] * 4 + [429] * 4
    finally:
        gate.set()


async def test_concurrent_uploads_of_one_id_get_one_202(aiohttp_client, store, store_cfg):
    gate = threading.Event()
    client = await aiohttp_client(_gated_app(store, store_cfg, gate))
    try:
        posts = [
            client.post("/v1/templates?id=same", data=_png(seed=i), headers={"Content-Type": "image/png", **AUTH_W})
            for i in range(6)
        ]
        statuses = sorted([r.status for r in await asyncio.gather(*posts)])
        assert statuses == [202] + [409] * 5
        # a refused upload (bad image) gives its reserved slot back
        resp = await client.post("/v1/templates?id=bad", data=b"nope", headers={"Content-Type": "image/png", **AUTH_W})
        assert resp.status == 400
        assert sum(j.state == "queued" or j.state == "running" for j in client.app[_state_key()].jobs.values()) == 1
    finally:
        gate.set()


def _state_key():
    from cloud_server.state import STATE_KEY

    return STATE_KEY


# ---- client disconnects -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("close", ["rst", "fin", "shutdown"])
@pytest.mark.parametrize("sendfile", ["native", "fallback"])
async def test_client_disconnects_are_counted_as_aborted_not_errors(
    aiohttp_server, store, store_cfg, monkeypatch, caplog, sendfile, close
):
    if sendfile == "fallback":  # asyncio's copy fallback (no sendfile(2) for this file/transport) raises a plain
        loop = asyncio.get_running_loop()  # ConnectionError("Connection closed by peer") when the client leaves

        async def unavailable(*args, **kwargs):
            raise asyncio.SendfileNotAvailableError("forced by the test")

        monkeypatch.setattr(loop, "_sendfile_native", unavailable)
    big = make_synthetic_template(store, "big", model_id=MODEL_ID, level_bytes=(100, 8 * 2**20))
    digest = big["shards"][0]["representations"][1]["digest"]
    cfg = ServerConfig(**store_cfg, model=None, write_token=WRITE_TOKEN)
    app = create_app(cfg, store=store, model=SyntheticModel(MODEL_ID))
    server = await aiohttp_server(app)
    clients = 10

    def leave_mid_transfer() -> None:  # blocking sockets: run in a thread, the server runs on this loop
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(f"GET /v1/shards/{digest} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.recv(1024)  # the headers arrived: the body is being sent
        if close == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif close == "shutdown":
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    for _ in range(clients):
        await asyncio.to_thread(leave_mid_transfer)
    m = app[_state_key()].metrics
    for _ in range(200):  # bounded: until every handler has seen its client go
        if m.in_flight == 0 and m.aborted + m.errors >= clients:
            break
        await asyncio.sleep(0.05)
    assert m.errors == 0 and m.aborted == clients and m.responses.get("5xx", 0) == 0, (m.errors, m.aborted)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no tracebacks either


# ---- fuzz: Range, Authorization and multipart bytes never get a 5xx ---------------------------------------------------
_HEADER_BYTES = st.binary(max_size=80).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\0", b""))
_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class _Fuzz:
    """One server for every example (hypothesis and function-scoped async fixtures do not mix)."""

    def __init__(self, store, store_cfg):
        self.manifest = make_synthetic_template(store, "fz", model_id=MODEL_ID, level_bytes=(100, 4096))
        self.digest = self.manifest["shards"][0]["representations"][1]["digest"]
        cfg = ServerConfig(
            **store_cfg, model=None, write_token=WRITE_TOKEN, read_token=READ_TOKEN, max_pending_jobs=64
        )
        self.app = create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=synthetic_precompute)
        self.loop = asyncio.new_event_loop()
        from aiohttp import web

        self.runner = web.AppRunner(self.app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        from sakura_core.http_serving import bound_port

        self.port = bound_port(self.runner)

    def status(self, request: bytes) -> int:
        return self.loop.run_until_complete(_raw_request(self.port, request))

    def close(self) -> None:
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()


@pytest.fixture
def fuzz(store, store_cfg):
    f = _Fuzz(store, store_cfg)
    yield f
    assert f.app[_state_key()].metrics.errors == 0
    f.close()


@_FUZZ
@given(rng=_HEADER_BYTES, auth=_HEADER_BYTES)
def test_fuzz_range_and_authorization_headers(fuzz, rng, auth):
    req = (
        b"GET /v1/shards/" + fuzz.digest.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer " + READ_TOKEN.encode() + b"\r\nRange: bytes=" + rng + b"\r\n\r\n"
    )
    assert fuzz.status(req) < 500
    req = b"GET /v1/templates HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + auth + b"\r\n\r\n"
    assert fuzz.status(req) < 500


_PART = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(
        [
            b"--b\r\n",
            b"--b--\r\n",
            b"\r\n",
            b'Content-Disposition: form-data; name="id"\r\n',
            b'Content-Disposition: form-data; name="image"; filename="x.png"\r\n',
            b"Content-Type: multipart/mixed; boundary=c\r\n",
            b"--c\r\n",
            b"abc",
            _png(8),
        ]
    ),
)


@_FUZZ
@given(parts=st.lists(_PART, max_size=10), ctype=st.sampled_from([b"boundary=b", b"boundary=", b"", b'boundary="b']))
def test_fuzz_multipart_upload(fuzz, parts, ctype):
    body = b"".join(parts)
    req = (
        b"POST /v1/templates?id=fz-up HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
        + WRITE_TOKEN.encode()
        + b"\r\nContent-Type: multipart/form-data; "
        + ctype
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    assert fuzz.status(req) < 500


@settings(max_examples=500, deadline=None)
@given(value=st.text(max_size=60), size=st.integers(0, 10**6))
def test_fuzz_parse_range_never_raises_anything_else(value, size):
    try:
        got = parse_range(value, size)
    except _Unsatisfiable:
        return
    if got is not None:
        offset, count = got
        assert 0 <= offset < size and 1 <= count <= size - offset

"""Shared fixtures of the cloud-server tests: a store holding a synthetic template, and an app factory.

``store`` is parametrised: every test that uses it runs on a ``LocalStore`` and on an ``S3Store`` in a bucket of a
real S3 server (Ceph's radosgw, one per test session: ``radosgw``). Without Ceph the S3 half skips with the reason,
and fails instead under ``CI=true`` (``.ci/run`` installs Ceph).
"""

import asyncio
import itertools
import os
import re
import sys
import uuid

import pytest
from ci_deps import require_or_skip

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel, make_synthetic_template, synthetic_precompute

MODEL_ID = "ab" * 32
WRITE_TOKEN = "write-token-0123"
READ_TOKEN = "read-token-4567"
S3_BUCKET = "sakura-tests"

_prefixes = itertools.count()


def unavailable(reason: str):
    """Skip with ``reason``; under CI (``CI=true``) fail instead: CI installs every server these tests need
    (``ci_deps.require_or_skip``, the one mechanism)."""
    require_or_skip(False, reason)


@pytest.fixture(scope="session")
def skip_or_fail():
    """``skip_or_fail(reason)``: ``unavailable`` as a fixture, for test modules starting servers of their own."""
    return unavailable


@pytest.fixture(scope="session")
def radosgw(tmp_path_factory):
    """A real S3 server for the session: mon + memstore OSD + radosgw on 127.0.0.1, its credentials in the
    process environment (so ``sakura`` subprocesses find them too) and the bucket ``sakura-tests``."""
    from sakura_tools.infra.radosgw import RadosGateway, RadosGatewayError, missing_ceph_binaries

    missing = missing_ceph_binaries()
    if missing:
        unavailable(
            f"Ceph radosgw is not installed (missing {', '.join(missing)}; apt-get install ceph-mon ceph-osd "
            "radosgw ceph-common): S3 store tests skipped"
        )
    try:
        import boto3  # noqa: F401
    except ImportError:
        unavailable("the S3 store needs boto3 (pip install 'sakura-kv[cloud]'): S3 store tests skipped")
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


# ---- a gate in front of the S3 server: hold or cut one request, to kill a writer at an exact point ---------------
class Hold:
    """One matching request, held: ``arrived`` is set when it comes; ``release(forward)`` lets it through (or drops
    it: the writer was killed meanwhile). With ``cut``, half its body is sent on to S3 and the connection closed.
    With ``every``, every matching request is held (``count`` of them came) until the release."""

    def __init__(self, method: str, pattern: str, cut: bool = False, every: bool = False):
        self.method, self.regex, self.cut, self.every = method, re.compile(pattern), cut, every
        self.arrived, self._released = asyncio.Event(), asyncio.Event()
        self.forward = True
        self.used = False
        self.count = 0

    def release(self, forward: bool = True) -> None:
        self.forward = forward
        self._released.set()


class S3Gate:
    """An HTTP proxy on 127.0.0.1 in front of the radosgw. Requests pass unchanged (same Host header, so their
    signatures hold) except the first one matching each ``hold(...)`` (each one with ``every``), and those an
    ``answer(...)`` rule answers itself; ``seen`` lists (method, path) of all."""

    def __init__(self, upstream_url: str):
        self.upstream = upstream_url
        self.holds: list[Hold] = []
        self.answers: list[tuple[str, re.Pattern, object]] = []
        self.seen: list[tuple[str, str]] = []
        self.port: int | None = None
        self._runner = self._session = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self, method: str, pattern: str, *, cut: bool = False, every: bool = False) -> Hold:
        h = Hold(method, pattern, cut, every)
        self.holds.append(h)
        return h

    def answer(self, method: str, pattern: str, reply) -> None:
        """Every matching request is answered by ``await reply(gate, request, body)`` (a response; it may
        ``await gate.forward(...)`` first) instead of being passed through."""
        self.answers.append((method, re.compile(pattern), reply))

    async def stop_listening(self) -> None:
        """Close the gate's port: a client of it now finds its endpoint refusing connections."""
        await self._runner.cleanup()
        self._runner = None

    async def start(self) -> "S3Gate":
        import aiohttp
        from aiohttp import web

        from sakura_core.http_serving import bound_port

        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = bound_port(self._runner)
        return self

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        self.seen.append((request.method, request.path))
        for h in self.holds:
            if not h.used and h.method == request.method and h.regex.search(request.path):
                h.used = not h.every
                h.count += 1
                h.arrived.set()
                if h.cut:
                    await self._send_half(request, body)
                await h._released.wait()
                if h.cut or not h.forward:
                    return web.Response(status=503, text="dropped by the test gate")
        for method, regex, reply in self.answers:
            if method == request.method and regex.search(request.path):
                return await reply(self, request, body)
        status, out, payload = await self.forward(request, body)
        return web.Response(status=status, headers=out, body=payload)

    async def forward(self, request, body: bytes, drop: tuple[str, ...] = ()) -> tuple[int, dict, bytes]:
        """``request`` sent on to S3 (less the headers named in ``drop``): its (status, headers, body)."""
        skip = _HOP | {"content-length", "expect", *drop}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        async with self._session.request(
            request.method, self.upstream + request.raw_path, headers=headers, data=body, allow_redirects=False
        ) as r:
            payload = await r.read()
            out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP and k.lower() != "content-length"}
            return r.status, out, payload

    async def _send_half(self, request, body: bytes) -> None:
        """The request line, its headers and half its body straight to S3, then a closed connection."""
        host, port = self.upstream.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        head = f"{request.method} {request.raw_path} HTTP/1.1\r\n".encode()
        head += b"".join(k + b": " + v + b"\r\n" for k, v in request.raw_headers) + b"\r\n"
        writer.write(head + body[: len(body) // 2])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    async def close(self) -> None:
        for h in self.holds:
            h.release(False)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"})


@pytest.fixture
async def s3_gate(radosgw):
    gate = await S3Gate(radosgw.endpoint_url).start()
    yield gate
    await gate.close()


# ---- sakura serve processes ----------------------------------------------------------------------------------------
async def _start_serve(store_url: str, *extra: str, endpoint: str | None = None):
    argv = [sys.executable, "-m", "sakura_core.cli", "serve", "--store", store_url, "--port", "0", *extra]
    if endpoint is not None:
        argv += ["--s3-endpoint", endpoint]
    env = {k: v for k, v in os.environ.items() if k not in ("SAKURA_TOKEN", "SAKURA_READ_TOKEN")}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    line = await asyncio.wait_for(proc.stdout.readline(), 180)
    if not line.startswith(b"serving http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"sakura serve did not start: {line!r} {(await proc.stderr.read()).decode()[-3000:]}")
    return proc, int(line.split()[1].rsplit(b":", 1)[1])


async def _stop(proc) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def sakura_serve():
    """``await sakura_serve(store_url, *args, endpoint=...)`` -> (process, port) of a ``sakura serve`` on a free
    127.0.0.1 port; every one still running is stopped (SIGTERM) after the test."""
    procs = []

    async def start(store_url: str, *extra: str, endpoint: str | None = None):
        proc, port = await _start_serve(store_url, *extra, endpoint=endpoint)
        procs.append(proc)
        return proc, port

    start.stop = _stop
    yield start
    for proc in procs:
        await _stop(proc)


async def run_sakura(*argv: str, timeout_s: float = 300) -> tuple[int, str]:
    """Run ``sakura ARGV``; (exit status, stdout+stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sakura_core.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        raise
    return proc.returncode, out.decode()


@pytest.fixture
def sakura_cli():
    """``await sakura_cli(*argv)`` -> (exit status, output) of a ``sakura`` subprocess."""
    return run_sakura

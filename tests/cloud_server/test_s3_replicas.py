"""Stateless replicas: two ``sakura serve --store s3://...`` processes over one bucket of a real radosgw, behind the
nginx CDN tier, give identical answers; a template another writer publishes shows in both; the gate proxy the crash
tests use passes S3 requests through unchanged."""

import asyncio
import hashlib
import os

import aiohttp

from sakura_core.fetch.client import ShardClient
from sakura_tools.infra.nginx import NginxProcess, find_nginx

from ..synthetic_templates import make_synthetic_template

MODEL_ID = "ab" * 32  # as in conftest.py


async def _get(session, url, **kw) -> tuple[int, dict, bytes]:
    async with session.get(url, **kw) as r:
        return r.status, dict(r.headers), await r.read()


def _same(a: dict, b: dict, *names: str) -> None:
    for name in names:
        assert a.get(name) == b.get(name), (name, a.get(name), b.get(name))


async def test_two_replicas_over_one_bucket_answer_identically_behind_the_cdn(
    radosgw, sakura_serve, skip_or_fail, tmp_path
):
    if find_nginx() is None:
        skip_or_fail("nginx is not installed (apt-get install nginx-light; .ci/run does): replica CDN test skipped")
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/replicas-{os.getpid()}", endpoint_url=radosgw.endpoint_url)
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID, level_bytes=(100, 4096, 8192))
    url = str(store.location)
    procs = [await sakura_serve(url, "--model", "none", endpoint=radosgw.endpoint_url) for _ in range(2)]
    ports = [port for _, port in procs]
    rep = manifest["shards"][1]["representations"][2]
    paths = ["/v1/templates", "/v1/templates/tpl-a/manifest", f"/v1/shards/{rep['digest']}"]
    async with aiohttp.ClientSession() as session:
        for path in paths:
            a, b = [await _get(session, f"http://127.0.0.1:{p}{path}") for p in ports]
            assert a[0] == b[0] == 200 and a[2] == b[2], path
            _same(a[1], b[1], "ETag", "Cache-Control", "Content-Length", "Repr-Digest")
        rng = {"Range": "bytes=100-199"}
        a, b = [await _get(session, f"http://127.0.0.1:{p}{paths[2]}", headers=rng) for p in ports]
        assert a[0] == b[0] == 206 and a[2] == b[2] and len(a[2]) == 100
        _same(a[1], b[1], "Content-Range", "ETag")
        # another writer publishes: both replicas list it once their catalog cache (2 s) expires
        make_synthetic_template(store, "tpl-b", model_id=MODEL_ID, seed=1)
        for _ in range(60):
            bodies = [(await _get(session, f"http://127.0.0.1:{p}/v1/templates"))[2] for p in ports]
            if all(b"tpl-b" in body for body in bodies):
                break
            await asyncio.sleep(0.2)
        assert bodies[0] == bodies[1] and b"tpl-b" in bodies[0]

        with NginxProcess(tmp_path / "nginx", upstream_port=ports) as cdn:
            for _ in range(6):  # round-robin: both replicas answer through the CDN
                status, _, body = await _get(session, f"{cdn.base_url}/v1/templates")
                assert status == 200 and body == bodies[0]
            for port in ports:
                metrics = (await _get(session, f"http://127.0.0.1:{port}/metrics"))[2].decode()
                assert 'sakura_requests_total{route="catalog"}' in metrics
                served = [ln for ln in metrics.splitlines() if ln.startswith('sakura_requests_total{route="catalog"}')]
                assert int(served[0].split()[-1]) >= 2 + 1  # direct reads + at least one via nginx
            first = await _get(session, f"{cdn.base_url}{paths[2]}")
            second = await _get(session, f"{cdn.base_url}{paths[2]}")
            assert first[1]["X-Cache-Status"] == "MISS" and second[1]["X-Cache-Status"] == "HIT"
            assert first[2] == second[2] and hashlib.sha256(second[2]).hexdigest() == rep["digest"]
            async with ShardClient(cdn.base_url) as client:
                assert (await client.get_manifest("tpl-a")).to_json() == manifest
                for shard in manifest["shards"]:
                    for r in shard["representations"]:
                        data = await client.fetch_shard(r["digest"], expected_bytes=r["bytes"])
                        assert hashlib.sha256(data).hexdigest() == r["digest"]


async def test_the_gate_passes_requests_through_unchanged(radosgw, s3_gate):
    """A signed PUT/GET/LIST through the gate works (Host kept), and ``seen`` records them."""
    from cloud_server.s3_store import S3Store

    store = S3Store(f"s3://sakura-tests/gate-{os.getpid()}", endpoint_url=s3_gate.url)
    blob = os.urandom(3 * 2**20)  # > 1 MiB: botocore sends Expect: 100-continue
    digest = hashlib.sha256(blob).hexdigest()
    await asyncio.to_thread(store.put_shard, digest, blob)
    f, size = await asyncio.to_thread(store.open_shard, digest)
    with f:
        assert size == len(blob) and await asyncio.to_thread(f.read) == blob
    assert any(m == "PUT" and p.endswith(digest) for m, p in s3_gate.seen)

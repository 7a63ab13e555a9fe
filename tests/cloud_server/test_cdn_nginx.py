"""CDN tier: a real nginx ``proxy_cache`` on 127.0.0.1 in front of the server caches shards from their headers."""

import hashlib

import aiohttp
from ci_deps import require_or_skip

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from sakura_core.fetch.client import ShardClient
from sakura_tools.infra.nginx import NginxProcess, find_nginx

require_or_skip(
    find_nginx() is not None,
    "nginx is not installed (apt-get install nginx-light; .ci/run does)",
    allow_module_level=True,
)


def _shard_requests(metrics_text: str) -> int:
    for line in metrics_text.splitlines():
        if line.startswith('sakura_requests_total{route="shard"}'):
            return int(line.split()[-1])
    return 0


async def test_second_fetch_is_a_cache_hit_and_byte_identical(aiohttp_server, store, store_cfg, manifest, tmp_path):
    server = await aiohttp_server(create_app(ServerConfig(**store_cfg, model=None), store=store))
    rep = manifest["shards"][0]["representations"][-1]  # the 8 KiB one
    with NginxProcess(tmp_path / "nginx", upstream_port=server.port) as cdn:
        url = f"{cdn.base_url}/v1/shards/{rep['digest']}"
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as r1:
                first = await r1.read()
                assert r1.status == 200 and r1.headers["X-Cache-Status"] == "MISS"
            async with session.get(url) as r2:
                second = await r2.read()
                assert r2.status == 200 and r2.headers["X-Cache-Status"] == "HIT"
                assert r2.headers["ETag"] == f'"{rep["digest"]}"'
                assert r2.headers["Cache-Control"] == "public, max-age=31536000, immutable"
            assert first == second
            assert hashlib.sha256(second).hexdigest() == rep["digest"]
            # a Range request is answered from the cache as well
            async with session.get(url, headers={"Range": "bytes=100-199"}) as r3:
                assert r3.status == 206 and r3.headers["X-Cache-Status"] == "HIT"
                assert await r3.read() == second[100:200]
            # conditional revalidation against the cache
            async with session.get(url, headers={"If-None-Match": f'"{rep["digest"]}"'}) as r4:
                assert r4.status == 304
            async with session.get(f"http://127.0.0.1:{server.port}/metrics") as m:
                assert _shard_requests(await m.text()) == 1  # the origin saw only the first request

        # the verifying client works through the CDN unchanged
        async with ShardClient(cdn.base_url) as client:
            manifest_via_cdn = await client.get_manifest("tpl-a")
            assert manifest_via_cdn.to_json() == manifest
            for shard in manifest["shards"]:
                for r in shard["representations"]:
                    data = await client.fetch_shard(r["digest"], expected_bytes=r["bytes"])
                    assert hashlib.sha256(data).hexdigest() == r["digest"]

"""Cross-origin reads for the phone page ComfyUI serves (``cloud_server/cors.py``): only the origins
``--allow-origin`` names get CORS headers, on the read paths only; a preflight is answered before the token check,
the real request still needs the token; errors are readable by the page; other origins and writes get nothing."""

from __future__ import annotations

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel, make_synthetic_template

COMFY = "http://localhost:8188"
TOKEN = "read-token-4567"


@pytest.fixture
def app(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id="ab" * 32, level_bytes=(100, 4096, 8192))
    config = ServerConfig(
        store_dir=tmp_path / "store", model=None, read_token=TOKEN, allowed_origins=("HTTP://LocalHost:8188/",)
    )
    return create_app(config, store=store, model=SyntheticModel("ab" * 32))


async def test_the_allowed_origin_reads_across_origins(aiohttp_client, app):
    client = await aiohttp_client(app)
    preflight = await client.options(
        "/v1/templates/t/manifest",
        headers={
            "Origin": COMFY,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization,range",
        },
    )
    assert preflight.status == 204  # no token on a preflight, and none asked
    assert preflight.headers["Access-Control-Allow-Origin"] == COMFY
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    assert preflight.headers["Access-Control-Allow-Methods"] == "GET, HEAD"
    listed = await client.get("/v1/templates", headers={"Origin": COMFY, "Authorization": f"Bearer {TOKEN}"})
    assert listed.status == 200 and listed.headers["Access-Control-Allow-Origin"] == COMFY
    assert listed.headers["Vary"] == "Origin" and "Content-Range" in listed.headers["Access-Control-Expose-Headers"]
    assert listed.headers["Cross-Origin-Resource-Policy"] == "cross-origin"
    refused = await client.get("/v1/templates", headers={"Origin": COMFY})  # the token is still checked
    assert refused.status == 401 and refused.headers["Access-Control-Allow-Origin"] == COMFY  # readable error
    manifest = await (
        await client.get("/v1/templates/tpl-a/manifest", headers={"Authorization": f"Bearer {TOKEN}", "Origin": COMFY})
    ).json()
    digest = manifest["shards"][0]["representations"][-1]["digest"]
    shard = await client.get(
        f"/v1/shards/{digest}", headers={"Origin": COMFY, "Authorization": f"Bearer {TOKEN}", "Range": "bytes=10-"}
    )
    assert shard.status == 206 and shard.headers["Access-Control-Allow-Origin"] == COMFY  # a streamed body too
    missing = await client.get(
        "/v1/templates/nope/manifest", headers={"Origin": COMFY, "Authorization": f"Bearer {TOKEN}"}
    )
    assert missing.status == 404 and missing.headers["Access-Control-Allow-Origin"] == COMFY


async def test_other_origins_paths_and_methods_get_no_cors(aiohttp_client, app):
    client = await aiohttp_client(app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    other = await client.get("/v1/templates", headers={"Origin": "http://evil.example", **auth})
    assert other.status == 200 and "Access-Control-Allow-Origin" not in other.headers
    foreign = await client.options(
        "/v1/templates", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}
    )
    assert foreign.status in (401, 405) and "Access-Control-Allow-Origin" not in foreign.headers
    health = await client.get("/healthz", headers={"Origin": COMFY})
    assert "Access-Control-Allow-Origin" not in health.headers  # not a path the page reads
    write = await client.options("/v1/templates", headers={"Origin": COMFY, "Access-Control-Request-Method": "POST"})
    assert write.status == 403 and "read-only across origins" in (await write.json())["error"]
    assert "Access-Control-Allow-Origin" not in write.headers


def test_a_bad_origin_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"allowed origin 'http://x:1/path' must be scheme://host\[:port\]"):
        ServerConfig(store_dir=tmp_path, model=None, allowed_origins=("http://x:1/path",))


def test_sakura_serve_takes_allow_origin(tmp_path):
    import argparse

    from cloud_server.cli_serve import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--store",
            str(tmp_path),
            "--model",
            "none",
            "--allow-origin",
            COMFY,
            "--allow-origin",
            "http://192.168.1.5:8188",
        ]
    )
    assert config_from_args(args).allowed_origins == (COMFY, "http://192.168.1.5:8188")

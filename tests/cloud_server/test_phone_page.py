"""``sakura serve`` serves the phone page at ``/phone``: the page, its modules and fzstd, same-origin isolated
(COOP/COEP/CORP), open even behind a read token; nothing outside ``phone_web/`` and no other kind of file."""

from __future__ import annotations

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.phone_page import PHONE_WEB
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel

MODEL_ID = "ab" * 32


@pytest.fixture
def app(tmp_path):
    store = LocalStore(tmp_path / "store")
    return create_app(
        ServerConfig(store_dir=tmp_path / "store", model=None, read_token="read-token-4567"),
        store=store,
        model=SyntheticModel(MODEL_ID),
    )


async def test_the_page_and_its_modules_are_served_isolated(aiohttp_client, app):
    client = await aiohttp_client(app)
    page = await client.get("/phone")  # no token: the page is code, not data
    assert page.status == 200 and page.content_type == "text/html"
    text = await page.text()
    assert '<base href="/phone/">' in text and '"fzstd": "./vendor/fzstd.mjs"' in text and "./src/index.js" in text
    for path in ("/phone", "/phone/", "/phone/src/index.js", "/phone/src/sakura_codec.js"):
        r = await client.get(path)
        assert r.status == 200, path
        assert r.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert r.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert r.headers["Cross-Origin-Resource-Policy"] == "same-origin"
        assert "Access-Control-Allow-Origin" not in r.headers
    module = await client.get("/phone/src/chain.js")
    assert module.content_type == "text/javascript"
    assert await module.read() == (PHONE_WEB / "src" / "chain.js").read_bytes()
    head = await client.head("/phone/src/index.js")
    assert head.status == 200
    # the API itself still wants the token
    assert (await client.get("/v1/templates")).status == 401


async def test_fzstd_comes_from_node_modules_or_a_clear_404(aiohttp_client, app):
    client = await aiohttp_client(app)
    r = await client.get("/phone/vendor/fzstd.mjs")
    if (PHONE_WEB / "node_modules" / "fzstd").is_dir():
        assert r.status == 200 and r.content_type == "text/javascript"
    else:
        assert r.status == 404 and "npm ci" in (await r.json())["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/phone/src/../package.json",
        "/phone/src/%2e%2e/package.json",
        "/phone/package.json",
        "/phone/src/missing.js",
        "/phone/node_modules/fzstd/package.json",
        "/phone/test/run_vectors.mjs",
        "/phone/src/format_constants.json",
        "/phone/src/",
        "/phone/src/..%2f..%2fcloud_server%2fapp.py",
    ],
)
async def test_nothing_else_is_served(aiohttp_client, app, path):
    client = await aiohttp_client(app)
    r = await client.get(path)
    assert r.status in (400, 404), (path, r.status)

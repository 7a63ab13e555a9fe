"""``If-Match`` compares strongly everywhere (RFC 9110 13.1.1; issue 28): shards did already, the manifest and the
catalog ignored the header on main (200 for any tag); now a tag that is not theirs, or only weakly equal, is 412."""

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..synthetic_templates import SyntheticModel, make_synthetic_template
from .conftest import MODEL_ID


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    return await aiohttp_client(
        create_app(ServerConfig(store_dir=store.root, model=None), store=store, model=SyntheticModel(MODEL_ID))
    )


@pytest.mark.parametrize("path", ["/v1/templates/tpl-a/manifest", "/v1/templates"])
async def test_if_match_on_json_is_strong(client, path):
    etag = (await client.get(path)).headers["ETag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    for ok in (etag, f'"x", {etag}', "*"):
        r = await client.get(path, headers={"If-Match": ok})
        assert r.status == 200, (ok, r.status)
    for bad in ('"other"', f"W/{etag}", f'"x", W/{etag}', etag.strip('"')):
        r = await client.get(path, headers={"If-Match": bad})
        assert r.status == 412, (bad, r.status)  # main: 200 whatever the tag
        assert "does not match" in (await r.json())["error"]
    r = await client.get(path, headers={"If-Match": "W/" + etag + ", " + '"y"' * 100})
    assert r.status == 412 and len((await r.json())["error"]) < 200  # a long header is not echoed whole


async def test_if_match_on_a_shard_stays_strong(client, tmp_path):
    manifest = await (await client.get("/v1/templates/tpl-a/manifest")).json()
    digest = manifest["shards"][0]["representations"][0]["digest"]
    url = f"/v1/shards/{digest}"
    assert (await client.get(url, headers={"If-Match": f'"{digest}"'})).status == 200
    assert (await client.get(url, headers={"If-Match": f'W/"{digest}"'})).status == 412

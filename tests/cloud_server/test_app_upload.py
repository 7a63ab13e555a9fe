"""The aiohttp app in-process (pytest-aiohttp), its write path: the write token, uploads (multipart and raw body),
their limits and checks, and a precompute that fails publishing nothing."""

import asyncio
import io

import numpy as np
import pytest
from aiohttp import FormData
from PIL import Image

from .conftest import MODEL_ID, READ_TOKEN, WRITE_TOKEN

AUTH_W = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def _png(side=40, seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


async def test_write_path_needs_the_token(aiohttp_client, make_app):
    client = await aiohttp_client(make_app())
    resp = await client.post("/v1/templates?id=t1", data=_png(), headers={"Content-Type": "image/png"})
    assert resp.status == 401
    resp = await client.post(
        "/v1/templates?id=t1",
        data=_png(),
        headers={"Content-Type": "image/png", "Authorization": f"Bearer {READ_TOKEN}"},
    )
    assert resp.status == 401
    disabled = await aiohttp_client(make_app(write_token=None))
    resp = await disabled.post("/v1/templates?id=t1", data=_png(), headers={"Content-Type": "image/png", **AUTH_W})
    assert resp.status == 403


async def _wait_job(client, status_url, timeout_s=10.0):
    for _ in range(int(timeout_s / 0.02)):
        job = await (await client.get(status_url, headers=AUTH_W)).json()
        if job["state"] in ("done", "failed"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {status_url} did not finish: {job}")


async def test_upload_multipart_precomputes_and_publishes(aiohttp_client, make_app, store, stored):
    client = await aiohttp_client(make_app())
    form = FormData()
    form.add_field("id", "new-tpl")
    form.add_field("image", _png(), filename="t.png", content_type="image/png")
    resp = await client.post("/v1/templates", data=form, headers=AUTH_W)
    assert resp.status == 202, await resp.text()
    job = await resp.json()
    assert resp.headers["Location"] == job["status_url"]
    job = await _wait_job(client, job["status_url"])
    assert job["state"] == "done", job
    assert job["manifest_url"] == "/v1/templates/new-tpl/manifest"
    manifest = await (await client.get(job["manifest_url"])).json()
    assert manifest["template_id"] == "new-tpl" and manifest["model_id"] == MODEL_ID
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            assert store.has_shard(rep["digest"])
    assert stored("templates/new-tpl/source.png") == _png()
    catalog = await (await client.get("/v1/templates")).json()
    assert "new-tpl" in [t["id"] for t in catalog["templates"]]
    # the same id again: conflict
    resp = await client.post("/v1/templates?id=new-tpl", data=_png(1), headers={"Content-Type": "image/png", **AUTH_W})
    assert resp.status == 409


async def test_upload_raw_body(aiohttp_client, make_app, store):
    client = await aiohttp_client(make_app())
    resp = await client.post("/v1/templates?id=raw-1", data=_png(), headers={"Content-Type": "image/png", **AUTH_W})
    assert resp.status == 202
    job = await _wait_job(client, (await resp.json())["status_url"])
    assert job["state"] == "done" and store.has_template("raw-1")


@pytest.mark.parametrize("bad_id", ["", "UPPER", "a/b", "../x", "a" * 65, "a b"])
async def test_upload_rejects_bad_ids(aiohttp_client, make_app, store, bad_id):
    client = await aiohttp_client(make_app())
    form = FormData()
    form.add_field("id", bad_id)
    form.add_field("image", _png(), filename="t.png", content_type="image/png")
    resp = await client.post("/v1/templates", data=form, headers=AUTH_W)
    assert resp.status == 400
    assert store.list_templates() == []


async def test_upload_size_limit_413(aiohttp_client, make_app, store):
    client = await aiohttp_client(make_app(max_upload_bytes=2048))
    # declared too large up front (raw body over the limit + the 64 KiB multipart slack): refused before reading
    resp = await client.post(
        "/v1/templates?id=big", data=b"\0" * 200_000, headers={"Content-Type": "image/png", **AUTH_W}
    )
    assert resp.status == 413
    assert "upload of 200000 bytes is over the limit of 2048" in (await resp.json())["error"]
    # a real PNG over the limit but under the slack: its Content-Length passes, reading it stops at the limit
    big = _png(side=40)
    assert 2048 < len(big) < 64 * 2**10
    resp = await client.post("/v1/templates?id=big", data=big, headers={"Content-Type": "image/png", **AUTH_W})
    assert resp.status == 413
    assert "the image is over the limit of 2048 bytes" in (await resp.json())["error"]
    # multipart whose image part is over the limit while the request is under the multipart slack
    form = FormData()
    form.add_field("id", "big")
    form.add_field("image", b"\x89PNG" + b"\0" * 4000, filename="t.png", content_type="image/png")
    resp = await client.post("/v1/templates", data=form, headers=AUTH_W)
    assert resp.status == 413
    assert store.list_templates() == []


async def test_upload_rejects_non_images_and_wrong_types(aiohttp_client, make_app):
    client = await aiohttp_client(make_app())
    resp = await client.post(
        "/v1/templates?id=x", data=b"not an image", headers={"Content-Type": "image/png", **AUTH_W}
    )
    assert resp.status == 400 and "image" in (await resp.json())["error"]
    resp = await client.post("/v1/templates?id=x", data=b"{}", headers={"Content-Type": "application/json", **AUTH_W})
    assert resp.status == 415
    gif = io.BytesIO()
    Image.new("RGB", (16, 16)).save(gif, format="GIF")
    resp = await client.post(
        "/v1/templates?id=x", data=gif.getvalue(), headers={"Content-Type": "image/png", **AUTH_W}
    )
    assert resp.status == 400 and "GIF" in (await resp.json())["error"]


async def test_upload_without_a_model_is_refused(aiohttp_client, store, store_cfg):
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    app = create_app(ServerConfig(**store_cfg, model=None, write_token=WRITE_TOKEN), store=store)
    client = await aiohttp_client(app)
    resp = await client.post("/v1/templates?id=x", data=_png(), headers={"Content-Type": "image/png", **AUTH_W})
    assert resp.status == 409 and "no model" in (await resp.json())["error"]


async def test_failing_precompute_publishes_nothing(aiohttp_client, store, store_cfg):
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig

    from ..synthetic_templates import SyntheticModel

    def broken(model, image, template_id, **kw):
        kw["progress"]("encode", 0, 2)
        raise RuntimeError("codec exploded")

    app = create_app(
        ServerConfig(**store_cfg, model=None, write_token=WRITE_TOKEN),
        store=store,
        model=SyntheticModel(MODEL_ID),
        precompute_fn=broken,
    )
    client = await aiohttp_client(app)
    resp = await client.post("/v1/templates?id=boom", data=_png(), headers={"Content-Type": "image/png", **AUTH_W})
    job = await _wait_job(client, (await resp.json())["status_url"])
    assert job["state"] == "failed" and "codec exploded" in job["error"]
    assert not store.has_template("boom")
    assert (await client.get("/v1/jobs/" + "0" * 32, headers=AUTH_W)).status == 404
    assert (await client.get("/v1/jobs/nope", headers=AUTH_W)).status == 404


@pytest.mark.parametrize("profile", [None, "full"])
async def test_an_upload_is_published_in_the_configured_store_profile(aiohttp_client, tmp_path, profile):
    """An upload keeps what ``sakura serve --store-profile`` says: ``serving`` unless told ``full``."""
    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from cloud_server.store import LocalStore

    from ..synthetic_templates import SyntheticModel, synthetic_precompute

    asked = []

    def recording(model, image, template_id, **kw):
        asked.append(kw.get("store_profile"))
        return synthetic_precompute(model, image, template_id, **kw)

    store = LocalStore(tmp_path / "store")
    extra = {} if profile is None else {"store_profile": profile}
    cfg = ServerConfig(store_dir=store.root, model=None, write_token=WRITE_TOKEN, **extra)
    client = await aiohttp_client(
        create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=recording)
    )
    resp = await client.post("/v1/templates?id=up", data=_png(), headers={"Content-Type": "image/png", **AUTH_W})
    job = await _wait_job(client, (await resp.json())["status_url"])
    assert job["state"] == "done", job
    assert asked == [profile or "serving"]
    with pytest.raises(ValueError, match="store_profile must be one of serving, full"):
        ServerConfig(store_dir=store.root, store_profile="fp16")

"""A store folder the server cannot write (issue 28: a read-only mount, another user's folder): ``/healthz`` and
``sakura serve``'s first line say write=off with the reason, an upload is refused with a 503 naming it before its
body is read, and nothing is left in the store; the read path keeps serving."""

import asyncio
import sys

import pytest
from aiohttp import FormData

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore

from ..readonly import read_only
from ..synthetic_templates import SyntheticModel, make_synthetic_template, synthetic_precompute
from .conftest import MODEL_ID, WRITE_TOKEN

AUTH_W = {"Authorization": f"Bearer {WRITE_TOKEN}"}


@pytest.fixture
def store(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    return store


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_a_read_only_store_reports_write_off_and_refuses_uploads(aiohttp_client, store):
    before = _files(store.root)
    with read_only(store.root) as errno_name:
        cfg = ServerConfig(store_dir=store.root, model=None, write_token=WRITE_TOKEN)
        app = create_app(cfg, store=store, model=SyntheticModel(MODEL_ID), precompute_fn=synthetic_precompute)
        client = await aiohttp_client(app)
        health = await (await client.get("/healthz")).json()
        assert health["write"] is False, health  # main said write=on
        assert (
            health["write_off"].startswith(f"the store cannot be written: {store.root}: ")
            and errno_name in health["write_off"]
        )
        form = FormData()
        form.add_field("id", "new-tpl")
        form.add_field("image", b"\x89PNG not read", filename="t.png", content_type="image/png")
        r = await client.post("/v1/templates", data=form, headers=AUTH_W)
        body = await r.json()
        assert r.status == 503 and r.headers["Sakura-Retry"] == "no", body  # main: 202, then a failed job
        assert body["error"].startswith("the store cannot be written") and "make the store writable" in body["error"]
        assert (await client.get("/v1/templates/tpl-a/manifest")).status == 200  # reads go on
        assert _files(store.root) == before  # no probe, temp or half-written file left


async def test_a_writable_store_keeps_write_on(aiohttp_client, store):
    cfg = ServerConfig(store_dir=store.root, model=None, write_token=WRITE_TOKEN)
    client = await aiohttp_client(create_app(cfg, store=store, model=SyntheticModel(MODEL_ID)))
    assert await (await client.get("/healthz")).json() == {"status": "ok", "model_id": MODEL_ID, "write": True}
    no_token = create_app(ServerConfig(store_dir=store.root, model=None), store=store, model=SyntheticModel(MODEL_ID))
    health = await (await (await aiohttp_client(no_token)).get("/healthz")).json()
    assert health["write"] is False and health["write_off"] == "no --token"


async def test_sakura_serve_prints_write_off_with_the_reason(store):
    with read_only(store.root):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sakura_core.cli",
            "serve",
            "--store",
            str(store.root),
            "--port",
            "0",
            "--model",
            "none",
            "--token",
            WRITE_TOKEN,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        finally:
            proc.terminate()
            await proc.wait()
    assert line.startswith("serving http://127.0.0.1:"), line
    assert " write=off (the store cannot be written: " in line  # main: write=on

"""ComfyUI's routes for a phone page (``nodes/page_routes.py``) over HTTP on the stand-in server: the page served at
``/sakura/phone`` with its base tag moved there (same page code as ``/phone``), codes only for the pack's frontend,
pairing refused by name, the bounded long poll handing over a job, a bad result refused, a page leaving."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import web

from android_bridge.page_channel import PageChannelError, PageHub, PageHubConfig

OURS = {"X-Sakura-Request": "1"}


@pytest.fixture
async def page_client(comfy, aiohttp_client):
    hub = PageHub(PageHubConfig(hold_s=0.6, stale_after_s=5))
    table = web.RouteTableDef()
    comfy.nodes.page_routes.page_routes(table, hub)
    app = web.Application()
    app.add_routes(table)
    return await aiohttp_client(app), hub


async def test_the_page_is_served_at_sakura_phone(page_client):
    from android_bridge.page_files import PHONE_WEB

    client, _ = page_client
    page = await client.get("/sakura/phone")
    text = await page.text()
    assert page.status == 200 and page.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert '<base href="/sakura/phone/" data-dispatch="true">' in text and '<base href="/phone/">' not in text
    assert (
        text.replace('<base href="/sakura/phone/" data-dispatch="true">', '<base href="/phone/">')
        == (PHONE_WEB / "page" / "index.html").read_text()
    )  # the same page code, only its base moved
    module = await client.get("/sakura/phone/src/dispatch.js")
    assert module.status == 200 and await module.read() == (PHONE_WEB / "src" / "dispatch.js").read_bytes()
    assert (await client.get("/sakura/phone/src/../../pyproject.toml")).status == 404


async def test_without_npm_the_page_names_the_set_up_step(page_client, monkeypatch, tmp_path):
    import shutil

    from android_bridge import page_files

    client, _ = page_client
    (tmp_path / "page").mkdir()
    shutil.copy(page_files.PHONE_WEB / "page" / "index.html", tmp_path / "page" / "index.html")
    monkeypatch.setattr(page_files, "PHONE_WEB", tmp_path)  # a ComfyUI-Manager install: no node_modules
    answer = await client.get("/sakura/phone/vendor/ort/ort.wasm.min.mjs")
    assert answer.status == 404 and "run `npm ci` in phone_web/" in (await answer.json())["error"]


async def test_pairing_and_a_job_over_http(page_client):
    client, hub = page_client
    assert (await client.post("/sakura/phone/api/code")).status == 403  # not the pack's frontend
    given = await (await client.post("/sakura/phone/api/code", headers=OURS)).json()
    assert len(given["code"]) == 6 and given["path"] == f"/sakura/phone/#code={given['code']}"
    bad = await client.post("/sakura/phone/api/pair", json={"code": "XXXXXX"})
    assert (
        bad.status == 403 and "pairing code 'XXXXXX' is not one this ComfyUI gave out" in (await bad.json())["error"]
    )
    paired = await (
        await client.post(
            "/sakura/phone/api/pair", json={"code": given["code"].lower(), "info": {"browser": "Chrome"}}
        )
    ).json()
    auth = {"Authorization": f"Bearer {paired['token']}"}
    assert paired["code"] == given["code"] and paired["stale_after_s"] == 5
    assert (await client.get("/sakura/phone/api/job", headers={"Authorization": "Bearer nope"})).status == 401
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await (await client.get("/sakura/phone/api/job", headers=auth)).json() == {"job": None}
    assert 0.5 <= loop.time() - t0 < 3  # held about hold_s, no longer
    listed = await (await client.get("/sakura/phone/api/pages", headers=OURS)).json()
    assert [p["code"] for p in listed["pages"]] == [given["code"]] and listed["pages"][0]["info"][
        "browser"
    ] == "Chrome"
    job = hub.submit(given["code"], {"prompt": "p"}, timeout_s=60)
    taken = (await (await client.get("/sakura/phone/api/job", headers=auth)).json())["job"]
    assert taken == {"job_id": job.job_id, "prompt": "p"}
    token, job_id = paired["token"], job.job_id
    beat = await client.post(
        "/sakura/phone/api/beat", json={"token": token, "job_id": job_id, "progress": {"phase": "computed", "done": 1}}
    )
    assert await beat.json() == {"cancel": False} and job.progress["done"] == 1
    rgba = base64.b64encode(bytes(2 * 2 * 4)).decode()
    short = await client.post(
        "/sakura/phone/api/result",
        json={"token": token, "job_id": job_id, "width": 3, "height": 2, "rgba_b64": rgba, "report": {}},
    )
    assert short.status == 400 and "not 3x2 RGBA (24)" in (await short.json())["error"]
    ok = await client.post(
        "/sakura/phone/api/result",
        json={"token": token, "job_id": job_id, "width": 2, "height": 2, "rgba_b64": rgba, "report": {"steps": 1}},
    )
    assert ok.status == 200 and hub.wait(job, 0)["report"] == {"steps": 1}


async def test_a_page_saying_goodbye_fails_its_job(page_client):
    client, hub = page_client
    code, _ = hub.new_code()
    token = hub.pair(code, {})
    job = hub.submit(code, {}, timeout_s=60)
    hub.take_job(token)
    beacon = await client.post(
        "/sakura/phone/api/bye", data=f'{{"token": "{token}"}}', headers={"Content-Type": "text/plain"}
    )  # what navigator.sendBeacon posts
    assert beacon.status == 200
    with pytest.raises(PageChannelError, match=f"phone page {code}: the page was closed or left during the job"):
        hub.wait(job, 0)
    assert (await client.post("/sakura/phone/api/pair", data="not json")).status == 400

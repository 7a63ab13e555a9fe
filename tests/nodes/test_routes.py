"""The pack's route inside ComfyUI (``GET /sakura/templates``), on the stand-in ``PromptServer``: registered only when
ComfyUI's server is there, once, and listing what a real ``sakura serve`` publishes (or saying why it cannot)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from .conftest import TEMPLATE, free_port

OURS = {"X-Sakura-Request": "1"}  # what web/sakura.js sends


@pytest.fixture
def prompt_server(comfy):
    import server

    instance = server.PromptServer()
    try:
        yield instance
    finally:
        server.PromptServer.instance = None


def test_registered_by_the_entrypoint_only_inside_comfyui(comfy, prompt_server):
    routes = comfy.nodes.routes
    assert asyncio.run(comfy.package.comfy_entrypoint()) is not None
    paths = [(r.method, r.path) for r in prompt_server.routes]
    assert paths == [("GET", "/sakura/templates")]
    assert routes.register_routes() is True  # again: no second route
    assert len(list(prompt_server.routes)) == 1
    import server

    server.PromptServer.instance = None
    assert routes.register_routes() is False  # no ComfyUI server: nothing to register on


@pytest.fixture
async def client(comfy, prompt_server, aiohttp_client, monkeypatch):
    monkeypatch.delenv("SAKURA_READ_TOKEN", raising=False)
    comfy.nodes.routes.register_routes()
    app = web.Application()
    app.add_routes(prompt_server.routes)
    return await aiohttp_client(app)


@pytest.mark.slow
async def test_lists_the_published_templates(client, server_url, examples, store_dir, demo_model):
    examples.publish_examples(store_dir, demo_model, ["face-swap-astronaut-per-step"])
    resp = await client.get("/sakura/templates", headers=OURS, params={"server_url": server_url})
    assert resp.status == 200
    body = await resp.json()
    assert body["error"] is None and body["server_url"] == server_url
    listed = {t["id"]: t for t in body["templates"]}
    assert TEMPLATE in listed
    # the chooser marks a per-step template with the step count it serves (examples.KV_SETTINGS: 4 steps)
    assert (listed[TEMPLATE]["kv_mode"], listed[TEMPLATE]["steps"]) == ("single", None)
    per_step = listed["face-swap-astronaut-per-step"]
    assert (per_step["kv_mode"], per_step["steps"]) == ("per-step", 4)


async def test_a_failing_server_is_asked_once(comfy, aiohttp_server):
    """The chooser must answer at once: one request, no retry window (the client's default retries for 8 s)."""
    hits = []

    async def catalog(request):
        hits.append(request.path)
        return web.json_response({"error": "warming up"}, status=503)

    app = web.Application()
    app.router.add_get("/v1/templates", catalog)
    srv = await aiohttp_server(app)
    body = await comfy.nodes.routes.list_published(str(srv.make_url("")), None)
    assert body["templates"] == [] and "503" in body["error"]
    assert hits == ["/v1/templates"]


async def test_an_unreachable_server_is_a_readable_answer(client):
    closed = f"http://127.0.0.1:{free_port()}"
    body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": closed})).json()
    assert body["templates"] == []
    assert body["error"] == (
        f"catalog: cannot reach the SAKURA server at {closed} (connection refused) — is `sakura serve` running?"
    )
    body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": "ftp://x"})).json()
    assert body["error"] == "server_url 'ftp://x' must start with http:// or https://, e.g. http://127.0.0.1:8080"


async def test_other_pages_cannot_use_the_route(client):
    """Without the pack's header (an <img src=...> on another site, say) nothing is fetched and no token is sent."""
    resp = await client.get("/sakura/templates", params={"server_url": "http://203.0.113.9:8080"})
    assert resp.status == 403
    assert "answers the SAKURA frontend only" in (await resp.json())["error"]


def test_each_new_route_table_gets_the_route(comfy):
    """A table freed and a new one allocated (ComfyUI restarted in one process, tests): the new one often has the
    freed one's id(), and must still get the route."""
    register_routes = comfy.nodes.routes.register_routes
    for _ in range(20):
        table = web.RouteTableDef()
        assert register_routes(table) is True
        assert register_routes(table) is True  # idempotent
        assert [(r.method, r.path) for r in table] == [("GET", "/sakura/templates")]
        del table

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
    api = "/sakura/phone/api"
    assert paths == [
        ("GET", "/sakura/templates"),
        ("POST", f"{api}/code"),
        ("GET", f"{api}/pages"),
        ("POST", f"{api}/pair"),
        ("GET", f"{api}/job"),
        ("POST", f"{api}/beat"),
        ("POST", f"{api}/result"),
        ("POST", f"{api}/error"),
        ("POST", f"{api}/bye"),
        ("GET", "/sakura/phone"),
        ("GET", "/sakura/phone/{rest:.*}"),
    ]
    assert routes.register_routes() is True  # again: no second route
    assert comfy.nodes.page_routes.register_page_routes() is True
    assert len(list(prompt_server.routes)) == len(paths)
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
async def test_lists_the_published_templates(client, server_url, examples, store_dir, demo_model, monkeypatch):
    monkeypatch.setenv("SAKURA_SERVER_URLS", f"http://example.invalid, {server_url}")
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


UNIFORM = "(not reachable, no SAKURA server there, or it answered with an error; ComfyUI's log says which)"


async def test_a_failing_server_is_asked_once_and_its_page_never_echoed(comfy, aiohttp_server):
    """The chooser must answer at once: one request, no retry window (the client's default retries for 8 s)."""
    hits = []

    async def catalog(request):
        hits.append(request.path)
        return web.json_response({"error": "warming up: SECRET-PAGE-TEXT"}, status=503)

    app = web.Application()
    app.router.add_get("/v1/templates", catalog)
    srv = await aiohttp_server(app)
    url = str(srv.make_url("")).rstrip("/")
    body = await comfy.nodes.routes.list_published(url, None)
    assert body == {
        "server_url": url,
        "templates": [],
        "error": f"no template catalog could be read from {url} " + UNIFORM,
    }
    assert hits == ["/v1/templates"]


async def test_refused_and_an_error_page_read_the_same(client, aiohttp_server, monkeypatch):
    """No port-scan oracle: a closed port and a server answering 500 give one message (but for the URL)."""

    async def page(request):
        return web.Response(status=500, text="<html>internal details</html>")

    app = web.Application()
    app.router.add_get("/v1/templates", page)
    srv = await aiohttp_server(app)
    answering, closed = str(srv.make_url("")).rstrip("/"), f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("SAKURA_SERVER_URLS", f"{answering},{closed}")
    errors = []
    for url in (answering, closed):
        body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": url})).json()
        assert body["templates"] == [] and "internal details" not in body["error"]
        errors.append(body["error"].replace(url, "URL"))
    assert errors[0] == errors[1] == f"no template catalog could be read from URL {UNIFORM}"


async def test_only_the_configured_servers_are_asked(client, aiohttp_server, monkeypatch):
    hits = []

    async def catalog(request):
        hits.append(request.headers.get("Authorization"))
        return web.json_response({"model_id": None, "templates": [{"id": "x"}]})

    app = web.Application()
    app.router.add_get("/v1/templates", catalog)
    srv = await aiohttp_server(app)
    url = str(srv.make_url("")).rstrip("/")
    monkeypatch.setenv("SAKURA_READ_TOKEN", "read-token-123")
    monkeypatch.delenv("SAKURA_SERVER_URLS", raising=False)
    body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": url})).json()
    assert body["templates"] == [] and f"server_url {url!r} is not one of the servers" in body["error"]
    assert "$SAKURA_SERVER_URLS" in body["error"] and hits == []  # not even a connection, so no token sent
    body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": "ftp://x"})).json()
    assert "server_url 'ftp://x' is not one of the servers" in body["error"]
    monkeypatch.setenv("SAKURA_SERVER_URLS", url + "/")
    body = await (await client.get("/sakura/templates", headers=OURS, params={"server_url": url})).json()
    assert body["error"] is None and [t["id"] for t in body["templates"]] == ["x"]
    assert hits == ["Bearer read-token-123"]


async def test_a_silent_server_is_answered_within_the_total_timeout(comfy, monkeypatch):
    """A server that accepts and never answers: the route gives up after TOTAL_TIMEOUT_S (here 0.3 s), not after the
    client's own read timeouts."""
    held = []

    async def hold(reader, writer):  # accepts, reads the request, never answers
        held.append(writer)
        await asyncio.sleep(30)

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    monkeypatch.setattr(comfy.nodes.routes, "TOTAL_TIMEOUT_S", 0.3)
    try:
        body = await asyncio.wait_for(comfy.nodes.routes.list_published(url, None), 3.0)
    finally:
        for writer in held:
            writer.close()
        silent.close()
    assert held and body["error"] == f"no template catalog could be read from {url} {UNIFORM}"


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


async def test_a_redirect_is_not_followed_past_the_allow_list(client, aiohttp_server, monkeypatch, caplog):
    """An allowed server answering 302 to an unlisted port and path: the route names the redirect, ComfyUI's log
    names the Location, and the target receives nothing (no request, so no read token)."""
    from redirecting import redirect_pair

    pair = await redirect_pair(aiohttp_server)
    monkeypatch.setenv("SAKURA_SERVER_URLS", pair.url)
    monkeypatch.setenv("SAKURA_READ_TOKEN", "read-token-123")
    with caplog.at_level("INFO"):
        resp = await client.get("/sakura/templates", headers=OURS, params={"server_url": pair.url})
    body = await resp.json()
    assert body["templates"] == [] and f"the server at {pair.url} answered with a redirect (HTTP 302)" in body["error"]
    assert "does not follow" in body["error"] and pair.location not in body["error"]
    assert any(pair.location in r.getMessage() and "not followed" in r.getMessage() for r in caplog.records)
    assert pair.hits == []

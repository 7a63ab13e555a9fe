"""The pack's HTTP route inside ComfyUI: ``GET /sakura/templates?server_url=URL`` lists the templates a SAKURA server
publishes, so the Template KV Loader can offer them as a choice (``web/sakura.js`` adds the button that reads it; the
``template_id`` field stays a plain text box, so a typed id works offline).

Registered on ComfyUI's ``PromptServer`` by :func:`register_routes`, which ``comfy_entrypoint`` calls: only inside
ComfyUI, once. ComfyUI also serves it under ``/api/sakura/templates``.
"""

from __future__ import annotations

import logging

from aiohttp import web

from ._common import READ_TOKEN_ENV, SakuraNodeError, refused_token_message, resolve_token_source

__all__ = ["DEFAULT_SERVER_URL", "REQUEST_HEADER", "ROUTE", "list_published", "register_routes", "templates_handler"]

logger = logging.getLogger(__name__)

ROUTE = "/sakura/templates"
# A request header the pack's own frontend sends: an <img> or a link elsewhere cannot set it, and a cross-origin
# fetch that sets it needs a CORS preflight ComfyUI does not grant; so another web page cannot make this route send
# the read token to a server_url of its choosing.
REQUEST_HEADER = "X-Sakura-Request"
DEFAULT_SERVER_URL = "http://127.0.0.1:8080"


async def list_published(server_url: str, token: str | None, token_source: str = "the read token") -> dict:
    """``{"server_url", "templates": [{"id", "model_id", "kv_mode", "steps"}], "error"}``: one quick try (no retries,
    no retry window), so a dead server answers at once and a silent one within the timeouts; ``steps`` is the step
    count a per-step template serves (None in single mode); ``error`` is the readable reason when the catalog cannot
    be read."""
    from sakura_core.fetch.client import AuthError, ClientConfig, FetchError, ShardClient

    url = server_url.strip().rstrip("/") or DEFAULT_SERVER_URL
    if not url.startswith(("http://", "https://")):
        return {"server_url": url, "templates": [], "error": f"server_url {url!r} must start with http:// or "
                "https://, e.g. http://127.0.0.1:8080"}  # fmt: skip
    config = ClientConfig(connect_timeout_s=2.0, read_timeout_s=5.0, max_retries=0, retry_window_s=0.0)
    try:
        async with ShardClient(url, token, config=config) as client:
            catalog = await client.get_catalog()
    except AuthError:
        what = f"the SAKURA server at {url}"
        why = refused_token_message(what, token_source, READ_TOKEN_ENV, None)  # the browser never sends a token
        return {"server_url": url, "templates": [], "error": why}
    except (FetchError, ValueError) as e:
        return {"server_url": url, "templates": [], "error": str(e)}
    templates = [
        {"id": t["id"], "model_id": t.get("model_id"), "kv_mode": t.get("kv_mode", "single"), "steps": t.get("steps")}
        for t in catalog["templates"]
        if isinstance(t, dict) and isinstance(t.get("id"), str)
    ]
    return {"server_url": url, "templates": sorted(templates, key=lambda t: t["id"]), "error": None}


async def templates_handler(request: web.Request) -> web.Response:
    """``GET /sakura/templates?server_url=URL``: the server's published templates (token from the environment or
    ComfyUI's user folder, never from the browser). Only with the ``X-Sakura-Request: 1`` header (403 otherwise)."""
    if request.headers.get(REQUEST_HEADER) != "1":
        return web.json_response(
            {"server_url": None, "templates": [], "error": f"{ROUTE} answers the SAKURA frontend only "
             f"(header {REQUEST_HEADER}: 1)"},
            status=403,
        )  # fmt: skip
    try:
        token, source = resolve_token_source("", READ_TOKEN_ENV)
    except SakuraNodeError as e:
        return web.json_response({"server_url": None, "templates": [], "error": str(e)})
    return web.json_response(await list_published(request.query.get("server_url", ""), token, source))


def register_routes(routes: web.RouteTableDef | None = None) -> bool:
    """Add the route to ComfyUI's route table (``PromptServer.instance.routes``, or ``routes``); False when ComfyUI's
    server is not there (tests, plain Python). Idempotent."""
    if routes is None:
        try:
            from server import PromptServer
        except ImportError:
            return False
        instance = getattr(PromptServer, "instance", None)
        if instance is None:
            return False
        routes = instance.routes
    if any(getattr(r, "handler", None) is templates_handler for r in routes):
        return True  # the table itself says so (an id() kept elsewhere can be reused by a new table)
    routes.get(ROUTE)(templates_handler)
    logger.debug("sakura: registered %s", ROUTE)
    return True

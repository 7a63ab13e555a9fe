"""The pack's HTTP route inside ComfyUI: ``GET /sakura/templates?server_url=URL`` lists the templates a SAKURA server
publishes, so the Template KV Loader can offer them as a choice (``web/sakura.js`` adds the button that reads it; the
``template_id`` field stays a plain text box, so a typed id works offline).

Registered on ComfyUI's ``PromptServer`` by :func:`register_routes`, which ``comfy_entrypoint`` calls: only inside
ComfyUI, once. ComfyUI also serves it under ``/api/sakura/templates``.

The route talks only to the servers ComfyUI's owner configured (:func:`allowed_server_urls`: the default
``http://127.0.0.1:8080`` and ``$SAKURA_SERVER_URLS``), so a page cannot make it send the read token elsewhere or
use it to probe ports; it never follows a redirect (which could lead it, and the token, to a server nobody
configured: a 3xx is its own error, the Location goes to ComfyUI's log); it answers within :data:`TOTAL_TIMEOUT_S`,
and any other failure is one message whatever the cause (refused, timed out, an error page), never the foreign
server's text (the cause goes to ComfyUI's log).
"""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from ._common import READ_TOKEN_ENV, SakuraNodeError, refused_token_message, resolve_token_source

__all__ = [
    "ALLOWED_URLS_ENV",
    "DEFAULT_SERVER_URL",
    "REQUEST_HEADER",
    "ROUTE",
    "TOTAL_TIMEOUT_S",
    "allowed_server_urls",
    "list_published",
    "prompt_server_routes",
    "register_routes",
    "templates_handler",
]

logger = logging.getLogger(__name__)

ROUTE = "/sakura/templates"
# A request header the pack's own frontend sends: an <img> or a link elsewhere cannot set it, and a cross-origin
# fetch that sets it needs a CORS preflight ComfyUI does not grant; so another web page cannot make this route send
# the read token to a server_url of its choosing.
REQUEST_HEADER = "X-Sakura-Request"
DEFAULT_SERVER_URL = "http://127.0.0.1:8080"
#: Comma-separated server URLs the route may talk to, besides :data:`DEFAULT_SERVER_URL` (ComfyUI's environment).
ALLOWED_URLS_ENV = "SAKURA_SERVER_URLS"
#: Seconds the route takes at most, whatever the server does.
TOTAL_TIMEOUT_S = 4.0


def _normal(url: str) -> str:
    return url.strip().rstrip("/").lower()


def allowed_server_urls() -> list[str]:
    """The server URLs the route may ask: :data:`DEFAULT_SERVER_URL` and those in ``$SAKURA_SERVER_URLS``."""
    extra = [u for u in os.environ.get(ALLOWED_URLS_ENV, "").replace(" ", ",").split(",") if u.strip()]
    return [DEFAULT_SERVER_URL, *(u.strip().rstrip("/") for u in extra)]


async def list_published(server_url: str, token: str | None, token_source: str = "the read token") -> dict:
    """``{"server_url", "templates": [{"id", "model_id", "kv_mode", "steps"}], "error"}``: one quick try (no retries,
    no retry window), so a dead server answers at once and a silent one within the timeouts; ``steps`` is the step
    count a per-step template serves (None in single mode); ``error`` is the readable reason when the catalog cannot
    be read."""
    from sakura_core.fetch.client import AuthError, ClientConfig, FetchError, RedirectRefusedError, ShardClient

    url = server_url.strip().rstrip("/") or DEFAULT_SERVER_URL
    if not url.startswith(("http://", "https://")):
        return {
            "server_url": url,
            "templates": [],
            "error": f"server_url {url!r} must start with http:// or https://, e.g. http://127.0.0.1:8080",
        }
    config = ClientConfig(connect_timeout_s=2.0, read_timeout_s=3.0, max_retries=0, retry_window_s=0.0)

    async def read() -> dict:
        async with ShardClient(url, token, config=config) as client:
            return await client.get_catalog()

    try:
        catalog = await asyncio.wait_for(read(), TOTAL_TIMEOUT_S)
    except AuthError:
        what = f"the SAKURA server at {url}"
        why = refused_token_message(what, token_source, READ_TOKEN_ENV, None)  # the browser never sends a token
        return {"server_url": url, "templates": [], "error": why}
    except RedirectRefusedError as e:  # never followed: the target was not configured here
        logger.info(
            "sakura: the SAKURA server at %s answered the catalog request with HTTP %d, a redirect to %r; "
            "not followed (the server's side)",
            url,
            e.status,
            e.location,
        )
        return {
            "server_url": url,
            "templates": [],
            "error": f"the server at {url} answered with a redirect "
            f"(HTTP {e.status}), which this route does not follow (ComfyUI's log names where it pointed); give "
            f"the final server's URL, listed in ${ALLOWED_URLS_ENV}",
        }
    except (FetchError, ValueError, asyncio.TimeoutError) as e:
        logger.info(
            "sakura: the template catalog of %s could not be read (the server's side or the link): %s",
            url,
            str(e)[:300],
        )
        return {
            "server_url": url,
            "templates": [],
            "error": f"no template catalog could be read from {url} "
            "(not reachable, no SAKURA server there, or it answered with an error; ComfyUI's log says which)",
        }
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
            {
                "server_url": None,
                "templates": [],
                "error": f"{ROUTE} answers the SAKURA frontend only (header {REQUEST_HEADER}: 1)",
            },
            status=403,
        )
    try:
        token, source = resolve_token_source("", READ_TOKEN_ENV)
    except SakuraNodeError as e:
        return web.json_response({"server_url": None, "templates": [], "error": str(e)})
    url = request.query.get("server_url", "").strip().rstrip("/") or DEFAULT_SERVER_URL
    allowed = allowed_server_urls()
    if _normal(url) not in {_normal(u) for u in allowed}:  # nothing is sent there, not even a connection
        return web.json_response(
            {
                "server_url": url,
                "templates": [],
                "error": (
                    f"server_url {url!r} is not one of the servers this ComfyUI may ask ({', '.join(allowed)}); add it to "
                    f"${ALLOWED_URLS_ENV} (comma-separated) in ComfyUI's environment, or type the template id"
                ),
            }
        )
    return web.json_response(await list_published(url, token, source))


def prompt_server_routes() -> web.RouteTableDef | None:
    """ComfyUI's route table (``PromptServer.instance.routes``); None outside ComfyUI (tests, plain Python)."""
    try:
        from server import PromptServer
    except ImportError:
        return None
    instance = getattr(PromptServer, "instance", None)
    return None if instance is None else instance.routes


def register_routes(routes: web.RouteTableDef | None = None) -> bool:
    """Add the route to ComfyUI's route table (``PromptServer.instance.routes``, or ``routes``); False when ComfyUI's
    server is not there (tests, plain Python). Idempotent."""
    routes = routes if routes is not None else prompt_server_routes()
    if routes is None:
        return False
    if any(getattr(r, "handler", None) is templates_handler for r in routes):
        return True  # the table itself says so (an id() kept elsewhere can be reused by a new table)
    routes.get(ROUTE)(templates_handler)
    logger.debug("sakura: registered %s", ROUTE)
    return True

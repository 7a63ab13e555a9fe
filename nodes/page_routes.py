"""ComfyUI's routes for a phone page paired with it (dispatch from the Sakura Phone Device node to a browser).

``GET /sakura/phone`` serves the phone page (the same ``phone_web/`` as ``sakura serve``'s ``/phone``, its base tag
set to this mount point and marked as a dispatch page); the phone opens it over USB (``adb reverse tcp:8188
tcp:8188``: ``http://localhost:8188/sakura/phone`` is a secure context) or the LAN (ComfyUI started with
``--listen``). The page pairs with a code ComfyUI shows and then takes jobs over a bounded long poll:

- ``POST /sakura/phone/api/code`` (the pack's frontend only: header ``X-Sakura-Request: 1``): a new pairing code;
- ``GET /sakura/phone/api/pages`` (the same header): the paired pages;
- ``POST /sakura/phone/api/pair`` ``{"code", "info"}``: the page's token (403 naming the code when it is not valid);
- ``GET /sakura/phone/api/job`` (``Authorization: Bearer TOKEN``): the next job, held up to ``hold_s``;
- ``POST /sakura/phone/api/beat|result|error|bye`` ``{"token", "job_id", ...}``: progress, the result, an error,
  the page leaving (``navigator.sendBeacon``).

The channel's state is one :class:`android_bridge.page_channel.PageHub` per ComfyUI process (:func:`page_hub`),
which the node reads when it dispatches.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging

from aiohttp import web

from android_bridge.page_channel import PageHub, PairingError
from android_bridge.page_files import ISOLATION_HEADERS, PAGE_TYPES, PageFileError, page_file, page_html

from .routes import REQUEST_HEADER, prompt_server_routes

__all__ = [
    "MAX_IMAGE_SIDE",
    "MOUNT",
    "check_result_image",
    "page_hub",
    "page_routes",
    "register_page_routes",
    "serve_page",
]

logger = logging.getLogger(__name__)

MOUNT = "/sakura/phone"
#: The largest image side a page may post back (pixels).
MAX_IMAGE_SIDE = 4096
_hubs: list[PageHub] = []  # the process's hub (ComfyUI's lifetime, like PromptServer.instance); see page_hub()


def page_hub() -> PageHub:
    """The ComfyUI process's pairing hub (made on first use)."""
    if not _hubs:
        _hubs.append(PageHub())
    return _hubs[0]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request) -> dict:
    try:
        body = json.loads(await request.read() or b"{}")  # sendBeacon posts text/plain: read the bytes
    except (ValueError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"the body is not JSON: {e}"}), content_type="application/json"
        ) from e
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "the body must be a JSON object"}), content_type="application/json"
        )
    return body


def _frontend_only(request: web.Request) -> web.Response | None:
    if request.headers.get(REQUEST_HEADER) != "1":
        return _error(403, f"{request.path} answers the SAKURA frontend only (header {REQUEST_HEADER}: 1)")
    return None


def check_result_image(body: dict) -> bytes:
    """The RGBA bytes a page posted (``rgba_b64``, ``width``, ``height``); ValueError naming what is wrong."""
    width, height = body.get("width"), body.get("height")
    if not (
        isinstance(width, int) and isinstance(height, int) and all(1 <= v <= MAX_IMAGE_SIDE for v in (width, height))
    ):
        raise ValueError(f"result size {width!r}x{height!r} is not within 1..{MAX_IMAGE_SIDE} pixels a side")
    rgba = base64.b64decode(str(body.get("rgba_b64", "")), validate=True)
    if len(rgba) != width * height * 4:
        raise ValueError(f"result holds {len(rgba)} bytes, not {width}x{height} RGBA ({width * height * 4})")
    return rgba


def page_routes(routes: web.RouteTableDef, hub: PageHub) -> None:
    """Add the page's routes over ``hub`` to ``routes`` (the API first: the page files take the rest)."""

    async def new_code(request: web.Request) -> web.Response:
        if (refused := _frontend_only(request)) is not None:
            return refused
        code, ttl_s = hub.new_code()
        return web.json_response({"code": code, "ttl_s": ttl_s, "path": f"{MOUNT}/#code={code}"})

    async def pages(request: web.Request) -> web.Response:
        if (refused := _frontend_only(request)) is not None:
            return refused
        return web.json_response({"pages": hub.pages()})

    async def pair(request: web.Request) -> web.Response:
        body = await _body(request)
        info = body.get("info")
        info = info if isinstance(info, dict) else {}
        try:
            token = hub.pair(str(body.get("code", "")), {k: str(v)[:300] for k, v in list(info.items())[:16]})
        except PairingError as e:
            return _error(403, str(e))
        cfg = hub.config
        return web.json_response(
            {
                "token": token,
                "code": str(body["code"]).strip().upper(),
                "stale_after_s": cfg.stale_after_s,
                "hold_s": cfg.hold_s,
            }
        )

    async def take_job(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        deadline = asyncio.get_running_loop().time() + hub.config.hold_s
        while True:  # bounded: hold_s, or the page's connection closing
            try:
                job = hub.take_job(token)
            except PairingError as e:
                return _error(401, str(e))
            transport = request.transport
            if job is not None or asyncio.get_running_loop().time() >= deadline:
                return web.json_response({"job": job})
            if transport is None or transport.is_closing():
                return _error(499, "the page went")
            await asyncio.sleep(0.2)

    def posted(action):
        async def handler(request: web.Request) -> web.Response:
            body = await _body(request)
            try:
                return web.json_response(action(str(body.get("token", "")), str(body.get("job_id", "")), body) or {})
            except PairingError as e:
                return _error(409, str(e))
            except ValueError as e:
                return _error(400, str(e))

        return handler

    def result(token: str, job_id: str, body: dict) -> None:
        check_result_image(body)
        if not isinstance(body.get("report"), dict):
            raise ValueError("the result has no report object")
        hub.finish(token, job_id, {k: body[k] for k in ("rgba_b64", "width", "height", "report")})

    routes.post(f"{MOUNT}/api/code")(new_code)
    routes.get(f"{MOUNT}/api/pages")(pages)
    routes.post(f"{MOUNT}/api/pair")(pair)
    routes.get(f"{MOUNT}/api/job")(take_job)
    routes.post(f"{MOUNT}/api/beat")(posted(lambda t, j, b: {"cancel": hub.beat(t, j, b.get("progress"))}))
    routes.post(f"{MOUNT}/api/result")(posted(result))
    routes.post(f"{MOUNT}/api/error")(posted(lambda t, j, b: hub.fail(t, j, str(b.get("message", "no message")))))
    routes.post(f"{MOUNT}/api/bye")(posted(lambda t, j, b: hub.close(t)))
    routes.get(MOUNT)(serve_page)
    routes.get(MOUNT + "/{rest:.*}")(serve_page)


async def serve_page(request: web.Request) -> web.Response:
    """The page (its base tag at :data:`MOUNT`), its modules and npm's files; a 404 naming the set-up step."""
    rest = request.match_info.get("rest", "")
    try:
        path = page_file(rest)
        if rest in ("", "index.html"):
            body = page_html(f"{MOUNT}/", dispatch=True)
        else:
            body = path.read_bytes()
    except PageFileError as e:
        return _error(e.status, str(e))
    kind = PAGE_TYPES[path.suffix]
    charset = None if path.suffix == ".wasm" else "utf-8"
    return web.Response(body=body, content_type=kind, charset=charset, headers=ISOLATION_HEADERS)


def register_page_routes(routes: web.RouteTableDef | None = None) -> bool:
    """Add the page's routes over :func:`page_hub` to ComfyUI's table (or ``routes``); False outside ComfyUI.
    Idempotent: once per table."""
    routes = routes if routes is not None else prompt_server_routes()
    if routes is None:
        return False
    if not any(getattr(r, "path", None) == f"{MOUNT}/api/code" for r in routes):
        page_routes(routes, page_hub())
        logger.debug("sakura: registered %s", MOUNT)
    return True

"""Cross-origin reads for the phone page that ComfyUI serves (dispatch: the page's origin is ComfyUI's, e.g.
``http://localhost:8188``, and it fetches the template KV and the web model from here itself).

Only the origins the operator names (``sakura serve --allow-origin ORIGIN``, ``ServerConfig.allowed_origins``) are
answered, and only for reading: the catalog, manifests, shards and ``/phone/model/`` files (GET / HEAD). A preflight
(``OPTIONS``, sent because the page's requests carry ``Authorization``, ``Range`` and ``If-Range``) is answered 204
here, before the token check (a preflight never carries the token); the real request is checked as any other. Every
answer to an allowed origin names it in ``Access-Control-Allow-Origin`` (with ``Vary: Origin``) and exposes the
headers the page's shard fetch reads; ``Cross-Origin-Resource-Policy: cross-origin`` lets a cross-origin-isolated
page (COEP ``require-corp``) use them. Other origins get no CORS header: the browser keeps their page from reading.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from .state import STATE_KEY

__all__ = ["CORS_PATHS", "check_origin", "cors_middleware"]

#: The read paths a dispatch page fetches across origins.
CORS_PATHS = ("/v1/templates", "/v1/shards/", "/phone/model/")
_ALLOW_HEADERS = "Authorization, Range, If-Range"
_EXPOSE_HEADERS = "ETag, Content-Range, Content-Length, Accept-Ranges, Location, Sakura-Retry, Retry-After"
_PREFLIGHT_MAX_AGE_S = 600


def check_origin(origin: str) -> str:
    """``origin`` as a browser sends it (``scheme://host[:port]``, no path); ValueError naming it and the fix."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"allowed origin {origin!r} must be scheme://host[:port] with no path, e.g. "
                         "http://localhost:8188 (the ComfyUI the phone page is served by)")  # fmt: skip
    return f"{parts.scheme}://{parts.netloc}".lower()


def _cors_headers(origin: str) -> dict[str, str]:
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Expose-Headers": _EXPOSE_HEADERS,
            "Cross-Origin-Resource-Policy": "cross-origin"}  # fmt: skip


@web.middleware
async def cors_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Preflights and CORS headers for the configured origins on :data:`CORS_PATHS`; else the request as it is."""
    origin = request.headers.get("Origin", "").lower()
    allowed = request.app[STATE_KEY].config.allowed_origins
    if not origin or origin not in allowed or not request.path.startswith(CORS_PATHS):
        return await handler(request)
    headers = _cors_headers(origin)
    if request.method == "OPTIONS":
        asked = request.headers.get("Access-Control-Request-Method", "")
        if asked not in ("GET", "HEAD"):
            return web.json_response({"error": f"{request.path} is read-only across origins (GET, HEAD); asked {asked!r}"},
                                     status=403)  # fmt: skip
        return web.Response(status=204, headers={**headers, "Access-Control-Allow-Methods": "GET, HEAD",
                            "Access-Control-Allow-Headers": _ALLOW_HEADERS,
                            "Access-Control-Max-Age": str(_PREFLIGHT_MAX_AGE_S)})  # fmt: skip
    try:
        response = await handler(request)
    except web.HTTPException as e:  # an error the page must be able to read (it says how to fix it)
        e.headers.update(headers)
        raise
    response.headers.update(headers)
    return response

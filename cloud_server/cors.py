"""Cross-origin reads for the phone page that ComfyUI serves (dispatch: the page's origin is ComfyUI's, e.g.
``http://localhost:8188``, and it fetches the template KV and the web model from here itself).

Only the origins the operator names (``sakura serve --allow-origin ORIGIN``, ``ServerConfig.allowed_origins``, checked by ``cloud_server.config.check_origin``) are
answered, and only for reading: the catalog, manifests, shards and ``/phone/model/`` files (GET / HEAD). A preflight
(``OPTIONS``, sent because the page's requests carry ``Authorization``, ``Range`` and ``If-Range``) is answered 204
here, before the token check (a preflight never carries the token); the real request is checked as any other. Every
answer to an allowed origin names it in ``Access-Control-Allow-Origin`` (with ``Vary: Origin``) and exposes the
headers the page's shard fetch reads; ``Cross-Origin-Resource-Policy: cross-origin`` lets a cross-origin-isolated
page (COEP ``require-corp``) use them. Other origins get no CORS header: the browser keeps their page from reading.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from .state import STATE_KEY

__all__ = ["CORS_PATHS", "cors_middleware", "cors_on_prepare"]

#: The read paths a dispatch page fetches across origins.
CORS_PATHS = ("/v1/templates", "/v1/shards/", "/phone/model/")
_ALLOW_HEADERS = "Authorization, Range, If-Range"
_EXPOSE_HEADERS = "ETag, Content-Range, Content-Length, Accept-Ranges, Location, Sakura-Retry, Retry-After"
_PREFLIGHT_MAX_AGE_S = 600


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Vary": "Origin",
        "Access-Control-Expose-Headers": _EXPOSE_HEADERS,
        "Cross-Origin-Resource-Policy": "cross-origin",
    }


def _allowed(request: web.Request) -> str | None:
    origin = request.headers.get("Origin", "").lower()
    if origin and origin in request.app[STATE_KEY].config.allowed_origins and request.path.startswith(CORS_PATHS):
        return origin
    return None


@web.middleware
async def cors_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Answers the preflight of a configured origin on :data:`CORS_PATHS`; anything else goes on as it is."""
    origin = _allowed(request)
    if origin is None or request.method != "OPTIONS":
        return await handler(request)
    asked = request.headers.get("Access-Control-Request-Method", "")
    if asked not in ("GET", "HEAD"):
        return web.json_response(
            {"error": f"{request.path} is read-only across origins (GET, HEAD); asked {asked!r}"},
            status=403,
            headers={"Vary": "Origin"},
        )
    return web.Response(
        status=204,
        headers={
            **_cors_headers(origin),
            "Access-Control-Allow-Methods": "GET, HEAD",
            "Access-Control-Allow-Headers": _ALLOW_HEADERS,
            "Access-Control-Max-Age": str(_PREFLIGHT_MAX_AGE_S),
        },
    )


async def cors_on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the CORS headers on every answer to a configured origin, streamed shards and errors
    included (their headers are sent before the body, so they are added here, not after the handler)."""
    origin = _allowed(request)
    if origin is not None and request.method != "OPTIONS":
        response.headers.update(_cors_headers(origin))

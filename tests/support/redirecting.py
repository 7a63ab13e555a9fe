"""A redirecting server pair for tests, both on 127.0.0.1: ``redirector`` answers every request with a redirect to
``target`` (another port, a path and a query), and ``target`` records every request it receives. A client that
follows the redirect shows up in ``target.hits``."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["RedirectPair", "redirect_pair"]


@dataclass
class RedirectPair:
    url: str  # the redirector's base URL (what a client is pointed at)
    location: str  # where every redirect points
    hits: list[str] = field(default_factory=list)  # path + query of each request the target received


async def redirect_pair(aiohttp_server, status: int = 302) -> RedirectPair:
    """Start the pair with pytest-aiohttp's ``aiohttp_server``; the redirects answer ``status``."""
    pair = RedirectPair("", "")

    async def record(request: web.Request) -> web.Response:
        pair.hits.append(request.path_qs)
        return web.json_response({"templates": [], "model_id": None})

    target = web.Application()
    target.router.add_route("*", "/{tail:.*}", record)
    target_server = await aiohttp_server(target)
    pair.location = str(target_server.make_url("/internal/admin?token=leak"))

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": pair.location})

    redirector = web.Application()
    redirector.router.add_route("*", "/{tail:.*}", redirect)
    pair.url = str((await aiohttp_server(redirector)).make_url("")).rstrip("/")
    return pair

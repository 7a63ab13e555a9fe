"""Reading a server's answer before its body: a redirect refused (never followed), a fault the server marked final,
the error detail it sent; and the resolver that pins a client's connections to addresses its caller checked."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import aiohttp.abc

from ..limits import bounded_json
from .errors import RedirectRefusedError

__all__ = ["PinnedResolver", "error_detail", "not_transient", "refuse_redirect"]


class PinnedResolver(aiohttp.abc.AbstractResolver):
    """Resolves every name to the given addresses only (already checked by the caller); no DNS query."""

    def __init__(self, addresses: tuple[str, ...]):
        self._addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for a in self._addresses
        ]

    async def close(self) -> None:
        return None


def refuse_redirect(resp: aiohttp.ClientResponse, what: str, url: str) -> None:
    """A 3xx is an error naming the URL and its ``Location``; the redirect is never followed (aiohttp would)."""
    if 300 <= resp.status < 400 and resp.status != 304:
        raise RedirectRefusedError(what, url, resp.status, resp.headers.get("Location"))


def not_transient(resp: aiohttp.ClientResponse) -> bool:
    """The server marked the error as one retrying cannot fix (``Sakura-Retry: no``: a store fault)."""
    return resp.headers.get("Sakura-Retry", "").strip().lower() == "no"


async def error_detail(resp: aiohttp.ClientResponse) -> str:
    """The server's error message (JSON ``{"error": ...}`` or the first 200 characters of text)."""
    try:
        text = (await resp.content.read(4096)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return ""
    try:
        return str(bounded_json(text, "error body").get("error", text))[:300]
    except (ValueError, AttributeError):
        return text[:200]

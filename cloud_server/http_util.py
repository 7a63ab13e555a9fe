"""HTTP helpers of the cloud server: JSON errors, access classes, conditional requests, Range parsing, tokens."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

from aiohttp import web

__all__ = ["parse_range"]


# ---- helpers --------------------------------------------------------------------------------------------------
def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.HTTPException:
    cls = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        412: web.HTTPPreconditionFailed,
        413: web.HTTPRequestEntityTooLarge,
        415: web.HTTPUnsupportedMediaType,
        416: web.HTTPRequestRangeNotSatisfiable,
        429: web.HTTPTooManyRequests,
        503: web.HTTPServiceUnavailable,
    }[status]
    body = json.dumps({"error": message, "status": status})
    if cls is web.HTTPRequestEntityTooLarge:
        return cls(max_size=0, actual_size=0, text=body, content_type="application/json", headers=headers)
    return cls(text=body, content_type="application/json", headers=headers)


def _access(kind: str) -> Callable:
    """Mark a handler ``open`` (no token), ``read`` (read token when configured) or ``write`` (write token)."""

    def mark(handler: Callable) -> Callable:
        handler.sakura_access = kind
        handler.sakura_route = handler.__name__.removeprefix("handle_")
        return handler

    return mark


def _etag_matches(header: str | None, etag: str) -> bool:
    """Weak comparison of an ``If-None-Match``/``If-Match`` list against a quoted etag (``*`` matches)."""
    if header is None:
        return False
    for item in header.split(","):
        item = item.strip()
        if item == "*" or item.removeprefix("W/") == etag:
            return True
    return False


class _Unsatisfiable(Exception):
    pass


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """A ``Range`` header -> (offset, count), ``None`` to send everything; raise ``_Unsatisfiable`` (416).

    One ``bytes`` range only: ``a-b``, ``a-`` or ``-n``. Another unit is ignored (RFC 9110 14.2); several ranges or
    a malformed or unsatisfiable one are refused.
    """
    if value is None:
        return None
    unit, _, spec = value.strip().partition("=")
    if unit.strip().lower() != "bytes":
        return None
    spec = spec.strip()
    first, dash, last = spec.partition("-")
    if "," in spec or not dash or not (first.isdigit() or last.isdigit()):
        raise _Unsatisfiable
    if not first:  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _Unsatisfiable
        start = max(0, size - n)
        return start, size - start
    if not first.isdigit() or (last and not last.isdigit()):
        raise _Unsatisfiable
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        raise _Unsatisfiable
    return start, end - start + 1


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _token_ok(given: str | None, *allowed: str | None) -> bool:
    if given is None:
        return False
    return any(t is not None and hmac.compare_digest(given.encode(), t.encode()) for t in allowed)

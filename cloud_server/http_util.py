"""HTTP helpers of the cloud server: JSON errors, access classes, conditional requests, Range parsing (the bearer
token check is ``sakura_core.http_serving``'s)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from aiohttp import web

__all__ = ["check_if_match", "parse_range"]


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
        # function attributes, read by the app's middleware (getattr with a default)
        handler.__dict__.update(sakura_access=kind, sakura_route=handler.__name__.removeprefix("handle_"))
        return handler

    return mark


def _etag_matches(header: str | None, etag: str, *, strong: bool = False) -> bool:
    """Does an ``If-None-Match``/``If-Match`` list name the quoted strong ``etag`` (``*`` matches any)?

    RFC 9110 8.8.3.2: ``If-None-Match`` uses the weak comparison (``W/"x"`` matches ``"x"``); ``If-Match`` the strong
    one (``strong=True``, 13.1.1): a weak entity tag never matches.
    """
    if header is None:
        return False
    for item in header.split(","):
        item = item.strip()
        if item == "*" or item == etag or (not strong and item.removeprefix("W/") == etag):
            return True
    return False


def check_if_match(request: web.Request, etag: str) -> None:
    """412 unless an ``If-Match`` (when sent) names ``etag`` by the strong comparison (RFC 9110 13.1.1: a weak
    ``W/"x"`` never matches), on shards, manifests and the catalog alike."""
    if_match = request.headers.get("If-Match")
    if if_match is not None and not _etag_matches(if_match, etag, strong=True):
        shown = if_match if len(if_match) <= 80 else if_match[:80] + "…"
        raise _json_error(412, f"If-Match {shown!r} does not match {etag}")


class _Unsatisfiable(Exception):
    pass


class _ClientGone(Exception):
    """The client went away while ``response`` (already prepared) was being sent: an abort, not a server error."""

    def __init__(self, response: web.StreamResponse, cause: BaseException):
        super().__init__(f"client went away: {cause!r}")
        self.response = response


_RANGE_SPEC = re.compile(r"([0-9]*)-([0-9]*)", re.ASCII)
#: Longer digit strings than this are treated as "past any shard" (no int() of a 5000-digit number).
_MAX_RANGE_DIGITS = 18


def _pos(digits: str) -> int | None:
    """ASCII digits -> int; ``None`` for empty; a number too long to be a byte offset -> ``10**18`` (beyond any shard)."""
    if not digits:
        return None
    return int(digits) if len(digits) <= _MAX_RANGE_DIGITS else 10**_MAX_RANGE_DIGITS


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """A ``Range`` header -> (offset, count), ``None`` to send everything; raise ``_Unsatisfiable`` (416).

    One ``bytes`` range only: ``a-b``, ``a-`` or ``-n``, ASCII digits only (RFC 9110 14.1.1). Another unit is
    ignored (RFC 9110 14.2), and so is a well-formed list of several ranges (the whole shard is sent: 200); a
    malformed or unsatisfiable range is refused.
    """
    if value is None:
        return None
    unit, _, spec = value.strip().partition("=")
    if unit.strip().lower() != "bytes":
        return None
    matches = [_RANGE_SPEC.fullmatch(part.strip()) for part in spec.split(",")]
    specs = [m for m in matches if m is not None]
    if len(specs) < len(matches) or any(not (m.group(1) or m.group(2)) for m in specs):
        raise _Unsatisfiable
    if len(specs) > 1:
        return None  # several ranges: a multipart/byteranges answer is not worth it for immutable shards
    first, last = _pos(specs[0].group(1)), _pos(specs[0].group(2))
    if first is None:  # suffix: the last n bytes
        if last is None or last == 0 or size == 0:  # last is set here: the spec's check above
            raise _Unsatisfiable
        start = max(0, size - last)
        return start, size - start
    end = min(last, size - 1) if last is not None else size - 1
    if first >= size or end < first:
        raise _Unsatisfiable
    return first, end - first + 1

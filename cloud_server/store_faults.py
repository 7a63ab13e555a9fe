"""Store faults as the server answers them, one mapping for every store and route (manifest, shard, catalog):

* a file or object the store cannot read (a folder or a link in its place, no permission, an I/O error, a manifest
  over its size limit) or a manifest that fails the schema: 500, ``Sakura-Retry: no`` (a client fails fast instead
  of retrying); one such template never breaks the catalog;
* an object store that refuses the server (403: its credentials; a missing bucket): 502, ``Sakura-Retry: no``;
* an object store that cannot answer now (unreachable, a timeout, a cut connection, a 5xx): 503 with
  ``Retry-After`` and ``Sakura-Retry: yes``;
* any other store error: 502, ``Sakura-Retry: yes``.

The body is ``{"error": message, "status": ..., "retry": ...}``; the message names the store. The server logs one
line per kind of fault per interval (``IntervalLog``), never a traceback for these."""

from __future__ import annotations

import json

from aiohttp import web

from sakura_core.kv.manifest import Manifest, ManifestError, parse_manifest
from sakura_core.limits import bounded_json

from .conn_guard import IntervalLog
from .store import (
    InvalidNameError,
    NotFoundError,
    StoreError,
    StoreFaultError,
    StoreRefusedError,
    StoreUnavailableError,
)

__all__ = [
    "NO_RETRY_HEADER",
    "StoreFaultError",
    "checked_manifest",
    "fault_kind",
    "fault_response",
    "store_error",
    "store_fault",
]

#: Response header saying whether retrying can help (``no``: ``sakura_core.fetch.client`` does not retry it).
NO_RETRY_HEADER = "Sakura-Retry"
#: Seconds a client is asked to wait before retrying a store that cannot answer now.
RETRY_AFTER_S = 1


def _response(cls: type[web.HTTPException], message: str, retry: bool, **headers: str) -> web.HTTPException:
    body = json.dumps({"error": message, "status": cls.status_code, "retry": retry})
    headers[NO_RETRY_HEADER] = "yes" if retry else "no"
    return cls(text=body, content_type="application/json", headers=headers)


def store_fault(message: str) -> web.HTTPException:
    """The 500 of a store fault: ``{"error": message}`` and ``Sakura-Retry: no``."""
    return _response(web.HTTPInternalServerError, message, False)


def store_error(e: StoreError, context: str = "") -> web.HTTPException:
    """The response to a store error other than not-found (see the module docstring); ``context`` (e.g. the
    template) goes before the error's message."""
    message = f"{context}: {e}"[:400] if context else str(e)[:400]
    if isinstance(e, StoreUnavailableError):
        return _response(web.HTTPServiceUnavailable, message, True, **{"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, StoreRefusedError):
        return _response(web.HTTPBadGateway, message, False)
    if isinstance(e, StoreFaultError):
        return store_fault(message)
    return _response(web.HTTPBadGateway, message, True)


def fault_kind(e: Exception) -> str:
    """A store error's kind in a few words (one log line per kind per interval)."""
    return getattr(e, "kind", None) or type(e).__name__


def fault_response(
    log: IntervalLog, e: StoreError | ManifestError, where: str, context: str = ""
) -> web.HTTPException:
    """The answer to a store error or a bad manifest ``e`` met serving ``where`` (``"GET /v1/..."``): 404 and 400
    for a missing or malformed name, else :func:`store_error`'s answer, logged to ``log`` (one line per kind of
    fault per interval, no traceback)."""
    if isinstance(e, NotFoundError):
        return web.HTTPNotFound(text=json.dumps({"error": str(e), "status": 404}), content_type="application/json")
    if isinstance(e, InvalidNameError):
        return web.HTTPBadRequest(text=json.dumps({"error": str(e), "status": 400}), content_type="application/json")
    log.event(fault_kind(e), f"{where}: {str(e)[:300]}")
    if isinstance(e, ManifestError):
        return store_fault(f"{context}: {e}"[:400] if context else str(e)[:400])
    return store_error(e, context)


def checked_manifest(raw: bytes, template_id: str) -> Manifest:
    """The stored manifest ``raw`` parsed (bounded JSON, the schema); ``ManifestError`` naming what is wrong."""
    try:
        return parse_manifest(bounded_json(raw, f"the store's manifest of {template_id!r}"), template_id=template_id)
    except ValueError as e:  # not JSON / too deep: a ManifestError like the schema's
        if isinstance(e, ManifestError):
            raise
        raise ManifestError(str(e)) from e

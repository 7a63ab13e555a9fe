"""Store faults as the server answers them: a file the store cannot read (a folder or a link in its place, no
permission, an I/O error) or a manifest that fails the schema is a 500 that says which and why, marked
``Sakura-Retry: no`` so a client fails fast instead of retrying; one such template never breaks the catalog."""

from __future__ import annotations

import json

from aiohttp import web

from sakura_core.fetch.store_layout import StoreFaultError
from sakura_core.kv.manifest import Manifest, ManifestError, parse_manifest
from sakura_core.limits import bounded_json

__all__ = ["NO_RETRY_HEADER", "StoreFaultError", "checked_manifest", "store_fault"]

#: Response header of a 500 that retrying cannot fix (``sakura_core.fetch.client`` does not retry it).
NO_RETRY_HEADER = "Sakura-Retry"


def store_fault(message: str) -> web.HTTPException:
    """The 500 of a store fault: ``{"error": message}`` and ``Sakura-Retry: no``."""
    body = json.dumps({"error": message, "status": 500, "retry": False})
    return web.HTTPInternalServerError(text=body, content_type="application/json", headers={NO_RETRY_HEADER: "no"})


def checked_manifest(raw: bytes, template_id: str) -> Manifest:
    """The stored manifest ``raw`` parsed (bounded JSON, the schema); ``ManifestError`` naming what is wrong."""
    try:
        return parse_manifest(bounded_json(raw, f"the store's manifest of {template_id!r}"), template_id=template_id)
    except ValueError as e:  # not JSON / too deep: a ManifestError like the schema's
        if isinstance(e, ManifestError):
            raise
        raise ManifestError(str(e)) from e

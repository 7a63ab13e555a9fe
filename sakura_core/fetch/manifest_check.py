"""The client's manifest check: the codec's schema plus what a client must know before it fetches anything."""

from __future__ import annotations

import re
from typing import Any

from .errors import ManifestError, ModelMismatchError

__all__ = ["DIGEST_RE", "MANIFEST_VERSION", "TEMPLATE_ID_RE", "check_manifest"]

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
TEMPLATE_ID_RE = re.compile(r"[a-z0-9-]{1,64}")
MANIFEST_VERSION = 2


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_manifest(manifest: Any, *, template_id: str | None = None, model_id: str | None = None) -> dict:
    """Validate a manifest; return it or raise ``ManifestError`` naming the offending field.

    The schema is the codec's (``sakura_core.kv.validate_manifest``: version, ids, grid, shards covering layers
    0..L-1 in order, representations with level, name, bytes, distortion, digest, requires chains). On top: the
    template id asked for, the model in use (a different one raises ``ModelMismatchError``), and the optional
    ``template_image`` blob reference the publisher adds.
    """
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest must be a JSON object, got {type(manifest).__name__}")
    from sakura_core.kv import validate_manifest  # the schema lives with the codec
    from sakura_core.kv.manifest import version_problem

    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestError(
            f"{version_problem(manifest.get('version'))}; this client reads version {MANIFEST_VERSION}"
        )

    try:
        validate_manifest(manifest)
    except ValueError as e:
        raise ManifestError(f"manifest of template {str(manifest.get('template_id'))[:64]!r}: {e}") from e
    if template_id is not None and manifest["template_id"] != template_id:
        raise ManifestError(
            f"manifest field 'template_id' is {manifest['template_id']!r} but template {template_id!r} was asked for"
        )
    if model_id is not None and manifest["model_id"] != model_id:
        raise ModelMismatchError(
            f"template {manifest['template_id']!r} was computed for model {manifest['model_id']}, not for the model "
            f"in use ({model_id}); precompute it for this model"
        )
    image = manifest.get("template_image")
    if image is not None and not (
        isinstance(image, dict)
        and isinstance(image.get("digest"), str)
        and DIGEST_RE.fullmatch(image["digest"])
        and _is_int(image.get("bytes"))
        and image["bytes"] > 0
    ):
        raise ManifestError(f"manifest field 'template_image' must be {{digest, bytes}} of a blob, got {image!r}")
    return manifest

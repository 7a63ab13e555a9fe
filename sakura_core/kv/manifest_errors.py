"""The manifest's errors (raised by the schema, the limits and the cross-step checks; re-exported by
:mod:`.manifest_schema`)."""

from __future__ import annotations

__all__ = ["ManifestError", "ModelMismatchError"]


class ManifestError(ValueError):
    """A manifest does not follow the schema, or is not the one asked for; the message names the offending field
    (e.g. ``shards[2].layers``)."""


class ModelMismatchError(ManifestError):
    """The template's KV was computed for another model than the one asked for."""

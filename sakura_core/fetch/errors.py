"""Errors of the shard client: each says what failed and carries the digest or template it was about."""

from __future__ import annotations

__all__ = [
    "AuthError",
    "FetchError",
    "ManifestError",
    "ModelMismatchError",
    "ShardIntegrityError",
    "ShardNotFoundError",
    "ShardUnavailableError",
    "TemplateNotFoundError",
]


class FetchError(Exception):
    """Base class: something went wrong talking to the shard server."""


class ShardIntegrityError(FetchError):
    """The bytes received for a shard do not match its digest (or its announced size); they were discarded."""

    def __init__(self, digest: str, detail: str):
        super().__init__(f"shard {digest}: {detail}; the bytes were discarded")
        self.digest = digest
        self.detail = detail


class ShardUnavailableError(FetchError):
    """A shard could not be fetched: retries exhausted, or the server refused it."""

    def __init__(self, digest: str, detail: str, attempts: int = 0):
        super().__init__(f"shard {digest} unavailable after {attempts} attempt(s): {detail}")
        self.digest = digest
        self.detail = detail
        self.attempts = attempts


class ShardNotFoundError(ShardUnavailableError):
    """The server has no shard with this digest (404)."""


class AuthError(FetchError):
    """The server wants a (different) bearer token: 401/403."""


class ManifestError(FetchError, ValueError):
    """A manifest is malformed; the message names the offending field."""


class ModelMismatchError(ManifestError):
    """The template's KV was computed for another model than the one asked for."""


class TemplateNotFoundError(FetchError, LookupError):
    """No published template with this id."""

"""Errors of the shard client: each says what failed and carries the digest or template it was about. A bad
manifest raises the schema's ``ManifestError`` / ``ModelMismatchError`` (:mod:`sakura_core.kv.manifest_schema`,
re-exported here)."""

from __future__ import annotations

import asyncio
import socket

from ..kv.manifest_schema import ManifestError, ModelMismatchError  # a manifest's errors (the schema's own)

__all__ = [
    "AuthError",
    "ServerUnreachableError",
    "connection_problem",
    "unreachable_message",
    "FetchError",
    "ManifestError",
    "ModelMismatchError",
    "RedirectRefusedError",
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


class RedirectRefusedError(FetchError):
    """The server answered a 3xx: SAKURA clients never follow a redirect (a redirect could lead the fetch, and the
    token, to a host, port or path nobody configured). Carries the URL asked and the ``Location`` answered."""

    def __init__(self, what: str, url: str, status: int, location: str | None):
        self.url = url
        self.status = status
        self.location = (location or "")[:300]
        where = f"to {self.location!r}" if location else "without a Location"
        super().__init__(
            f"{what}: {url} answered HTTP {status}, a redirect {where}; SAKURA clients do not follow "
            "redirects: give the final server URL instead"
        )


class TemplateNotFoundError(FetchError, LookupError):
    """No published template with this id."""


class ServerUnreachableError(FetchError, ConnectionError):
    """No connection to the server could be made (refused, unknown host, timed out), retries included."""


def connection_problem(error: BaseException) -> str | None:
    """A short reason for a failed connection (``"connection refused"``, ``"unknown host"``, ``"timed out"``, ...),
    or None when ``error`` is not about connecting. Reads aiohttp's ``ClientConnectorError.os_error`` without
    importing aiohttp, so its internals (``ConnectionKey(...)``) never reach a user."""
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    os_error = getattr(error, "os_error", None)
    if not isinstance(os_error, OSError):
        return None
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(os_error, socket.gaierror):
        return "unknown host"
    if isinstance(os_error, TimeoutError):
        return "timed out"
    return os_error.strerror or type(os_error).__name__


def unreachable_message(what: str, url: str, problem: str, command: str = "sakura serve") -> str:
    """The one wording of "no connection": what failed, where, why, and what to start."""
    return f"{what}: cannot reach the SAKURA server at {url} ({problem}) — is `{command}` running?"

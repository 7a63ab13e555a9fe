"""Shard client: catalog, manifests and content-addressed KV shards from a SAKURA server (or any cache in front).

``ShardClient.fetch_shard`` streams one shard, resumes with ``Range`` after a broken connection (bounded retries with
backoff), and checks the sha256 of the whole blob against its digest before returning it: it raises, never returns
wrong bytes. Two hooks serve the runtime: ``on_chunk(nbytes)`` after each chunk (throughput measurement) and
``throttle(nbytes)``, awaited before each chunk is counted (a token-bucket link shaper plugs in there).

Example::

    async with ShardClient("http://127.0.0.1:8080") as client:
        manifest = await client.get_manifest("astronaut", expected_model_id=model.model_id)   # a kv.Manifest
        rep = manifest.shards[0].representations[0]
        blob = await client.fetch_shard(rep.digest, expected_bytes=rep.nbytes)
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from ..kv.manifest import Manifest, parse_manifest
from ..kv.names import is_digest, is_template_id
from ..limits import bounded_json
from .answers import PinnedResolver, error_detail, not_transient, refuse_redirect
from .client_config import ClientConfig, FetchStats
from .errors import (
    AuthError,
    FetchError,
    ManifestError,
    ModelMismatchError,
    RedirectRefusedError,
    ServerUnreachableError,
    ShardIntegrityError,
    ShardNotFoundError,
    ShardUnavailableError,
    TemplateNotFoundError,
    connection_problem,
    unreachable_message,
)

__all__ = [
    "AuthError",
    "ClientConfig",
    "FetchError",
    "FetchStats",
    "ManifestError",
    "ModelMismatchError",
    "OnChunk",
    "RedirectRefusedError",
    "ServerUnreachableError",
    "ShardClient",
    "ShardIntegrityError",
    "ShardNotFoundError",
    "ShardUnavailableError",
    "TemplateNotFoundError",
    "Throttle",
]

logger = logging.getLogger(__name__)

_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


# ---- client ---------------------------------------------------------------------------------------------------
class _Retry(Exception):
    """An attempt failed in a way another attempt may fix."""


class _Progress:
    """The bytes of one shard assembled so far, with their running hash."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.hasher = hashlib.sha256()
        self.total: int | None = None

    def reset(self) -> None:
        self.buf = bytearray()
        self.hasher = hashlib.sha256()
        self.total = None


OnChunk = Callable[[int], Any]
Throttle = Callable[[int], Awaitable[None]]


class ShardClient:
    """aiohttp client of a SAKURA server (or a CDN in front of one). Use as ``async with`` or call ``close()``.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8080``.
        token: bearer token sent with every request (needed when the server has a read token).
        config: timeouts, retries, limits.
        session: an existing ``aiohttp.ClientSession`` to use (not closed by this client).
        sleep: the coroutine used to wait between retries (inject a fake clock in tests).
        addresses: when given, the only IP addresses the client's own session connects to for ``base_url``'s host
            (checked ones, e.g. the phone agent's; a second answer of the resolver cannot redirect it).

    A redirect (3xx) is never followed: it raises :class:`RedirectRefusedError`, naming the URL and the Location.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        config: ClientConfig | None = None,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        addresses: tuple[str, ...] = (),
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.config = config or ClientConfig()
        self._token = token
        self._session = session
        self._own_session = session is None
        self._sleep = sleep
        self._addresses = tuple(addresses)
        self._rng = random.Random(self.config.seed)
        self.stats = FetchStats()

    async def __aenter__(self) -> ShardClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            cfg = self.config
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=cfg.max_connections, resolver=PinnedResolver(self._addresses) if self._addresses else None
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s
                ),
                auto_decompress=False,
            )
            self._own_session = True
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def shard_url(self, digest: str) -> str:
        return f"{self.base_url}/v1/shards/{digest}"

    def _backoff_s(self, failures: int) -> float:
        cfg = self.config
        delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** max(0, failures - 1))
        return delay * (1 - cfg.backoff_jitter * self._rng.random())

    def _count_error(self, e: BaseException) -> None:
        name = type(e).__name__
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1

    # ---- JSON endpoints -------------------------------------------------------------------------------------
    def _give_up(self, failures: int, waited_s: float) -> bool:
        """After ``failures`` consecutive failures spanning ``waited_s`` seconds of backoff."""
        return failures > self.config.max_retries and waited_s >= self.config.retry_window_s

    async def _read_capped(self, resp: aiohttp.ClientResponse, what: str) -> bytes:
        """The whole body (``content.read(n)`` may return less than is coming), refused past ``max_json_bytes``."""
        limit, body = self.config.max_json_bytes, bytearray()
        async for chunk in resp.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > limit:
                raise FetchError(f"{what}: body over the client's limit of {limit}")
        return bytes(body)

    async def _get_json(self, path: str, what: str) -> Any:
        failures, waited_s = 0, 0.0
        while True:
            try:
                url = self.base_url + path
                async with self._get_session().get(url, headers=self._headers(), allow_redirects=False) as resp:
                    refuse_redirect(resp, what, url)
                    if resp.status == 200:
                        if (resp.content_length or 0) > self.config.max_json_bytes:
                            raise FetchError(f"{what}: {resp.content_length} bytes is over the client's limit")
                        body = await self._read_capped(resp, what)
                        try:
                            return bounded_json(body, what, max_bytes=self.config.max_json_bytes)
                        except ValueError as e:  # not JSON, too deep, NaN
                            raise ManifestError(f"the server sent {e}") from e
                    detail = await error_detail(resp)
                    if resp.status in (401, 403):
                        raise AuthError(f"{what}: HTTP {resp.status} {detail} (pass the server's token)")
                    if resp.status == 404:
                        raise TemplateNotFoundError(f"{what}: not found ({detail})")
                    if resp.status == 409:
                        raise ModelMismatchError(f"{what}: {detail}")
                    if resp.status not in _RETRY_STATUSES or not_transient(resp):
                        raise FetchError(f"{what}: HTTP {resp.status} {detail}")
                    raise _Retry(f"HTTP {resp.status} {detail}")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, _Retry) as e:
                failures += 1
                self._count_error(e)
                if self._give_up(failures, waited_s) or failures >= self.config.max_attempts:
                    problem = connection_problem(e)
                    if problem is not None:
                        raise ServerUnreachableError(unreachable_message(what, self.base_url, problem)) from e
                    raise FetchError(f"{what}: failed after {failures} attempt(s): {e!r}") from e
                delay = self._backoff_s(failures)
                waited_s += delay
                await self._sleep(delay)

    async def get_catalog(self) -> dict:
        """``GET /v1/templates``: ``{"model_id", "templates": [{"id", "model_id", ...}]}``."""
        catalog = await self._get_json("/v1/templates", "catalog")
        if not isinstance(catalog, dict) or not isinstance(catalog.get("templates"), list):
            raise FetchError(f"catalog: expected an object with a 'templates' list, got {str(catalog)[:200]}")
        return catalog

    async def get_manifest(self, template_id: str, *, expected_model_id: str | None = None) -> Manifest:
        """``GET /v1/templates/{id}/manifest``, parsed (``sakura_core.kv.parse_manifest``: the schema, the template
        asked for and, when given, the model)."""
        if not is_template_id(template_id):
            raise ValueError(f"invalid template id {template_id!r}: use 1-64 characters from a-z, 0-9 and '-'")
        manifest = await self._get_json(f"/v1/templates/{template_id}/manifest", f"manifest of {template_id!r}")
        return parse_manifest(manifest, template_id=template_id, model_id=expected_model_id)

    # ---- shards ---------------------------------------------------------------------------------------------
    async def fetch_shard(
        self,
        digest: str,
        *,
        expected_bytes: int | None = None,
        on_chunk: OnChunk | None = None,
        throttle: Throttle | None = None,
    ) -> bytes:
        """Fetch one shard; return its bytes only once their sha256 equals ``digest``.

        Args:
            digest: the shard's sha256 hex digest (its name).
            expected_bytes: size from the manifest; a server announcing another size is refused.
            on_chunk: called with each chunk's size once it is counted (may return an awaitable).
            throttle: awaited with each chunk's size before it is counted (link shaping).

        Raises:
            ShardIntegrityError: the bytes (after ``integrity_retries`` refetches) do not match the digest or size.
            ShardNotFoundError: the server has no such shard.
            ShardUnavailableError: retries exhausted (the last error is chained).
            AuthError: the server refused the token.
        """
        if not is_digest(digest):
            raise ValueError(f"invalid shard digest {digest!r}: expected 64 lowercase hex characters")
        cfg = self.config
        if expected_bytes is not None and not 0 <= expected_bytes <= cfg.max_shard_bytes:
            raise ValueError(f"expected_bytes {expected_bytes} is outside 0..{cfg.max_shard_bytes}")
        progress = _Progress()
        attempts = failures = integrity_failures = 0
        waited_s = 0.0  # backoff slept during the current run of failures
        while True:
            attempts += 1
            self.stats.attempts += 1
            before = len(progress.buf)
            try:
                await self._attempt(digest, progress, expected_bytes, on_chunk, throttle)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, _Retry) as e:
                self._count_error(e)
                if len(progress.buf) > before:
                    failures, waited_s = 0, 0.0
                else:
                    failures += 1
                logger.info(
                    "shard %s: attempt %d failed after %d bytes: %r", digest[:12], attempts, len(progress.buf), e
                )
                if self._give_up(failures, waited_s) or attempts >= cfg.max_attempts:
                    problem = connection_problem(e)
                    last = (
                        unreachable_message("last error", self.base_url, problem)
                        if problem is not None
                        else f"last error: {e!r}"
                    )
                    raise ShardUnavailableError(digest, last, attempts) from e
                delay = self._backoff_s(max(failures, 1))
                waited_s += delay
                await self._sleep(delay)
                continue
            actual = progress.hasher.hexdigest()
            if actual == digest:
                self.stats.shards += 1
                return bytes(progress.buf)
            integrity_failures += 1
            self.stats.integrity_failures += 1
            detail = f"received {len(progress.buf)} bytes hashing to {actual}"
            if integrity_failures > cfg.integrity_retries or attempts >= cfg.max_attempts:
                raise ShardIntegrityError(digest, detail)
            logger.warning("shard %s: %s; refetching it whole", digest[:12], detail)
            progress.reset()
            self.stats.restarts += 1

    async def _attempt(
        self,
        digest: str,
        progress: _Progress,
        expected_bytes: int | None,
        on_chunk: OnChunk | None,
        throttle: Throttle | None,
    ) -> None:
        """One GET; appends to ``progress`` and returns when the body is complete, else raises."""
        cfg = self.config
        headers = self._headers()
        offset = len(progress.buf)
        if offset:
            headers["Range"] = f"bytes={offset}-"
            headers["If-Range"] = f'"{digest}"'
            self.stats.resumes += 1
        url = self.shard_url(digest)
        async with self._get_session().get(url, headers=headers, allow_redirects=False) as resp:
            refuse_redirect(resp, f"shard {digest[:12]}", url)
            etag = resp.headers.get("ETag")
            if resp.status in (200, 206) and etag is not None and etag.removeprefix("W/").strip('"') != digest:
                raise ShardIntegrityError(digest, f"server answered with ETag {etag}, another object")
            if resp.status == 200:
                if offset:
                    logger.info("shard %s: server ignored Range, restarting from byte 0", digest[:12])
                    progress.reset()
                    self.stats.restarts += 1
                total = resp.content_length
            elif resp.status == 206:
                m = _CONTENT_RANGE_RE.fullmatch(resp.headers.get("Content-Range", "").strip())
                if m is None or int(m.group(1)) != offset or int(m.group(2)) != int(m.group(3)) - 1:
                    # Not the range asked for: start over rather than splice bytes we cannot place.
                    progress.reset()
                    self.stats.restarts += 1
                    raise _Retry(f"206 with Content-Range {resp.headers.get('Content-Range')!r}, asked for {offset}-")
                total = int(m.group(3))
            elif resp.status == 416 and offset and progress.total == offset:
                return  # we already hold every byte
            else:
                detail = await error_detail(resp)
                if resp.status == 404:
                    raise ShardNotFoundError(digest, f"HTTP 404 {detail}", 1)
                if resp.status in (401, 403):
                    raise AuthError(f"shard {digest}: HTTP {resp.status} {detail} (pass the server's token)")
                if resp.status == 416:
                    progress.reset()
                    raise _Retry(f"HTTP 416 at offset {offset}")
                if resp.status in _RETRY_STATUSES and not not_transient(resp):
                    raise _Retry(f"HTTP {resp.status} {detail}")
                raise ShardUnavailableError(digest, f"HTTP {resp.status} {detail}", 1)
            if total is not None:
                if expected_bytes is not None and total != expected_bytes:
                    raise ShardIntegrityError(digest, f"server announces {total} bytes, the manifest {expected_bytes}")
                if total > cfg.max_shard_bytes:
                    raise ShardIntegrityError(
                        digest, f"{total} bytes is over the client's limit {cfg.max_shard_bytes}"
                    )
                progress.total = total
            limit = progress.total if progress.total is not None else (expected_bytes or cfg.max_shard_bytes)
            async for chunk in resp.content.iter_chunked(cfg.chunk_bytes):
                n = len(chunk)
                if len(progress.buf) + n > limit:
                    progress.reset()
                    raise ShardIntegrityError(digest, f"server sent more than the {limit} bytes announced")
                if throttle is not None:
                    await throttle(n)
                progress.buf += chunk
                progress.hasher.update(chunk)
                self.stats.bytes_received += n
                if on_chunk is not None:
                    res = on_chunk(n)
                    if inspect.isawaitable(res):
                        await res
            if progress.total is not None and len(progress.buf) < progress.total:
                raise _Retry(f"body ended at {len(progress.buf)} of {progress.total} bytes")
            if progress.total is None:
                progress.total = len(progress.buf)

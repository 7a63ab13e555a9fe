"""Shard client: catalog, manifests and content-addressed KV shards from a SAKURA server (or any cache in front).

``ShardClient.fetch_shard`` streams one shard, resumes with ``Range`` after a broken connection (bounded retries with
backoff), and checks the sha256 of the whole blob against its digest before returning it: it raises, never returns
wrong bytes. Two hooks serve the runtime: ``on_chunk(nbytes)`` after each chunk (throughput measurement) and
``throttle(nbytes)``, awaited before each chunk is counted (a token-bucket link shaper plugs in there).

Example::

    async with ShardClient("http://127.0.0.1:8080") as client:
        manifest = await client.get_manifest("astronaut", expected_model_id=model.model_id)
        rep = manifest["shards"][0]["representations"][0]
        blob = await client.fetch_shard(rep["digest"], expected_bytes=rep["bytes"])
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = [
    "AuthError",
    "ClientConfig",
    "FetchError",
    "FetchStats",
    "ManifestError",
    "ModelMismatchError",
    "ShardClient",
    "ShardIntegrityError",
    "ShardNotFoundError",
    "ShardUnavailableError",
    "TemplateNotFoundError",
    "check_manifest",
]

logger = logging.getLogger(__name__)

_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_TEMPLATE_ID_RE = re.compile(r"[a-z0-9-]{1,64}")
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MANIFEST_VERSION = 1


# ---- errors ---------------------------------------------------------------------------------------------------
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


# ---- manifest checks ------------------------------------------------------------------------------------------
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
    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestError(
            f"manifest field 'version' is {manifest.get('version')!r}; this client reads version {MANIFEST_VERSION}"
        )
    from sakura_core.kv import validate_manifest  # the schema lives with the codec

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
        and _DIGEST_RE.fullmatch(image["digest"])
        and _is_int(image.get("bytes"))
        and image["bytes"] > 0
    ):
        raise ManifestError(f"manifest field 'template_image' must be {{digest, bytes}} of a blob, got {image!r}")
    return manifest


# ---- client ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientConfig:
    """Timeouts, retries and limits of ``ShardClient``.

    Attributes:
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: longest silence (seconds) between two reads of a body before the attempt is abandoned.
        max_retries: consecutive failed attempts that brought no new bytes before giving up.
        max_attempts: attempts per shard in all (each resume is an attempt).
        backoff_initial_s: wait before the first retry (seconds); doubles per consecutive failure.
        backoff_max_s: cap of the wait between retries (seconds).
        backoff_jitter: fraction (0..1) of each wait that is randomised, so clients do not retry in lockstep.
        integrity_retries: full refetches after the assembled bytes fail their digest, before raising.
        chunk_bytes: largest chunk handed to ``throttle``/``on_chunk`` (bytes).
        max_shard_bytes: refuse shards larger than this (bytes).
        max_json_bytes: refuse catalog/manifest bodies larger than this (bytes).
        max_connections: connection pool size of the client's own session.
        seed: seed of the backoff jitter.
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_retries: int = 4
    max_attempts: int = 16
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    backoff_jitter: float = 0.2
    integrity_retries: int = 1
    chunk_bytes: int = 64 * 2**10
    max_shard_bytes: int = 4 * 2**30
    max_json_bytes: int = 16 * 2**20
    max_connections: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.backoff_initial_s < 0 or not 0 <= self.backoff_jitter <= 1:
            raise ValueError(
                f"backoff_initial_s must be >= 0 and backoff_jitter in [0, 1], got {self.backoff_initial_s}, "
                f"{self.backoff_jitter}"
            )
        for name in ("max_retries", "integrity_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_attempts", "chunk_bytes", "max_shard_bytes", "max_json_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class FetchStats:
    """Counters over the client's lifetime (bytes are payload bytes received, including discarded ones)."""

    shards: int = 0
    bytes_received: int = 0
    attempts: int = 0
    resumes: int = 0
    restarts: int = 0
    integrity_failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)


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
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        config: ClientConfig | None = None,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.config = config or ClientConfig()
        self._token = token
        self._session = session
        self._own_session = session is None
        self._sleep = sleep
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
                connector=aiohttp.TCPConnector(limit=cfg.max_connections),
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
    async def _get_json(self, path: str, what: str) -> Any:
        failures = 0
        while True:
            try:
                async with self._get_session().get(self.base_url + path, headers=self._headers()) as resp:
                    if resp.status == 200:
                        if (resp.content_length or 0) > self.config.max_json_bytes:
                            raise FetchError(f"{what}: {resp.content_length} bytes is over the client's limit")
                        body = await resp.content.read(self.config.max_json_bytes + 1)
                        if len(body) > self.config.max_json_bytes:
                            raise FetchError(f"{what}: body over the client's limit of {self.config.max_json_bytes}")
                        try:
                            return json.loads(body)
                        except ValueError as e:
                            raise ManifestError(f"{what}: server sent invalid JSON: {e}") from e
                    detail = await _error_detail(resp)
                    if resp.status in (401, 403):
                        raise AuthError(f"{what}: HTTP {resp.status} {detail} (pass the server's token)")
                    if resp.status == 404:
                        raise TemplateNotFoundError(f"{what}: not found ({detail})")
                    if resp.status == 409:
                        raise ModelMismatchError(f"{what}: {detail}")
                    if resp.status not in _RETRY_STATUSES:
                        raise FetchError(f"{what}: HTTP {resp.status} {detail}")
                    raise _Retry(f"HTTP {resp.status} {detail}")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, _Retry) as e:
                failures += 1
                self._count_error(e)
                if failures > self.config.max_retries:
                    raise FetchError(f"{what}: failed after {failures} attempt(s): {e!r}") from e
                await self._sleep(self._backoff_s(failures))

    async def get_catalog(self) -> dict:
        """``GET /v1/templates``: ``{"model_id", "templates": [{"id", "model_id", ...}]}``."""
        catalog = await self._get_json("/v1/templates", "catalog")
        if not isinstance(catalog, dict) or not isinstance(catalog.get("templates"), list):
            raise FetchError(f"catalog: expected an object with a 'templates' list, got {str(catalog)[:200]}")
        return catalog

    async def get_manifest(self, template_id: str, *, expected_model_id: str | None = None) -> dict:
        """``GET /v1/templates/{id}/manifest``, checked with ``check_manifest`` (model id too, when given)."""
        if not isinstance(template_id, str) or not _TEMPLATE_ID_RE.fullmatch(template_id):
            raise ValueError(f"invalid template id {template_id!r}: use 1-64 characters from a-z, 0-9 and '-'")
        manifest = await self._get_json(f"/v1/templates/{template_id}/manifest", f"manifest of {template_id!r}")
        return check_manifest(manifest, template_id=template_id, model_id=expected_model_id)

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
        if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
            raise ValueError(f"invalid shard digest {digest!r}: expected 64 lowercase hex characters")
        cfg = self.config
        if expected_bytes is not None and not 0 <= expected_bytes <= cfg.max_shard_bytes:
            raise ValueError(f"expected_bytes {expected_bytes} is outside 0..{cfg.max_shard_bytes}")
        progress = _Progress()
        attempts = failures = integrity_failures = 0
        while True:
            attempts += 1
            self.stats.attempts += 1
            before = len(progress.buf)
            try:
                await self._attempt(digest, progress, expected_bytes, on_chunk, throttle)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, _Retry) as e:
                self._count_error(e)
                failures = 0 if len(progress.buf) > before else failures + 1
                logger.info(
                    "shard %s: attempt %d failed after %d bytes: %r", digest[:12], attempts, len(progress.buf), e
                )
                if failures > cfg.max_retries or attempts >= cfg.max_attempts:
                    raise ShardUnavailableError(digest, f"last error: {e!r}", attempts) from e
                await self._sleep(self._backoff_s(max(failures, 1)))
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
        async with self._get_session().get(self.shard_url(digest), headers=headers) as resp:
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
                detail = await _error_detail(resp)
                if resp.status == 404:
                    raise ShardNotFoundError(digest, f"HTTP 404 {detail}", 1)
                if resp.status in (401, 403):
                    raise AuthError(f"shard {digest}: HTTP {resp.status} {detail} (pass the server's token)")
                if resp.status == 416:
                    progress.reset()
                    raise _Retry(f"HTTP 416 at offset {offset}")
                if resp.status in _RETRY_STATUSES:
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


async def _error_detail(resp: aiohttp.ClientResponse) -> str:
    """The server's error message (JSON ``{"error": ...}`` or the first 200 characters of text)."""
    try:
        text = (await resp.content.read(4096)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return ""
    try:
        return str(json.loads(text).get("error", text))[:300]
    except (ValueError, AttributeError):
        return text[:200]

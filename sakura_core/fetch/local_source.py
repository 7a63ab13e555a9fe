"""A store folder on this machine as a shard source: :class:`LocalShardSource` reads manifests and shards from the
folder directly (no server), with the shard client's interface and checks: the manifest parsed once
(``sakura_core.kv.parse_manifest``), every shard's sha256 checked against its digest and its size against the
manifest's before it is returned, ``throttle(n)`` awaited and ``on_chunk(n)`` called per chunk (so a link shaper
and the pipeline's transfer tracking work as over HTTP).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os

from ..kv.manifest import Manifest, parse_manifest
from ..kv.names import is_digest, is_template_id
from .client import OnChunk, Throttle
from .client_config import ClientConfig, FetchStats
from .errors import FetchError, ManifestError, ShardIntegrityError, ShardNotFoundError, TemplateNotFoundError
from .store_layout import NotFoundError, StoreReader

__all__ = ["LocalShardSource"]


class LocalShardSource:
    """The :class:`~sakura_core.fetch.sources.ShardSource` of a store folder (``sakura precompute --store DIR``).
    Use as ``async with`` (nothing to release; for symmetry with the HTTP client).

    Args:
        root: the store folder; ``ValueError`` when it is not a SAKURA store (says how to make one).
        config: the limits and chunk size it shares with the HTTP client (``max_shard_bytes``,
            ``max_json_bytes``, ``chunk_bytes``); retries do not apply (a file does not heal by re-reading).
    """

    def __init__(self, root: str | os.PathLike, *, config: ClientConfig | None = None):
        self.store = StoreReader.existing(root)
        self.config = config or ClientConfig()
        self.stats = FetchStats()

    def __repr__(self) -> str:
        return f"LocalShardSource({str(self.store.root)!r})"

    async def __aenter__(self) -> LocalShardSource:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        pass

    async def get_catalog(self) -> dict:
        """``{"model_id": None, "templates": [{"id": ...}, ...]}``: the store's published ids (any model's)."""
        ids = await asyncio.to_thread(self.store.list_templates)
        return {"model_id": None, "templates": [{"id": tid} for tid in ids]}

    async def get_manifest(self, template_id: str, *, expected_model_id: str | None = None) -> Manifest:
        """The template's manifest as stored, parsed (the schema, the template asked for and, when given, the
        model); ``TemplateNotFoundError`` when the store has not published it."""
        if not is_template_id(template_id):
            raise ValueError(f"invalid template id {template_id!r}: use 1-64 characters from a-z, 0-9 and '-'")
        what = f"manifest of {template_id!r}"
        try:
            raw = await asyncio.to_thread(self.store.get_manifest_bytes, template_id)
        except NotFoundError as e:
            raise TemplateNotFoundError(f"{what}: not found ({e})") from e
        if len(raw) > self.config.max_json_bytes:
            raise FetchError(f"{what}: {len(raw)} bytes is over the client's limit")
        try:
            manifest = json.loads(raw)
        except ValueError as e:
            raise ManifestError(f"{what}: the store holds invalid JSON: {e}") from e
        return parse_manifest(manifest, template_id=template_id, model_id=expected_model_id)

    async def fetch_shard(
        self,
        digest: str,
        *,
        expected_bytes: int | None = None,
        on_chunk: OnChunk | None = None,
        throttle: Throttle | None = None,
    ) -> bytes:
        """One shard's bytes, returned only once their sha256 equals ``digest`` (arguments and errors as
        ``ShardClient.fetch_shard``: ``ShardNotFoundError``, ``ShardIntegrityError``)."""
        if not is_digest(digest):
            raise ValueError(f"invalid shard digest {digest!r}: expected 64 lowercase hex characters")
        cfg = self.config
        if expected_bytes is not None and not 0 <= expected_bytes <= cfg.max_shard_bytes:
            raise ValueError(f"expected_bytes {expected_bytes} is outside 0..{cfg.max_shard_bytes}")
        self.stats.attempts += 1
        try:
            f, size = await asyncio.to_thread(self.store.open_shard, digest)
        except NotFoundError as e:
            raise ShardNotFoundError(digest, f"not in {self.store}", 1) from e
        with f:
            if expected_bytes is not None and size != expected_bytes:
                raise ShardIntegrityError(digest, f"the store holds {size} bytes, the manifest {expected_bytes}")
            if size > cfg.max_shard_bytes:
                raise ShardIntegrityError(digest, f"{size} bytes is over the client's limit {cfg.max_shard_bytes}")
            buf, hasher = await self._read(f, size, digest, on_chunk, throttle)
        actual = hasher.hexdigest()
        if actual != digest:
            self.stats.integrity_failures += 1
            raise ShardIntegrityError(digest, f"the store's {len(buf)} bytes hash to {actual}")
        self.stats.shards += 1
        return bytes(buf)

    async def _read(self, f, size: int, digest: str, on_chunk, throttle):
        buf, hasher = bytearray(), hashlib.sha256()
        while chunk := await asyncio.to_thread(f.read, self.config.chunk_bytes):
            n = len(chunk)
            if len(buf) + n > size:
                raise ShardIntegrityError(digest, f"the file grew past its {size} bytes while it was read")
            if throttle is not None:
                await throttle(n)
            buf += chunk
            hasher.update(chunk)
            self.stats.bytes_received += n
            if on_chunk is not None:
                res = on_chunk(n)
                if inspect.isawaitable(res):
                    await res
        return buf, hasher

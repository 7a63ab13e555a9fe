"""Where an edit's template comes from, behind one interface: a :class:`ShardSource` serves a template's manifest,
its shards and its image by digest, checked the same way whichever it is. Two kinds:

* :class:`ServerSource` (a SAKURA server or a CDN in front of one): opens a ``ShardClient`` (HTTP, ``Range``
  resumption, retries);
* :class:`StoreSource` (a store folder on this machine, ``sakura precompute --store DIR``): opens a
  ``LocalShardSource`` that reads the folder directly (no server).

``source.open()`` gives the shard source to use as ``async with``; its ``fetch_shard(digest, expected_bytes=,
on_chunk=, throttle=)`` is what ``fetch.link.shaped_fetcher`` paces into the pipeline's ``fetch_blob``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..kv.manifest import Manifest

__all__ = ["ServerSource", "ShardSource", "StoreSource", "TemplateSource"]


class ShardSource(Protocol):
    """Manifests and content-addressed blobs (shards, the template image) of published templates.

    ``get_manifest`` returns the parsed manifest (``sakura_core.kv.parse_manifest``; ``TemplateNotFoundError`` when
    unpublished); ``fetch_shard`` returns a blob only once its sha256 equals the digest (and its size the
    ``expected_bytes``), calling ``throttle(n)`` before and ``on_chunk(n)`` after each chunk it counts.
    """

    async def __aenter__(self) -> ShardSource: ...

    async def __aexit__(self, *exc) -> None: ...

    async def get_catalog(self) -> dict: ...

    async def get_manifest(self, template_id: str, *, expected_model_id: str | None = None) -> Manifest: ...

    async def fetch_shard(self, digest: str, *, expected_bytes=None, on_chunk=None, throttle=None) -> bytes: ...


class TemplateSource(Protocol):
    """Where a template is served: ``label`` (for messages and reports) and ``open()``, the :class:`ShardSource`
    to fetch from (use it as ``async with``)."""

    @property
    def label(self) -> str: ...

    def open(self) -> ShardSource: ...


@dataclass(frozen=True)
class ServerSource:
    """A SAKURA server (or a CDN in front of one).

    Attributes:
        url: base URL, ``http(s)://HOST[:PORT]`` (a trailing slash is dropped).
        token: bearer token of the server's read path, if it has one (never shown in reprs or reports).
        addresses: when given, the only IP addresses connected to for the URL's host (checked ones: the phone
            agent's; ``ShardClient``'s ``addresses``).
    """

    url: str
    token: str | None = field(default=None, repr=False)
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError(f"server url must be a non-empty http(s) URL, got {self.url!r}")
        object.__setattr__(self, "url", self.url.strip().rstrip("/"))

    @property
    def label(self) -> str:
        return self.url

    def open(self) -> ShardSource:
        from .client import ShardClient

        return ShardClient(self.url, self.token, addresses=self.addresses)


@dataclass(frozen=True)
class StoreSource:
    """A SAKURA store folder on this machine, read directly (digests and sizes verified as over HTTP).

    Attributes:
        store_dir: the store folder (it holds ``templates/`` and ``shards/``).
    """

    store_dir: str

    def __post_init__(self) -> None:
        if not isinstance(self.store_dir, str) or not self.store_dir.strip():
            raise ValueError("a local store source needs the store folder; give store_dir")

    @property
    def label(self) -> str:
        return f"store:{self.store_dir}"

    def open(self) -> ShardSource:
        """The folder's shard source; ``ValueError`` if it is not a SAKURA store (the message says how to make one)."""
        from .local_source import LocalShardSource

        return LocalShardSource(Path(self.store_dir).expanduser())

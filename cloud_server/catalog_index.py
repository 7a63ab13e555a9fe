"""The served catalog (``GET /v1/templates``), kept up to date incrementally.

Each published template has a cached summary (its catalog entry, already JSON-encoded) under a cheap version key
read from the store's listing, never from the manifest itself:

- a folder store: ``(mtime_ns, ctime_ns, size, inode)`` of ``templates/<id>/manifest.json`` (one ``lstat``; a publish
  renames a new file into place, so its inode changes too);
- an S3 store: the object's ``ETag`` and ``Size`` from ListObjectsV2 (no GET for an unchanged template);
- any other store: the sha256 of the manifest's bytes (read each time, parsed only when they change).

A rebuild lists the store, reads and validates only the manifests whose key changed or that appeared, drops the
ones that went away, and re-joins the encoded entries. A manifest left out (corrupt, unreadable, over the size limit,
another model's) is remembered under its key too: it is not read again, nor logged again, until it changes.

Rebuilds run in a worker thread, one at a time. The listing is rebuilt at most every ``ttl_s`` (and at once after a
publish here: :meth:`CatalogIndex.invalidate`). A request waits up to ``wait_s`` for a rebuild; past that, a server
that has served a catalog before answers with its last complete one, and a server still building its first answers
503 with ``Retry-After`` (:class:`CatalogBuildingError`: how many manifests are read so far, of how many).

Pages: ``?limit=N&after=ID`` (:func:`parse_page_query`) list the templates with ids after ``ID`` in id order, at most
``N``, with ``"next"``: the ``after`` of the next page, or null on the last. Without parameters the whole catalog is
sent, in the same order, as ``{"model_id", "templates"}``.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from sakura_core.fetch.store_layout import MANIFEST_FILE, TEMPLATES_DIR, StoreReader
from sakura_core.kv.manifest import Manifest, ManifestError
from sakura_core.kv.names import TEMPLATE_ID_RE

from .store import InvalidNameError, NotFoundError, Store, validate_template_id
from .store_faults import StoreFaultError, checked_manifest

__all__ = [
    "CatalogBuildingError",
    "CatalogConfig",
    "CatalogIndex",
    "CatalogSnapshot",
    "DEFAULT_PAGE_LIMIT",
    "MAX_PAGE_LIMIT",
    "catalog_entry",
    "parse_page_query",
    "template_versions",
]

logger = logging.getLogger(__name__)

#: Templates per page when ``after`` is given without ``limit``.
DEFAULT_PAGE_LIMIT = 100
#: The largest ``limit`` a page request may ask for.
MAX_PAGE_LIMIT = 1000


@dataclass(frozen=True)
class CatalogConfig:
    """How the catalog is kept.

    Attributes:
        ttl_s: seconds a built catalog is served before the store is listed again (``ServerConfig.catalog_ttl_s``).
        wait_s: seconds a request waits for a rebuild before it is answered without it (503 during the first build,
            else the last complete catalog).
        retry_after_s: the ``Retry-After`` (whole seconds) of the 503 sent during the first build.
    """

    ttl_s: float = 2.0
    wait_s: float = 5.0
    retry_after_s: int = 2

    def __post_init__(self):
        if not (self.ttl_s >= 0 and self.wait_s >= 0):
            raise ValueError(f"ttl_s and wait_s must be >= 0 seconds, got {self.ttl_s}, {self.wait_s}")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be >= 1 second, got {self.retry_after_s}")


class CatalogBuildingError(Exception):
    """The first catalog is still being built; ``retry_after_s`` says when to ask again."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


# ---- version keys -----------------------------------------------------------------------------------------------
def template_versions(store: Store) -> dict[str, str] | None:
    """``{template id: version key}`` of every published template from one listing (no manifest read), or ``None``
    for a store with no cheap version (the caller hashes the manifest bytes instead)."""
    if isinstance(store, StoreReader):
        return _folder_versions(store)
    from .s3_store import S3Store  # boto3 itself is imported only when an S3Store is made

    if isinstance(store, S3Store):
        return _s3_versions(store)
    return None


def _folder_versions(store: StoreReader) -> dict[str, str]:
    """One ``scandir`` of ``templates/`` and one ``lstat`` per manifest (links are not followed: a link in place of
    a manifest is listed, and its read is refused as a store fault)."""
    if store.templates_dir.is_symlink():  # as StoreReader.list_templates: a link out of the store is never followed
        return {}
    versions = {}
    with os.scandir(store.templates_dir) as entries:
        for entry in entries:
            if not (TEMPLATE_ID_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
                continue
            try:
                st = os.lstat(os.path.join(entry.path, MANIFEST_FILE))
            except FileNotFoundError:
                continue  # a template being written: not published yet
            except OSError as e:  # e.g. no permission on its folder: listed, and its read says why
                versions[entry.name] = f"error:{e.errno}"
                continue
            if not stat.S_ISDIR(st.st_mode):
                versions[entry.name] = f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_size}:{st.st_ino}"
    return versions


def _s3_versions(store: Any) -> dict[str, str]:
    """ListObjectsV2 under ``templates/``: each ``templates/<id>/manifest.json``'s ETag and size."""
    versions = {}
    for obj in store.list_objects(f"{TEMPLATES_DIR}/"):
        parts = store.relative(obj["Key"]).split("/")
        if len(parts) == 3 and parts[2] == MANIFEST_FILE and TEMPLATE_ID_RE.fullmatch(parts[1]):
            versions[parts[1]] = f"{obj.get('ETag', '')}:{obj.get('Size', '')}"
    return versions


# ---- entries ----------------------------------------------------------------------------------------------------
def catalog_entry(manifest: Manifest, template_id: str) -> dict:
    """A template's catalog entry from its (validated) manifest."""
    levels: dict[int, int] = {}
    for shard in manifest.shards:
        for rep in shard.representations:
            levels[rep.level] = levels.get(rep.level, 0) + rep.nbytes
    return {
        "id": template_id,
        "model_id": manifest.model_id,
        "token_grid": list(manifest.token_grid),
        "codec": manifest.codec,
        "num_layers": manifest.num_layers,
        "kv_mode": manifest.kv_mode,
        "steps": manifest.schedule.steps if manifest.schedule is not None else None,
        "shards": len(manifest.shards),
        "bytes_by_level": {str(k): v for k, v in sorted(levels.items())},
        "manifest_url": f"/v1/templates/{template_id}/manifest",
    }


@dataclass(frozen=True)
class _Summary:
    """A template as the catalog keeps it: its version key, and its encoded entry (None: left out, ``why``)."""

    key: str
    entry: bytes | None
    why: str = ""


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


@dataclass(frozen=True)
class CatalogSnapshot:
    """One complete catalog: the listed ids in order, their encoded entries, the whole body and its ETag;
    ``built_s``: when the store was listed for it (``time.monotonic``)."""

    model_id: str | None
    ids: tuple[str, ...]
    entries: tuple[bytes, ...]
    body: bytes
    etag: str
    generation: int
    built_s: float

    @classmethod
    def build(
        cls, model_id: str | None, listed: list[tuple[str, bytes]], generation: int, built_s: float
    ) -> CatalogSnapshot:
        head = b'{"model_id": ' + json.dumps(model_id).encode()
        entries = tuple(e for _, e in listed)
        body = head + b', "templates": [' + b", ".join(entries) + b"]}"  # json.dumps's own separators
        return cls(model_id, tuple(i for i, _ in listed), entries, body, _etag(body), generation, built_s)

    def page(self, after: str | None, limit: int) -> tuple[bytes, str]:
        """(body, ETag) of up to ``limit`` templates with ids after ``after`` (from the first without it)."""
        start = 0 if after is None else bisect.bisect_right(self.ids, after)
        end = min(start + limit, len(self.ids))
        nxt = self.ids[end - 1] if end < len(self.ids) and end > start else None
        body = (
            b'{"model_id": '
            + json.dumps(self.model_id).encode()
            + b', "templates": ['
            + b", ".join(self.entries[start:end])
            + b'], "next": '
            + json.dumps(nxt).encode()
            + b"}"
        )
        return body, _etag(body)


def parse_page_query(query: Mapping[str, str]) -> tuple[str | None, int] | None:
    """``(after, limit)`` of a page request, or ``None`` for the whole catalog (neither parameter given);
    ``ValueError`` naming the bad value and the fix."""
    if hasattr(query, "getall"):
        for name in ("limit", "after"):
            if len(query.getall(name, [])) > 1:
                raise ValueError(f"{name} is given {len(query.getall(name))} times: give it once")
    limit_text, after = query.get("limit"), query.get("after")
    if limit_text is None and after is None:
        return None
    limit = DEFAULT_PAGE_LIMIT
    if limit_text is not None:
        shown = limit_text if len(limit_text) <= 20 else limit_text[:20] + "…"
        if not (limit_text.isascii() and limit_text.isdigit() and 1 <= int(limit_text) <= MAX_PAGE_LIMIT):
            raise ValueError(
                f"limit {shown!r} is not a whole number from 1 to {MAX_PAGE_LIMIT}: send e.g. "
                f"?limit={DEFAULT_PAGE_LIMIT} (without it a page holds {DEFAULT_PAGE_LIMIT})"
            )
        limit = int(limit_text)
    if after is not None:
        try:
            validate_template_id(after)
        except InvalidNameError as e:
            raise ValueError(f"after: {e}; send the 'next' of the previous page, or no after for the first") from e
    return after, limit


# ---- the index --------------------------------------------------------------------------------------------------
class CatalogIndex:
    """The catalog of one server: cached summaries, the last complete snapshot, one rebuild at a time.

    Args:
        store: the store to list.
        config: TTL and waits (:class:`CatalogConfig`).
    """

    def __init__(self, store: Store, config: CatalogConfig | None = None):
        self.store = store
        self.config = config or CatalogConfig()
        self._summaries: dict[str, _Summary] = {}
        self._summaries_model: str | None = None
        self._snapshot: CatalogSnapshot | None = None
        self._pending = False  # summaries changed since the last snapshot (a rebuild that failed part-way)
        self._generation = 0
        self._task: asyncio.Future | None = None
        self._progress = (0, 0)  # (manifests read, to read) of the rebuild under way
        self._lock = threading.Lock()  # one rebuild at a time, even if two event loops share a store

    def invalidate(self) -> None:
        """A template was published here: the next request rebuilds (and waits for it)."""
        self._generation += 1

    def _fresh(self, snap: CatalogSnapshot | None, model_id: str | None, asked_s: float) -> TypeGuard[CatalogSnapshot]:
        """Whether ``snap`` answers a request made at ``asked_s``: the model's, no publish since, and listed within
        the TTL or after the request came."""
        if snap is None or snap.model_id != model_id or snap.generation != self._generation:
            return False
        return snap.built_s >= asked_s or time.monotonic() - snap.built_s < self.config.ttl_s

    async def snapshot(self, model_id: str | None) -> CatalogSnapshot:
        """The current catalog for ``model_id``: cached within the TTL, else rebuilt off the event loop (see the
        module docstring for what a request gets when the rebuild takes longer than ``wait_s``)."""
        asked_s = time.monotonic()
        deadline = asked_s + self.config.wait_s
        for _ in range(3):  # a rebuild under way when the request came (or before a publish), then its own
            snap = self._snapshot
            if self._fresh(snap, model_id, asked_s):
                return snap
            if self._task is None or self._task.done():
                self._task = self._start(model_id)
            try:
                await asyncio.wait_for(asyncio.shield(self._task), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        snap = self._snapshot
        if snap is not None and snap.model_id == model_id:
            return snap  # the last complete catalog while a long rebuild goes on
        done, total = self._progress
        raise CatalogBuildingError(
            f"the catalog is being built: {done} of {total} manifests read; retry in {self.config.retry_after_s} s",
            self.config.retry_after_s,
        )

    def _start(self, model_id: str | None) -> asyncio.Future:
        generation = self._generation
        fut = asyncio.get_running_loop().run_in_executor(None, self._rebuild, model_id, generation)
        fut.add_done_callback(_log_failure)
        return fut

    def _rebuild(self, model_id: str | None, generation: int) -> None:
        """List the store, re-read what changed, publish a new snapshot (in a worker thread)."""
        with self._lock:
            listed_s = time.monotonic()
            versions = template_versions(self.store)
            ids = sorted(versions) if versions is not None else self.store.list_templates()
            if model_id != self._summaries_model:  # entries filter by model: another model, start over
                self._summaries, self._summaries_model = {}, model_id
            summaries, snap = self._summaries, self._snapshot
            removed = summaries.keys() - set(ids)
            for gone in removed:
                del summaries[gone]
            self._pending |= bool(removed)
            todo = [t for t in ids if versions is None or t not in summaries or summaries[t].key != versions[t]]
            self._progress = (0, len(todo))
            for n, template_id in enumerate(todo):
                old = summaries.get(template_id)
                summary = self._summarize(template_id, None if versions is None else versions[template_id], model_id)
                if summary is None:  # unpublished meanwhile
                    self._pending |= summaries.pop(template_id, None) is not None
                else:
                    self._pending |= old is None or old.key != summary.key
                    summaries[template_id] = summary
                self._progress = (n + 1, len(todo))
            if self._pending or snap is None or snap.model_id != model_id:
                listed = [(t, e) for t in ids if t in summaries and (e := summaries[t].entry) is not None]
                self._snapshot = CatalogSnapshot.build(model_id, listed, generation, listed_s)
                self._pending = False
                self._log_left_out(model_id)
            else:
                self._snapshot = dataclasses.replace(snap, generation=generation, built_s=listed_s)

    def _summarize(self, template_id: str, key: str | None, model_id: str | None) -> _Summary | None:
        """Read, validate and summarize one manifest; ``None`` when it was unpublished meanwhile."""
        try:
            raw = self.store.get_manifest_bytes(template_id)
        except NotFoundError:
            return None
        except StoreFaultError as e:
            return self._left_out(template_id, key or f"fault:{e}", str(e))
        if key is None:
            key = "sha256:" + hashlib.sha256(raw).hexdigest()
            old = self._summaries.get(template_id)
            if old is not None and old.key == key:
                return old
        try:
            manifest = checked_manifest(raw, template_id)
        except ManifestError as e:
            return self._left_out(template_id, key, str(e))
        if model_id is not None and manifest.model_id != model_id:
            return _Summary(key, None, "other-model")
        return _Summary(key, json.dumps(catalog_entry(manifest, template_id)).encode())

    @staticmethod
    def _left_out(template_id: str, key: str, why: str) -> _Summary:
        logger.warning("catalog: template %s left out: %s", template_id, why[:300])  # once per version
        return _Summary(key, None, why)

    def _log_left_out(self, model_id: str | None) -> None:
        other = sum(1 for s in self._summaries.values() if s.why == "other-model")
        if other:
            logger.info("catalog: %d template(s) made for models other than %s not listed", other, model_id)


def _log_failure(fut: asyncio.Future) -> None:
    """Retrieve a failed rebuild's error (the requests that waited for it got it; asyncio would warn of one that
    nobody waited for); the next request starts a new rebuild, which goes on from the summaries already read."""
    if not fut.cancelled() and fut.exception() is not None:
        logger.debug("catalog rebuild failed: %r", fut.exception())

"""Where templates and shards live: a small ``Store`` interface and the local-folder implementation.

A ``LocalStore`` is a store folder (its layout and read side: ``sakura_core.fetch.store_layout``, which a local
shard source reads directly) with the writes on top. Every write goes through a temp file in the same folder +
fsync + rename, so a crash never leaves a visible partial shard or manifest. Names are validated before any path is
built; a name that fails raises ``InvalidNameError`` without touching the filesystem.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import logging
import os
import time
from pathlib import Path

from sakura_core.fetch.store_layout import (
    MANIFEST_FILE,
    SOURCE_IMAGE_EXTS,
    InvalidNameError,
    NotFoundError,
    StoreError,
    StoreFaultError,
    StoreReader,
    validate_digest,
    validate_template_id,
)
from sakura_core.files import atomic_create_bytes, atomic_write_bytes, folder_write_problem

__all__ = [
    "DigestMismatchError",
    "InvalidNameError",
    "LocalStore",
    "ManifestExistsError",
    "NotFoundError",
    "SOURCE_IMAGE_EXTS",
    "Store",
    "StoreError",
    "StoreFaultError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "validate_digest",
    "file_sha256",
    "validate_template_id",
]

logger = logging.getLogger(__name__)


class ManifestExistsError(StoreError, FileExistsError):
    """A template with this id was published (by another writer) before this manifest could be."""


class DigestMismatchError(StoreError, ValueError):
    """A shard's bytes do not hash to the digest it is stored under."""


class StoreUnavailableError(StoreError):
    """The store cannot answer now (an object store unreachable, a timeout, a connection cut, a 5xx answer):
    retrying later may help. ``kind`` names the fault in a few words (one log line per kind per interval)."""

    def __init__(self, message: str, *, kind: str = "store unavailable"):
        super().__init__(message)
        self.kind = kind


class StoreRefusedError(StoreFaultError):
    """An object store refused the request (403: the credentials; a missing bucket): retrying does not help until
    its configuration is fixed. ``kind`` as for :class:`StoreUnavailableError`."""

    def __init__(self, message: str, *, kind: str = "store refused"):
        super().__init__(message)
        self.kind = kind


class Store(abc.ABC):
    """What the server needs from storage. An object store (S3, GCS, ...) implements the same methods.

    Shards are immutable and content-addressed: ``put_shard`` of an existing digest is a no-op. A template is
    visible (listed, readable) only once its manifest is written, which callers do after all of its shards.
    """

    #: ``open_shard`` returns quickly (a local disk): the server may call it on its event loop. Network-backed
    #: stores leave this False and are called from a worker thread.
    open_is_fast: bool = False

    @abc.abstractmethod
    def put_shard(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest``; raise ``DigestMismatchError`` unless sha256(data) == digest."""

    @abc.abstractmethod
    def has_shard(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def open_shard(self, digest: str) -> tuple[io.RawIOBase, int]:
        """Open a shard for reading: (binary file object, size in bytes). Raise ``NotFoundError`` when absent.

        A file object with a real ``fileno()`` lets the server send it zero-copy (sendfile); others are streamed.
        The caller closes it.
        """

    @abc.abstractmethod
    def put_manifest(self, template_id: str, manifest: dict) -> None:
        """Publish a template: write its manifest (JSON). Call after every shard it names is stored."""

    @abc.abstractmethod
    def get_manifest_bytes(self, template_id: str) -> bytes:
        """The manifest exactly as stored; ``NotFoundError`` when the template is not published."""

    @abc.abstractmethod
    def list_templates(self) -> list[str]:
        """Ids of published templates (those with a manifest), sorted."""

    @abc.abstractmethod
    def put_source_image(self, template_id: str, data: bytes, ext: str) -> None:
        """Keep the template image a template was computed from (``ext`` in ``SOURCE_IMAGE_EXTS``)."""

    def check(self) -> None:
        """Raise ``StoreError`` saying what is wrong unless the store can be used (a network store: reachable, the
        bucket exists, the credentials work). Nothing to check for a local folder."""
        return None

    def write_problem(self) -> str | None:
        """Why this store cannot be written (a read-only or full folder, no permission), or ``None``: the server
        asks once at startup and reports write=off with this reason instead of accepting uploads it cannot keep."""
        return None

    def get_manifest(self, template_id: str) -> dict:
        """The parsed manifest."""
        raw = self.get_manifest_bytes(template_id)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise StoreError(f"manifest of template {template_id!r} is not valid JSON: {e}") from e

    def put_new_manifest(self, template_id: str, manifest: dict) -> None:
        """:meth:`put_manifest` unless the template is published: ``ManifestExistsError`` then. Atomic in a
        ``LocalStore`` (link(2)) and an ``S3Store`` whose server honours ``If-None-Match: *`` (AWS S3, radosgw):
        of concurrent publishers of one id one wins, the others are told; check-then-put in this default."""
        if self.has_template(template_id):
            raise ManifestExistsError(f"template {template_id!r} is already published")
        self.put_manifest(template_id, manifest)

    def has_template(self, template_id: str) -> bool:
        try:
            self.get_manifest_bytes(template_id)
        except NotFoundError:
            return False
        return True


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (POSIX: the directory entry lives in the directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:  # e.g. platforms that cannot open directories
        logger.debug("cannot open %s to fsync it: %s", path, e)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(StoreReader, Store):
    """A store in a local folder (the default): :class:`~sakura_core.fetch.store_layout.StoreReader`'s layout and
    reads, plus the writes.

    Args:
        root: the store folder; created if missing.
    """

    open_is_fast = True

    def __init__(self, root: str | os.PathLike):
        super().__init__(root)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.templates_dir.mkdir(parents=True, exist_ok=True)

    def _writable_folder(self, folder: Path) -> Path:
        """``folder`` (under the root) unless it or a folder above it in the store is a symbolic link: a write is
        never sent out of the store (``StoreFaultError``, as reads are refused)."""
        for part in (folder, *folder.parents):
            if part == self.root:
                return folder
            if part.is_symlink():
                raise StoreFaultError(
                    f"cannot write under {part.relative_to(self.root)}: it is a symbolic link (the "
                    "store never follows one; put the folder itself)"
                )
        raise StoreFaultError(f"{folder} is not inside the store {self.root}")

    # ---- shards ----------------------------------------------------------------------------------------------
    def put_shard(self, digest: str, data: bytes) -> None:
        path = self.shard_path(digest)
        self._writable_folder(path.parent)
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise DigestMismatchError(f"shard bytes hash to {actual}, not to the digest {digest} they were put under")
        if path.is_file():
            on_disk = file_sha256(path)
            if on_disk == digest:
                return  # content-addressed: verified to be the same bytes
            logger.warning(
                "store %s: shard %s on disk hashes to %s (corrupt); rewriting it", self.root, digest, on_disk
            )
        atomic_write_bytes(path, data)
        _fsync_dir(path.parent)

    def has_shard(self, digest: str) -> bool:
        return self.shard_path(digest).is_file()

    # ---- templates ------------------------------------------------------------------------------------------
    def put_manifest(self, template_id: str, manifest: dict) -> None:
        folder = self._writable_folder(self.template_dir(template_id))
        data = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
        atomic_write_bytes(folder / MANIFEST_FILE, data)
        _fsync_dir(folder)

    def put_new_manifest(self, template_id: str, manifest: dict) -> None:
        folder = self._writable_folder(self.template_dir(template_id))
        data = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
        try:
            atomic_create_bytes(folder / MANIFEST_FILE, data)
        except FileExistsError as e:
            raise ManifestExistsError(f"template {template_id!r} is already published in {self}") from e
        _fsync_dir(folder)

    def put_source_image(self, template_id: str, data: bytes, ext: str) -> None:
        if ext not in SOURCE_IMAGE_EXTS:
            raise ValueError(f"source image extension {ext!r} not one of {SOURCE_IMAGE_EXTS}")
        folder = self._writable_folder(self.template_dir(template_id))
        atomic_write_bytes(folder / f"source.{ext}", data)

    # ---- housekeeping ---------------------------------------------------------------------------------------
    def write_problem(self) -> str | None:
        """Create and remove a probe file in each folder a publish writes to (``os.access`` is no test: root passes
        it on a read-only mount); the first failure as ``folder: strerror (ERRNO)``."""
        for folder in (self.root, self.shards_dir, self.templates_dir):
            problem = folder_write_problem(folder)
            if problem is not None:
                return f"the store cannot be written: {problem}"
        return None

    def sweep_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete temp files a crashed writer left behind (never visible under a real name); returns the count."""
        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    p = Path(dirpath) / name
                    try:
                        if p.stat().st_mtime <= cutoff:
                            p.unlink()
                            removed += 1
                    except FileNotFoundError:
                        continue
                    except OSError as e:  # a read-only store: its temp files stay (logged once), serving goes on
                        logger.warning("store %s: cannot remove stale temp file %s: %s", self.root, p, e.strerror)
                        return removed
        if removed:
            logger.info("store %s: removed %d stale temp file(s)", self.root, removed)
        return removed

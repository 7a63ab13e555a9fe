"""``sakura store verify|repair`` for an :class:`~cloud_server.s3_store.S3Store`: the local check, on objects.

The same findings and the same report as :func:`cloud_server.fsck.fsck`: every object under ``PREFIX/shards/`` is
re-hashed (streamed, never held whole) against its name; misplaced keys, corrupt shards, orphan shards (no manifest
names them and older than ``orphan_age_s`` by ``LastModified``: shards are written before their manifest), shards a
manifest names that are absent, unreadable manifests. S3 has no temp files (a PUT appears whole or not at all); the
counterpart is an unfinished multipart upload, listed as a temp entry (``upload:<key>:<id>``) once older than
``temp_age_s``. ``repair`` copies corrupt and misplaced objects to ``PREFIX/quarantine/`` and deletes them, aborts
stale multipart uploads and deletes orphan shards.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time

from sakura_core.fetch.store_layout import SHARDS_DIR

from .fsck import FsckConfig, FsckReport, missing_digests, referenced_digests
from .s3_io import s3_error, stream_errors
from .s3_store import S3Store
from .store import NotFoundError

__all__ = ["fsck_s3"]

logger = logging.getLogger(__name__)

_SHARD_KEY = re.compile(rf"{SHARDS_DIR}/([0-9a-f]{{2}})/([0-9a-f]{{64}})")  # the layout's shard_key


def _object_sha256(store: S3Store, key: str, chunk_bytes: int = 1 << 20) -> str | None:
    """sha256 hex of an object's bytes (streamed); ``None`` when it vanished meanwhile."""
    try:
        body = store.get_object(key)["Body"]
    except NotFoundError:
        return None
    h = hashlib.sha256()
    try:
        while chunk := body.read(chunk_bytes):
            h.update(chunk)
    except stream_errors() as e:  # a timeout or a cut connection: a store error
        raise s3_error(store, f"reading {key}", e) from e
    finally:
        body.close()
    return h.hexdigest()


def _quarantine(store: S3Store, rel: str, report: FsckReport) -> None:
    dest = f"quarantine/{rel.rsplit('/', 1)[-1]}.{int(time.time())}"
    store.copy_object(store.key(rel), store.key(dest))
    store.delete_object(store.key(rel))
    report.quarantined.append(dest)


def _scan_shards(store: S3Store, cfg: FsckConfig, refs: dict[str, list[str]], report: FsckReport) -> set[str]:
    """Re-hash every shard object; returns the digests still stored under their name (intact or not)."""
    now = time.time()
    present: set[str] = set()
    for obj in store.list_objects(f"{SHARDS_DIR}/"):
        rel = store.relative(obj["Key"])
        m = _SHARD_KEY.fullmatch(rel)
        if m is None or m.group(2)[:2] != m.group(1):
            report.misplaced.append(rel)
            if cfg.repair:
                _quarantine(store, rel, report)
            continue
        digest = m.group(2)
        report.shards_checked += 1
        actual = _object_sha256(store, obj["Key"])
        if actual is None:
            continue
        if actual != digest:
            report.corrupt.append(digest)
            logger.warning("%s: shard %s is corrupt (its bytes hash to %s)", store, digest, actual)
            if cfg.repair:
                _quarantine(store, rel, report)
            else:
                present.add(digest)
            continue
        present.add(digest)
        if digest not in refs and now - obj["LastModified"].timestamp() >= cfg.orphan_age_s:
            report.orphans.append(digest)
            if cfg.repair:
                store.delete_object(obj["Key"])
                report.removed.append(rel)
    return present


def _stale_uploads(store: S3Store, cfg: FsckConfig, report: FsckReport) -> None:
    now = time.time()
    for upload in store.list_multipart_uploads():
        if now - upload["Initiated"].timestamp() < cfg.temp_age_s:
            continue
        entry = f"upload:{store.relative(upload['Key'])}:{upload['UploadId']}"
        report.temp_files.append(entry)
        if cfg.repair:
            store.abort_multipart_upload(upload["Key"], upload["UploadId"])
            report.removed.append(entry)


def fsck_s3(store: S3Store, config: FsckConfig | None = None) -> FsckReport:
    """Check (and with ``config.repair``, repair) an S3 store; see the module docstring."""
    cfg = config or FsckConfig()
    report = FsckReport(root=str(store.location))
    refs = referenced_digests(store, report)
    present = _scan_shards(store, cfg, refs, report)
    missing_digests(refs, present, report)
    _stale_uploads(store, cfg, report)
    return report

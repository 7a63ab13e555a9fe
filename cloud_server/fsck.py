"""Store consistency check and repair (``sakura store verify|repair``) for a :class:`~cloud_server.store.LocalStore`.

``verify`` re-hashes every shard against its name, reads every manifest, and reports: corrupt shards (bytes that
do not hash to their digest), misplaced files under ``shards/``, stale temp files a crashed writer left, orphan
shards no manifest names, and digests a manifest names that are absent. ``repair`` also acts on them: corrupt and
misplaced files are moved to ``ROOT/quarantine/`` (kept for inspection, never served), stale temp files and orphan
shards older than a grace period are deleted. A template whose shard was quarantined stays published: clients get
404 for that shard and fall back (computing it on the device); republish the template to restore it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sakura_core.kv.manifest import ManifestError, blob_digests, parse_manifest
from sakura_core.limits import bounded_json

from .store import LocalStore, Store, StoreError, file_sha256, validate_digest

__all__ = ["FsckConfig", "FsckReport", "fsck", "missing_digests", "referenced_digests"]

logger = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
_FOLDER_LINK = (
    "a symbolic link to a folder (never followed: the server refuses what is under it; put the folder itself)"
)


@dataclass(frozen=True)
class FsckConfig:
    """What ``fsck`` does.

    Attributes:
        repair: quarantine corrupt/misplaced files and delete stale temp files and orphan shards (else report only).
        temp_age_s: a temp file older than this (seconds) is stale (a live writer renames it within seconds).
        orphan_age_s: an unreferenced shard older than this (seconds) is an orphan; younger ones may belong to a
            template being published right now (shards are written before the manifest).
    """

    repair: bool = False
    temp_age_s: float = 3600.0
    orphan_age_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.temp_age_s < 0 or self.orphan_age_s < 0:
            raise ValueError(
                f"temp_age_s and orphan_age_s must be >= 0 seconds, got {self.temp_age_s}, {self.orphan_age_s}"
            )


@dataclass
class FsckReport:
    """Findings (paths relative to the store root, digests) and, with ``repair``, what was done about them."""

    root: str
    shards_checked: int = 0
    templates_checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)  # template -> named digests with no file
    bad_manifests: dict[str, str] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # shard files that cannot be read: "path: reason"
    quarantined: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing found at all."""
        return not (
            self.corrupt
            or self.misplaced
            or self.temp_files
            or self.orphans
            or self.missing
            or self.bad_manifests
            or self.unreadable
        )

    def to_json(self) -> dict:
        return {**asdict(self), "clean": self.clean}


def referenced_digests(store: Store, report: FsckReport) -> dict[str, list[str]]:
    """digest -> templates whose manifest names it (representations, their chains, the reference images); manifests
    that cannot be read or name malformed digests go to ``report.bad_manifests``. Any ``Store``."""
    refs: dict[str, list[str]] = {}
    for template_id in store.list_templates():
        report.templates_checked += 1
        try:
            manifest = bounded_json(store.get_manifest_bytes(template_id), f"manifest of {template_id!r}")
            digests = blob_digests(manifest)
            digests += [d for s in manifest["shards"] for r in s["representations"] for d in r.get("requires", [])]
            if isinstance(manifest.get("template_image"), dict):
                digests.append(manifest["template_image"]["digest"])
            for ref in manifest.get("references") or []:  # each reference image (a try-on's garment too)
                if isinstance(ref, dict) and isinstance(ref.get("image"), dict):
                    digests.append(ref["image"]["digest"])
            for d in digests:
                validate_digest(d)
        except (StoreError, OSError, ValueError, LookupError, TypeError, AttributeError) as e:
            # any shape a broken manifest has: reported, the check goes on (OSError: unreadable, e.g. its mode)
            report.bad_manifests[template_id] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        try:  # its shards are referenced whatever the verdict (repair never deletes them), but a schema fault shows
            parse_manifest(manifest, template_id=template_id)
        except ManifestError as e:
            report.bad_manifests[template_id] = f"{type(e).__name__}: {str(e)[:200]}"
        for d in digests:
            if template_id not in refs.setdefault(d, []):
                refs[d].append(template_id)
    return refs


def _quarantine(store: LocalStore, path: Path, report: FsckReport) -> None:
    dest_dir = store.root / QUARANTINE_DIR
    dest = dest_dir / f"{path.name}.{int(time.time())}"
    try:
        dest_dir.mkdir(exist_ok=True)
        os.replace(path, dest)
    except OSError as e:  # a read-only store, another owner's file: reported, the repair goes on
        report.unreadable.append(f"{path.relative_to(store.root)}: cannot quarantine: {e.strerror or e}")
        return
    report.quarantined.append(str(dest.relative_to(store.root)))


def _remove(store: LocalStore, path: Path, report: FsckReport) -> None:
    rel = str(path.relative_to(store.root))
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        report.unreadable.append(f"{rel}: cannot remove: {e.strerror or e}")
        return
    report.removed.append(rel)


def _scan_shards(store: LocalStore, cfg: FsckConfig, refs: dict[str, list[str]], report: FsckReport) -> set[str]:
    """Re-hash every shard file; returns the digests still on disk under their name (intact or not)."""
    now = time.time()
    present: set[str] = set()
    shards_dir = store.shards_dir
    if shards_dir.is_symlink():  # walking it would re-hash (and repair delete) files outside the store
        report.unreadable.append(f"{shards_dir.name}: {_FOLDER_LINK}")
        return present
    for dirpath, dirs, files in os.walk(shards_dir):  # os.walk descends into no linked folder below
        for name in sorted(d for d in dirs if os.path.islink(os.path.join(dirpath, d))):
            report.unreadable.append(f"{Path(dirpath, name).relative_to(store.root)}: {_FOLDER_LINK}")
        for name in sorted(files):
            path = Path(dirpath) / name
            rel = str(path.relative_to(store.root))
            if name.startswith(".") and name.endswith(".tmp"):
                continue  # temp files: _sweep_temp
            try:
                digest = validate_digest(name)
            except ValueError:
                digest = None
            if digest is None or path.parent != shards_dir / digest[:2]:
                report.misplaced.append(rel)
                if cfg.repair:
                    _quarantine(store, path, report)
                continue
            report.shards_checked += 1
            if path.is_symlink():  # never served (the store follows no link): say so, do not hash its target
                report.unreadable.append(f"{rel}: a symbolic link (the server refuses it; put the file itself)")
                continue
            try:
                actual = file_sha256(path)
            except OSError as e:  # unreadable (its mode, a folder in its place, an I/O error): reported, not fatal
                report.unreadable.append(f"{rel}: {type(e).__name__}: {e.strerror or e}")
                present.add(digest)
                continue
            if actual != digest:
                report.corrupt.append(digest)
                logger.warning("store %s: shard %s is corrupt (its bytes hash to something else)", store.root, digest)
                if cfg.repair:
                    _quarantine(store, path, report)
                else:
                    present.add(digest)
                continue
            present.add(digest)
            if digest not in refs and now - _mtime(path, now) >= cfg.orphan_age_s:
                report.orphans.append(digest)
                if cfg.repair:
                    _remove(store, path, report)
    return present


def _linked_template_folders(store: LocalStore, report: FsckReport) -> None:
    """``templates/`` or a template's folder that is a symbolic link: never listed nor served, reported here."""
    templates_dir = store.templates_dir
    if templates_dir.is_symlink():
        report.unreadable.append(f"{templates_dir.name}: {_FOLDER_LINK}")
        return
    for entry in sorted(os.scandir(templates_dir), key=lambda e: e.name):
        if entry.is_symlink():
            report.unreadable.append(f"{templates_dir.name}/{entry.name}: {_FOLDER_LINK}")


def _mtime(path: Path, now: float) -> float:
    """The file's mtime, or ``now`` when it vanished or cannot be stat'ed (then it is never taken for an orphan)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return now


def _sweep_temp(store: LocalStore, cfg: FsckConfig, report: FsckReport) -> None:
    now = time.time()
    for dirpath, _dirs, files in os.walk(store.root):
        if Path(dirpath).is_relative_to(store.root / QUARANTINE_DIR):
            continue
        for name in sorted(files):
            path = Path(dirpath) / name
            if name.startswith(".") and name.endswith(".tmp"):
                if now - _mtime(path, now) >= cfg.temp_age_s:
                    report.temp_files.append(str(path.relative_to(store.root)))
                    if cfg.repair:
                        _remove(store, path, report)


def missing_digests(refs: dict[str, list[str]], present: set[str], report: FsckReport) -> None:
    """Record in ``report.missing`` every referenced digest that is not ``present``, under each template naming it."""
    for digest, templates in sorted(refs.items()):
        if digest not in present:
            for template_id in templates:
                report.missing.setdefault(template_id, []).append(digest)


def fsck(store: LocalStore, config: FsckConfig | None = None) -> FsckReport:
    """Check (and with ``config.repair``, repair) ``store``; see the module docstring."""
    cfg = config or FsckConfig()
    report = FsckReport(root=str(store.root))
    refs = referenced_digests(store, report)
    _linked_template_folders(store, report)
    present = _scan_shards(store, cfg, refs, report)
    missing_digests(refs, present, report)
    _sweep_temp(store, cfg, report)
    return report

"""Store consistency check and repair (``sakura store verify|repair``) for a :class:`~cloud_server.store.LocalStore`.

``verify`` re-hashes every shard against its name, reads every manifest, and reports: corrupt shards (bytes that
do not hash to their digest), misplaced files under ``shards/``, stale temp files a crashed writer left, orphan
shards no manifest names, and digests a manifest names that are absent. ``repair`` also acts on them: corrupt and
misplaced files are moved to ``ROOT/quarantine/`` (kept for inspection, never served), stale temp files and orphan
shards older than a grace period are deleted. A template whose shard was quarantined stays published: clients get
404 for that shard and fall back (computing it on the device); republish the template to restore it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .store import LocalStore, NotFoundError, Store, file_sha256, validate_digest

__all__ = ["FsckConfig", "FsckReport", "fsck", "missing_digests", "referenced_digests"]

logger = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"


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
    quarantined: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing found at all."""
        return not (self.corrupt or self.misplaced or self.temp_files or self.orphans or self.missing
                    or self.bad_manifests)  # fmt: skip

    def to_json(self) -> dict:
        return {**asdict(self), "clean": self.clean}


def referenced_digests(store: Store, report: FsckReport) -> dict[str, list[str]]:
    """digest -> templates whose manifest names it (representations, their chains, the template image); manifests
    that cannot be read or name malformed digests go to ``report.bad_manifests``. Any ``Store``."""
    refs: dict[str, list[str]] = {}
    for template_id in store.list_templates():
        report.templates_checked += 1
        try:
            manifest = json.loads(store.get_manifest_bytes(template_id))
            digests = [r["digest"] for s in manifest["shards"] for r in s["representations"]]
            digests += [d for s in manifest["shards"] for r in s["representations"] for d in r.get("requires", [])]
            if isinstance(manifest.get("template_image"), dict):
                digests.append(manifest["template_image"]["digest"])
            for d in digests:
                validate_digest(d)
        except (NotFoundError, ValueError, KeyError, TypeError) as e:
            report.bad_manifests[template_id] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        for d in digests:
            if template_id not in refs.setdefault(d, []):
                refs[d].append(template_id)
    return refs


def _quarantine(store: LocalStore, path: Path, report: FsckReport) -> None:
    dest_dir = store.root / QUARANTINE_DIR
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / f"{path.name}.{int(time.time())}"
    os.replace(path, dest)
    report.quarantined.append(str(dest.relative_to(store.root)))


def _scan_shards(store: LocalStore, cfg: FsckConfig, refs: dict[str, list[str]], report: FsckReport) -> set[str]:
    """Re-hash every shard file; returns the digests still on disk under their name (intact or not)."""
    now = time.time()
    present: set[str] = set()
    shards_dir = store.shards_dir
    for dirpath, _dirs, files in os.walk(shards_dir):
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
            if file_sha256(path) != digest:
                report.corrupt.append(digest)
                logger.warning("store %s: shard %s is corrupt (its bytes hash to something else)", store.root, digest)
                if cfg.repair:
                    _quarantine(store, path, report)
                else:
                    present.add(digest)
                continue
            present.add(digest)
            if digest not in refs and now - path.stat().st_mtime >= cfg.orphan_age_s:
                report.orphans.append(digest)
                if cfg.repair:
                    path.unlink()
                    report.removed.append(rel)
    return present


def _sweep_temp(store: LocalStore, cfg: FsckConfig, report: FsckReport) -> None:
    now = time.time()
    for dirpath, _dirs, files in os.walk(store.root):
        if Path(dirpath).is_relative_to(store.root / QUARANTINE_DIR):
            continue
        for name in sorted(files):
            path = Path(dirpath) / name
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    stale = now - path.stat().st_mtime >= cfg.temp_age_s
                except FileNotFoundError:
                    continue
                if stale:
                    report.temp_files.append(str(path.relative_to(store.root)))
                    if cfg.repair:
                        path.unlink(missing_ok=True)
                        report.removed.append(report.temp_files[-1])


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
    present = _scan_shards(store, cfg, refs, report)
    missing_digests(refs, present, report)
    _sweep_temp(store, cfg, report)
    return report

"""``sakura store verify|repair|usage``: check a store (a folder or ``s3://bucket/prefix``: re-hash shards, read
manifests) and optionally repair it; or total what its templates occupy (``usage``: per template, KV mode and store
profile, :mod:`.store_usage`).

Exit status: 0 when the store is clean (``verify``) or everything found could be repaired (``repair``); 1 when
problems remain (``verify``: any finding; ``repair``: corrupt manifests or shards a manifest names that are
missing, which only republishing fixes); 2 on bad arguments. ``usage`` exits 0, or 1 when a manifest cannot be read.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import sys
from pathlib import Path

from sakura_core.fetch.store_layout import SHARDS_DIR, TEMPLATES_DIR

from .fsck import FsckConfig, FsckReport, fsck
from .store import LocalStore, StoreError
from .store_url import S3_ENDPOINT_HELP, is_s3_url, open_store
from .store_usage import format_usage, store_usage

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "action",
        choices=("verify", "repair", "usage"),
        help="verify: report only; repair: also quarantine, sweep temp files and orphan shards; "
        "usage: bytes stored per template, KV mode and store profile",
    )
    parser.add_argument("--store", required=True, help="store folder or s3://BUCKET/PREFIX")
    parser.add_argument("--s3-endpoint", default=None, help=S3_ENDPOINT_HELP)
    parser.add_argument(
        "--temp-age-s",
        type=float,
        default=3600.0,
        help="temp files older than this are stale (default: %(default)s s)",
    )
    parser.add_argument(
        "--orphan-age-s",
        type=float,
        default=3600.0,
        help="unreferenced shards older than this are orphans (default: %(default)s s)",
    )
    parser.add_argument("--json", default=None, help="also write the report as JSON to this path")


def _open(args):
    """The store ``args.store`` names, checked to be one (``ValueError``/``StoreError`` otherwise)."""
    if is_s3_url(args.store):
        store = open_store(args.store, endpoint_url=args.s3_endpoint)
        store.check()
        return store
    root = Path(args.store)
    if not (root / SHARDS_DIR).is_dir() or not (root / TEMPLATES_DIR).is_dir():
        raise ValueError(f"{root} is not a store (no shards/ and templates/ folders); pass --store DIR")
    if args.s3_endpoint is not None:
        raise ValueError("--s3-endpoint is only for s3:// stores")
    return LocalStore(root)


def _usage(args) -> int:
    try:
        usage = store_usage(_open(args))
    except (ValueError, StoreError) as e:
        print(f"sakura store: {e}", file=sys.stderr)
        return 2
    print(f"store {args.store}: {len(usage['templates'])} templates")
    print(format_usage(usage))
    if args.json:
        Path(args.json).write_text(json.dumps(usage, indent=1) + "\n")
    return 1 if usage["unreadable"] else 0


def _check(args, cfg: FsckConfig) -> FsckReport:
    """Run the check of the store ``args.store`` names (``ValueError``/``StoreError`` when it cannot be opened)."""
    if is_s3_url(args.store):
        from .s3_fsck import fsck_s3
        from .s3_store import S3Store

        store = open_store(args.store, endpoint_url=args.s3_endpoint)
        assert isinstance(store, S3Store)  # an s3:// URL opens an S3Store
        store.check()
        return fsck_s3(store, cfg)
    root = Path(args.store)
    if not (root / SHARDS_DIR).is_dir() or not (root / TEMPLATES_DIR).is_dir():
        raise ValueError(f"{root} is not a store (no shards/ and templates/ folders); pass --store DIR")
    if args.s3_endpoint is not None:
        raise ValueError("--s3-endpoint is only for s3:// stores")
    return fsck(LocalStore(root), cfg)


def run(args) -> int:
    if args.action == "usage":
        return _usage(args)
    try:
        cfg = FsckConfig(repair=args.action == "repair", temp_age_s=args.temp_age_s, orphan_age_s=args.orphan_age_s)
        report = _check(args, cfg)
    except (ValueError, StoreError) as e:
        print(f"sakura store: {e}", file=sys.stderr)
        return 2
    print(f"store {report.root}: {report.shards_checked} shards, {report.templates_checked} templates checked")
    for label, items in (
        ("corrupt shard", report.corrupt),
        ("misplaced file", report.misplaced),
        ("stale temp file", report.temp_files),
        ("orphan shard", report.orphans),
        ("unreadable shard", report.unreadable),
    ):
        for item in items:
            print(f"  {label}: {item}")
    for template_id, digests in report.missing.items():
        print(f"  template {template_id}: {len(digests)} shard(s) missing, e.g. {digests[0]} (republish it)")
    for template_id, error in report.bad_manifests.items():
        print(f"  template {template_id}: unreadable manifest: {error}")
    for item in report.quarantined:
        print(f"  quarantined -> {item}")
    for item in report.removed:
        print(f"  removed {item}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    print("clean" if report.clean else ("repaired" if cfg.repair else "problems found"))
    if cfg.repair:
        return 1 if (report.missing or report.bad_manifests or report.unreadable) else 0
    return 0 if report.clean else 1

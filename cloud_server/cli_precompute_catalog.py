"""``sakura precompute-catalog CATALOG.json --store URL [--ray ADDRESS | --workers N]``: publish every entry of a
template catalog (templates x models x KV modes x schedules), skipping what is already published.

Prints one line per entry as it finishes (published / skipped / coalesced / failed, seconds, where it ran) and a
summary; ``--json`` writes the results. Exit status 0 when every entry is published, 1 when any failed, 2 on bad
arguments.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sakura_core.kv.storage import STORE_PROFILES

from .catalog import CatalogError, load_catalog, published_key
from .catalog_jobs import LocalRunner, make_job
from .precompute import add_device_arguments
from .store import StoreError
from .store_url import add_s3_limit_arguments, add_store_arguments, open_store, s3_config_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("catalog", help="the catalog JSON (format: cloud_server/catalog.py)")
    add_store_arguments(parser)
    add_s3_limit_arguments(parser)  # the driver's and every worker's S3 client
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the entries as tasks on this Ray cluster (e.g. 127.0.0.1:6379 or auto)",
    )
    where.add_argument("--workers", type=int, default=1, help="local worker processes (default: %(default)s)")
    add_device_arguments(parser)
    parser.add_argument("--namespace", default="sakura", help="Ray namespace of the coordinator (default: sakura)")
    parser.add_argument("--json", default=None, help="write the per-entry results here")
    parser.add_argument(
        "--store-profile",
        choices=STORE_PROFILES,
        default=None,
        help="what the store keeps of "
        "each entry: serving (the rungs a client fetches, no fp16) or full (every representation, the "
        "fp16 included) (default: the catalog's store_profile, else serving)",
    )


def _line(result: dict, done: int, total: int, t0: float) -> str:
    status = result["status"]
    if status == "failed":
        what = f"FAILED: {result.get('error', '')[:300]}"
    elif status == "skipped":
        what = "already published (skipped)"
    else:
        what = f"{status} in {result['seconds']:.1f} s, {result['shards']} blobs, {result['bytes'] / 2**20:.2f} MiB"
        what += f" (pid {result['pid']} on {result['host']})"
        if result.get("coalesced"):
            what += ", coalesced with a request already in flight"
    return f"  [{done}/{total}] {result['template_id']}: {what}  (t+{time.monotonic() - t0:.0f} s)"


def run(args) -> int:
    try:
        entries = load_catalog(args.catalog, dtype=args.dtype, store_profile=args.store_profile)
        from sakura_core.models.loading import check_device_dtype

        check_device_dtype(args.device, args.dtype)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        s3_config = s3_config_from_args(args)
        store = open_store(args.store, endpoint_url=args.s3_endpoint, s3_config=s3_config)
        store.check()
        todo = [e for e in entries if published_key(store, e.template_id) != e.key]
    except (CatalogError, ValueError, StoreError) as e:
        print(f"sakura precompute-catalog: {e}", file=sys.stderr)
        return 2
    where = f"Ray cluster {args.ray}" if args.ray else f"{args.workers} local worker(s)"
    print(
        f"catalog {args.catalog}: {len(entries)} entries, {len(entries) - len(todo)} already published, "
        f"{len(todo)} to precompute on {where} -> {args.store}",
        flush=True,
    )
    jobs = [make_job(e, args.store, args.s3_endpoint, args.device, args.dtype, s3_config=s3_config) for e in todo]
    t0, finished = time.monotonic(), [0]

    def progress(result: dict) -> None:
        finished[0] += 1
        print(_line(result, finished[0], len(jobs), t0), flush=True)

    if not jobs:
        results = []
    elif args.ray:
        from .catalog_ray import run_on_ray

        results = run_on_ray(jobs, address=args.ray, namespace=args.namespace, progress=progress)
    else:
        results = LocalRunner(args.workers, progress=progress).run(jobs)
    counts = {s: sum(r["status"] == s for r in results) for s in ("published", "skipped", "failed")}
    secs = time.monotonic() - t0
    print(
        f"done in {secs:.1f} s: {counts['published']} published, {counts['skipped'] + len(entries) - len(todo)} "
        f"already there, {counts['failed']} failed",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"entries": len(entries), "seconds": round(secs, 2), "results": results}, indent=1) + "\n"
        )
    return 1 if counts["failed"] else 0

"""``sakura bench store-catalog``: a catalog of N templates (half single-mode, half per-step) published into a real S3
store in one store profile, and what the store then says it holds.

1. N/2 template images: seeded square crops of scikit-image's sample photographs (colour ones, and grey ones made
   RGB), each a catalog template in both KV modes (per-step: ``--steps``), published by ``sakura precompute-catalog
   --store-profile P`` into the S3 store (``--s3 s3://bucket/prefix`` with ``--s3-endpoint``, or a single-node Ceph
   radosgw started for the run; everything on 127.0.0.1).
2. ``sakura store usage``: per template its bytes stored, the ratio to its uncompressed fp16 KV, floor and top PSNR;
   totals by KV mode. Checked three ways: the total equals the sum of the per-template figures; each template's
   figure equals the bytes its publisher wrote (the catalog run's result); and the shard objects the S3 bucket
   lists (the reference images' PNGs, stored as blobs too, added) equal the usage's distinct blob bytes.
3. ``sakura store verify``: every shard re-hashed, every manifest's blobs present; clean or not.

Prints a table and writes JSON (``--json``); exit status 1 when a check fails.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cloud_server.store_url import S3_ENDPOINT_HELP, open_store
from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES

from .bench_catalog import bench_s3_store

__all__ = ["add_arguments", "run"]

#: scikit-image sample photographs the template crops come from (grey ones are made RGB).
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
    "camera",
    "coins",
    "brick",
    "grass",
    "gravel",
    "moon",
    "clock",
)
#: The issue's storage bound: a template at most 1/3.06 of its uncompressed fp16 KV.
BOUND_X_FP16 = 1 / 3.06


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument(
        "--templates", type=int, default=100, help="catalog entries, half per KV mode (even; default %(default)s)"
    )
    parser.add_argument("--workers", type=int, default=2, help="precompute worker processes (default %(default)s)")
    parser.add_argument("--steps", type=int, default=4, help="per-step entries' steps (default %(default)s)")
    parser.add_argument(
        "--store-profile",
        choices=STORE_PROFILES,
        default=DEFAULT_STORE_PROFILE,
        help="what the store keeps of each template (default %(default)s)",
    )
    parser.add_argument("--s3", default=None, help="an S3 store to use (default: start a local radosgw)")
    parser.add_argument("--s3-endpoint", default=None, help=S3_ENDPOINT_HELP)
    parser.add_argument("--seed", type=int, default=0, help="seed of the crops (default %(default)s)")


def _photo(name: str) -> np.ndarray:
    import skimage.data

    img = getattr(skimage.data, name)()
    img = np.stack([img] * 3, axis=-1) if img.ndim == 2 else img[..., :3]  # (H, W, 3)
    return img.astype(np.uint8)


def template_images(work: Path, n: int, seed: int) -> list[Path]:
    """``n`` PNG files of 128 px: the photographs' centre squares first, then seeded crops (a side of 35-100 % of the
    photograph's shorter side, anywhere in it)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = _photo(PHOTOS[i % len(PHOTOS)])
        h, w = img.shape[:2]
        side = min(h, w) if i < len(PHOTOS) else int(min(h, w) * rng.uniform(0.35, 1.0))
        y, x = (
            ((h - side) // 2, (w - side) // 2)
            if i < len(PHOTOS)
            else (int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1)))
        )
        path = work / f"t{i:03d}.png"
        Image.fromarray(img[y : y + side, x : x + side]).resize((128, 128), Image.Resampling.LANCZOS).save(path)
        out.append(path)
    return out


def _catalog(work: Path, images: list[Path], steps: int, profile: str) -> Path:
    spec = {
        "version": 1,
        "templates": [{"name": p.stem, "image": str(p)} for p in images],
        "models": {"d": "demo"},
        "kv_modes": ["single", "per-step"],
        "schedules": [{"steps": steps, "shift": 1.0}],
        "store_profile": profile,
    }
    path = work / "catalog.json"
    path.write_text(json.dumps(spec))
    return path


def _cli(argv: list[str]) -> int:
    from sakura_core.cli import main

    print("$ sakura " + " ".join(argv), flush=True)
    return main(argv)


def _s3_blob_bytes(store) -> tuple[int, int]:
    """(objects, bytes) under the store's ``shards/``: what the bucket itself says it holds."""
    sizes = [int(o["Size"]) for o in store.list_objects("shards/")]
    return len(sizes), sum(sizes)


def _image_bytes(store, template_ids: list[str]) -> int:
    """The reference images' PNG blobs the manifests name (stored as shards, not counted by ``store usage``)."""
    seen: dict[str, int] = {}
    for tid in template_ids:
        m = store.get_manifest(tid)
        for ref in m.get("references") or [{"image": m["template_image"]}]:
            seen[ref["image"]["digest"]] = ref["image"]["bytes"]
    return sum(seen.values())


def _mode_rows(usage: dict) -> list[dict]:
    out = []
    for mode in ("single", "per-step"):
        rows = [t for t in usage["templates"] if t["kv_mode"] == mode]
        if not rows:
            continue
        x = [t["x_fp16"] for t in rows]
        out.append(
            {
                "kv_mode": mode,
                "templates": len(rows),
                "stored_bytes": sum(t["stored_bytes"] for t in rows),
                "fp16_kv_bytes": sum(t["fp16_kv_bytes"] for t in rows),
                "x_fp16_min": min(x),
                "x_fp16_median": statistics.median(x),
                "x_fp16_max": max(x),
                "over_bound": sum(v > BOUND_X_FP16 for v in x),
                "floor_psnr_db_min": min((t["floor_psnr_db"] or 0.0) for t in rows),
                "top_psnr_db_min": min((t["top_psnr_db"] or 0.0) for t in rows),
            }
        )
    return out


def _measure(args, work: Path, store_url: str, endpoint: str | None) -> dict:
    """Publish the catalog, then read back usage and verify; every figure and check."""
    images = template_images(work, args.templates // 2, args.seed)
    catalog = _catalog(work, images, args.steps, args.store_profile)
    s3 = ["--store", store_url] + (["--s3-endpoint", endpoint] if endpoint else [])
    t0 = time.perf_counter()
    rc_pre = _cli(
        [
            "precompute-catalog",
            str(catalog),
            *s3,
            "--workers",
            str(args.workers),
            "--json",
            str(work / "published.json"),
        ]
    )
    seconds = time.perf_counter() - t0
    rc_use = _cli(["store", "usage", *s3, "--json", str(work / "usage.json")])
    rc_ver = _cli(["store", "verify", *s3, "--json", str(work / "verify.json")])
    published = json.loads((work / "published.json").read_text())["results"]
    usage = json.loads((work / "usage.json").read_text())
    verify = json.loads((work / "verify.json").read_text())
    store = open_store(store_url, endpoint_url=endpoint)
    objects, bucket_bytes = _s3_blob_bytes(store)
    images_b = _image_bytes(store, [t["template_id"] for t in usage["templates"]])
    written = {r["template_id"]: r["bytes"] for r in published if r["status"] == "published"}
    figures = {t["template_id"]: t["stored_bytes"] for t in usage["templates"]}
    total = usage["total"]["stored_bytes"]
    checks = {
        "every entry published": rc_pre == 0 and len(written) == args.templates,
        "usage total == sum of the per-template figures": total == sum(figures.values()),
        "each template's figure == the bytes its publisher wrote": figures == written,
        "bucket's shard objects == distinct blob bytes + reference images": bucket_bytes
        == usage["total"]["distinct_bytes"] + images_b,
        "store verify clean": rc_ver == 0 and verify.get("clean", False),
        "usage readable": rc_use == 0 and not usage["unreadable"],
    }
    return {
        "seconds_precompute": round(seconds, 1),
        "usage_total": usage["total"],
        "by_mode": _mode_rows(usage),
        "bucket": {"shard_objects": objects, "shard_object_bytes": bucket_bytes, "reference_image_bytes": images_b},
        "verify": verify,
        "checks": checks,
        "templates": usage["templates"],
    }


def _print(report: dict) -> None:
    m = report["measured"]
    print(
        f"\n{'KV mode':<10}{'templates':>10}{'stored B':>14}{'fp16 KV B':>14}{'x fp16':>8}{'min-median-max':>22}"
        f"{'> 1/3.06':>9}{'floor dB min':>13}{'top dB min':>11}"
    )
    for r in m["by_mode"]:
        spread = f"{r['x_fp16_min']:.3f}-{r['x_fp16_median']:.3f}-{r['x_fp16_max']:.3f}"
        print(
            f"{r['kv_mode']:<10}{r['templates']:>10}{r['stored_bytes']:>14}{r['fp16_kv_bytes']:>14}"
            f"{r['stored_bytes'] / r['fp16_kv_bytes']:>8.3f}{spread:>22}{r['over_bound']:>9}"
            f"{r['floor_psnr_db_min']:>13.1f}{r['top_psnr_db_min']:>11.1f}"
        )
    t = m["usage_total"]
    print(f"{'total':<10}{t['templates']:>10}{t['stored_bytes']:>14}{t['fp16_kv_bytes']:>14}{t['x_fp16']:>8.3f}")
    b = m["bucket"]
    print(
        f"bucket: {b['shard_objects']} shard objects, {b['shard_object_bytes']} bytes ({b['reference_image_bytes']} "
        f"of them the reference images' PNGs); precompute {m['seconds_precompute']:.0f} s"
    )
    for name, ok in m["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")


def run(args) -> int:
    if args.templates < 2 or args.templates % 2 or args.workers < 1 or args.steps < 1:
        print(
            "sakura bench store-catalog: --templates must be even and >= 2, --workers and --steps >= 1",
            file=sys.stderr,
        )
        return 2
    work = Path(tempfile.mkdtemp(prefix="sakura-bench-store-catalog-"))
    gw = None
    try:
        store_url, endpoint, gw = bench_s3_store(args, work)
        measured = _measure(args, work, store_url, endpoint)
    finally:
        if gw is not None:
            gw.stop()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "bench": "store-catalog",
        "command": f"sakura bench store-catalog --templates {args.templates} --workers {args.workers} --steps "
        f"{args.steps} --store-profile {args.store_profile} --seed {args.seed}",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]},
        "config": {
            "templates": args.templates,
            "steps": args.steps,
            "store_profile": args.store_profile,
            "model": "demo (cpu, float32)",
            "images": f"seeded crops of {', '.join(PHOTOS)}",
            "s3": "--s3" if args.s3 else "Ceph radosgw (single node, memstore OSD) started for the run",
        },
        "measured": measured,
    }
    _print(report)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0 if all(measured["checks"].values()) else 1

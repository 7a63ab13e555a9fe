"""``sakura precompute``: compute a template's KV ladder and publish it into a store (manifest last)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys
import time

from sakura_core.models.loading import check_model_source

from .config import MODELS
from .precompute import (
    ImageError,
    TemplateExistsError,
    add_device_arguments,
    load_model,
    publish_template,
    read_template_image,
)
from .store import InvalidNameError, StoreError, validate_template_id
from .store_url import add_store_arguments, open_store

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    add_store_arguments(parser)
    parser.add_argument(
        "--model",
        default="demo",
        help=f"model to compute the KV with: {', '.join(MODELS)} or the path of a diffusers FLUX.2 [klein] pipeline "
        "folder (its model_index.json names Flux2KleinKVPipeline)",
    )
    parser.add_argument("--image", required=True, help="template image file (PNG/JPEG/WebP) or a demo sample name")
    parser.add_argument("--id", required=True, dest="template_id", help="template id, [a-z0-9-]{1,64}")
    parser.add_argument("--codec", default="sakura", help="codec name (default: %(default)s)")
    parser.add_argument("--shard-layers", type=int, default=1, help="consecutive layers per shard (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the importance probes (default: 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace a published template with the same id")
    parser.add_argument(
        "--kv-mode",
        choices=("single", "per-step"),
        default="single",
        help="single: one KV per layer, reused by every step; per-step: one KV per (step, layer) for the schedule "
        "--steps/--shift (default: %(default)s)",
    )
    parser.add_argument("--steps", type=int, default=4, help="per-step mode: sampler steps (default: %(default)s)")
    parser.add_argument("--shift", type=float, default=1.0, help="per-step mode: schedule shift (default: 1.0)")
    parser.add_argument(
        "--template-size",
        type=int,
        default=None,
        help="template side in pixels (default: the model's edit size; e.g. 128 for the 64 px demo edit gives "
        "4x the edit's tokens)",
    )
    add_device_arguments(parser)


def run(args) -> int:
    try:
        check_model_source(args.model)
        validate_template_id(args.template_id)
        if args.shard_layers < 1:
            raise ValueError(f"--shard-layers must be >= 1, got {args.shard_layers}")
        if args.steps < 1 or args.shift <= 0:
            raise ValueError(f"--steps must be >= 1 and --shift > 0, got {args.steps} and {args.shift}")
        image, source = read_template_image(args.image)
        store = open_store(args.store, endpoint_url=args.s3_endpoint)
        store.check()
        published = store.has_template(args.template_id)
    except (ValueError, InvalidNameError, ImageError, StoreError) as e:
        print(f"sakura precompute: {e}", file=sys.stderr)
        return 2
    if not args.overwrite and published:
        print(
            f"sakura precompute: template {args.template_id!r} is already published in {args.store}", file=sys.stderr
        )
        return 1
    t0 = time.perf_counter()
    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    except ValueError as e:
        print(f"sakura precompute: {e}", file=sys.stderr)
        return 2
    print(f"model {args.model} ({model.model_id[:16]}) loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    last = {"stage": None}

    def progress(stage: str, done: int, total: int) -> None:
        if stage != last["stage"] or done == total:
            print(f"  {stage}: {done}/{total}", flush=True)
            last["stage"] = stage

    t0 = time.perf_counter()
    try:
        result = publish_template(
            store,
            model,
            image,
            args.template_id,
            codec=args.codec,
            shard_layers=args.shard_layers,
            seed=args.seed,
            source=source,
            overwrite=args.overwrite,
            progress=progress,
            kv_mode=args.kv_mode,
            steps=args.steps,
            shift=args.shift,
            template_size=args.template_size,
        )
    except TemplateExistsError as e:
        print(f"sakura precompute: {e}", file=sys.stderr)
        return 1
    secs = time.perf_counter() - t0
    m = result.manifest
    print(
        f"published {result.template_id} in {args.store}: {len(m['shards'])} shards, "
        f"{result.shards} blobs, {result.shard_bytes / 2**20:.2f} MiB in {secs:.1f} s"
    )
    _print_level_bytes(m)
    return 0


def _print_level_bytes(manifest: dict) -> None:
    """Bytes per template at each level (a level's whole chain, every shard), in this manifest's KV mode."""
    mode = manifest.get("kv_mode", "single")
    sched = manifest.get("schedule")
    steps = sched["steps"] if sched else 1
    per_level: dict[tuple[int, str], int] = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            key = (rep["level"], rep["name"])
            per_level[key] = per_level.get(key, 0) + rep.get("total_bytes", rep["bytes"])
    what = f"per-step, {steps} steps x {manifest['num_layers']} layers" if sched else "single, one KV per layer"
    rows, cols = manifest["token_grid"]
    what += f"; template {rows}x{cols} = {rows * cols} tokens"
    print(f"bytes per template, kv_mode {mode} ({what}):")
    print(f"  {'level':>5} {'name':<16}{'bytes':>12}{'KiB':>10}{'per step KiB':>14}  psnr_db")
    for (level, name), nbytes in sorted(per_level.items()):
        psnr = next((r.get("psnr_db") for r in manifest["shards"][0]["representations"] if r["level"] == level), None)
        print(
            f"  {level:>5} {name:<16}{nbytes:>12}{nbytes / 2**10:>10.1f}{nbytes / steps / 2**10:>14.1f}"
            f"  {'-' if psnr is None else psnr}"
        )

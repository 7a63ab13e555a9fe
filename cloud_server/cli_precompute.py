"""``sakura precompute``: compute a template's KV ladder and publish it into a store (manifest last)."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sakura_core.files import atomic_write_json, output_problem
from sakura_core.kv.storage import template_storage
from sakura_core.models.loading import check_model_source
from sakura_core.models.ref_layout import MAX_REFERENCES
from sakura_core.precompute.cross_step import compare_to_single, level_totals

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
from .store_url import add_store_arguments, add_store_profile_argument, open_store
from .store_usage import format_storage

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    add_store_arguments(parser)
    parser.add_argument(
        "--model",
        default="demo",
        help=f"model to compute the KV with: {', '.join(MODELS)}, the path of a diffusers FLUX.2 [klein] pipeline "
        "folder (its model_index.json names Flux2KleinKVPipeline), or ComfyUI's single files as "
        "klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR",
    )
    parser.add_argument(
        "--image",
        required=True,
        action="append",
        metavar="IMAGE",
        help="template image file (PNG/JPEG/WebP) or a demo sample name; repeat it (up to 4) for a "
        "template of several reference images, in the model's order (try-on: --image person.png "
        "--image garment.png)",
    )
    parser.add_argument(
        "--reference-name",
        action="append",
        default=None,
        metavar="NAME",
        help="a short name per --image (shown by the nodes); default: the file stems / sample names",
    )
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
        "--per-step-coding",
        choices=("cross-step", "independent"),
        default="cross-step",
        help="per-step mode: code steps >= 1 as residuals against step 0 (+ a zero-byte reuse rung), or every step "
        "on its own (default: %(default)s)",
    )
    parser.add_argument(
        "--compare-single",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-step mode: also precompute the single-mode template (not published) and print bytes per level "
        "against it at equal end-to-end PSNR (default: on)",
    )
    add_store_profile_argument(parser)
    parser.add_argument("--json", default=None, metavar="FILE", help="write the per-level table (and comparison) here")
    parser.add_argument(
        "--template-size",
        type=int,
        default=None,
        help="template side in pixels (default: the model's edit size; e.g. 128 for the 64 px demo edit gives "
        "4x the edit's tokens)",
    )
    add_device_arguments(parser)


def _inputs(args):
    """(image(s), source, reference names, store, published?) from the arguments; raises naming the bad one."""
    check_model_source(args.model)
    validate_template_id(args.template_id)
    if args.shard_layers < 1:
        raise ValueError(f"--shard-layers must be >= 1, got {args.shard_layers}")
    if args.steps < 1 or args.shift <= 0:
        raise ValueError(f"--steps must be >= 1 and --shift > 0, got {args.steps} and {args.shift}")
    if not 1 <= len(args.image) <= MAX_REFERENCES:
        raise ValueError(f"--image: give 1..{MAX_REFERENCES} reference images, got {len(args.image)}")
    read = [read_template_image(x) for x in args.image]
    image = [im for im, _ in read] if len(read) > 1 else read[0][0]
    source = read[0][1]
    names = args.reference_name or [Path(x).stem[:64] or f"reference-{i + 1}" for i, x in enumerate(args.image)]
    if len(names) != len(args.image):
        raise ValueError(f"--reference-name: give one per --image ({len(args.image)}), got {len(names)}")
    store = open_store(args.store, endpoint_url=args.s3_endpoint)
    store.check()
    return image, source, names, store, store.has_template(args.template_id)


def run(args) -> int:
    try:
        image, source, names, store, published = _inputs(args)
    except (ValueError, InvalidNameError, ImageError, StoreError) as e:
        print(f"sakura precompute: {e}", file=sys.stderr)
        return 2
    problem = store.write_problem() or (output_problem(args.json) if args.json else None)
    if problem is not None:  # a read-only or forbidden store (or --json folder): said before the compute
        print(f"sakura precompute: {problem}", file=sys.stderr)
        return 1
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
    last: dict[str, str | None] = {"stage": None}

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
            reference_names=names,
            store_profile=args.store_profile,
            **({"cross_step": args.per_step_coding == "cross-step"} if args.kv_mode == "per-step" else {}),
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
    stored = template_storage(m)
    print(format_storage(stored))
    report = {"template_id": result.template_id, "kv_mode": args.kv_mode, "levels": level_totals(m), "storage": stored}
    if args.kv_mode == "per-step" and args.compare_single:
        report["vs_single"] = _compare_single(store, model, image, args, m)
    if args.json:
        atomic_write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0


def _compare_single(store, model, image, args, manifest: dict) -> dict:
    """Precompute the single-mode template of the same image (not published) and print the per-step one against it."""
    from sakura_core.models.edit_model import load_image
    from sakura_core.precompute import precompute_template

    size = args.template_size or model.spec.image_size
    t0 = time.perf_counter()
    single = precompute_template(
        model,
        load_image(image, size),
        args.template_id,
        codec=args.codec,
        shard_layers=args.shard_layers,
        seed=args.seed,
    ).manifest
    cmp = compare_to_single(manifest, single)
    print(f"\nvs the single-mode template of the same image ({time.perf_counter() - t0:.1f} s), at equal PSNR:")
    print(f"  {'level':<16}{'per-step B':>12}{'PSNR dB':>9}{'single B at PSNR':>18}{'x single':>10}")
    for r in cmp["levels"]:
        sb, x = r["single_bytes_at_psnr"], r["x_single"]
        print(f"  {r['name']:<16}{r['bytes']:>12}{_f(r['psnr_db'], '.2f'):>9}{_f(sb, 'd'):>18}{_f(x, '.3f'):>10}")
    print(
        "  single-mode levels: "
        + ", ".join(f"{r['name']} {r['bytes']} B {_f(r['psnr_db'], '.2f')} dB" for r in cmp["single_levels"])
    )
    fl = cmp["floor"]
    if fl["per_step"] and fl["single"]:
        print(
            f"  floor (cheapest >= 35 dB): per-step {fl['per_step']['name']} {fl['per_step']['bytes']} B "
            f"({fl['per_step']['psnr_db']} dB), single {fl['single']['name']} {fl['single']['bytes']} B "
            f"({fl['single']['psnr_db']} dB): {fl['x_single']}x; at the per-step floor's PSNR: "
            f"{fl['per_step']['x_single']}x"
        )
    st = cmp["stored_bytes"]
    print(
        f"  stored bytes (every representation): per-step {st['per_step']}, single {st['single']}: {st['x_single']}x"
    )
    return cmp


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _print_level_bytes(manifest: dict) -> None:
    """Bytes per template at each level (a level's whole chain, every shard), in this manifest's KV mode."""
    mode = manifest.get("kv_mode", "single")
    sched = manifest.get("schedule")
    steps = sched["steps"] if sched else 1
    coding = manifest.get("per_step_coding")
    what = (
        f"per-step ({coding}), {steps} steps x {manifest['num_layers']} layers"
        if sched
        else "single, one KV per layer"
    )
    refs = manifest.get("references") or [{"token_grid": manifest["token_grid"]}]
    grids = " + ".join(f"{r['token_grid'][0]}x{r['token_grid'][1]}" for r in refs)
    tokens = sum(r["token_grid"][0] * r["token_grid"][1] for r in refs)
    what += f"; template {grids} = {tokens} tokens" + (f" ({len(refs)} references)" if len(refs) > 1 else "")
    print(f"bytes per template, kv_mode {mode} ({what}):")
    print(
        f"  {'name':<16}{'bytes':>12}{'KiB':>10}{'per step KiB':>14}  psnr_db   (bytes: the whole template at that level)"
    )
    for r in level_totals(manifest):
        nbytes, psnr = r["bytes"], r["psnr_db"]
        print(
            f"  {r['name']:<16}{nbytes:>12}{nbytes / 2**10:>10.1f}{nbytes / steps / 2**10:>14.1f}"
            f"  {'-' if psnr is None else psnr}"
        )

"""``sakura bench heldout``: every level's manifest PSNR against edits precompute never saw, and whether the quality
floor a client picks from the manifest holds on them. Prints a table and writes JSON."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys

from sakura_core.files import atomic_write_json

from .cli_weights import add_weights_arg, demo_model_from
from .heldout import HeldOutConfig, heldout_command, run_heldout

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    d = HeldOutConfig()
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument(
        "--templates",
        default=",".join(d.templates),
        help="comma-separated templates (samples or image paths; default: %(default)s)",
    )
    parser.add_argument(
        "--users",
        default=",".join(d.users),
        help="comma-separated user images; a template is edited by every other one (default: %(default)s)",
    )
    parser.add_argument(
        "--prompts", default="|".join(d.prompts), help="'|'-separated edit prompts (default: %(default)s)"
    )
    parser.add_argument("--kv-mode", default=d.kv_mode, choices=("single", "per-step"), help="(default: %(default)s)")
    parser.add_argument("--steps", type=int, default=d.steps, help="denoising steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed, help="first held-out edit's seed (default: %(default)s)")
    parser.add_argument("--floor-db", type=float, default=d.floor_db, help="quality floor (default: %(default)s)")
    add_weights_arg(parser)


def run(args) -> int:
    split = lambda s, sep=",": tuple(x.strip() for x in s.split(sep) if x.strip())  # noqa: E731
    try:
        cfg = HeldOutConfig(
            templates=split(args.templates),
            users=split(args.users),
            prompts=split(args.prompts, "|"),
            kv_mode=args.kv_mode,
            steps=args.steps,
            seed=args.seed,
            floor_db=args.floor_db,
        )
    except ValueError as e:
        print(f"sakura bench heldout: {e}", file=sys.stderr)
        return 2
    model = demo_model_from(args)
    result = run_heldout(model, cfg, say=lambda line: print(line, flush=True))
    result["model"] = {"id": model.model_id, "weights": model.weights_source}
    result["command"] = heldout_command(cfg, args.json, args.weights)
    atomic_write_json(args.json, result)
    n = len(result["rows"][0]["heldout_psnr_db"]) if result["rows"] else 0
    print(
        f"\n{cfg.kv_mode} templates, {cfg.steps} steps; PSNR dB vs the exact-KV edit: the manifest's (the lowest of its held-out edits) and "
        f"{n} held-out edits per template (min / median / max)"
    )
    print(f"{'template':<12}{'level':<16}{'bytes':>10}{'manifest':>10}{'min':>8}{'median':>8}{'max':>8}")
    for r in result["rows"]:
        print(
            f"{r['template']:<12}{r['name']:<16}{r['bytes']:>10}{r['manifest_psnr_db']:>10.2f}"
            f"{r['heldout_min_db']:>8.2f}{r['heldout_median_db']:>8.2f}{r['heldout_max_db']:>8.2f}"
        )
    print(f"\nquality floor (the cheapest level whose manifest PSNR >= {cfg.floor_db} dB) on the held-out edits:")
    for f in result["floors"]:
        if f["floor"] is None:
            print(f"  {f['template']}: no level reaches {cfg.floor_db} dB in the manifest")
            continue
        print(
            f"  {f['template']}: {f['floor']} ({f['bytes']} B), manifest {f['manifest_psnr_db']:.2f} dB, held-out "
            f"min {f['heldout_min_db']:.2f} dB: {'holds' if f['holds'] else 'FALLS BELOW'}"
        )
    held = sum(f["holds"] for f in result["floors"])
    print(f"  floor holds on every held-out edit for {held} of {len(result['floors'])} templates")
    for fam, v in result["families"].items():
        worst = v["worst_shortfall_db"]
        below = f"worst {worst:.2f} dB below the manifest" if worst > 0 else "never below the manifest"
        print(f"  {fam}: held-out - manifest median {v['median_diff_db']:+.2f} dB, {below}")
    print(f"wrote {args.json}")
    return 0

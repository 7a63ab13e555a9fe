"""``sakura bench scale``: the CPU seconds and peak memory of simulating one per-step edit with every policy (the
oracle included) and the fluid bound at growing step counts (4, 28, 50 by default). Prints a table and writes JSON."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import platform
from pathlib import Path

from sakura_core.files import atomic_write_json
from sakura_core.policy.policies import POLICIES

from .scale import TEMPLATE_IMAGE_BYTES, format_scale_table, scale_case

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument("--steps", default="4,28,50", help="comma list of step counts (default: %(default)s)")
    parser.add_argument("--policies", default="all", help=f"comma list or 'all' ({','.join(POLICIES)})")
    parser.add_argument("--profile", default="snapdragon-8-elite-cpu", help="device profile (default: %(default)s)")
    parser.add_argument("--geometry", default="klein4b-512-ref1024", help="DiT geometry (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic random-walk link")
    parser.add_argument("--mean-mbit", type=float, default=30.0, help="the walk's starting rate, Mbit/s")
    parser.add_argument(
        "--ladders",
        metavar="DIR",
        help="the geometry's committed per-step ladders (e.g. "
        "docs/results/ladders) and sakura's measured / modelled per-step ladders instead of the "
        "synthetic ones (bench/scale.py)",
    )
    parser.add_argument(
        "--template-image-kb",
        type=float,
        default=TEMPLATE_IMAGE_BYTES / 1024,
        help="KiB of the template image each edit fetches before its lanes, seeding its estimator (0: none; "
        "default: %(default)g)",
    )
    parser.add_argument("--before", metavar="JSON", help="an earlier `sakura bench scale` JSON, kept beside these")


def _fail(msg: str) -> int:
    print(f"sakura bench scale: {msg}")
    return 2


def run(args) -> int:
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        return _fail(f"--steps must be a comma list of integers, got {args.steps!r}")
    if not args.template_image_kb >= 0:
        return _fail(f"--template-image-kb must be >= 0 (0: no image), got {args.template_image_kb}")
    if not steps or min(steps) < 1:
        return _fail(f"--steps needs step counts >= 1, got {args.steps!r}")
    names = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad or "sakura" not in names or "oracle" not in names:
        return _fail(
            f"--policies must name sakura and oracle and only known policies ({', '.join(POLICIES)}); "
            f"got {args.policies!r}"
        )
    before = None
    if args.before:
        try:
            before = json.loads(Path(args.before).read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return _fail(f"--before {args.before}: not a `sakura bench scale --json` file ({e!r})")
    rows = []
    for s in steps:
        try:
            image = int(args.template_image_kb * 1024)
            rows.append(
                scale_case(s, names, args.profile, args.geometry, args.seed, args.mean_mbit, args.ladders, image)
            )
        except ValueError as e:
            return _fail(str(e))
        print(f"{s} steps: {rows[-1]['cpu_s_total']:.1f} s of CPU for {len(names)} policies and the bound", flush=True)
    cpu = platform.processor() or platform.machine()
    print(
        f"\nsakura bench scale: per-step KV, {args.geometry}, {args.profile}, synthetic walk (seed {args.seed}, from "
        f"{args.mean_mbit:g} Mbit/s), policies {','.join(names)}; CPU seconds of this process on this {cpu} host"
    )
    print(format_scale_table(rows, before))
    command = (
        f"sakura bench scale --steps {args.steps} --policies {args.policies} --profile {args.profile} "
        f"--geometry {args.geometry} --seed {args.seed} --mean-mbit {args.mean_mbit:g}"
        + (f" --ladders {args.ladders}" if args.ladders else "")
        + f" --template-image-kb {args.template_image_kb:g}"
    )
    out = {"cpu": cpu, "command": command, "policies": names, "ladders": args.ladders or "synthetic", "rows": rows}
    if before is not None:
        out["before"] = before
    atomic_write_json(args.json, out)
    print(f"wrote {args.json}")
    return 0

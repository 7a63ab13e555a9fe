"""``sakura bench cross-step``: per-step template KV coded independently vs across steps, against single-mode KV;
bytes per template at equal end-to-end PSNR. Prints a table and writes JSON."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys

from sakura_core.files import atomic_write_json

from .cli_weights import add_weights_arg, demo_model_from
from .cross_step import CrossStepConfig, run_cross_step

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    d = CrossStepConfig()
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument("--template", default=d.template, help="template sample or image (default: %(default)s)")
    parser.add_argument(
        "--users", default=",".join(d.users), help="comma-separated user images (default: %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=d.steps, help="per-step schedule steps (default: %(default)s)")
    parser.add_argument("--shift", type=float, default=d.shift, help="schedule shift (default: %(default)s)")
    parser.add_argument(
        "--probes", type=int, default=d.probes, help="importance probes per step (default: %(default)s)"
    )
    add_weights_arg(parser)


def run(args) -> int:
    try:
        config = CrossStepConfig(
            template=args.template,
            users=tuple(u for u in args.users.split(",") if u),
            steps=args.steps,
            shift=args.shift,
            probes=args.probes,
        )
    except ValueError as e:
        print(f"sakura bench cross-step: {e}", file=sys.stderr)
        return 2
    model = demo_model_from(args)
    result = run_cross_step(model, config, say=lambda line: print(line, flush=True))
    result["model"] = {"id": model.model_id, "weights": model.weights_source}
    atomic_write_json(args.json, result)
    print(f"\n{'store':<24}{'level':>6}{'bytes':>10}{'PSNR dB':>9}")
    for r in result["rows"]:
        print(f"{r['store']:<24}{r['level']:>6}{r['bytes']:>10}{r['psnr_db']:>9.2f}")
    print(
        f"\nat each single-mode level's PSNR, per-step bytes as a multiple of single-mode bytes ({config.steps} steps):"
    )
    print(f"{'PSNR dB':>8}{'single B':>10}{'independent':>13}{'cross-step':>12}")
    for row in result["summary"]:
        ind, cross = row["per-step-independent_x_single"], row["per-step-cross_x_single"]
        print(
            f"{row['psnr_db']:>8.2f}{row['single_bytes']:>10}{'-' if ind is None else ind:>13}{'-' if cross is None else cross:>12}"
        )
    print(f"wrote {args.json}")
    return 0

"""``sakura bench codec``: every codec and ladder level on the demo model; prints a table and writes JSON."""

from __future__ import annotations

import sys

from sakura_core.files import atomic_write_json
from sakura_core.kv import CODECS
from sakura_core.models.edit_model import DEMO_TEMPLATES

from .cli_weights import add_weights_arg, demo_model_from
from .codec_bench import DEFAULT_PROMPT, CodecBenchConfig, format_table, run_codec_bench

__all__ = ["add_arguments", "run"]


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument(
        "--templates",
        type=_csv,
        default=CodecBenchConfig.templates,
        help=f"comma-separated template samples or image paths (samples: {', '.join(DEMO_TEMPLATES)}; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--users", type=_csv, default=CodecBenchConfig.users, help="user images (default: %(default)s)"
    )
    parser.add_argument(
        "--codecs", type=_csv, default=CodecBenchConfig.codecs, help=f"codecs of {sorted(CODECS)} (default: all)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="edit prompt (default: %(default)r)")
    parser.add_argument(
        "--steps", type=int, default=CodecBenchConfig.steps, help="denoising steps (default: %(default)s)"
    )
    parser.add_argument("--shard-layers", type=int, default=1, help="layers per shard (default: %(default)s)")
    parser.add_argument("--probes", type=int, default=8, help="importance probes (default: %(default)s)")
    parser.add_argument(
        "--held-out-probes", type=int, default=8, help="probes for attn_rel_err (default: %(default)s)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timing repetitions, best kept (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="probe and edit seed (default: %(default)s)")
    parser.add_argument("--no-phone-scale", action="store_true", help="skip the phone-scale decode throughput table")
    parser.add_argument(
        "--no-uniform-ablation", action="store_true", help="skip the sakura-uniform rows (SAKURA without importance)"
    )
    add_weights_arg(parser)


def run(args) -> int:
    try:
        config = CodecBenchConfig(
            templates=args.templates,
            users=args.users,
            prompt=args.prompt,
            steps=args.steps,
            codecs=args.codecs,
            shard_layers=args.shard_layers,
            probes=args.probes,
            held_out_probes=args.held_out_probes,
            seed=args.seed,
            repeats=args.repeats,
            phone_scale=not args.no_phone_scale,
            uniform_ablation=not args.no_uniform_ablation,
        )
    except (ValueError, KeyError) as e:
        print(f"sakura bench codec: {e}", file=sys.stderr)
        return 2
    model = demo_model_from(args)
    result = run_codec_bench(config, model=model, progress=lambda msg: print(f"  {msg}", file=sys.stderr))
    print(format_table(result))
    atomic_write_json(args.json, result)
    print(f"\nwrote {args.json}")
    return 0

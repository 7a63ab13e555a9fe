"""``sakura bench decode``: one decode thread on a phone-scale shard, SAKURA's ladder and CacheGen's side by side in one
run; prints a table (fp16 MB/s decoded, Mbit/s of wire consumed) and writes JSON.

The shard is one phone-class DiT layer (:data:`~sakura_tools.bench.phone_scale.PHONE_SHARD`) made of the demo
template's real K/V tiled to that size (:func:`~sakura_tools.bench.phone_scale.phone_scale_input`; uniform importance,
so SAKURA's rungs keep every token) — or, with ``--data gaussian``, Gaussian K/V of that size (tiling repeats the
demo's 256 tokens, which the entropy coder exploits: the demo data's wire sizes are smaller than a real layer's).
Every level is encoded once and its whole chain decoded with ``sakura_core.kv.decode_chain`` on this thread (torch
limited to one thread), best of ``--repeats``; then SAKURA's cross-step rungs (:mod:`.decode_residual`: a per-step
template's step 1 against step 0, the open-loop residual chain and the closed-loop twin, the reference add included;
``--no-residual`` leaves them out). The wire rate a decoder sustains is ``8 * wire bytes / decode time``, against
:data:`TARGET_WIRE_MBIT_S`. The machine's load average is recorded beside the figures (a shared machine slows every
codec alike, which is why they are measured in one run).
"""

from __future__ import annotations

import os
import platform
import sys
from functools import partial

import numpy as np

from sakura_core.files import atomic_write_json

from .cli_weights import add_weights_arg, demo_model_from
from .phone_scale import PHONE_SHARD, decode_row, level_chain, phone_scale_input
from .timing import best_time_s

__all__ = ["TARGET_WIRE_MBIT_S", "add_arguments", "format_table", "measure_decode", "run"]

#: The target: one decode thread keeps up with this much wire (Mbit/s).
TARGET_WIRE_MBIT_S = 500.0


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument(
        "--codecs", type=_csv, default=("sakura", "cachegen"), help="codecs (default: sakura,cachegen)"
    )
    parser.add_argument(
        "--data",
        choices=("demo", "gaussian"),
        default="demo",
        help="demo: the demo template's KV tiled; gaussian: N(0,1) keys, N(0,0.36) values",
    )
    parser.add_argument(
        "--template", default="astronaut", help="demo template whose KV is tiled (default: %(default)s)"
    )
    parser.add_argument(
        "--layer", type=int, default=0, help="the demo layer whose K/V is tiled (default: %(default)s)"
    )
    parser.add_argument(
        "--tokens", type=int, default=PHONE_SHARD["tokens"], help="shard tokens (default: %(default)s)"
    )
    parser.add_argument("--heads", type=int, default=PHONE_SHARD["heads"], help="shard heads (default: %(default)s)")
    parser.add_argument("--head-dim", type=int, default=PHONE_SHARD["head_dim"], help="(default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed decodes per level, best kept (default: %(default)s)"
    )
    add_weights_arg(parser)
    parser.add_argument(
        "--no-residual",
        action="store_true",
        help="leave out SAKURA's cross-step rungs (a per-step template's step 1 coded against step 0: "
        "the open-loop residual chain and the closed-loop twin, reference add included)",
    )


def measure_decode(layer_kv, codecs: tuple[str, ...], shard: dict, repeats: int) -> list[dict]:
    """One row per (codec, level): wire bytes, ratio vs fp16, decode seconds (best of ``repeats``, after one untimed
    decode), fp16 MB/s and wire Mbit/s."""
    from sakura_core.kv.chain import decode_chain
    from sakura_core.kv.codec_registry import get_codec

    inp, fp16_bytes = phone_scale_input(layer_kv, shard)
    rows = []
    for name in codecs:
        codec = get_codec(name)
        for level in codec.levels:
            blobs = codec.encode(inp, level_chain(codec, level))
            wire = sum(len(b) for b in blobs)
            seconds = best_time_s(partial(decode_chain, blobs), repeats, warmup=True)
            row = decode_row(name, level, codec.level_name(level), wire, fp16_bytes, seconds, TARGET_WIRE_MBIT_S)
            rows.append(row)
    return rows


def format_table(result: dict) -> str:
    """The rows as text (what ``sakura bench decode`` prints)."""
    s = result["shard"]
    lines = [
        f"one decode thread, phone-scale shard (1 layer, K+V, {s['tokens']} tokens x {s['heads']} heads x "
        f"{s['head_dim']}; {result['fp16_bytes']} B fp16; {'demo KV tiled' if result['data'] == 'demo' else 'Gaussian K/V'}, uniform importance); load average "
        f"{result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after; target >= "
        f"{TARGET_WIRE_MBIT_S:g} Mbit/s of wire",
        f"{'codec':<17}{'level':<14}{'wire B':>10}{'x fp16':>8}{'decode ms':>11}{'fp16 MB/s':>11}{'wire Mbit/s':>13}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['codec']:<17}{r['name']:<14}{r['wire_bytes']:>10}{r['ratio_vs_fp16']:>8.2f}{r['decode_s'] * 1e3:>11.1f}"
            f"{r['fp16_mb_s']:>11.1f}{r['wire_mbit_s']:>13.1f}{'' if r['meets_target'] else '  < target'}"
        )
    return "\n".join(lines)


def run(args) -> int:
    import torch

    from sakura_core.models.edit_model import load_image

    shard = {"tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim}
    if args.repeats < 1 or min(shard.values()) < 1 or args.tokens % 32:
        print(
            "sakura bench decode: --repeats, --heads, --head-dim must be >= 1, --tokens a multiple of 32",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    steps = None  # (step 0, step 1) of one layer for the cross-step rows
    if args.data == "gaussian":
        rng = np.random.default_rng(0)
        shape = (args.tokens, args.heads, args.head_dim)
        layer_kv = np.stack(
            [rng.standard_normal(shape, dtype=np.float32), 0.6 * rng.standard_normal(shape, dtype=np.float32)]
        )
        if not args.no_residual:
            from .decode_residual import gaussian_steps

            steps = gaussian_steps(args.tokens, args.heads, args.head_dim)
    else:
        model = demo_model_from(args)
        if not 0 <= args.layer < model.adapter.num_layers:
            print(f"sakura bench decode: --layer must be in 0..{model.adapter.num_layers - 1}", file=sys.stderr)
            return 2
        image = load_image(args.template, model.spec.image_size)
        tokens = model.template_tokens(image)
        kv = model.adapter.extract_template_kv(tokens, model.spec.grid)
        layer_kv = kv.kv[args.layer].float().numpy()  # (2, tokens, heads, head_dim)
        if not args.no_residual:
            from sakura_core.runtime.schedule import edit_times

            times = edit_times(model, 4)[:2]  # the first two steps of a 4-step edit
            per_step = model.adapter.extract_per_step_kv(tokens, model.spec.grid, times)
            steps = tuple(per_step.kv[s, args.layer].float().numpy() for s in (0, 1))
    load_before = os.getloadavg()
    rows = measure_decode(layer_kv, args.codecs, shard, args.repeats)
    if steps is not None:
        from .decode_residual import measure_residual_decode

        rows += measure_residual_decode(*steps, shard, args.repeats, TARGET_WIRE_MBIT_S)
    result = {
        "shard": shard,
        "fp16_bytes": 2 * 2 * args.tokens * args.heads * args.head_dim,
        "rows": rows,
        "data": args.data,
        "template": args.template,
        "layer": args.layer,
        "repeats": args.repeats,
        "threads": 1,
        "target_wire_mbit_s": TARGET_WIRE_MBIT_S,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    print(format_table(result))
    atomic_write_json(args.json, result)
    print(f"\nwrote {args.json}")
    return 0

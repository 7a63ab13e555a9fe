"""``sakura bench ladder-model``: the per-step ladder model (bench/step_ladders.py) fitted on every measured per-step
ladder file, its error on the held-out step count printed and written with it (``per_step_model.json``); ``--add
MANIFEST`` first turns a per-step precompute's manifest (``sakura precompute --kv-mode per-step --steps S
--store-profile full``) into the measured file ``per_step_ladders_<S>.json``."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
from pathlib import Path

from .per_step_ladders import DATA_PATH, from_manifest
from .step_ladders import MODEL_PATH, write_model

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--add",
        metavar="MANIFEST",
        help="a per-step template's manifest.json (store profile full) to add as a measurement first",
    )
    parser.add_argument("--note", default="", help="with --add: how it was measured (command, host, time)")
    parser.add_argument(
        "--hold-out",
        type=int,
        metavar="S",
        help="fit without the S-step measurement and state the "
        "error on it (default: fit on every one; the error is the largest count's, left out of a "
        "second fit)",
    )
    parser.add_argument("--out", default=str(MODEL_PATH), help="the model file (default: the shipped one)")


def run(args) -> int:
    if args.add:
        try:
            manifest = json.loads(Path(args.add).read_text())
            data = from_manifest(manifest, {"manifest_model": manifest.get("model_id"), "measured": args.note})
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(
                f"sakura bench ladder-model: --add {args.add}: not a per-step manifest ({e!r}); precompute one with "
                "--kv-mode per-step --store-profile full"
            )
            return 2
        path = DATA_PATH.with_name(f"per_step_ladders_{data['steps']}.json")
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path} ({data['steps']} steps, {len(data['levels'])} levels)")
    try:
        model = write_model(args.out, hold_out=args.hold_out)
    except ValueError as e:
        print(f"sakura bench ladder-model: {e}")
        return 2
    h = model["heldout"]
    print(
        f"fitted on {model['fit_on']} steps; held out {h['steps']} (fit on {h['fit_on']}): edit PSNR within "
        f"{h['max_psnr_error_db']:.2f} dB, bytes over the edit within {100 * h['max_bytes_rel_error']:.1f} %"
    )
    for r in h["levels"]:
        twin = (
            f"; twin {r['closed_psnr_error_db']:+.2f} dB, {100 * r['closed_bytes_rel_error']:+.1f} %"
            if "closed_psnr_error_db" in r
            else ""
        )
        print(f"  {r['name']:<10} PSNR {r['psnr_error_db']:+.2f} dB, bytes {100 * r['bytes_rel_error']:+.1f} %{twin}")
    print(f"wrote {args.out}")
    return 0

"""``sakura eval demo-model``: held-out quality of the demo model's KV edits, and how concentrated its attention is.

Prints a table and writes JSON ``{"psnr_db", "ssim", "baselines": {"template": {"psnr_db"}, "user_image":
{"psnr_db"}, ...}, "importance_gini", ...}``. The held-out pairs come from a seed disjoint from training.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from .train import EVAL_SEED

    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument("--weights", default="auto", help="weights file (default: the packaged trained weights)")
    parser.add_argument("--pairs", type=int, default=32, help="held-out pairs (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8, help="denoising steps per edit (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="held-out data seed (default: %(default)s)")
    parser.add_argument("--probes", type=int, default=4, help="templates probed for importance (default: %(default)s)")
    parser.add_argument("--no-reference", action="store_true", help="skip the random-init importance reference")
    parser.add_argument(
        "--kv-mode",
        choices=("single", "per-step", "both"),
        default="single",
        help="single: template KV at the fixed reference time, reused by every step; per-step: template KV at each "
        "step's own time; both: evaluate each and report the gap (default: %(default)s)",
    )


def _training_record(weights_path: Path | None) -> dict | None:
    if weights_path is None or not weights_path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(weights_path), framework="pt") as f:
        raw = (f.metadata() or {}).get("training")
    return json.loads(raw) if raw else None


def run(args) -> int:
    from sakura_core.demo.edit_task import ImageBank
    from sakura_core.files import atomic_write_json

    if args.pairs < 1 or args.steps < 1 or args.probes < 0:
        raise SystemExit("sakura eval demo-model: --pairs and --steps must be >= 1, --probes >= 0")
    model, reference, record = _load_models(args)
    bank = ImageBank.load()
    t0 = time.perf_counter()
    per_mode = _evaluate_modes(model, reference, bank, args)
    result = dict(next(iter(per_mode.values())))
    result["kv_mode"] = args.kv_mode
    if len(per_mode) > 1:
        result["modes"] = {m: {"psnr_db": r["psnr_db"], "ssim": r["ssim"]} for m, r in per_mode.items()}
        result["per_step_minus_single_db"] = per_mode["per-step"]["psnr_db"] - per_mode["single"]["psnr_db"]
    result["eval_s"] = round(time.perf_counter() - t0, 1)
    if record is not None:
        result["training"] = {k: record.get(k) for k in ("steps", "elapsed_s", "train_config")}
    atomic_write_json(args.json, result)
    _print_results(model, args, result, per_mode)
    return 0


def _load_models(args):
    """(the evaluated model, the random-init reference or None, the weights' training record or None); refuses the
    training seed as the held-out seed."""
    from sakura_core.models.edit_model import ModelSpec, load_demo_model

    spec = ModelSpec.load()
    if args.weights == "auto":
        path = Path(str(resources.files("sakura_core.models").joinpath(spec.weights)))
        weights_path = path if path.is_file() else None
    else:
        weights_path = Path(args.weights)
    record = _training_record(weights_path)
    if record is not None and record.get("train_config", {}).get("seed") == args.seed:
        raise SystemExit(f"sakura eval demo-model: --seed {args.seed} is the training seed; pick a held-out seed")
    model = load_demo_model(spec, weights=args.weights)
    if model.weights_source.startswith("random"):
        print("note: no trained weights found — evaluating the random init")
    reference = None if args.no_reference else load_demo_model(spec, weights=None)
    return model, reference, record


def _evaluate_modes(model, reference, bank, args) -> dict[str, dict]:
    """``evaluate`` per KV mode asked for (``--kv-mode both``: single, then per-step), in that order."""
    from .evaluate import evaluate

    modes = ("single", "per-step") if args.kv_mode == "both" else (args.kv_mode,)
    per_mode = {}
    for i, mode in enumerate(modes):
        probes = args.probes if i == 0 else 0  # importance is a property of the weights: measured once
        per_mode[mode] = evaluate(
            model,
            bank,
            pairs=args.pairs,
            seed=args.seed,
            steps=args.steps,
            probes=probes,
            reference_model=reference,
            kv_mode=mode,
        )
    return per_mode


def _print_results(model, args, result: dict, per_mode: dict[str, dict]) -> None:
    b = result["baselines"]
    print(
        f"model {model.spec.name} ({model.weights_source}), {args.pairs} held-out pairs (seed {args.seed}), "
        f"{args.steps} steps, template KV injected at every layer"
    )
    print(f"\n{'output':<34}{'PSNR dB':>9}{'SSIM':>8}")
    for mode, r in per_mode.items():
        label = f"model edit (KV path, {mode})"
        print(f"{label:<34}{r['psnr_db']:>9.2f}{r['ssim']:>8.3f}")
    print(f"{'baseline: return the template':<34}{b['template']['psnr_db']:>9.2f}{b['template']['ssim']:>8.3f}")
    print(f"{'baseline: return the user image':<34}{b['user_image']['psnr_db']:>9.2f}{b['user_image']['ssim']:>8.3f}")
    nc = b["naive_composite"]
    print(f"{'reference: paste, no recolour *':<34}{nc['psnr_db']:>9.2f}{nc['ssim']:>8.3f}")
    if len(per_mode) > 1:
        print(f"per-step minus single: {result['per_step_minus_single_db']:+.2f} dB")
    gain = result["psnr_db"] - max(b["template"]["psnr_db"], b["user_image"]["psnr_db"])
    print(f"\ngain over the better trivial baseline: {gain:+.2f} dB")
    r = result["region_psnr_db"]
    print(f"model PSNR inside the region {r['inside']:.2f} dB, outside {r['outside']:.2f} dB")
    print("* uses the ground-truth region and scene: what a model that composites perfectly but never recolours gets")
    if result["importance_gini"] is not None:
        imp = result["importance"]
        line = (
            f"\ntemplate-token importance: gini {imp['gini']:.3f}, top 10% of tokens hold {imp['top10pct_mass']:.1%}"
        )
        if "importance_reference" in result:
            ref = result["importance_reference"]
            line += f" (random init: gini {ref['gini']:.3f}, top 10% {ref['top10pct_mass']:.1%}; uniform: 0, 10%)"
        print(line)
        print(
            f"per-layer gini: {', '.join(f'{g:.3f}' for g in imp['gini_per_layer'])}; request attention on the "
            f"template: {imp['template_share']:.1%}"
        )
    print(f"wrote {args.json} ({result['eval_s']} s)")

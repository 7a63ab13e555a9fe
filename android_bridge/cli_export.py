"""``sakura export --target onnx|qnn|web --out DIR [--model FOLDER]``: the demo DiT (or a klein folder's transformer) in
cached-KV mode for the Snapdragon NPU toolchain; ``--target web``: the demo model's files for the phone page
(:mod:`android_bridge.web_export`; serve them with ``sakura serve --phone-model DIR``).

Prints the op coverage and the numerical parity against torch; writes the models, ``io.json`` and
``export_report.json`` into DIR. ``--target qnn`` needs ``onnxruntime-qnn`` (pip install 'sakura-kv[npu]').
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--target",
        choices=("onnx", "qnn", "web"),
        default="qnn",
        help="onnx: fp32 + w8a16 QDQ (ORT CPU checks); qnn: also the HTP context binary (default); "
        "web: the phone page's graph, tables and model.json",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--soc-model", default="69", help="QNN soc_model (69 = SM8750, Snapdragon 8 Elite)")
    parser.add_argument("--calibration-steps", type=int, default=4, help="denoising steps per calibration edit")
    parser.add_argument("--validation-steps", type=int, default=4, help="steps of the held-out validation edit")
    parser.add_argument("--weights", default="auto", help="demo model weights: auto, none or a path")
    parser.add_argument(
        "--model",
        default="demo",
        help="demo, the path of a diffusers FLUX.2 [klein] pipeline folder, or klein-files:"
        "diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR (its transformer)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--split",
        type=int,
        default=None,
        help="web: the hybrid split whose template graph is exported (layers computed in the page; "
        "default half the layers, 0 = none)",
    )
    parser.add_argument(
        "--no-template-layers",
        action="store_true",
        help="web: skip the per-layer template graphs (the page's template pass at any layer)",
    )


def _fmt(p: dict) -> str:
    return f"max abs {p['max_abs']:.3e}  max abs/range {p['max_abs_over_range']:.3e}  rel L2 {p['rel_l2']:.3e}"


def run(args) -> int:
    import logging

    import torch

    from .export import ExportConfig, ExportError, export_demo

    torch.set_num_threads(max(1, args.threads))
    if args.target == "web":
        return _run_web(args)
    logging.getLogger("onnx_ir").setLevel(logging.WARNING)  # one INFO line per deduplicated initializer
    try:
        config = ExportConfig(
            out_dir=args.out,
            target=args.target,
            soc_model=args.soc_model,
            calibration_steps=args.calibration_steps,
            validation_steps=args.validation_steps,
            weights=args.weights,
        )
        model = None
        if args.model != "demo":
            from sakura_core.models.loading import load_edit_model

            model = load_edit_model(args.model)
        report = export_demo(config, model=model, progress=lambda msg: print(msg, flush=True))
    except (ExportError, ValueError) as e:
        print(f"sakura export: {e}", file=sys.stderr)
        return 1
    print()
    print(
        f"model {report['model']['name']} ({report['model']['weights']}), {report['model']['layers']} layers, "
        f"{report['model']['params']:,} params"
    )
    for name, p in report["parity"].items():
        if isinstance(p, dict) and "max_abs" in p:
            print(f"  {name:<32} {_fmt(p)}")
    q = report.get("qnn")
    if q:
        print(f"  {'qnn_htp_edit_psnr_db_vs_torch':<32} {report['parity']['qnn_htp_edit_psnr_db_vs_torch']} dB")
        print(
            f"QNN HTP (soc_model {q['soc_model']}, CPU fallback {q['cpu_fallback']}): {q['compute_nodes']} compute "
            f"nodes, {q['qnn_partitions']} QNN partition(s), outside QNN: {q['nodes_outside_qnn'] or 'none'}; "
            f"op coverage {q['op_coverage']:.1%}"
        )
    print(f"wrote {args.out}/export_report.json")
    return 0


def _run_web(args) -> int:
    from .web_export import export_web

    if args.model != "demo":
        print("sakura export: --target web exports the demo model only", file=sys.stderr)
        return 1
    try:
        index = export_web(
            args.out, weights=args.weights, split=args.split, template_layers=not args.no_template_layers
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"sakura export: {e}", file=sys.stderr)
        return 1
    g = index["graph"]
    print(
        f"model {index['name']} ({index['weights']}) {index['model_id'][:16]}: {g['file']} {g['bytes']:,} bytes, "
        f"{len(index['tables'])} tables; ORT CPU vs torch max abs {g['ort_cpu_vs_torch_max_abs']:.3e}; "
        f"export {index['export_s']} s"
    )
    t = index["template_graph"]
    if t:
        print(
            f"template graph {t['file']} (layers < {t['split_layer']}): {t['bytes']:,} bytes; ORT CPU vs torch max "
            f"abs {t['ort_cpu_vs_torch_max_abs']:.3e}; export {t['export_s']} s"
        )
    p = index["template_layers"]
    if p:
        worst = max(x["ort_cpu_vs_torch_max_abs"] for x in p["layers"])
        print(
            f"template pass: {p['embed']['file']} + {len(p['layers'])} layer graphs, {p['bytes']:,} bytes; ORT CPU "
            f"vs torch max abs {worst:.3e}"
        )
    print(f"wrote {args.out}/model.json")
    return 0

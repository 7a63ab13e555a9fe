"""Calibrate the FLOP cost model on this machine's CPU against real forwards of the bench model.

The bench model is the demo transformer (FLUX.2-KV architecture, :mod:`sakura_core.models.edit_model`); a wider variant of
the same architecture (random weights, same token counts) puts points where the layers are FLOP-bound. Each model
runs the three forwards the simulator charges — request tokens with the template KV injected (``cached``), request
and template tokens through every layer (``full``, extract mode), and a template-only pass — timed (best of
``repeats``). The cost model ``time = FLOPs / effective FLOP/s + layers * overhead`` is fitted by least squares, and
each forward's model-vs-measured error is reported. Times are of this CPU, never a phone's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from sakura_core.runtime.geometry import BlockShape, DitGeometry, TokenCounts

from .timing import best_time_s

__all__ = ["calibrate_cpu", "demo_geometry", "fit_cost_model", "format_calibration"]


def demo_geometry(model, name: str = "demo") -> DitGeometry:
    """The cost model's view of a demo-architecture model (``EditModel``)."""
    a, spec = model.adapter, model.spec
    shape = BlockShape(
        layers=a.num_layers,
        heads=a.num_heads,
        head_dim=a.head_dim,
        mlp_ratio=float(a.model.config.mlp_ratio),
        double_layers=a.num_double,
    )
    tokens = TokenCounts(image_tokens=spec.num_tokens, template_tokens=spec.num_tokens, text_tokens=spec.text_tokens)
    return DitGeometry(name=name, shape=shape, tokens=tokens, description="the demo model as the cost model sees it")


def _wide_variant(model, heads: int, head_dim: int):
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    from sakura_core.models.edit_model import EditModel

    cfg = {**model.spec.transformer, "num_attention_heads": heads, "attention_head_dim": head_dim}
    cfg["axes_dims_rope"] = [head_dim // 4] * 4
    torch.manual_seed(0)
    spec = replace(model.spec, transformer=cfg)
    return EditModel(spec, Flux2Transformer2DModel(**cfg).eval(), "random (calibration variant)")


def _measure(model, repeats: int) -> list[dict]:
    """Time the cached, full and template-only forwards of ``model``; FLOPs from the cost model."""
    a, spec = model.adapter, model.spec
    g = demo_geometry(model)
    gen = torch.Generator().manual_seed(0)
    n, cfg = spec.num_tokens, a.model.config
    x = torch.randn(1, n, cfg.in_channels, generator=gen)  # (1, tokens, channels)
    txt = torch.randn(1, spec.text_tokens, cfg.joint_attention_dim, generator=gen)
    ref = torch.randn(1, n, cfg.in_channels, generator=gen)
    t = torch.full((1,), 0.5)
    kv = a.extract_template_kv(ref, spec.grid)
    L = a.num_layers

    def cached():
        a.forward(x, txt, t, img_grid=spec.grid, cached=kv, split_layer=0)

    def full():
        a.forward(x, txt, t, img_grid=spec.grid, ref_tokens=ref, ref_grid=spec.grid, split_layer=L)

    def template():
        a.extract_template_kv(ref, spec.grid)

    rows = []
    for kind, fn, flops in (
        ("cached", cached, L * g.layer_cached_flops),
        ("full", full, L * g.layer_full_flops),
        ("template", template, L * g.template_layer_flops),
    ):
        rows.append(
            {
                "width": g.width,
                "kind": kind,
                "layers": L,
                "flops": flops,
                "measured_s": best_time_s(fn, repeats, warmup=True),
            }
        )
    return rows


def fit_cost_model(rows: list[dict]) -> tuple[float, float]:
    """(effective FLOP/s, per-layer overhead s) fitting ``measured_s = flops / E + layers * overhead`` (rows with
    ``flops``, ``layers``, ``measured_s``), least squares on the relative error; adds ``model_s`` and ``error``."""
    a = np.array([[r["flops"], r["layers"]] for r in rows], dtype=np.float64)
    y = np.array([r["measured_s"] for r in rows], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    if coef[1] < 0:  # a negative overhead is not physical: fit through the origin
        w = a[:, 0] / y
        coef = np.array([float(np.sum(w) / np.sum(w**2)), 0.0])
    inv_flops, overhead = float(coef[0]), float(coef[1])
    for r in rows:
        r["model_s"] = r["flops"] * inv_flops + r["layers"] * overhead
        r["error"] = r["model_s"] / r["measured_s"] - 1
    return 1.0 / inv_flops, overhead


def calibrate_cpu(model, wide=((8, 64), (12, 64)), repeats: int = 5) -> dict:
    """Fit effective FLOP/s and per-layer overhead of this CPU; per-forward model-vs-measured error."""
    rows = _measure(model, repeats)
    for heads, head_dim in wide:
        rows += _measure(_wide_variant(model, heads, head_dim), repeats)
    flop_s, overhead = fit_cost_model(rows)
    errs = [abs(r["error"]) for r in rows]
    return {
        "effective_flop_per_s": flop_s,
        "layer_overhead_s": overhead,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "max_abs_error": max(errs),
        "mean_abs_error": float(np.mean(errs)),
    }


def format_calibration(cal: dict) -> str:
    lines = [
        f"CPU calibration (this machine, {cal['threads']} threads): effective {cal['effective_flop_per_s'] / 1e9:.1f} "
        f"GFLOP/s, overhead {cal['layer_overhead_s'] * 1e3:.2f} ms/layer; model vs measured: mean |error| "
        f"{cal['mean_abs_error'] * 100:.1f} %, max {cal['max_abs_error'] * 100:.1f} %",
        f"{'width':>6}{'forward':>10}{'GFLOP':>9}{'measured ms':>13}{'model ms':>10}{'error':>8}",
    ]
    for r in cal["rows"]:
        lines.append(
            f"{r['width']:>6}{r['kind']:>10}{r['flops'] / 1e9:>9.2f}{r['measured_s'] * 1e3:>13.1f}"
            f"{r['model_s'] * 1e3:>10.1f}{r['error'] * 100:>7.1f}%"
        )
    return "\n".join(lines)

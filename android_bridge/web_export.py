"""``sakura export --target web``: what the phone page needs to run the demo DiT in the browser (onnxruntime-web).

``export_web(out_dir)`` writes into ``out_dir``:

* ``dit_cached_kv.onnx`` — the fp32 cached-KV graph (:class:`~android_bridge.npu_graph.CachedKVGraph`, every layer
  takes fetched template K/V: single KV mode, split 0), static shapes but the template K/V's token count (one
  reference's tokens or several references' stacked), opset 17 (TorchScript exporter: seconds);
* the tables computed outside the graph, little-endian float32, row-major: ``rope_cos.f32`` / ``rope_sin.f32``
  (text then image token positions, ``(text_tokens + image_tokens, head_dim)``), ``byte_table.f32`` (the prompt
  embedding: ``(256, joint_dim)``, one row per UTF-8 byte), ``time_freqs.f32`` (the timestep projection's
  frequencies, ``(timestep_guidance_channels / 2,)``);
* ``template_kv.onnx`` — the hybrid split's template pass for layers ``< split`` (single KV mode;
  :mod:`android_bridge.web_template_graph`), unless ``split=0``;
* ``template_embed.onnx`` and ``template_layer_{l}.onnx`` — the template pass layer by layer, at any time (the page's
  ``template_pass.js``: a split at any layer, the on-device edit, single or per-step; :mod:`.web_template_layers`),
  unless ``template_layers=False``;
* ``model.json``: the index the page reads — model id and geometry, each file with its shape and SHA-256, the
  graph's input names, how the outside-the-graph inputs are formed, the schedule and the noise generator.

The demo model is VAE-free (pixels are cut into patch tokens), so nothing else is needed to go from the user's photo
to the model's input and back. The export is checked: ORT CPU on the written graph against the torch graph.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from .npu_graph import CachedKVGraph, graph_input_names, graph_inputs
from .web_template_graph import export_template_graph
from .web_template_layers import export_template_layers

__all__ = ["WEB_FORMAT", "WebCachedKVGraph", "export_web"]

WEB_FORMAT = "sakura-web-model/1"
GRAPH_NAME = "dit_cached_kv.onnx"


class WebCachedKVGraph(CachedKVGraph):
    """The cached-KV graph with the template's token count free (one reference, or several stacked: try-on), which
    the NPU export keeps static."""

    def _with_ref(self, t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        ref = ref.reshape(1, -1, self.heads * self.head_dim)  # (1, N_ref, H*D): N_ref from the input
        return torch.cat([t[:, : self.n_txt], ref, t[:, self.n_txt :]], dim=1)


# how the page forms each input outside the graphs (what web_model.js implements)
_RECIPES = {
    "prompt": "lower-case, UTF-8, first text_tokens bytes; token i = byte_table[byte i], the rest zero",
    "timestep": "t_freq = [cos(1000 t f), sin(1000 t f)] over time_freqs f (diffusers Timesteps, flip_sin_to_cos)",
    "schedule": {"kind": "flow", "shift": 1.0, "times": "linspace(1, 0, steps + 1)"},
    "noise": "torch.randn((1, image_tokens, 3 p^2)): mt19937(seed), 24-bit uniforms, Box-Muller in blocks of 16",
    "pixels": "[-1, 1] = uint8 / 127.5 - 1; token = a p x p patch, row-major, (py, px, rgb) inside",
    "request_tokens": "concat(noisy patch, user patch) on channels",
}


def _time_freqs(tp) -> np.ndarray:
    """The timestep projection's frequencies (diffusers ``get_timestep_embedding``, fp32), times its scale."""
    if not tp.flip_sin_to_cos or tp.num_channels % 2:
        raise ValueError("the page forms t_freq as [cos, sin] of an even width (flip_sin_to_cos); this model differs")
    half = tp.num_channels // 2
    exponent = -np.log(10000.0) * torch.arange(0, half, dtype=torch.float32) / (half - tp.downscale_freq_shift)
    return (torch.exp(exponent) * tp.scale).numpy()


def _table(out: Path, name: str, array: np.ndarray) -> dict:
    data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    (out / name).write_bytes(data)
    return {"file": name, "shape": list(array.shape), "dtype": "float32", "sha256": hashlib.sha256(data).hexdigest()}


def _tables(out: Path, model, ins) -> dict:
    """The tables the page reads beside the graph (the RoPE of ``ins``, the graph's example inputs)."""
    return {
        "rope_cos": _table(out, "rope_cos.f32", ins[3].numpy()),
        "rope_sin": _table(out, "rope_sin.f32", ins[4].numpy()),
        "byte_table": _table(out, "byte_table.f32", model._byte_table.numpy()),
        "time_freqs": _table(out, "time_freqs.f32", _time_freqs(model.adapter.model.time_guidance_embed.time_proj)),
    }


def _export_graph(graph, ins, path: Path, names: list[str], opset: int, dynamo: bool) -> tuple[dict, float]:
    """Export ``graph`` to ``path`` and run it in onnxruntime on ``ins``: its ``model.json`` entry (with the largest
    difference from torch) and the export's seconds."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    free = {n: {1: "template_tokens"} for n in names if n.startswith(("k_ref_", "v_ref_"))}  # 1..N references
    torch.onnx.export(
        graph,
        ins,
        str(path),
        input_names=names,
        output_names=["velocity"],
        dynamo=dynamo,
        opset_version=opset,
        external_data=False,
        verbose=False,
        dynamic_axes=free,
    )
    export_s = time.perf_counter() - t0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.numpy() for n, t in zip(names, ins, strict=True)})[0]
    max_abs = float(np.abs(got - graph(*ins).numpy()).max())
    graph_bytes = path.read_bytes()
    entry = {
        "file": path.name,
        "bytes": len(graph_bytes),
        "sha256": hashlib.sha256(graph_bytes).hexdigest(),
        "inputs": names,
        "output": "velocity",
        "opset": opset,
        "ort_cpu_vs_torch_max_abs": max_abs,
    }
    return entry, export_s


@torch.no_grad()
def export_web(
    out_dir: Path | str,
    model=None,
    weights: str = "auto",
    opset: int = 17,
    dynamo: bool = False,
    split: int | None = None,
    template_layers: bool = True,
) -> dict:
    """Write the page's model files into ``out_dir``; returns the index (also ``model.json``). ``split``: the hybrid
    split whose template graph is written too (layers ``< split`` computed in the page; default half the layers; 0 =
    none); ``template_layers``: write the per-layer template graphs (:mod:`.web_template_layers`) too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        from sakura_core.models.edit_model import load_demo_model

        model = load_demo_model(weights=None if weights == "none" else weights)
    if not hasattr(model, "encode_prompt") or hasattr(model, "edit_start"):
        raise ValueError("--target web exports the VAE-free demo model only (a latent model needs its VAE)")
    a, spec, m = model.adapter, model.spec, model.adapter.model
    names = graph_input_names(a.num_layers)
    graph = WebCachedKVGraph(a, spec.text_tokens, spec.num_tokens, spec.num_tokens).eval()
    # example inputs: a real template's KV and a real prompt, so the export traces the shapes it will run
    gen = torch.Generator().manual_seed(0)
    template = torch.rand(1, spec.num_tokens, spec.patch_dim, generator=gen) * 2 - 1
    kv = a.extract_template_kv(torch.cat([template, torch.zeros_like(template)], dim=-1), spec.grid)
    x = model.request_tokens(torch.randn(template.shape, generator=gen), template)
    ins = graph_inputs(model, x, model.encode_prompt("place it"), torch.tensor([0.5]), kv)
    graph_entry, export_s = _export_graph(graph, ins, out / GRAPH_NAME, names, opset, dynamo)
    split = a.num_layers // 2 if split is None else split
    template_graph = export_template_graph(model, out, split) if split else None  # the split graph
    layers = export_template_layers(model, out) if template_layers else None  # the template pass layer by layer
    index = {
        "format": WEB_FORMAT,
        "model_id": model.model_id,
        "name": spec.name,
        "weights": model.weights_source,
        "image_size": spec.image_size,
        "patch_size": spec.patch_size,
        "grid": list(spec.grid),
        "text_tokens": spec.text_tokens,
        "image_tokens": spec.num_tokens,
        "in_channels": m.config.in_channels,
        "out_channels": m.config.out_channels,
        "layers": a.num_layers,
        "heads": a.num_heads,
        "head_dim": a.head_dim,
        "kv_modes": ["single", "per-step"],
        "split_layers": [0] if template_graph is None else [0, split],
        "template_graph": template_graph,
        "template_layers": layers,
        "graph": graph_entry,
        "tables": _tables(out, model, ins),
        **_RECIPES,
        "export_s": round(export_s, 2),
    }
    (out / "model.json").write_text(json.dumps(index, indent=1))
    return index

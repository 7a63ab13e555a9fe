"""The phone page's template pass layer by layer: the demo model's template-only pass
(``Flux2KVAdapter.resume_template_kv``) cut into one ONNX graph per layer, so the page can compute the template's K/V
for any prefix of layers, pause between layers and resume (the lanes' split at any layer and their late-shard race),
at the fixed reference time (single KV mode) or at a step's own flow time (per-step KV mode).

* ``template_embed.onnx``: ``template`` (1, image_tokens, in_channels) -> ``hidden`` (1, image_tokens, dim);
* ``template_layer_{l}.onnx``, one per layer: ``hidden`` (1, image_tokens, dim) and ``t_freq``
  (1, timestep_guidance_channels: the page's ``timeFeatures`` of the template's modulation time) -> ``k``, ``v``
  (1, image_tokens, heads, head_dim) and ``hidden`` entering the next layer (``hidden_next``).

One reference's token grid (the model's), fp32, opset 21, the dynamo exporter (the TorchScript one has no
``rms_norm``). Each graph is checked at export: ORT CPU against :meth:`resume_template_kv` at the reference time.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "EMBED_GRAPH_NAME",
    "TemplateEmbedGraph",
    "TemplateLayerGraph",
    "export_template_layers",
    "layer_graph_name",
]

EMBED_GRAPH_NAME = "template_embed.onnx"


def layer_graph_name(layer: int) -> str:
    """The file of layer ``layer``'s graph."""
    return f"template_layer_{layer}.onnx"


class TemplateEmbedGraph(torch.nn.Module):
    """``forward(template) -> hidden``: the template tokens' input embedding (the hidden state entering layer 0)."""

    def __init__(self, adapter):
        super().__init__()
        self.adapter = adapter

    def forward(self, template: torch.Tensor) -> torch.Tensor:
        return self.adapter.model.x_embedder(template)


class TemplateLayerGraph(torch.nn.Module):
    """``forward(hidden, t_freq) -> (k, v, hidden_next)``: layer ``layer`` of the template-only pass, the template
    modulated at the time whose features are ``t_freq``."""

    def __init__(self, adapter, grid: tuple[int, int], layer: int):
        super().__init__()
        self.adapter, self.grid, self.layer = adapter, grid, layer

    def forward(self, hidden: torch.Tensor, t_freq: torch.Tensor):
        temb = self.adapter.model.time_guidance_embed.timestep_embedder(t_freq)  # (1, dim)
        return self.adapter.template_layer(hidden, self.grid, self.layer, temb)


def _entry(path: Path, export_s: float, max_abs: float, **fields) -> dict:
    data = path.read_bytes()
    return {
        "file": path.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **fields,
        "ort_cpu_vs_torch_max_abs": max_abs,
        "export_s": round(export_s, 2),
    }


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], opset: int):
    """Export ``module`` to ``path``; (ORT CPU's outputs on ``args``, seconds the export took)."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    torch.onnx.export(
        module.eval(),
        args,
        str(path),
        input_names=inputs,
        output_names=outputs,
        dynamo=True,
        opset_version=opset,
        external_data=False,
        verbose=False,
    )
    export_s = time.perf_counter() - t0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {n: a.numpy() for n, a in zip(inputs, args, strict=True)}), export_s


@torch.no_grad()
def export_template_layers(model, out: Path, opset: int = 21) -> dict:
    """Write the embed graph and one graph per layer into ``out``; returns their entry of ``model.json``."""
    a, spec, m = model.adapter, model.spec, model.adapter.model
    for p in m.parameters():  # traced weights must not carry grad
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(2)
    patches = torch.rand(1, spec.num_tokens, spec.patch_dim, generator=gen) * 2 - 1
    template = torch.cat([patches, torch.zeros_like(patches)], dim=-1)  # a template token: patch, then zeros
    # the reference time's features, as the page forms them (timeFeatures) and the model does (time_proj)
    t = torch.full((1,), a.ref_fixed_timestep * 1000)
    t_freq = m.time_guidance_embed.time_proj(t).float()  # (1, timestep_guidance_channels)
    want = a.resume_template_kv(m.x_embedder(template), spec.grid, 0)  # [(k, v)] per layer, (1, tok, heads, hd)
    (hidden,), embed_s = _export(
        TemplateEmbedGraph(a), (template,), out / EMBED_GRAPH_NAME, ["template"], ["hidden"], opset
    )
    embed = _entry(
        out / EMBED_GRAPH_NAME,
        embed_s,
        float(np.abs(hidden - m.x_embedder(template).numpy()).max()),
        input="template",
        output="hidden",
    )
    layers = []
    h = torch.from_numpy(hidden)
    for layer in range(a.num_layers):
        path = out / layer_graph_name(layer)
        (k, v, nxt), s = _export(
            TemplateLayerGraph(a, spec.grid, layer),
            (h, t_freq),
            path,
            ["hidden", "t_freq"],
            ["k", "v", "hidden_next"],
            opset,
        )
        max_abs = max(float(np.abs(k - want[layer][0].numpy()).max()), float(np.abs(v - want[layer][1].numpy()).max()))
        layers.append(_entry(path, s, max_abs, layer=layer))
        h = torch.from_numpy(nxt)  # the next graph is checked on what this one handed over, as the page chains them
    return {
        "embed": embed,
        "layers": layers,
        "inputs": ["hidden", "t_freq"],
        "outputs": ["k", "v", "hidden_next"],
        "ref_timestep": a.ref_fixed_timestep,
        "template_tokens": spec.num_tokens,
        "opset": opset,
        "bytes": embed["bytes"] + sum(x["bytes"] for x in layers),
    }

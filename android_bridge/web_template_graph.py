"""The phone page's template graph for the hybrid split: the demo model's template-only pass
(``Flux2KVAdapter.resume_template_kv`` from the embedded template tokens, single KV mode: the template modulated at the
adapter's fixed reference time) for layers ``< split``, exported to ONNX. The template tokens attend only to
themselves, so this K/V is the hybrid forward's for those layers; the page feeds it to the cached-KV graph in place of
fetched shards.

``template`` (1, image_tokens, in_channels) -> ``k_ref_0``, ``v_ref_0``, ..., ``v_ref_{split-1}``, each
(1, image_tokens, heads, head_dim), fp32. Exported with the dynamo exporter (the TorchScript one has no ``rms_norm``).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch

__all__ = ["TEMPLATE_GRAPH_NAME", "TemplatePassGraph", "export_template_graph"]

TEMPLATE_GRAPH_NAME = "template_kv.onnx"


class TemplatePassGraph(torch.nn.Module):
    """``forward(template) -> (k_ref_0, v_ref_0, ..., v_ref_{split-1})``: the template-only pass up to ``split``."""

    def __init__(self, adapter, grid: tuple[int, int], split: int):
        super().__init__()
        self.adapter, self.grid, self.split = adapter, grid, split

    def forward(self, template: torch.Tensor):
        hidden = self.adapter.model.x_embedder(template)
        last = self.split - 1
        layers = self.adapter.resume_template_kv(hidden, self.grid, 0, None, stop=lambda layer, _kv: layer >= last)
        return tuple(t for k, v in layers for t in (k, v))


@torch.no_grad()
def export_template_graph(model, out: Path, split: int, opset: int = 21) -> dict:
    """Write ``template_kv.onnx`` for layers ``< split`` into ``out``; returns its entry of ``model.json``."""
    import onnxruntime as ort

    a, spec = model.adapter, model.spec
    if not 0 < split < a.num_layers:
        raise ValueError(f"split must be in 1..{a.num_layers - 1} (layers computed in the page), got {split}")
    for p in a.model.parameters():  # traced weights must not carry grad
        p.requires_grad_(False)
    names = [f"{x}_ref_{layer}" for layer in range(split) for x in "kv"]
    gen = torch.Generator().manual_seed(1)
    patches = torch.rand(1, spec.num_tokens, spec.patch_dim, generator=gen) * 2 - 1
    template = torch.cat([patches, torch.zeros_like(patches)], dim=-1)  # a template token: patch, then zeros
    path = out / TEMPLATE_GRAPH_NAME
    t0 = time.perf_counter()
    torch.onnx.export(
        TemplatePassGraph(a, spec.grid, split).eval(),
        (template,),
        str(path),
        input_names=["template"],
        output_names=names,
        dynamo=True,
        opset_version=opset,
        external_data=False,
        verbose=False,
    )
    export_s = time.perf_counter() - t0
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"template": template.numpy()})
    ref = a.extract_template_kv(template, spec.grid)
    max_abs = max(float(np.abs(got[2 * i + j] - ref.layer(i)[j].numpy()).max()) for i in range(split) for j in (0, 1))
    data = path.read_bytes()
    return {
        "file": path.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "input": "template",
        "outputs": names,
        "split_layer": split,
        "opset": opset,
        "ort_cpu_vs_torch_max_abs": max_abs,
        "export_s": round(export_s, 2),
    }

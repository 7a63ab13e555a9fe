"""The QNN compute backend: the hybrid forward as per-layer graphs on the (emulated) Hexagon HTP.

:class:`SplitForward` is the runtime's forward (:mod:`sakura_core.runtime.backend`) over a *layer runner*: for each
layer, the template graph while the device computes the template tokens (layers ``< k``, its K/V kept), then the
cached-KV graph with that layer's template K/V as inputs (the template graph's outputs, or a fetched shard). The
runner is either the per-layer ONNX context binaries on the QNN HTP (:class:`QnnBackend`, CPU fallback disabled)
or the same graphs' torch modules (:class:`TorchLayerRunner`, for tests of the decomposition).

On the host CPU (stated, tiny next to the blocks): the input embeddings (two linears), the timestep embedding and
modulation vectors (an MLP on a (1, dim) vector), the RoPE tables, and the final norm + projection. Everything in
the transformer blocks — attention with template K/V, MLPs, norms — runs in the graphs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from sakura_core.models.flux2_kv import REF_TIME_OFFSET, ROPE_LAYOUT, ForwardResult, image_ids, text_ids
from sakura_core.models.kv_types import TemplateKV

from .npu_layers import CachedLayerGraph, TemplateLayerGraph, layer_graph_io

__all__ = ["LayerRunner", "QnnBackend", "SplitForward", "TorchLayerRunner"]

logger = logging.getLogger(__name__)

# (layer, kind, feeds by input name) -> the graph's outputs in order
LayerRunner = Callable[[int, str, dict], list[np.ndarray]]


class TorchLayerRunner:
    """The layer graphs as torch modules (fp32, this host): the decomposition without the NPU toolchain."""

    def __init__(self, model):
        a, spec = model.adapter, model.spec
        geo = (spec.text_tokens, spec.num_tokens, spec.num_tokens)
        self.graphs = {
            (layer, kind): cls(a, layer, *geo).eval()
            for layer in range(a.num_layers)
            for kind, cls in (("template", TemplateLayerGraph), ("cached", CachedLayerGraph))
        }

    @torch.no_grad()
    def __call__(self, layer: int, kind: str, feeds: dict) -> list[np.ndarray]:
        out = self.graphs[(layer, kind)](*(torch.from_numpy(v) for v in feeds.values()))
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().numpy())


class SplitForward:
    """The hybrid forward over a layer runner, with the signature of ``Flux2KVAdapter.forward``.

    Static geometry: the model's own (``spec.text_tokens`` text, ``spec.num_tokens`` image and template tokens).
    ``layer_s[(layer, kind)]`` sums the wall time of the graph calls (on x86 that is the HTP *emulator*).
    """

    name = "split"

    def __init__(self, model, runner: LayerRunner):
        self.model, self.adapter, self.runner = model, model.adapter, runner
        self.layer_s: dict[tuple[int, str], list[float]] = {}  # (layer, kind) -> [total seconds, calls]

    def _run(self, layer: int, kind: str, feeds: dict) -> list[np.ndarray]:
        t0 = time.perf_counter()
        out = self.runner(layer, kind, feeds)
        acc = self.layer_s.setdefault((layer, kind), [0.0, 0])
        acc[0], acc[1] = acc[0] + time.perf_counter() - t0, acc[1] + 1
        return out

    def _check_geometry(self, x, txt, img_grid, ref_tokens, ref_grid) -> None:
        spec = self.model.spec
        if (
            tuple(img_grid) != tuple(spec.grid)
            or x.shape[:2] != (1, spec.num_tokens)
            or txt.shape[1] != spec.text_tokens
        ):
            raise ValueError(
                f"the layer graphs are built for batch 1, grid {spec.grid} and {spec.text_tokens} text "
                f"tokens, got x {tuple(x.shape)}, txt {tuple(txt.shape)}, grid {img_grid}; "
                "use the torch backend for other geometries"
            )
        if ref_tokens is not None and (tuple(ref_grid) != tuple(spec.grid) or ref_tokens.shape[1] != spec.num_tokens):
            raise ValueError(f"the template graphs are built for template grid {spec.grid}, got {ref_grid}")

    @torch.no_grad()
    def _modulations(self, t1000: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = self.adapter.model
        temb = m.time_guidance_embed(t1000, None)
        return (
            temb,
            m.double_stream_modulation_img(temb),
            m.double_stream_modulation_txt(temb),
            m.single_stream_modulation(temb),
        )

    @torch.no_grad()
    def _ref_stream(self, ref_tokens, ref_grid, ref_timestep, hidden=None) -> dict:
        """Host-side inputs of the template graphs: embedded template tokens (or ``hidden``, their state entering a
        later layer), their modulations and RoPE."""
        m = self.adapter.model
        ref_t = self.adapter.ref_fixed_timestep if ref_timestep is None else float(ref_timestep)
        _, mod_img, _, mod_single = self._modulations(torch.tensor([ref_t * 1000.0]))
        cos, sin = m.pos_embed(image_ids(ref_grid[0], ref_grid[1], t=REF_TIME_OFFSET))
        h = _np(m.x_embedder(ref_tokens.float())) if hidden is None else _np(hidden.float())
        return {"h": h, "mod_img": _np(mod_img), "mod_single": _np(mod_single), "cos": _np(cos), "sin": _np(sin)}

    def _template_layer(self, layer: int, ref: dict) -> tuple[np.ndarray, np.ndarray]:
        mod = ref["mod_img"] if layer < self.adapter.num_double else ref["mod_single"]
        ref["h"], k, v = self._run(
            layer, "template", {"ref_h": ref["h"], "ref_mod": mod, "ref_cos": ref["cos"], "ref_sin": ref["sin"]}
        )
        return k, v

    @torch.no_grad()
    def forward(
        self,
        x,
        txt,
        timestep,
        *,
        img_grid,
        ref_tokens=None,
        ref_grid=None,
        split_layer=0,
        cached=None,
        on_layer=None,
        ref_timestep=None,
        on_drop=None,
    ) -> ForwardResult:
        """As ``Flux2KVAdapter.forward`` (``ref_timestep``: the template tokens' time, None = the fixed one;
        ``on_drop(layer, hidden)`` when the template tokens are dropped before ``layer``)."""
        a, m = self.adapter, self.adapter.model
        keep, split, cached = _resolve_split(a.num_layers, split_layer, cached)
        self._check_geometry(x, txt, img_grid, ref_tokens if split > 0 else None, ref_grid)
        temb, mod_img, mod_txt, mod_single = self._modulations(timestep.float() * 1000)
        rope_t, rope_i = m.pos_embed(text_ids(txt.shape[1])), m.pos_embed(image_ids(img_grid[0], img_grid[1], t=0))
        cos, sin = _np(torch.cat([rope_t[0], rope_i[0]])), _np(torch.cat([rope_t[1], rope_i[1]]))
        hidden, enc = _np(m.x_embedder(x.float())), _np(m.context_embedder(txt.float()))
        ref = self._ref_stream(ref_tokens, ref_grid, ref_timestep) if split > 0 else None
        extracted = []
        for layer in range(a.num_layers):
            if on_layer is not None:
                on_layer(layer)
            if ref is not None and (layer >= split or (keep is not None and not keep(layer))):
                if on_drop is not None:
                    on_drop(layer, torch.from_numpy(ref["h"].copy()))
                ref = None  # the template tokens are dropped for good
            if ref is not None:
                k, v = self._template_layer(layer, ref)
                extracted.append((torch.from_numpy(k), torch.from_numpy(v)))
            else:
                k, v = (_np(t) for t in cached(layer))
            if layer == a.num_double:
                hidden = np.concatenate([enc, hidden], axis=1)  # single blocks see (txt, img)
            if layer < a.num_double:
                hidden, enc = self._run(
                    layer,
                    "cached",
                    {
                        "hidden": hidden,
                        "enc": enc,
                        "mod_img": _np(mod_img),
                        "mod_txt": _np(mod_txt),
                        "rope_cos": cos,
                        "rope_sin": sin,
                        "k_ref": k,
                        "v_ref": v,
                    },
                )
            else:
                (hidden,) = self._run(
                    layer,
                    "cached",
                    {
                        "hidden": hidden,
                        "mod": _np(mod_single),
                        "rope_cos": cos,
                        "rope_sin": sin,
                        "k_ref": k,
                        "v_ref": v,
                    },
                )
        out = m.proj_out(m.norm_out(torch.from_numpy(hidden[:, txt.shape[1] :]), temb))
        return ForwardResult(sample=out, extracted=extracted)

    @torch.no_grad()
    def extract_template_kv(self, ref_tokens, token_grid, ref_timestep=None) -> TemplateKV:
        """Template-only pass: the template graphs alone (the template stream never reads the request)."""
        self._check_geometry(
            torch.zeros(1, self.model.spec.num_tokens),
            torch.zeros(1, self.model.spec.text_tokens),
            self.model.spec.grid,
            ref_tokens,
            token_grid,
        )
        ref = self._ref_stream(ref_tokens, token_grid, ref_timestep)
        kv = [self._template_layer(layer, ref) for layer in range(self.adapter.num_layers)]
        stacked = torch.from_numpy(np.stack([np.stack([k[0], v[0]]) for k, v in kv]))  # (layers, 2, tok, heads, hd)
        ref_t = self.adapter.ref_fixed_timestep if ref_timestep is None else float(ref_timestep)
        return TemplateKV(stacked, self.adapter.model_id, tuple(token_grid), ROPE_LAYOUT, ref_timestep=ref_t)

    @torch.no_grad()
    def resume_template_kv(self, ref_hidden, token_grid, start_layer, ref_timestep=None, stop=None):
        """The template graphs from ``start_layer`` on, from the template tokens' hidden state there (``on_drop``'s):
        the KV of layers ``start_layer .. L-1`` (up to the layer where ``stop`` says so), as
        ``Flux2KVAdapter.resume_template_kv``."""
        L, n = self.adapter.num_layers, token_grid[0] * token_grid[1]
        if not 0 <= start_layer <= L:
            raise ValueError(f"start_layer must be in [0, {L}], got {start_layer}")
        if ref_hidden.ndim != 3 or ref_hidden.shape[:2] != (1, n):
            raise ValueError(
                f"ref_hidden must be (1, {n}, dim) for token grid {tuple(token_grid)}, got {tuple(ref_hidden.shape)}"
            )
        ref = self._ref_stream(None, token_grid, ref_timestep, hidden=ref_hidden)
        out = []
        for layer in range(start_layer, L):
            k, v = self._template_layer(layer, ref)
            out.append((torch.from_numpy(k), torch.from_numpy(v)))
            if stop is not None and stop(layer, out[-1]):
                break
        return out

    def layer_times(self) -> dict[str, dict[str, float]]:
        """Mean seconds per call of each layer graph: ``{"<layer>/<kind>": {"mean_s", "calls"}}``."""
        return {
            f"{layer}/{kind}": {"mean_s": round(total / calls, 4), "calls": calls}
            for (layer, kind), (total, calls) in sorted(self.layer_s.items())
        }

    def describe(self) -> dict:
        return {
            "backend": self.name,
            "where": "this host's CPU (torch modules of the per-layer graphs)",
            "emulated_htp": False,
        }


class QnnBackend(SplitForward):
    """The per-layer context binaries on the QNN HTP through onnxruntime-qnn, CPU fallback disabled.

    Built by :func:`android_bridge.npu_build.open_qnn_backend` (cached per model id); ``sessions[(layer, kind)]``
    are strict ORT sessions; ``build`` is the build report (coverage, parity, where the cache lies)."""

    name = "qnn"

    def __init__(self, model, sessions: dict, build: dict):
        self.sessions, self.build = sessions, build
        super().__init__(model, self._run_session)

    def _run_session(self, layer: int, kind: str, feeds: dict) -> list[np.ndarray]:
        return self.sessions[(layer, kind)].run(None, feeds)

    def describe(self) -> dict:
        b = self.build
        return {
            "backend": "qnn",
            "where": "onnxruntime-qnn QNN execution provider, HTP backend, CPU fallback disabled",
            "emulated_htp": b["emulated"],
            "htp": "EMULATED: the x86-64 libQnnHtp.so emulates the Hexagon HTP on this host (numerics, not phone "
            "timing)"
            if b["emulated"]
            else "Hexagon HTP",
            "precision": b["precision"],
            "soc_model": b["soc_model"],
            "graphs": len(self.sessions),
            "op_coverage": b["op_coverage"],
            "cache_dir": b["cache_dir"],
            "on_host_cpu": "input embeddings, timestep embedding + modulation vectors, RoPE tables, final norm and "
            "projection (tiny); every transformer block runs on the HTP",
            "emulated_htp_s_per_layer": self.layer_times(),
        }


def _resolve_split(num_layers: int, split_layer, cached):
    """``(keep_template or None, split_layer, cached as layer -> (k, v))``; a dynamic split starts at all layers."""
    keep = None
    if callable(split_layer):
        keep, split_layer = split_layer, num_layers
    elif not 0 <= split_layer <= num_layers:
        raise ValueError(f"split_layer must be in [0, {num_layers}], got {split_layer}")
    if isinstance(cached, TemplateKV):
        kv_obj = cached

        def cached(layer: int, _kv=kv_obj):
            return _kv.layer(layer)

    if (keep is not None or split_layer < num_layers) and cached is None:
        raise ValueError(f"split_layer={split_layer} < {num_layers} layers: pass cached template KV for the others")
    return keep, split_layer, cached


def graph_io(model, layer: int, kind: str) -> tuple[dict, list[str]]:
    """Input shapes and output names of one of the model's layer graphs (its static geometry)."""
    spec = model.spec
    return layer_graph_io(model.adapter, layer, kind, spec.text_tokens, spec.num_tokens, spec.num_tokens)

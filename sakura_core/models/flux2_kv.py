"""Adapter over diffusers' ``Flux2Transformer2DModel`` in KV mode: exact template KV, injection and hybrid forwards.

In FLUX.2 [klein] KV mode the reference (template) tokens attend only to themselves and are modulated with a fixed
timestep, so their per-layer keys and values do not depend on the request. This module drives the transformer's own
blocks layer by layer, so one forward can:

* compute the template tokens on the device for layers ``< split_layer`` (diffusers "extract" mode, KV kept), and
* inject fetched template KV for layers ``>= split_layer`` (diffusers "cached" mode),

which is the hybrid step 0 of the SAKURA runtime. ``split_layer == num_layers`` is a full on-device template pass,
``split_layer == 0`` uses fetched KV everywhere. Layers are numbered in execution order: the double-stream blocks,
then the single-stream blocks.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2KVAttnProcessor,
    Flux2KVLayerCache,
    Flux2KVParallelSelfAttnProcessor,
    Flux2Transformer2DModel,
)

from .kv_types import KVMismatchError, PerStepTemplateKV, TemplateKV, check_kv_compatible

__all__ = [
    "REF_TIME_OFFSET",
    "ROPE_LAYOUT",
    "Flux2KVAdapter",
    "ForwardResult",
    "image_ids",
    "model_content_id",
    "text_ids",
]

logger = logging.getLogger(__name__)

# Reference images sit at t = 10 on the first RoPE axis, as in diffusers' Flux2 pipelines (scale + scale * i, i = 0).
REF_TIME_OFFSET = 10
ROPE_LAYOUT = "flux2-ref-t10"


def model_content_id(model: torch.nn.Module, config: dict | None = None) -> str:
    """sha256 over the canonical JSON of the config and every parameter/buffer (name, dtype, shape, bytes).

    Two models with the same id compute the same KV; any changed weight, dtype or config value changes it.
    """
    h = hashlib.sha256()
    cfg = dict(config if config is not None else getattr(model, "config", {}))
    h.update(json.dumps(_jsonable(cfg), sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def text_ids(num_tokens: int, device: torch.device | None = None) -> torch.Tensor:
    """RoPE ids of text tokens: (t, h, w, l) = (0, 0, 0, index). Shape (num_tokens, 4)."""
    ids = torch.zeros(num_tokens, 4, dtype=torch.long, device=device)
    ids[:, 3] = torch.arange(num_tokens, device=device)
    return ids


def image_ids(rows: int, cols: int, t: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """RoPE ids of an image token grid at time coordinate ``t``: (t, h, w, 0), row-major. Shape (rows*cols, 4)."""
    hh, ww = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
    ids = torch.zeros(rows * cols, 4, dtype=torch.long, device=device)
    ids[:, 0] = t
    ids[:, 1] = hh.reshape(-1)
    ids[:, 2] = ww.reshape(-1)
    return ids


@dataclass
class ForwardResult:
    """Output of one transformer forward.

    Attributes:
        sample: predicted velocity for the request image tokens, (batch, image_tokens, out_channels).
        extracted: K/V computed on the device for layers ``< split_layer`` (each (1, ref_tokens, heads, head_dim)),
            in layer order; empty when no template tokens were run.
    """

    sample: torch.Tensor
    extracted: list[tuple[torch.Tensor, torch.Tensor]]


LayerHook = Callable[[int], None]
DropHook = Callable[[int, torch.Tensor], None]  # (layer, template hidden state entering it)


@dataclass
class _Stream:
    """One forward's running state: the token sequence, the text stream and what every block reads.

    ``hidden`` is (batch, [ref +] img, dim) before the single-stream blocks and (batch, txt + [ref +] img, dim) in
    them; ``enc`` is (batch, txt, dim); the modulations are raw (batch, k * dim) vectors; the RoPE pairs cover
    (txt, img) or (txt, ref, img). The ``ref_*`` fields are None when no template tokens are run.
    """

    n_txt: int
    n_ref: int
    temb: torch.Tensor
    mod_img: torch.Tensor
    mod_txt: torch.Tensor
    mod_single: torch.Tensor
    hidden: torch.Tensor
    enc: torch.Tensor
    rope_plain: tuple[torch.Tensor, torch.Tensor] | None = None
    rope_with_ref: tuple[torch.Tensor, torch.Tensor] | None = None
    ref_mod_img: torch.Tensor | None = None
    ref_mod_single: torch.Tensor | None = None


class Flux2KVAdapter:
    """Drives a ``Flux2Transformer2DModel`` layer by layer with per-layer choice of computed or injected template KV.

    Args:
        model: the transformer; its attention processors are switched to diffusers' KV processors (the same switch
            ``Flux2KleinKVPipeline`` makes). Weights are not touched.
        model_id: content id of the model; computed when omitted.
        ref_fixed_timestep: timestep (0..1) the template tokens are modulated with; part of what the KV depends on.
    """

    def __init__(self, model: Flux2Transformer2DModel, model_id: str | None = None, ref_fixed_timestep: float = 0.0):
        if not isinstance(model, Flux2Transformer2DModel):
            raise TypeError(
                f"Flux2KVAdapter needs a diffusers Flux2Transformer2DModel, got {type(model).__name__}; "
                "for joint-attention models use sakura_core.models.joint_approx (approximate reuse)"
            )
        if not 0.0 <= ref_fixed_timestep <= 1.0:
            raise ValueError(f"ref_fixed_timestep must be in [0, 1], got {ref_fixed_timestep}")
        self.model = model
        self.ref_fixed_timestep = float(ref_fixed_timestep)
        for block in model.transformer_blocks:
            if not isinstance(block.attn.processor, Flux2KVAttnProcessor):
                block.attn.set_processor(Flux2KVAttnProcessor())
        for block in model.single_transformer_blocks:
            if not isinstance(block.attn.processor, Flux2KVParallelSelfAttnProcessor):
                block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())
        self.model_id = model_id or model_content_id(model)

    # ---- geometry -------------------------------------------------------------------------------------------
    @property
    def num_double(self) -> int:
        return len(self.model.transformer_blocks)

    @property
    def num_layers(self) -> int:
        return len(self.model.transformer_blocks) + len(self.model.single_transformer_blocks)

    @property
    def num_heads(self) -> int:
        return self.model.config.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.model.config.attention_head_dim

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def kv_bytes(self, num_ref_tokens: int, bytes_per_value: int = 2) -> int:
        """Size of one template's KV for this model (all layers, K and V)."""
        return self.num_layers * 2 * num_ref_tokens * self.num_heads * self.head_dim * bytes_per_value

    # ---- template KV ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def extract_template_kv(
        self, ref_tokens: torch.Tensor, token_grid: tuple[int, int], ref_timestep: float | None = None
    ) -> TemplateKV:
        """Template-only pass: the template's KV for every layer, with one dummy request and one dummy text token.

        Args:
            ref_tokens: (1, rows*cols, in_channels) packed template tokens.
            token_grid: (rows, cols) of the template.
            ref_timestep: modulation time of the template tokens; ``None`` = ``ref_fixed_timestep`` (single mode).
        """
        rows, cols = token_grid
        if ref_tokens.ndim != 3 or ref_tokens.shape[0] != 1 or ref_tokens.shape[1] != rows * cols:
            raise ValueError(
                f"ref_tokens must be (1, {rows * cols}, in_channels) for token grid {token_grid}, "
                f"got {tuple(ref_tokens.shape)}"
            )
        dtype, device = self.dtype, ref_tokens.device
        x = torch.zeros(1, 1, self.model.config.in_channels, dtype=dtype, device=device)
        txt = torch.zeros(1, 1, self.model.config.joint_attention_dim, dtype=dtype, device=device)
        result = self.forward(
            x,
            txt,
            torch.ones(1, device=device),
            img_grid=(1, 1),
            ref_tokens=ref_tokens.to(dtype),
            ref_grid=token_grid,
            split_layer=self.num_layers,
            ref_timestep=ref_timestep,
        )
        kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in result.extracted])  # (layers, 2, tok, heads, hd)
        ref_t = self.ref_fixed_timestep if ref_timestep is None else float(ref_timestep)
        return TemplateKV(kv, self.model_id, (rows, cols), ROPE_LAYOUT, ref_timestep=ref_t)

    @torch.no_grad()
    def resume_template_kv(
        self,
        ref_hidden: torch.Tensor,
        token_grid: tuple[int, int],
        start_layer: int,
        ref_timestep: float | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The template-only pass from ``start_layer`` on: the KV of layers ``start_layer .. L-1`` (each
        (1, tokens, heads, head_dim)), equal to :meth:`extract_template_kv`'s for those layers.

        Args:
            ref_hidden: (1, rows*cols, dim) the template tokens' hidden state entering ``start_layer`` — what
                :meth:`forward`'s ``on_drop`` handed over when a hybrid forward dropped them there (the template
                tokens attend only to themselves, so it does not depend on the request).
            token_grid: (rows, cols) of the template.
            start_layer: 0 .. num_layers.
            ref_timestep: as for :meth:`extract_template_kv` (the forward's own).
        """
        L, rows, cols = self.num_layers, *token_grid
        if not 0 <= start_layer <= L:
            raise ValueError(f"start_layer must be in [0, {L}], got {start_layer}")
        dim = self.model.config.num_attention_heads * self.model.config.attention_head_dim
        if ref_hidden.ndim != 3 or ref_hidden.shape[0] != 1 or tuple(ref_hidden.shape[1:]) != (rows * cols, dim):
            raise ValueError(
                f"ref_hidden must be (1, {rows * cols}, {dim}) for token grid {token_grid} (the template tokens' "
                f"hidden state on_drop handed over), got {tuple(ref_hidden.shape)}"
            )
        n_ref, dtype, device = rows * cols, self.dtype, ref_hidden.device
        cfg = self.model.config
        x = torch.zeros(1, 1, cfg.in_channels, dtype=dtype, device=device)
        txt = torch.zeros(1, 1, cfg.joint_attention_dim, dtype=dtype, device=device)
        ref = torch.zeros(1, n_ref, cfg.in_channels, dtype=dtype, device=device)  # rows replaced below
        s = self._embed(x, txt, torch.ones(1, device=device), (1, 1), ref, token_grid, n_ref, ref_timestep)
        parts = [ref_hidden.to(dtype), s.hidden[:, n_ref:]]
        s.hidden = torch.cat([s.enc, *parts] if self._joined(start_layer) else parts, dim=1)
        out = []
        for layer in range(start_layer, L):
            cache = Flux2KVLayerCache()
            self._run_block(layer, s, True, {"kv_cache": cache, "kv_cache_mode": "extract", "num_ref_tokens": n_ref})
            k, v = cache.get()
            out.append((k[:1], v[:1]))
        return out

    @torch.no_grad()
    def extract_per_step_kv(
        self, ref_tokens: torch.Tensor, token_grid: tuple[int, int], timesteps: torch.Tensor | list[float]
    ) -> PerStepTemplateKV:
        """``per-step`` KV mode: one template-only pass per sampler step, modulated with that step's own time.

        Args:
            ref_tokens: (1, rows*cols, in_channels) packed template tokens.
            token_grid: (rows, cols) of the template.
            timesteps: the sampler's step times ``t_0 .. t_{S-1}`` (``flow_timesteps(S, shift)[:-1]``): step ``s``
                runs the transformer at ``t_s``, so its template KV is the extract pass at ``t_s``.
        """
        times = [float(t) for t in (timesteps.tolist() if isinstance(timesteps, torch.Tensor) else timesteps)]
        if not times:
            raise ValueError("timesteps is empty: pass the sampler's step times, e.g. flow_timesteps(steps)[:-1]")
        per_step = [self.extract_template_kv(ref_tokens, token_grid, ref_timestep=t) for t in times]
        kv = torch.stack([p.kv for p in per_step])  # (steps, layers, 2, tokens, heads, head_dim)
        return PerStepTemplateKV(kv, self.model_id, tuple(token_grid), ROPE_LAYOUT, tuple(times))

    def check(self, kv: TemplateKV, token_grid: tuple[int, int]) -> None:
        """Refuse KV made for another model, grid or RoPE layout (error names both sides)."""
        check_kv_compatible(kv.model_id, kv.token_grid, kv.rope_layout, self.model_id, token_grid, ROPE_LAYOUT)
        if kv.num_layers != self.num_layers or kv.num_heads != self.num_heads or kv.head_dim != self.head_dim:
            raise ValueError(
                f"template KV geometry (layers={kv.num_layers}, heads={kv.num_heads}, head_dim={kv.head_dim}) "
                f"does not match the model (layers={self.num_layers}, heads={self.num_heads}, head_dim={self.head_dim})"
            )

    def check_ref_time(self, kv: TemplateKV, ref_timestep: float | torch.Tensor | None) -> None:
        """Refuse KV modulated at another time than this forward's template tokens (a per-step KV of step s'
        injected at step s, or single-mode KV in a per-step forward); the message names both times."""
        if isinstance(ref_timestep, torch.Tensor) and ref_timestep.numel() > 1:
            return  # per-example times (training): no injected KV to compare with
        want = self.ref_fixed_timestep if ref_timestep is None else float(ref_timestep)
        if abs(kv.ref_timestep - want) > 1e-7:
            raise KVMismatchError(
                f"template KV was computed with the template tokens at t={kv.ref_timestep:.6g} but this forward "
                f"modulates them at t={want:.6g}; in per-step mode inject the KV of this step (PerStepTemplateKV.at_step)"
            )

    # ---- forward --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        txt: torch.Tensor,
        timestep: torch.Tensor,
        *,
        img_grid: tuple[int, int],
        ref_tokens: torch.Tensor | None = None,
        ref_grid: tuple[int, int] | None = None,
        split_layer: int | Callable[[int], bool] = 0,
        cached: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | TemplateKV | None = None,
        on_layer: LayerHook | None = None,
        ref_timestep: float | torch.Tensor | None = None,
        on_drop: DropHook | None = None,
    ) -> ForwardResult:
        """One transformer forward without autograd; the arguments are those of :meth:`forward_grad`."""
        return self.forward_grad(
            x,
            txt,
            timestep,
            img_grid=img_grid,
            ref_tokens=ref_tokens,
            ref_grid=ref_grid,
            split_layer=split_layer,
            cached=cached,
            on_layer=on_layer,
            ref_timestep=ref_timestep,
            on_drop=on_drop,
        )

    def forward_grad(
        self,
        x: torch.Tensor,
        txt: torch.Tensor,
        timestep: torch.Tensor,
        *,
        img_grid: tuple[int, int],
        ref_tokens: torch.Tensor | None = None,
        ref_grid: tuple[int, int] | None = None,
        split_layer: int | Callable[[int], bool] = 0,
        cached: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | TemplateKV | None = None,
        on_layer: LayerHook | None = None,
        ref_timestep: float | torch.Tensor | None = None,
        on_drop: DropHook | None = None,
    ) -> ForwardResult:
        """One transformer forward with template KV computed for layers ``< split_layer`` and injected after.

        :meth:`forward` is this under ``torch.no_grad``; call this one directly to train through the KV path
        (autograd follows the caller's grad mode).

        Args:
            x: (batch, rows*cols, in_channels) request image tokens (noisy latent, plus any request conditioning).
            txt: (batch, text_tokens, joint_attention_dim) prompt embedding.
            timestep: (batch,) flow-matching time in [0, 1].
            img_grid: (rows, cols) of the request image tokens.
            ref_tokens: (1, ref_tokens, in_channels) template tokens; needed when ``split_layer > 0``.
            ref_grid: (rows, cols) of the template tokens.
            split_layer: layers ``< split_layer`` run the template tokens here; the rest use ``cached``. Or a
                function ``layer -> bool`` asked before each layer while the template tokens are still in the
                sequence: True keeps computing them, False drops them for good (the runtime's adaptive split).
            cached: per-layer K/V source for layers ``>= split_layer``: a TemplateKV, or a function
                ``layer -> (k, v)`` (each (1, ref_tokens, heads, head_dim)) — the runtime passes one that waits for
                the layer's shard. Not needed when ``split_layer == num_layers``.
            on_layer: called with the layer index before each layer runs (progress, cancellation).
            ref_timestep: time (0..1) the template tokens are modulated with in this forward: ``None`` = the
                adapter's ``ref_fixed_timestep`` (``single`` KV mode); the step's own ``t`` in ``per-step`` mode
                (a float, or (batch,) per example when training both modes). Injected KV must match it.
            on_drop: called as ``on_drop(layer, hidden)`` when the template tokens leave the sequence before
                ``layer`` (not when no template ran): ``hidden`` (1, ref_tokens, dim) is their state entering
                ``layer``, which :meth:`resume_template_kv` continues from (the device's fallback pass).
        """
        keep_template, split_layer, cached = self._resolve_split(
            split_layer, ref_tokens, ref_grid, cached, ref_timestep
        )
        n_ref = ref_tokens.shape[1] if split_layer > 0 else 0
        s = self._embed(x, txt, timestep, img_grid, ref_tokens, ref_grid, n_ref, ref_timestep)
        extracted: list[tuple[torch.Tensor, torch.Tensor]] = []
        ref_live = n_ref > 0  # are template tokens still part of the sequence?

        for layer in range(self.num_layers):
            if on_layer is not None:
                on_layer(layer)
            if ref_live and (layer >= split_layer or (keep_template is not None and not keep_template(layer))):
                if on_drop is not None:
                    on_drop(layer, self._ref_rows(s.hidden, layer, s.n_txt, n_ref)[:1].detach().clone())
                s.hidden = self._drop_ref(s.hidden, layer, s.n_txt, n_ref)
                ref_live = False
            cache = Flux2KVLayerCache()
            if ref_live:
                kwargs = {"kv_cache": cache, "kv_cache_mode": "extract", "num_ref_tokens": n_ref}
            else:
                k, v = cached(layer)
                batch = s.hidden.shape[0]
                cache.store(k.to(self.dtype).expand(batch, -1, -1, -1), v.to(self.dtype).expand(batch, -1, -1, -1))
                kwargs = {"kv_cache": cache, "kv_cache_mode": "cached", "num_ref_tokens": 0}
            self._run_block(layer, s, ref_live, kwargs)
            if ref_live:
                k, v = cache.get()
                extracted.append((k[:1], v[:1]))

        skip = s.n_txt + (n_ref if ref_live else 0)
        hidden = s.hidden[:, skip:]
        hidden = self.model.norm_out(hidden, s.temb)
        return ForwardResult(sample=self.model.proj_out(hidden), extracted=extracted)

    def _resolve_split(self, split_layer, ref_tokens, ref_grid, cached, ref_timestep=None):
        """Check :meth:`forward_grad`'s split arguments; returns ``(keep_template or None, split_layer, cached)``
        with a dynamic split starting at ``num_layers`` and ``cached`` as a function ``layer -> (k, v)``."""
        L = self.num_layers
        keep_template = None
        if callable(split_layer):
            keep_template, split_layer = split_layer, L
        elif not 0 <= split_layer <= L:
            raise ValueError(f"split_layer must be in [0, {L}], got {split_layer}")
        if split_layer > 0 and (ref_tokens is None or ref_grid is None):
            raise ValueError(
                f"split_layer={split_layer} runs template tokens on the device: pass ref_tokens and ref_grid"
            )
        if (keep_template is not None or split_layer < L) and cached is None:
            raise ValueError(f"split_layer={split_layer} < {L} layers: pass cached template KV for the other layers")
        if isinstance(cached, TemplateKV):
            kv_obj = cached
            if ref_grid is not None:
                self.check(kv_obj, ref_grid)
            self.check_ref_time(kv_obj, ref_timestep)

            def cached(layer: int, _kv=kv_obj):
                return _kv.layer(layer)

        return keep_template, split_layer, cached

    def _embed(self, x, txt, timestep, img_grid, ref_tokens, ref_grid, n_ref: int, ref_timestep=None) -> _Stream:
        """Time embeddings, modulations, RoPE and the input token embeddings (the template's first when ``n_ref``)."""
        m = self.model
        dtype, device = self.dtype, x.device
        batch = x.shape[0]
        n_txt = txt.shape[1]

        t = timestep.to(dtype) * 1000
        temb = m.time_guidance_embed(t, None)
        s = _Stream(
            n_txt=n_txt,
            n_ref=n_ref,
            temb=temb,
            mod_img=m.double_stream_modulation_img(temb),
            mod_txt=m.double_stream_modulation_txt(temb),
            mod_single=m.single_stream_modulation(temb),
            hidden=m.x_embedder(x.to(dtype)),
            enc=m.context_embedder(txt.to(dtype)),
        )

        rope_txt = m.pos_embed(text_ids(n_txt, device))
        rope_img = m.pos_embed(image_ids(*img_grid, t=0, device=device))
        s.rope_plain = (torch.cat([rope_txt[0], rope_img[0]]), torch.cat([rope_txt[1], rope_img[1]]))

        if n_ref:
            ref_t = _ref_time(ref_timestep, self.ref_fixed_timestep, t)
            ref_temb = m.time_guidance_embed(ref_t, None)
            s.ref_mod_img = m.double_stream_modulation_img(ref_temb)
            s.ref_mod_single = m.single_stream_modulation(ref_temb)
            rope_ref = m.pos_embed(image_ids(*ref_grid, t=REF_TIME_OFFSET, device=device))
            s.rope_with_ref = (
                torch.cat([rope_txt[0], rope_ref[0], rope_img[0]]),
                torch.cat([rope_txt[1], rope_ref[1], rope_img[1]]),
            )
            ref_hidden = m.x_embedder(ref_tokens.to(dtype)).expand(batch, -1, -1)
            s.hidden = torch.cat([ref_hidden, s.hidden], dim=1)  # (batch, ref + img, dim)
        return s

    def _run_block(self, layer: int, s: _Stream, ref_live: bool, kwargs: dict) -> None:
        """Run block ``layer`` (double-stream, then single-stream) on ``s``, updating its sequence in place."""
        m = self.model
        rope = s.rope_with_ref if ref_live else s.rope_plain
        n_ref = s.n_ref
        if layer < self.num_double:
            block = m.transformer_blocks[layer]
            img_mod = _blend_rows(s.mod_img, s.ref_mod_img, n_ref, s.hidden.shape[1], 0) if ref_live else s.mod_img
            s.enc, s.hidden = block(
                hidden_states=s.hidden,
                encoder_hidden_states=s.enc,
                temb_mod_img=img_mod,
                temb_mod_txt=s.mod_txt,
                image_rotary_emb=rope,
                joint_attention_kwargs=kwargs,
            )
            if layer == self.num_double - 1:
                s.hidden = torch.cat([s.enc, s.hidden], dim=1)  # single blocks see (txt, [ref,] img)
        else:
            if self.num_double == 0 and layer == 0:
                s.hidden = torch.cat([s.enc, s.hidden], dim=1)
            block = m.single_transformer_blocks[layer - self.num_double]
            smod = (
                _blend_rows(s.mod_single, s.ref_mod_single, n_ref, s.hidden.shape[1], s.n_txt)
                if ref_live
                else s.mod_single
            )
            s.hidden = block(
                hidden_states=s.hidden,
                encoder_hidden_states=None,
                temb_mod=smod,
                image_rotary_emb=rope,
                joint_attention_kwargs={**kwargs, "num_txt_tokens": s.n_txt},
            )

    def _joined(self, layer: int) -> bool:
        """Entering ``layer``, is the sequence the single blocks' (txt, [ref,] img)? (Else (ref, img), text apart.)"""
        return layer >= self.num_double and layer > 0  # with no double blocks, layer 0 joins them itself

    def _ref_rows(self, hidden: torch.Tensor, layer: int, n_txt: int, n_ref: int) -> torch.Tensor:
        """The template tokens' rows of the sequence entering ``layer``."""
        off = n_txt if self._joined(layer) else 0
        return hidden[:, off : off + n_ref]

    def _drop_ref(self, hidden: torch.Tensor, layer: int, n_txt: int, n_ref: int) -> torch.Tensor:
        """Remove the template tokens from the sequence before ``layer`` (they only ever attend to themselves)."""
        if not self._joined(layer):  # double blocks: hidden = (ref, img), text kept apart
            return hidden[:, n_ref:]
        return torch.cat([hidden[:, :n_txt], hidden[:, n_txt + n_ref :]], dim=1)  # single blocks: (txt, ref, img)


def _blend_rows(mod: torch.Tensor, ref_mod: torch.Tensor, n_ref: int, seq_len: int, offset: int) -> torch.Tensor:
    """Per-token modulation: rows ``[offset, offset + n_ref)`` take ``ref_mod``, the others ``mod``.

    ``mod``/``ref_mod`` are raw modulation vectors (batch, k * dim) as ``Flux2Modulation`` returns them; the result is
    (batch, seq_len, k * dim), which ``Flux2Modulation.split`` chunks along the last dim exactly like the unblended one.
    """
    batch = mod.shape[0]
    out = mod.unsqueeze(1).expand(batch, seq_len, -1).clone()  # (batch, seq, k*dim)
    out[:, offset : offset + n_ref] = ref_mod.unsqueeze(1).expand(batch, n_ref, -1)
    return out


def _ref_time(ref_timestep: float | torch.Tensor | None, fixed: float, t: torch.Tensor) -> torch.Tensor:
    """The template tokens' modulation time, scaled like ``t`` (x1000): ``fixed`` when ``ref_timestep`` is None."""
    if ref_timestep is None:
        return torch.full_like(t, fixed * 1000)
    if isinstance(ref_timestep, torch.Tensor) and ref_timestep.numel() > 1:
        if ref_timestep.shape != t.shape:
            raise ValueError(
                f"ref_timestep must be a float or shaped like timestep {tuple(t.shape)}, "
                f"got {tuple(ref_timestep.shape)}"
            )
        return ref_timestep.to(t.dtype) * 1000
    value = float(ref_timestep)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"ref_timestep must be in [0, 1], got {value}")
    return torch.full_like(t, value * 1000)

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

import logging
from collections.abc import Callable

import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2KVAttnProcessor,
    Flux2KVLayerCache,
    Flux2KVParallelSelfAttnProcessor,
    Flux2Transformer2DModel,
)

from .flux2_parts import (
    REF_TIME_OFFSET,
    ROPE_LAYOUT,
    DropHook,
    ForwardResult,
    LayerHook,
    _blend_rows,
    _ref_time,
    _Stream,
    image_ids,
    model_content_id,
    ref_position_ids,
    text_ids,
)
from .flux2_template import TemplatePasses
from .kv_types import KVMismatchError, TemplateKV, check_kv_compatible
from .ref_layout import num_tokens, rope_layout_of, stacked_grid

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


class Flux2KVAdapter(TemplatePasses):
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
        return self.model.config["num_attention_heads"]

    @property
    def head_dim(self) -> int:
        return self.model.config["attention_head_dim"]

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        """Where the weights are; inputs made elsewhere (CPU probes, prompts) are moved here."""
        return next(self.model.parameters()).device

    def kv_bytes(self, num_ref_tokens: int, bytes_per_value: int = 2) -> int:
        """Size of one template's KV for this model (all layers, K and V)."""
        return self.num_layers * 2 * num_ref_tokens * self.num_heads * self.head_dim * bytes_per_value

    # ---- template KV (the passes: flux2_template.TemplatePasses) ------------------------------------------------
    def check(self, kv: TemplateKV, token_grid) -> None:
        """Refuse KV made for another model, grid, references or RoPE layout (error names both sides).
        ``token_grid``: the template's (rows, cols), or its references' grids (:mod:`.ref_layout`)."""
        check_kv_compatible(
            kv.model_id,
            kv.token_grid,
            kv.rope_layout,
            self.model_id,
            stacked_grid(token_grid),
            rope_layout_of(token_grid),
        )
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
            ref_tokens: (1, ref_tokens, in_channels) template tokens (all references, in order); needed when
                ``split_layer > 0``.
            ref_grid: (rows, cols) of the template tokens, or the grids of its references (:mod:`.ref_layout`:
                reference ``i`` at RoPE time 10 (i + 1); they attend to each other, as in diffusers' KV mode).
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
        n_ref = ref_tokens.shape[1] if split_layer > 0 and ref_tokens is not None else 0  # checked: given then
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
                assert cached is not None  # _resolve_split: given whenever a layer runs without the template
                k, v = cached(layer)
                batch = s.hidden.shape[0]
                k, v = k.to(s.hidden.device, self.dtype), v.to(s.hidden.device, self.dtype)
                cache.store(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                kwargs = {"kv_cache": cache, "kv_cache_mode": "cached", "num_ref_tokens": 0}
            self._run_block(layer, s, ref_live, kwargs)
            if ref_live:
                k, v = cache.get()
                extracted.append((k[:1], v[:1]))

        skip = s.n_txt + (n_ref if ref_live else 0)
        hidden = s.hidden[:, skip:]
        hidden = self.model.norm_out(hidden, s.temb)
        return ForwardResult(sample=self.model.proj_out(hidden), extracted=extracted)

    def _resolve_split(
        self, split_layer, ref_tokens, ref_grid, cached, ref_timestep=None
    ) -> tuple[Callable[[int], bool] | None, int, Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None]:
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
        dtype, device = self.dtype, self.device
        batch = x.shape[0]
        n_txt = txt.shape[1]
        x, txt = x.to(device), txt.to(device)
        if ref_tokens is not None:
            ref_tokens = ref_tokens.to(device)
        if isinstance(ref_timestep, torch.Tensor):
            ref_timestep = ref_timestep.to(device)

        t = timestep.to(device, dtype) * 1000
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
        rope_img = m.pos_embed(image_ids(img_grid[0], img_grid[1], t=0, device=device))
        s.rope_plain = (torch.cat([rope_txt[0], rope_img[0]]), torch.cat([rope_txt[1], rope_img[1]]))

        if n_ref:
            ref_t = _ref_time(ref_timestep, self.ref_fixed_timestep, t)
            ref_temb = m.time_guidance_embed(ref_t, None)
            s.ref_mod_img = m.double_stream_modulation_img(ref_temb)
            s.ref_mod_single = m.single_stream_modulation(ref_temb)
            if num_tokens(ref_grid) != n_ref:
                raise ValueError(
                    f"ref_tokens hold {n_ref} tokens but the template's grid {ref_grid} holds {num_tokens(ref_grid)}"
                )
            rope_ref = m.pos_embed(ref_position_ids(ref_grid, device=device))
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
            img_mod = s.mod_img
            if ref_live:
                assert s.ref_mod_img is not None  # _embed sets it whenever template tokens run
                img_mod = _blend_rows(s.mod_img, s.ref_mod_img, n_ref, s.hidden.shape[1], 0)
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
            smod = s.mod_single
            if ref_live:
                assert s.ref_mod_single is not None  # _embed sets it whenever template tokens run
                smod = _blend_rows(s.mod_single, s.ref_mod_single, n_ref, s.hidden.shape[1], s.n_txt)
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

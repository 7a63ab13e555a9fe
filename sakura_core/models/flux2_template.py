"""The adapter's template-only passes (a mixin of :class:`~sakura_core.models.flux2_kv.Flux2KVAdapter`): every
layer's template KV, the rest of a pass from where a hybrid forward dropped the template tokens, and per-step KV."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from diffusers.models.transformers.transformer_flux2 import Flux2KVLayerCache

from .kv_types import PerStepTemplateKV, TemplateKV
from .ref_layout import TokenLayout, num_tokens, rope_layout_of, stacked_grid

if TYPE_CHECKING:
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    from .flux2_parts import _Stream

__all__ = ["TemplatePasses"]


class TemplatePasses:
    """Template-only passes over the adapter's blocks (needs ``_embed``, ``_run_block``, ``_joined``, ``_ref_rows``)."""

    if TYPE_CHECKING:  # what the adapter (flux2_kv.Flux2KVAdapter) gives these passes
        model: Flux2Transformer2DModel
        model_id: str
        ref_fixed_timestep: float

        @property
        def num_layers(self) -> int: ...
        @property
        def dtype(self) -> torch.dtype: ...
        @property
        def device(self) -> torch.device: ...
        def _embed(
            self, x, txt, timestep, img_grid, ref_tokens, ref_grid, n_ref: int, ref_timestep=None
        ) -> _Stream: ...
        def _run_block(self, layer: int, s: _Stream, ref_live: bool, kwargs: dict[str, Any]) -> None: ...
        def _joined(self, layer: int) -> bool: ...
        def _ref_rows(self, hidden: torch.Tensor, layer: int, n_txt: int, n_ref: int) -> torch.Tensor: ...

    @torch.no_grad()
    def extract_template_kv(
        self, ref_tokens: torch.Tensor, token_grid: TokenLayout, ref_timestep: float | None = None
    ) -> TemplateKV:
        """Template-only pass: the template's KV for every layer (:meth:`resume_template_kv` from the embedded tokens).

        Args:
            ref_tokens: (1, tokens, in_channels) packed template tokens (every reference's, in order).
            token_grid: (rows, cols) of the template, or its references' grids (:mod:`.ref_layout`).
            ref_timestep: modulation time of the template tokens; ``None`` = ``ref_fixed_timestep`` (single mode).
        """
        n = num_tokens(token_grid)
        if ref_tokens.ndim != 3 or ref_tokens.shape[0] != 1 or ref_tokens.shape[1] != n:
            raise ValueError(
                f"ref_tokens must be (1, {n}, in_channels) for token grid {token_grid}, got {tuple(ref_tokens.shape)}"
            )
        layers = self.resume_template_kv(
            self.model.x_embedder(ref_tokens.to(self.device, self.dtype)), token_grid, 0, ref_timestep
        )
        kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])  # (layers, 2, tok, heads, hd)
        ref_t = self.ref_fixed_timestep if ref_timestep is None else float(ref_timestep)
        return TemplateKV(kv, self.model_id, stacked_grid(token_grid), rope_layout_of(token_grid), ref_timestep=ref_t)

    @torch.no_grad()
    def resume_template_kv(
        self,
        ref_hidden: torch.Tensor,
        token_grid: TokenLayout,
        start_layer: int,
        ref_timestep: float | None = None,
        stop: Callable[[int, tuple[torch.Tensor, torch.Tensor]], bool] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The template-only pass from ``start_layer`` on (one dummy request token and one dummy text token beside
        the template, which never reads them): the KV of layers ``start_layer .. L-1`` (each
        (1, tokens, heads, head_dim)), equal to :meth:`extract_template_kv`'s for those layers.

        Args:
            ref_hidden: (1, rows*cols, dim) the template tokens' hidden state entering ``start_layer`` — what
                :meth:`forward`'s ``on_drop`` handed over when a hybrid forward dropped them there (the template
                tokens attend only to themselves, so it does not depend on the request).
            token_grid: (rows, cols) of the template, or its references' grids.
            start_layer: 0 .. num_layers.
            ref_timestep: as for :meth:`extract_template_kv` (the forward's own).
            stop: asked after each layer's KV is made, with that layer and its (K, V); True ends the pass there (the
                list then ends at that layer): the device's fallback pass is abandoned once the link has delivered
                the rest.
        """
        s = self._template_stream(ref_hidden, token_grid, start_layer, ref_timestep)
        n_ref = s.n_ref
        out = []
        for layer in range(start_layer, self.num_layers):
            cache = Flux2KVLayerCache()
            self._run_block(layer, s, True, {"kv_cache": cache, "kv_cache_mode": "extract", "num_ref_tokens": n_ref})
            k, v = cache.get()
            out.append((k[:1], v[:1]))
            if stop is not None and stop(layer, out[-1]):
                break
        return out

    @torch.no_grad()
    def template_layer(
        self, ref_hidden: torch.Tensor, token_grid: tuple[int, int], layer: int, ref_temb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer of :meth:`resume_template_kv` with the template's time embedding given as a tensor (the web
        export's per-layer graphs take the time as an input): ``(k, v, hidden)`` — layer ``layer``'s KV (each
        (1, tokens, heads, head_dim)) and the template tokens' hidden state entering ``layer + 1`` (1, tokens, dim).

        Args:
            ref_hidden: (1, rows*cols, dim) the template tokens' hidden state entering ``layer``.
            token_grid: (rows, cols) of the template, or its references' grids.
            layer: 0 .. num_layers - 1.
            ref_temb: (1, dim) ``time_guidance_embed`` of the template's modulation time (x1000, as the model's).
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers - 1}], got {layer}")
        s = self._template_stream(ref_hidden, token_grid, layer, None)
        s.ref_mod_img = self.model.double_stream_modulation_img(ref_temb)
        s.ref_mod_single = self.model.single_stream_modulation(ref_temb)
        cache = Flux2KVLayerCache()
        self._run_block(layer, s, True, {"kv_cache": cache, "kv_cache_mode": "extract", "num_ref_tokens": s.n_ref})
        k, v = cache.get()
        return k[:1], v[:1], self._ref_rows(s.hidden, layer + 1, s.n_txt, s.n_ref)

    def _template_stream(self, ref_hidden, token_grid, start_layer: int, ref_timestep):
        """The stream a template-only pass enters ``start_layer`` with: the template rows ``ref_hidden`` beside one
        dummy request token and one dummy text token (which the template never reads)."""
        L, n_ref = self.num_layers, num_tokens(token_grid)
        if not 0 <= start_layer <= L:
            raise ValueError(f"start_layer must be in [0, {L}], got {start_layer}")
        dim = self.model.config["num_attention_heads"] * self.model.config["attention_head_dim"]
        if ref_hidden.ndim != 3 or ref_hidden.shape[0] != 1 or tuple(ref_hidden.shape[1:]) != (n_ref, dim):
            raise ValueError(
                f"ref_hidden must be (1, {n_ref}, {dim}) for token grid {token_grid} (the template tokens' "
                f"hidden state on_drop handed over), got {tuple(ref_hidden.shape)}"
            )
        dtype, device = self.dtype, ref_hidden.device
        cfg = self.model.config
        x = torch.zeros(1, 1, cfg["in_channels"], dtype=dtype, device=device)
        txt = torch.zeros(1, 1, cfg["joint_attention_dim"], dtype=dtype, device=device)
        ref = torch.zeros(1, n_ref, cfg["in_channels"], dtype=dtype, device=device)  # rows replaced below
        s = self._embed(x, txt, torch.ones(1, device=device), (1, 1), ref, token_grid, n_ref, ref_timestep)
        parts = [ref_hidden.to(dtype), s.hidden[:, n_ref:]]  # (1, n_ref + 1, dim): template rows, dummy request
        s.hidden = torch.cat([s.enc, *parts] if self._joined(start_layer) else parts, dim=1)
        return s

    @torch.no_grad()
    def extract_per_step_kv(
        self, ref_tokens: torch.Tensor, token_grid: TokenLayout, timesteps: torch.Tensor | list[float]
    ) -> PerStepTemplateKV:
        """``per-step`` KV mode: one template-only pass per sampler step, modulated with that step's own time.

        Args:
            ref_tokens: (1, tokens, in_channels) packed template tokens.
            token_grid: (rows, cols) of the template, or its references' grids.
            timesteps: the sampler's step times ``t_0 .. t_{S-1}`` (``flow_timesteps(S, shift)[:-1]``): step ``s``
                runs the transformer at ``t_s``, so its template KV is the extract pass at ``t_s``.
        """
        times = [float(t) for t in (timesteps.tolist() if isinstance(timesteps, torch.Tensor) else timesteps)]
        if not times:
            raise ValueError("timesteps is empty: pass the sampler's step times, e.g. flow_timesteps(steps)[:-1]")
        per_step = [self.extract_template_kv(ref_tokens, token_grid, ref_timestep=t) for t in times]
        kv = torch.stack([p.kv for p in per_step])  # (steps, layers, 2, tokens, heads, head_dim)
        return PerStepTemplateKV(kv, self.model_id, per_step[0].token_grid, per_step[0].rope_layout, tuple(times))

"""Request-side attention inputs of every layer, recomputed from each block's own projections, norms and RoPE (the
computation the KV processors do) by forward pre-hooks held for one forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux2 import _get_qkv_projections

from ..models.edit_model import EditModel
from ..models.kv_types import TemplateKV
from .probes import Probes

if TYPE_CHECKING:
    from ..models.flux2_kv import Flux2KVAdapter

__all__ = ["AttentionCapture", "attention_modules", "capture_attention", "qkv_double", "qkv_single"]


@dataclass
class AttentionCapture:
    """Request-side attention inputs of one layer for a batch of probes (post norm and RoPE).

    Attributes:
        q, k, v: (batch, heads, request_tokens, head_dim) for the request tokens in sequence order
            ([text, image]); the template keys/values go between the first ``n_txt`` and the rest.
        n_txt: number of text tokens.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    n_txt: int

    def keys_values(self, k_ref: torch.Tensor, v_ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full key/value sequences with template K/V (tokens, heads, head_dim) inserted: (B, H, N_all, D)."""
        b = self.q.shape[0]
        kr = k_ref.to(self.k.device, self.k.dtype).permute(1, 0, 2).unsqueeze(0).expand(b, -1, -1, -1)  # (B, H, T, D)
        vr = v_ref.to(self.v.device, self.v.dtype).permute(1, 0, 2).unsqueeze(0).expand(b, -1, -1, -1)
        n = self.n_txt
        return (
            torch.cat([self.k[:, :, :n], kr, self.k[:, :, n:]], dim=2),
            torch.cat([self.v[:, :, :n], vr, self.v[:, :, n:]], dim=2),
        )

    def output(self, k_ref: torch.Tensor, v_ref: torch.Tensor) -> torch.Tensor:
        """Attention output of the request queries, (B, H, request_tokens, head_dim)."""
        k_all, v_all = self.keys_values(k_ref, v_ref)
        return F.scaled_dot_product_attention(self.q, k_all, v_all)


def attention_modules(adapter: Flux2KVAdapter) -> list[torch.nn.Module]:
    """The attention module of every layer, in layer order (double-stream blocks, then single-stream)."""
    blocks = [*adapter.model.transformer_blocks, *adapter.model.single_transformer_blocks]
    return [cast(torch.nn.Module, b.attn) for b in blocks]  # torch types a submodule attribute as Tensor | Module


def _rotate(x: torch.Tensor, rope) -> torch.Tensor:
    """diffusers' ``apply_rotary_emb`` (``use_real``, the default: one tensor back; its annotation says a pair)."""
    return cast(torch.Tensor, apply_rotary_emb(x, rope, sequence_dim=1))


def qkv_double(attn, kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    hs, ehs = kwargs["hidden_states"], kwargs["encoder_hidden_states"]
    q, k, v, eq, ek, ev = _get_qkv_projections(attn, hs, ehs)
    q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in (q, k, v))  # (B, N, H, D)
    q, k = attn.norm_q(q), attn.norm_k(k)
    eq, ek, ev = (t.unflatten(-1, (-1, attn.head_dim)) for t in (eq, ek, ev))
    eq, ek = attn.norm_added_q(eq), attn.norm_added_k(ek)
    q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
    rope = kwargs["image_rotary_emb"]
    q, k = _rotate(q, rope), _rotate(k, rope)
    return q, k, v, ehs.shape[1]


def qkv_single(attn, kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    proj = attn.to_qkv_mlp_proj(kwargs["hidden_states"])
    qkv_dim = 3 * attn.inner_dim
    mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
    local_qkv = proj.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
    q, k, v = proj[..., :local_qkv].chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in (q, k, v))
    q, k = attn.norm_q(q), attn.norm_k(k)
    rope = kwargs["image_rotary_emb"]
    q, k = _rotate(q, rope), _rotate(k, rope)
    return q, k, v, int(kwargs.get("num_txt_tokens", 0))


@torch.no_grad()
def capture_attention(model: EditModel, kv: TemplateKV, probes: Probes) -> list[AttentionCapture]:
    """Run the probes with ``kv`` injected and return every layer's request-side attention inputs."""
    adapter = model.adapter
    adapter.check(kv, kv.ref_grids)  # model, RoPE layout and geometry; the template grid may exceed the edit's
    captures: dict[int, AttentionCapture] = {}
    blocks = attention_modules(adapter)

    def make_hook(layer: int, double: bool):
        def hook(module, args, kwargs):
            if args:
                raise RuntimeError(f"layer {layer}: attention called with positional inputs; capture needs kwargs")
            q, k, v, n_txt = (qkv_double if double else qkv_single)(module, kwargs)
            to_bhnd = lambda t: t.permute(0, 2, 1, 3).float().contiguous()  # noqa: E731  (B, N, H, D) -> (B, H, N, D)
            captures[layer] = AttentionCapture(to_bhnd(q), to_bhnd(k), to_bhnd(v), n_txt)

        return hook

    handles = [
        attn.register_forward_pre_hook(make_hook(i, i < adapter.num_double), with_kwargs=True)
        for i, attn in enumerate(blocks)
    ]
    try:
        adapter.forward(
            probes.x,
            probes.txt,
            probes.t,
            img_grid=model.spec.grid,
            split_layer=0,
            cached=kv,
            ref_timestep=kv.ref_timestep,  # per-step KV: the probes see the template at the KV's own step time
        )
    finally:
        for h in handles:
            h.remove()
    missing = [i for i in range(adapter.num_layers) if i not in captures]
    if missing:
        raise RuntimeError(f"attention capture missed layers {missing}")
    return [captures[i] for i in range(adapter.num_layers)]


# ---- importance -----------------------------------------------------------------------------------------------------

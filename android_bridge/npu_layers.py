"""Per-layer graphs of the demo DiT for the QNN backend: one *template* graph and one *cached-KV* graph per layer.

The hybrid forward splits every transformer layer into two independent streams, exactly as diffusers' KV mode
computes them (``_flux2_kv_causal_attention``): the template (reference) tokens attend only to themselves, and the
request tokens (text + image) attend to text, template K/V and image. So a layer is

* ``TemplateLayerGraph`` (layers ``< k``, on the device): template hidden state, the template's modulation vector
  (from the template tokens' timestep: fixed in ``single`` mode, the step's own in ``per-step`` mode) and the
  template RoPE tables -> the next template hidden state and this layer's post-RoPE template K, V;
* ``CachedLayerGraph`` (every layer): the request stream with the template K/V of this layer as **inputs** —
  fetched shards for layers ``>= k``, the template graph's outputs for layers ``< k``.

Static shapes per geometry; RoPE tables and modulation vectors are inputs computed outside the graph (fp32), the
step's timestep reaches the graph through them. Same weights as the torch adapter (modules shared, not copied).
"""

from __future__ import annotations

import torch

from .npu_graph import CachedKVGraph

__all__ = ["CachedLayerGraph", "TemplateLayerGraph", "layer_graph_io"]


class _LayerBase(CachedKVGraph):
    """The op set of :class:`~android_bridge.npu_graph.CachedKVGraph` (RMSNorm, RoPE, attention, SwiGLU written for
    the HTP), for one layer."""

    def __init__(self, adapter, layer: int, text_tokens: int, image_tokens: int, template_tokens: int):
        super().__init__(adapter, text_tokens, image_tokens, template_tokens)
        if not 0 <= layer < adapter.num_layers:
            raise ValueError(f"layer must be in [0, {adapter.num_layers}), got {layer}")
        self.layer = layer
        self.is_double = layer < adapter.num_double
        blocks = self.m.transformer_blocks if self.is_double else self.m.single_transformer_blocks
        self.block = blocks[layer if self.is_double else layer - adapter.num_double]

    def _cs(self, cos: torch.Tensor, sin: torch.Tensor):
        return cos.repeat(1, self.heads), sin.repeat(1, self.heads)  # (S, H*D): head-major

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(1, t.shape[1], self.heads, self.head_dim)  # (1, S, H, D)


class TemplateLayerGraph(_LayerBase):
    """``forward(ref_h, ref_mod, ref_cos, ref_sin) -> (ref_h_next, k_ref, v_ref)``.

    Shapes: ref_h (1, N_ref, dim); ref_mod (1, 6*dim) double / (1, 3*dim) single; ref_cos/ref_sin (N_ref,
    head_dim); k_ref/v_ref (1, N_ref, heads, head_dim) post-RoPE (the layout of a decoded shard).
    """

    def forward(self, ref_h, ref_mod, ref_cos, ref_sin):
        cos, sin = self._cs(ref_cos, ref_sin)
        a = self.block.attn
        if self.is_double:
            sh_a, sc_a, g_a, sh_m, sc_m, g_m = self._split(ref_mod, 2)
            nh = self.block.norm1(ref_h) * (1 + sc_a) + sh_a
            q, k, v = self._rms(a.to_q(nh), a.norm_q), self._rms(a.to_k(nh), a.norm_k), a.to_v(nh)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            ref_h = ref_h + g_a * a.to_out[0](self._attention(q, k, v))
            ref_h = ref_h + g_m * self._ff(self.block.ff, self.block.norm2(ref_h) * (1 + sc_m) + sh_m)
        else:
            s_sh, s_sc, s_g = self._split(ref_mod, 1)
            proj = a.to_qkv_mlp_proj(self.block.norm(ref_h) * (1 + s_sc) + s_sh)
            inner = a.inner_dim
            q, k, v = proj[..., :inner], proj[..., inner : 2 * inner], proj[..., 2 * inner : 3 * inner]
            q, k = self._rope(self._rms(q, a.norm_q), cos, sin), self._rope(self._rms(k, a.norm_k), cos, sin)
            mlp = self._swiglu(proj[..., 3 * inner :])
            ref_h = ref_h + s_g * a.to_out(torch.cat([self._attention(q, k, v), mlp], dim=-1))
        return ref_h, self._heads(k), self._heads(v)


class CachedLayerGraph(_LayerBase):
    """Double: ``forward(hidden, enc, mod_img, mod_txt, cos, sin, k_ref, v_ref) -> (hidden, enc)``; single:
    ``forward(hidden, mod, cos, sin, k_ref, v_ref) -> hidden``.

    Shapes: hidden (1, N_img, dim) double / (1, N_txt + N_img, dim) single; enc (1, N_txt, dim); mod_* (1, 6*dim)
    double / (1, 3*dim) single; cos/sin (N_txt + N_img, head_dim); k_ref/v_ref (1, N_ref, heads, head_dim).
    """

    def forward(self, *args):
        return self._double(*args) if self.is_double else self._single(*args)

    def _double(self, hidden, enc, mod_img, mod_txt, rope_cos, rope_sin, k_ref, v_ref):
        cos, sin = self._cs(rope_cos, rope_sin)
        block, a = self.block, self.block.attn
        sh_a, sc_a, g_a, sh_m, sc_m, g_m = self._split(mod_img, 2)
        c_sh_a, c_sc_a, c_g_a, c_sh_m, c_sc_m, c_g_m = self._split(mod_txt, 2)
        nh = block.norm1(hidden) * (1 + sc_a) + sh_a
        ne = block.norm1_context(enc) * (1 + c_sc_a) + c_sh_a
        q = torch.cat([self._rms(a.add_q_proj(ne), a.norm_added_q), self._rms(a.to_q(nh), a.norm_q)], dim=1)
        k = torch.cat([self._rms(a.add_k_proj(ne), a.norm_added_k), self._rms(a.to_k(nh), a.norm_k)], dim=1)
        v = torch.cat([a.add_v_proj(ne), a.to_v(nh)], dim=1)  # (1, N_txt + N_img, H*D)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        out = self._attention(q, self._with_ref(k, k_ref), self._with_ref(v, v_ref))
        ctx_out, img_out = a.to_add_out(out[:, : self.n_txt]), a.to_out[0](out[:, self.n_txt :])
        hidden = hidden + g_a * img_out
        hidden = hidden + g_m * self._ff(block.ff, block.norm2(hidden) * (1 + sc_m) + sh_m)
        enc = enc + c_g_a * ctx_out
        enc = enc + c_g_m * self._ff(block.ff_context, block.norm2_context(enc) * (1 + c_sc_m) + c_sh_m)
        return hidden, enc

    def _single(self, hidden, mod, rope_cos, rope_sin, k_ref, v_ref):
        cos, sin = self._cs(rope_cos, rope_sin)
        a = self.block.attn
        s_sh, s_sc, s_g = self._split(mod, 1)
        proj = a.to_qkv_mlp_proj(self.block.norm(hidden) * (1 + s_sc) + s_sh)
        inner = a.inner_dim
        q, k, v = proj[..., :inner], proj[..., inner : 2 * inner], proj[..., 2 * inner : 3 * inner]
        q, k = self._rope(self._rms(q, a.norm_q), cos, sin), self._rope(self._rms(k, a.norm_k), cos, sin)
        mlp = self._swiglu(proj[..., 3 * inner :])
        attn = self._attention(q, self._with_ref(k, k_ref), self._with_ref(v, v_ref))
        return hidden + s_g * a.to_out(torch.cat([attn, mlp], dim=-1))


def layer_graph_io(adapter, layer: int, kind: str, n_txt: int, n_img: int, n_ref: int) -> tuple[dict, list[str]]:
    """Static input shapes ``{name: shape}`` (in order) and output names of one layer graph (``kind``: "template"
    or "cached")."""
    dim = adapter.num_heads * adapter.head_dim
    hd, heads = adapter.head_dim, adapter.num_heads
    double = layer < adapter.num_double
    mods = 6 * dim if double else 3 * dim
    kv = {"k_ref": (1, n_ref, heads, hd), "v_ref": (1, n_ref, heads, hd)}
    if kind == "template":
        ins = {"ref_h": (1, n_ref, dim), "ref_mod": (1, mods), "ref_cos": (n_ref, hd), "ref_sin": (n_ref, hd)}
        return ins, ["ref_h_out", "k_ref", "v_ref"]
    if kind != "cached":
        raise ValueError(f"kind must be 'template' or 'cached', got {kind!r}")
    rope = {"rope_cos": (n_txt + n_img, hd), "rope_sin": (n_txt + n_img, hd)}
    if double:
        ins = {"hidden": (1, n_img, dim), "enc": (1, n_txt, dim), "mod_img": (1, mods), "mod_txt": (1, mods)}
        return {**ins, **rope, **kv}, ["hidden_out", "enc_out"]
    return {"hidden": (1, n_txt + n_img, dim), "mod": (1, mods), **rope, **kv}, ["hidden_out"]

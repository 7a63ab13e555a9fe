"""The demo DiT's cached-KV forward as an export-friendly ``torch.nn.Module`` for the NPU toolchain.

Same weights (the diffusers modules are shared, not copied), same arithmetic as
``Flux2KVAdapter.forward(..., cached=kv)`` with every layer using template KV, written with the op set the
Hexagon HTP takes:

* static shapes: batch 1, ``text_tokens`` + ``image_tokens`` request tokens, ``template_tokens`` template tokens;
* RoPE cos/sin and the timestep's sinusoidal projection are **inputs**, computed outside the graph in fp32 (a
  float64 RoPE inside the graph breaks QNN graph composition), by :func:`graph_inputs`;
* the template K/V of each layer is a pair of graph inputs ``k_ref_{l}``, ``v_ref_{l}`` of shape
  (1, template_tokens, heads, head_dim) — the layout the runtime decodes shards into;
* attention is explicit MatMul/Softmax on rank-4 tensors; RMSNorm is written out; the RoPE rotation of interleaved
  pairs is Reshape/Slice/Neg/Concat (rank <= 4); no Einsum; the output stays in token space (unpatchify outside).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from sakura_core.models.flux2_kv import image_ids, text_ids

__all__ = ["CachedKVGraph", "graph_input_names", "graph_inputs"]


class CachedKVGraph(nn.Module):
    """``forward(x, txt, t_freq, rope_cos, rope_sin, k_ref_0, v_ref_0, ..., k_ref_{L-1}, v_ref_{L-1}) -> velocity``.

    Shapes: x (1, image_tokens, in_channels); txt (1, text_tokens, joint_attention_dim); t_freq (1,
    timestep_guidance_channels); rope_cos/rope_sin (text_tokens + image_tokens, head_dim); k/v_ref (1,
    template_tokens, heads, head_dim); velocity (1, image_tokens, out_channels). All fp32.
    """

    def __init__(self, adapter, text_tokens: int, image_tokens: int, template_tokens: int):
        super().__init__()
        self.m = adapter.model
        self.n_txt, self.n_img, self.n_ref = text_tokens, image_tokens, template_tokens
        self.heads, self.head_dim = adapter.num_heads, adapter.head_dim
        self.num_double, self.num_layers = adapter.num_double, adapter.num_layers

    # ---- pieces ---------------------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        s = x.shape[1]
        xh = x.reshape(1, s, self.heads, self.head_dim)  # (1, S, H, D)
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        y = xh * torch.rsqrt(xh.pow(2).mean(dim=-1, keepdim=True) + eps)
        if norm.weight is not None:
            y = y * norm.weight
        return y.reshape(1, s, self.heads * self.head_dim)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Interleaved-pair rotation: out = x * cos + rot(x) * sin, rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]."""
        s, hd = x.shape[1], self.heads * self.head_dim
        pairs = x.reshape(1, s, hd // 2, 2)  # (1, S, H*D/2, 2)
        rot = torch.cat([-pairs[..., 1:2], pairs[..., 0:1]], dim=-1).reshape(1, s, hd)
        return x * cos + rot * sin

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h, d = self.heads, self.head_dim
        s, sk = q.shape[1], k.shape[1]
        qh = q.reshape(1, s, h, d).transpose(1, 2)  # (1, H, S, D)
        kh = k.reshape(1, sk, h, d).permute(0, 2, 3, 1)  # (1, H, D, S_kv)
        vh = v.reshape(1, sk, h, d).transpose(1, 2)  # (1, H, S_kv, D)
        p = torch.softmax(torch.matmul(qh * (1.0 / math.sqrt(d)), kh), dim=-1)  # (1, H, S, S_kv)
        return torch.matmul(p, vh).transpose(1, 2).reshape(1, s, h * d)  # (1, S, H*D)

    def _with_ref(self, t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """Insert the template K or V between the text and the image tokens (cached-mode layout)."""
        ref = ref.reshape(1, self.n_ref, self.heads * self.head_dim)  # (1, N_ref, H*D)
        return torch.cat([t[:, : self.n_txt], ref, t[:, self.n_txt :]], dim=1)

    @staticmethod
    def _split(mod: torch.Tensor, sets: int) -> list[torch.Tensor]:
        return list(torch.chunk(mod.unsqueeze(1), 3 * sets, dim=-1))  # each (1, 1, dim)

    @staticmethod
    def _swiglu(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]

    def _ff(self, ff, x: torch.Tensor) -> torch.Tensor:
        return ff.linear_out(self._swiglu(ff.linear_in(x)))

    # ---- forward --------------------------------------------------------------------------------------------
    def forward(self, x, txt, t_freq, rope_cos, rope_sin, *kv):
        m = self.m
        if len(kv) != 2 * self.num_layers:
            raise ValueError(f"expected {2 * self.num_layers} template K/V inputs, got {len(kv)}")
        cos = rope_cos.repeat(1, self.heads)  # (S, H*D): head-major like the flattened heads
        sin = rope_sin.repeat(1, self.heads)
        temb = m.time_guidance_embed.timestep_embedder(t_freq)  # (1, dim)
        sh_a, sc_a, g_a, sh_m, sc_m, g_m = self._split(m.double_stream_modulation_img(temb), 2)
        c_sh_a, c_sc_a, c_g_a, c_sh_m, c_sc_m, c_g_m = self._split(m.double_stream_modulation_txt(temb), 2)
        s_sh, s_sc, s_g = self._split(m.single_stream_modulation(temb), 1)
        hidden = m.x_embedder(x)  # (1, N_img, dim)
        enc = m.context_embedder(txt)  # (1, N_txt, dim)
        if self.num_double == 0:
            hidden = torch.cat([enc, hidden], dim=1)
        for i, block in enumerate(m.transformer_blocks):
            a = block.attn
            nh = block.norm1(hidden) * (1 + sc_a) + sh_a
            ne = block.norm1_context(enc) * (1 + c_sc_a) + c_sh_a
            q = torch.cat([self._rms(a.add_q_proj(ne), a.norm_added_q), self._rms(a.to_q(nh), a.norm_q)], dim=1)
            k = torch.cat([self._rms(a.add_k_proj(ne), a.norm_added_k), self._rms(a.to_k(nh), a.norm_k)], dim=1)
            v = torch.cat([a.add_v_proj(ne), a.to_v(nh)], dim=1)  # (1, N_txt + N_img, H*D)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            out = self._attention(q, self._with_ref(k, kv[2 * i]), self._with_ref(v, kv[2 * i + 1]))
            ctx_out, img_out = a.to_add_out(out[:, : self.n_txt]), a.to_out[0](out[:, self.n_txt :])
            hidden = hidden + g_a * img_out
            hidden = hidden + g_m * self._ff(block.ff, block.norm2(hidden) * (1 + sc_m) + sh_m)
            enc = enc + c_g_a * ctx_out
            enc = enc + c_g_m * self._ff(block.ff_context, block.norm2_context(enc) * (1 + c_sc_m) + c_sh_m)
            if i == self.num_double - 1:
                hidden = torch.cat([enc, hidden], dim=1)  # single blocks see (txt, img)
        for j, block in enumerate(m.single_transformer_blocks):
            layer = self.num_double + j
            a = block.attn
            nh = block.norm(hidden) * (1 + s_sc) + s_sh
            proj = a.to_qkv_mlp_proj(nh)
            inner = a.inner_dim
            q, k, v = proj[..., :inner], proj[..., inner : 2 * inner], proj[..., 2 * inner : 3 * inner]
            mlp = self._swiglu(proj[..., 3 * inner :])
            q, k = self._rope(self._rms(q, a.norm_q), cos, sin), self._rope(self._rms(k, a.norm_k), cos, sin)
            attn = self._attention(q, self._with_ref(k, kv[2 * layer]), self._with_ref(v, kv[2 * layer + 1]))
            hidden = hidden + s_g * a.to_out(torch.cat([attn, mlp], dim=-1))
        hidden = hidden[:, self.n_txt :]
        return m.proj_out(m.norm_out(hidden, temb))


def graph_input_names(num_layers: int) -> list[str]:
    names = ["x", "txt", "t_freq", "rope_cos", "rope_sin"]
    for layer in range(num_layers):
        names += [f"k_ref_{layer}", f"v_ref_{layer}"]
    return names


@torch.no_grad()
def graph_inputs(model, x: torch.Tensor, txt: torch.Tensor, timestep: torch.Tensor, kv) -> tuple[torch.Tensor, ...]:
    """The graph's inputs for one denoising step, computed outside the graph in fp32.

    Args:
        model: the EditModel.
        x: (1, image_tokens, in_channels) request tokens; txt: (1, text_tokens, joint_dim); timestep: (1,) in [0, 1].
        kv: a TemplateKV (or anything with ``layer(i) -> (k, v)``).
    """
    m = model.adapter.model
    t_freq = m.time_guidance_embed.time_proj(timestep.float() * 1000).float()  # (1, timestep_guidance_channels)
    rope_txt = m.pos_embed(text_ids(txt.shape[1]))
    rope_img = m.pos_embed(image_ids(model.spec.grid[0], model.spec.grid[1], t=0))
    cos = torch.cat([rope_txt[0], rope_img[0]]).float()  # (N_txt + N_img, head_dim)
    sin = torch.cat([rope_txt[1], rope_img[1]]).float()
    refs = []
    for layer in range(model.adapter.num_layers):
        k, v = kv.layer(layer)
        refs += [k.float().contiguous(), v.float().contiguous()]
    return (x.float(), txt.float(), t_freq, cos, sin, *refs)

"""APPROXIMATE template-KV reuse for joint-attention DiTs (FLUX.1 / Kontext-style ``FluxTransformer2DModel``).

In plain joint attention the reference tokens attend to the noisy latent and the prompt and are modulated with the
request's timestep, so their keys/values depend on the request. Reuse here is an approximation: a *calibration run*
records the reference K/V of every (layer, step); later requests drop the reference tokens from the sequence and
inject the recorded K/V at the same (layer, step). The error against full computation is measured in
``tests/sakura_core/models/test_joint_approx.py`` (it bounds a tiny random model's relative output error; trained
models, whose reference tokens react more to the request, drift further) — never
offer this path as exact. Exact reuse needs FLUX.2 [klein] KV mode (``flux2_kv``).

Sequence layout assumed (Kontext): hidden states ``[latent, reference]``, so in every block the joint sequence is
``[text, latent, reference]`` and the reference tokens are its last ``num_ref_tokens`` positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxTransformer2DModel

__all__ = ["APPROXIMATE", "JointRefKVState", "apply_joint_ref_kv"]

APPROXIMATE = True  # label: everything this module serves is an approximation of the full computation


@dataclass
class JointRefKVState:
    """Per-run state shared by the processors of one model.

    Attributes:
        mode: ``"off"`` (plain attention), ``"capture"`` (record reference K/V), ``"inject"`` (use recorded K/V).
        num_ref_tokens: reference tokens at the end of the joint sequence (capture mode).
        step: current denoising step; the caller sets it before each forward.
        store: (layer, step) -> (k, v), each (batch, ref_tokens, heads, head_dim), post-RoPE.
    """

    mode: str = "off"
    num_ref_tokens: int = 0
    step: int = 0
    store: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def reset(self) -> None:
        self.mode, self.num_ref_tokens, self.step = "off", 0, 0
        self.store.clear()

    def kv(self, layer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self.store[(layer, step)]
        except KeyError as e:
            steps = sorted({s for _, s in self.store})
            raise KeyError(
                f"no calibrated reference KV for layer {layer} step {step} (calibrated steps: {steps}); "
                "run the calibration with the same step count"
            ) from e


class _JointRefKVProcessor:
    """Attention processor for ``FluxAttention`` that records or injects reference K/V (see module doc)."""

    def __init__(self, state: JointRefKVState, layer: int):
        self.state = state
        self.layer = layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        def heads(x):
            return x.unflatten(-1, (-1, attn.head_dim))  # (batch, seq, heads, head_dim)

        query = attn.norm_q(heads(attn.to_q(hidden_states)))
        key = attn.norm_k(heads(attn.to_k(hidden_states)))
        value = heads(attn.to_v(hidden_states))
        if encoder_hidden_states is not None and attn.added_kv_proj_dim is not None:
            eq = attn.norm_added_q(heads(attn.add_q_proj(encoder_hidden_states)))
            ek = attn.norm_added_k(heads(attn.add_k_proj(encoder_hidden_states)))
            ev = heads(attn.add_v_proj(encoder_hidden_states))
            query, key, value = torch.cat([eq, query], 1), torch.cat([ek, key], 1), torch.cat([ev, value], 1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        st = self.state
        if st.mode == "capture" and st.num_ref_tokens > 0:
            n = st.num_ref_tokens
            st.store[(self.layer, st.step)] = (key[:, -n:].clone(), value[:, -n:].clone())
        elif st.mode == "inject":
            k_ref, v_ref = st.kv(self.layer, st.step)
            key = torch.cat([key, k_ref.to(key.dtype)], dim=1)
            value = torch.cat([value, v_ref.to(value.dtype)], dim=1)

        out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask).flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            n_txt = encoder_hidden_states.shape[1]
            enc_out, out = out[:, :n_txt], out[:, n_txt:]
            out = attn.to_out[1](attn.to_out[0](out.contiguous()))
            return out, attn.to_add_out(enc_out.contiguous())
        return out


def apply_joint_ref_kv(model: FluxTransformer2DModel, state: JointRefKVState) -> None:
    """Install the recording/injecting processors on every attention of ``model``, all sharing ``state``.

    Layers are numbered in execution order (double-stream blocks, then single-stream blocks).
    """
    if not isinstance(model, FluxTransformer2DModel):
        raise TypeError(f"apply_joint_ref_kv expects a diffusers FluxTransformer2DModel, got {type(model).__name__}")
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    for layer, block in enumerate(blocks):
        block.attn.set_processor(_JointRefKVProcessor(state, layer))

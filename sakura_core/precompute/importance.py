"""Token importance from probe requests, and the attention-output error of a KV reconstruction.

A *probe* is a plausible request that the server can make up without any user data: a random user image (a smooth
random image or a crop of a sample photo), a generic prompt, and a noisy latent at one of several flow timesteps.
The probes run through :class:`~sakura_core.models.flux2_kv.Flux2KVAdapter` with the exact template KV injected
(cached mode). A forward pre-hook on every attention module recomputes that layer's request queries, keys and values
from the block's own projections, norms and RoPE — the computation the KV processors do — so the attention
probabilities over [text, template, request] keys are exact.

From them, per layer:

* ``mass`` (layers, heads, tokens): mean attention probability a request query puts on each template token — the
  token's importance;
* ``v_weight`` (layers, tokens, heads) = sum over queries of p², and ``k_weight`` (layers, tokens, heads, head_dim)
  = sum over queries of p² ||v_t - o_q||² q_c² / head_dim: the first-order sensitivity of the attention output to
  squared errors in a template value / key channel (what the SAKURA codec's rate-distortion allocation weighs);
* ``k_drop`` (layers, tokens, heads): the exact output distortion of replacing a key by the mean key (what the
  codec does with a dropped key);
* ``out_energy`` (layers,) = sum over queries of ||o_q||², so weighted error / energy is a relative output error;
* ``layer_gain`` (layers,), optional: squared change of the model's output per squared change of the layer's
  attention output, measured by perturbing that layer's template KV (:func:`layer_gains`). Off by default (see
  ``ProbeConfig``); without it the codec weighs each layer by ``(mean energy / out_energy) ** LAYER_NORM_POWER``
  (:meth:`TokenImportance.layer_scale`), i.e. by *relative* attention-output error.

The hooks are registered for the duration of one forward and removed in ``finally``; the model is not modified.
Everything is deterministic given the seed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..models.edit_model import EditModel
from ..models.kv_types import TemplateKV
from .attention_capture import AttentionCapture, capture_attention
from .probes import ProbeConfig, Probes, make_probes

__all__ = [
    "LAYER_NORM_POWER",
    "TokenImportance",
    "attention_error",
    "estimate_importance",
    "importance_from_captures",
    "layer_gains",
]

#: Layers are weighed by ``(mean out_energy / out_energy) ** LAYER_NORM_POWER`` in a template-wide allocation. In
#: plain attention-output units (power 0) the layers with the largest outputs take nearly every bit at the floor and
#: whole layers are dropped. 2: chosen because it gave the highest output PSNR at 1.5-1.75 bits per value on the
#: trained demo model among powers 0 to 3.
LAYER_NORM_POWER = 2.0


@dataclass(frozen=True)
class TokenImportance:
    """Importance and sensitivity of every template token (see the module docstring for the definitions).

    Attributes:
        mass: (layers, heads, tokens) mean attention probability per request query.
        k_weight: (layers, tokens, heads, head_dim) sensitivity to squared key error.
        v_weight: (layers, tokens, heads) sensitivity to squared value error.
        k_drop: (layers, tokens, heads) output distortion (same units) of replacing a key by the mean template key
            of its layer and head — exact, not first order (a dropped key's logit moves a lot).
        out_energy: (layers,) sum of squared attention outputs (same normalisation as the weights).
        template_share: (layers,) mean total probability mass on template tokens.
        num_probes, seed: how it was estimated.
        layer_gain: (layers,) model-output squared error per unit of attention-output squared error of each layer
            (measured by perturbing that layer's template KV), or ``None`` if not measured. Multiplying a layer's
            weights by its gain puts every layer in the same units — what a template-wide bit allocation needs.
    """

    mass: np.ndarray
    k_weight: np.ndarray
    v_weight: np.ndarray
    k_drop: np.ndarray
    out_energy: np.ndarray
    template_share: np.ndarray
    num_probes: int
    seed: int
    layer_gain: np.ndarray | None = None

    def layer_scale(self) -> np.ndarray:
        """(layers,) factor each layer's weights get in a template-wide bit allocation: the measured ``layer_gain``
        when set, else ``(mean out_energy / out_energy) ** LAYER_NORM_POWER`` (relative attention-output error)."""
        if self.layer_gain is not None:
            return np.asarray(self.layer_gain, dtype=np.float64)
        energy = np.maximum(np.asarray(self.out_energy, dtype=np.float64), 1e-30)
        return (energy.mean() / energy) ** LAYER_NORM_POWER

    def layers(self, first: int, last: int) -> TokenImportance:
        """The slice for layers ``first..last`` (inclusive)."""
        s = slice(first, last + 1)
        return TokenImportance(
            self.mass[s],
            self.k_weight[s],
            self.v_weight[s],
            self.k_drop[s],
            self.out_energy[s],
            self.template_share[s],
            self.num_probes,
            self.seed,
            None if self.layer_gain is None else self.layer_gain[s],
        )


@torch.no_grad()
def importance_from_captures(captures: list[AttentionCapture], kv: TemplateKV, seed: int = 0) -> TokenImportance:
    """Accumulate importance and sensitivities from captured probe attention (exact template KV)."""
    n_layers, t_ref = kv.num_layers, kv.num_tokens
    mass, kw, vw, kd, energy, share = [], [], [], [], [], []
    for layer, cap in enumerate(captures):
        k_ref, v_ref = kv.kv[layer, 0].float(), kv.kv[layer, 1].float()
        k_all, v_all = cap.keys_values(k_ref, v_ref)
        d = cap.q.shape[-1]
        b = cap.q.shape[0]
        p = torch.softmax(cap.q @ k_all.transpose(-1, -2) / math.sqrt(d), dim=-1)  # (B, H, Nq, N_all)
        o = p @ v_all  # (B, H, Nq, D)
        p_ref = p[..., cap.n_txt : cap.n_txt + t_ref]  # (B, H, Nq, T)
        p2 = p_ref.square()
        v_t = v_ref.permute(1, 0, 2)  # (H, T, D)
        dist2 = (
            v_t.square().sum(-1)[None, :, None, :]
            - 2.0 * (o @ v_t.transpose(-1, -2).unsqueeze(0))
            + o.square().sum(-1, keepdim=True)
        ).clamp_min(0.0)  # ||v_t - o_q||^2, (B, H, Nq, T)
        a = p2 * dist2
        kw_l = torch.einsum("bhqt,bhqd->htd", a, cap.q.square()) / (d * b)  # (H, T, D)
        # Dropping a key (replacing it by the mean template key) moves its logit by delta; the output then moves by
        # exactly p (e^delta - 1) / (1 - p + p e^delta) * (v_t - o_q) — not small, so use the exact expression.
        k_mean = k_ref.mean(0)  # (H, D)
        delta = (cap.q @ (k_mean[:, None, :] - k_ref.permute(1, 0, 2)).transpose(-1, -2).unsqueeze(0)) / math.sqrt(
            d
        )  # (B, H, Nq, T)
        grow = torch.expm1(delta.clamp(max=30.0))
        moved = p_ref * grow / (1.0 + p_ref * grow)
        kd.append((moved.square() * dist2).sum(2).sum(0).double().T / b)  # (T, H)
        mass.append((p_ref.sum(2).sum(0) / (b * p_ref.shape[2])).double())  # (H, T)
        vw.append((p2.sum(2).sum(0) / b).double().T)  # (T, H)
        kw.append(kw_l.double().permute(1, 0, 2))  # (T, H, D)
        energy.append(float(o.square().sum()) / b)
        share.append(float(p_ref.sum(-1).mean()))
    assert len(mass) == n_layers
    return TokenImportance(
        mass=torch.stack(mass).float().cpu().numpy(),
        k_weight=torch.stack(kw).float().cpu().numpy(),
        v_weight=torch.stack(vw).float().cpu().numpy(),
        k_drop=torch.stack(kd).float().cpu().numpy(),
        out_energy=np.asarray(energy, dtype=np.float64),
        template_share=np.asarray(share, dtype=np.float64),
        num_probes=int(captures[0].q.shape[0]),
        seed=seed,
    )


def estimate_importance(
    model: EditModel,
    kv: TemplateKV,
    template_image: np.ndarray | None = None,
    config: ProbeConfig | None = None,
) -> TokenImportance:
    """Importance of ``kv``'s template tokens for ``model``, from ``config.num_probes`` probe requests (stream 0)."""
    config = config or ProbeConfig()
    template = model.pack_image(template_image) if template_image is not None else None
    probes = make_probes(model, template, config, stream=0)
    captures = capture_attention(model, kv, probes)
    importance = importance_from_captures(captures, kv, seed=config.seed)
    if config.gain_steps is None:
        return importance
    gains = layer_gains(model, kv, probes, captures, seed=config.seed, steps=config.gain_steps)
    return dataclasses.replace(importance, layer_gain=gains)


@torch.no_grad()
def layer_gains(
    model: EditModel,
    kv: TemplateKV,
    probes: Probes,
    captures: list[AttentionCapture],
    rel_noise: float = 0.05,
    seed: int = 0,
    steps: int = 8,
) -> np.ndarray:
    """Per layer: squared change of the model output per squared change of that layer's attention output, when the
    layer's template K and V get small seeded noise (``rel_noise`` x their std).

    The output is the probes' whole edit (``steps`` Euler steps from seeded noise with the probes' user images and
    prompts, as :func:`sakura_core.runtime.denoise.run_edit` samples), or with ``steps == 0`` one velocity prediction
    at the probes' own timesteps. Attention-output errors of different layers do not matter equally; this is the
    exchange rate. Costs ``max(steps, 1)`` forwards per layer (plus one reference run).
    """
    from ..runtime.schedule import euler_sample, flow_timesteps

    adapter = model.adapter
    grid = model.spec.grid
    b = probes.x.shape[0]
    noise = torch.randn(probes.user.shape, generator=torch.Generator().manual_seed(int(seed) * 104729 + 3))

    def output(kv_used: TemplateKV) -> torch.Tensor:
        if steps == 0:
            return adapter.forward(
                probes.x,
                probes.txt,
                probes.t,
                img_grid=grid,
                split_layer=0,
                cached=kv_used,
                ref_timestep=kv.ref_timestep,
            ).sample

        def velocity(x: torch.Tensor, t: torch.Tensor, step: int) -> torch.Tensor:
            request = model.request_tokens(x, probes.user)
            return adapter.forward(
                request, probes.txt, t, img_grid=grid, split_layer=0, cached=kv_used, ref_timestep=kv.ref_timestep
            ).sample

        return euler_sample(velocity, noise, flow_timesteps(steps))

    base = output(kv)
    gen = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    gains = []
    for layer in range(kv.num_layers):
        k, v = kv.kv[layer, 0].float(), kv.kv[layer, 1].float()
        k_n = k + torch.randn(k.shape, generator=gen).to(k.device) * (rel_noise * float(k.std()))
        v_n = v + torch.randn(v.shape, generator=gen).to(v.device) * (rel_noise * float(v.std()))
        perturbed = kv.kv.clone()
        perturbed[layer, 0], perturbed[layer, 1] = k_n.to(kv.kv.dtype), v_n.to(kv.kv.dtype)
        out = output(TemplateKV(perturbed, kv.model_id, kv.token_grid, kv.rope_layout, kv.ref_timestep))
        d_out = float((out - base).double().square().sum()) / b
        cap = captures[layer]
        d_attn = float((cap.output(k_n, v_n) - cap.output(k, v)).double().square().sum()) / b
        gains.append(d_out / d_attn if d_attn > 0 else 0.0)
    return np.asarray(gains, dtype=np.float64)


@torch.no_grad()
def attention_error(
    captures: list[AttentionCapture],
    exact: TemplateKV,
    approx: dict[int, tuple[torch.Tensor, torch.Tensor]],
) -> float:
    """Relative error of the request attention output, ``||O(K^, V^) - O(K, V)|| / ||O(K, V)||`` over the layers in
    ``approx`` (layer -> (k, v), each (tokens, heads, head_dim)) and every probe, query and head."""
    err, ref = 0.0, 0.0
    for layer, (k_hat, v_hat) in approx.items():
        cap = captures[layer]
        o = cap.output(exact.kv[layer, 0].float(), exact.kv[layer, 1].float())
        o_hat = cap.output(k_hat.float(), v_hat.float())
        err += float((o_hat - o).square().sum())
        ref += float(o.square().sum())
    return math.sqrt(err / ref) if ref > 0 else 0.0

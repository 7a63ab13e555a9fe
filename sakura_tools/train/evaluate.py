"""Evaluation of the demo editing model: held-out PSNR/SSIM against trivial baselines, and how concentrated the
request's attention on the template tokens is (``sakura eval demo-model``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from sakura_core.demo.edit_task import EDIT_PROMPT, ImageBank, make_pair, region_mask, task_for
from sakura_core.metrics import psnr_uint8 as psnr_db
from sakura_core.models.edit_model import EditModel
from sakura_core.models.kv_types import PerStepTemplateKV, TemplateKV
from sakura_core.precompute.attention_capture import attention_modules, qkv_double, qkv_single

from .train import EVAL_SEED

__all__ = ["evaluate", "gini", "template_importance"]


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(a, b, channel_axis=-1, data_range=255))


def gini(values) -> float:
    """Gini coefficient of non-negative values: 0 = all equal, -> 1 = all mass on one element."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0 or np.any(x < 0):
        raise ValueError("gini needs a non-empty array of non-negative values")
    total = x.sum()
    if total == 0:
        return 0.0
    n = x.size
    return float((2 * np.sum(np.arange(1, n + 1) * x)) / (n * total) - (n + 1) / n)


@torch.no_grad()
def template_importance(
    model: EditModel, template: np.ndarray, user: np.ndarray, target: np.ndarray, times=(0.3, 0.6, 0.9), seed: int = 0
) -> tuple[np.ndarray, float]:
    """Attention mass the request queries put on each template token, per layer and head.

    Probe requests: the target noised to each of ``times`` (seeded noise), with the user image and the edit prompt.
    For every layer, the request image queries' softmax over all keys (text, template, request) is recomputed from
    the block's inputs exactly as the KV processors compute it, and averaged over queries and probes.

    Returns (importance (layers, heads, template_tokens), template_share = mean total mass on template tokens). The
    recomputed template keys are checked against the KV the forward extracted (a mismatch raises).
    """
    adapter = model.adapter
    grid, n_ref = model.spec.grid, model.spec.num_tokens
    L, n_txt = adapter.num_layers, model.spec.text_tokens
    ref = model.template_tokens(template)
    u, x0 = model.pack_image(user), model.pack_image(target)
    txt = model.encode_prompt(EDIT_PROMPT)
    gen = torch.Generator().manual_seed(seed)
    acc = torch.zeros(L, adapter.num_heads, n_ref, dtype=torch.float64)  # (layers, heads, ref tokens)
    keys: dict[int, torch.Tensor] = {}

    def make_hook(layer: int, double: bool):
        def hook(module, args, kwargs):
            q, k, _, _ = (qkv_double if double else qkv_single)(module, kwargs)  # (B, N, H, D) post-RoPE
            # double blocks: [txt, ref, img] after the text is prepended; single blocks: the same order
            keys[layer] = k[:, n_txt : n_txt + n_ref]
            q_img = q[:, n_txt + n_ref :]  # request queries (B, n_img, H, D)
            scores = torch.einsum("bqhd,bkhd->bhqk", q_img.float(), k.float()) / math.sqrt(q.shape[-1])
            probs = scores.softmax(dim=-1)[..., n_txt : n_txt + n_ref]  # (B, H, n_img, n_ref)
            acc[layer] += probs.mean(dim=(0, 2)).double()

        return hook

    blocks = attention_modules(adapter)
    handles = [
        attn.register_forward_pre_hook(make_hook(i, i < adapter.num_double), with_kwargs=True)
        for i, attn in enumerate(blocks)
    ]
    try:
        for t_val in times:
            noise = torch.randn(x0.shape, generator=gen)
            x_t = (1 - t_val) * x0 + t_val * noise
            result = adapter.forward(
                model.request_tokens(x_t, u),
                txt,
                torch.full((1,), float(t_val)),
                img_grid=grid,
                ref_tokens=ref,
                ref_grid=grid,
                split_layer=L,
            )
            for layer, (k_ext, _) in enumerate(result.extracted):
                err = float((keys[layer][:1] - k_ext).abs().max())
                if err > 1e-4 * max(1.0, float(k_ext.abs().max())):
                    raise RuntimeError(
                        f"importance probe: recomputed template keys of layer {layer} differ from the extracted KV "
                        f"by {err:.3g}; the diffusers attention processors changed — update sakura_core.precompute.importance.qkv_double/qkv_single"
                    )
    finally:
        for h in handles:
            h.remove()
    imp = (acc / len(times)).numpy()
    return imp, float(imp.sum(axis=-1).mean())


def evaluate(
    model: EditModel,
    bank: ImageBank | None = None,
    *,
    pairs: int = 32,
    seed: int = EVAL_SEED,
    steps: int = 8,
    probes: int = 4,
    reference_model: EditModel | None = None,
    on_pair: Callable[[int], None] | None = None,
    kv_mode: str = "single",
) -> dict:
    """Held-out evaluation of the KV edit path against the ground truth and trivial baselines.

    Each pair: the template's KV is extracted (server side), the edit runs with all template KV injected
    (``split_layer=0``, the phone path), ``steps`` Euler steps, noise seed = pair index.
    Baselines: return the template; return the user image; paste the user content into the region without
    recolouring (the ideal output of a model that composites but does not harmonise).
    ``importance_gini``: Gini of template-token importance (mean over layers, heads, probe times) per probe template,
    averaged over the first ``probes`` pairs; with ``reference_model`` (e.g. the random init) the same statistic
    for it is reported alongside.
    ``kv_mode``: ``"single"`` (template KV at the fixed reference time, reused by every step) or ``"per-step"``
    (template KV extracted at each step's own time, injected at that step).
    """
    if pairs < 1 or steps < 1 or probes < 0:
        raise ValueError(f"pairs and steps must be >= 1 and probes >= 0, got {pairs}, {steps}, {probes}")
    bank = bank or ImageBank.load()
    task = task_for(model.spec)
    rows, inside, outside = _score_pairs(model, bank, task, pairs, seed, steps, on_pair, kv_mode)

    result = {
        "psnr_db": float(np.mean(rows["model"]["psnr"])),
        "ssim": float(np.mean(rows["model"]["ssim"])),
        "baselines": {
            name: {"psnr_db": float(np.mean(rows[name]["psnr"])), "ssim": float(np.mean(rows[name]["ssim"]))}
            for name in ("template", "user_image", "naive_composite")
        },
        "region_psnr_db": {"inside": float(np.mean(inside)), "outside": float(np.mean(outside))},
        "importance_gini": None,
        "settings": {
            "pairs": pairs,
            "seed": seed,
            "steps": steps,
            "probes": probes,
            "prompt": EDIT_PROMPT,
            "path": "template KV extracted, then injected at every layer (split_layer=0)",
            "kv_mode": kv_mode,
        },
        "model": {"name": model.spec.name, "id": model.model_id, "weights": model.weights_source},
    }
    if probes:
        stats = _importance_stats(model, bank, task, seed, probes)
        result["importance_gini"] = stats["gini"]
        result["importance"] = stats
        if reference_model is not None:
            result["importance_reference"] = {
                "weights": reference_model.weights_source,
                **_importance_stats(reference_model, bank, task, seed, probes),
            }
    return result


def _score_pairs(model: EditModel, bank: ImageBank, task, pairs: int, seed: int, steps: int, on_pair, kv_mode: str):
    """Edit each held-out pair in ``kv_mode``; PSNR/SSIM of the model and the baselines against the target, and
    the model's PSNR inside and outside the edited region."""
    from sakura_core.runtime.denoise import run_edit
    from sakura_core.runtime.schedule import edit_times

    rows: dict[str, dict[str, list[float]]] = {
        k: {"psnr": [], "ssim": []} for k in ("model", "template", "user_image", "naive_composite")
    }
    inside, outside = [], []
    for i in range(pairs):
        p = make_pair(bank, task, seed, i)
        ref = model.template_tokens(p.template)
        kv: TemplateKV | PerStepTemplateKV
        if kv_mode == "per-step":
            kv = model.adapter.extract_per_step_kv(ref, model.spec.grid, edit_times(model, steps)[:-1])
        else:
            kv = model.adapter.extract_template_kv(ref, model.spec.grid)
        out = run_edit(
            model, p.user, EDIT_PROMPT, steps=steps, seed=i, split_layer=0, kv_source=kv, kv_mode=kv_mode
        ).image
        mask = region_mask(p.box, task.image_size)
        naive = np.where(mask[..., None], p.user, p.scene)
        cases: tuple[tuple[str, np.ndarray], ...] = (
            ("model", out),
            ("template", p.template),
            ("user_image", p.user),
            ("naive_composite", naive),
        )
        for name, img in cases:
            rows[name]["psnr"].append(psnr_db(img, p.target))
            rows[name]["ssim"].append(_ssim(img, p.target))
        inside.append(psnr_db(out[mask], p.target[mask]))
        outside.append(psnr_db(out[~mask], p.target[~mask]))
        if on_pair is not None:
            on_pair(i)
    return rows, inside, outside


def _importance_stats(m: EditModel, bank: ImageBank, task, seed: int, probes: int) -> dict:
    """Concentration of template-token importance over the first ``probes`` pairs (Gini, per layer, top-10% mass)."""
    ginis, layer_ginis, top10, share = [], [], [], []
    for i in range(probes):
        p = make_pair(bank, task, seed, i)
        imp, tshare = template_importance(m, p.template, p.user, p.target, seed=i)  # (L, H, n_ref)
        per_token = imp.mean(axis=(0, 1))
        ginis.append(gini(per_token))
        layer_ginis.append([gini(imp[layer].mean(axis=0)) for layer in range(imp.shape[0])])
        k = max(1, per_token.size // 10)
        top10.append(float(np.sort(per_token)[-k:].sum() / per_token.sum()))
        share.append(tshare)
    return {
        "gini": float(np.mean(ginis)),
        "gini_per_layer": np.mean(layer_ginis, axis=0).round(4).tolist(),
        "top10pct_mass": float(np.mean(top10)),
        "template_share": float(np.mean(share)),
    }

"""A template's output PSNR per level (the manifest's ``psnr_db``): every shard at one level, decoded, against the
exact-KV edit, over a few held-out edits (probe crops, generic prompts); the manifest keeps the lowest. Precompute
sets it; ``sakura bench heldout`` measures the same on edits precompute never saw."""

from __future__ import annotations

import numpy as np
import torch

from ..kv.template_codec import decode_kv, decode_per_step, level_chains
from ..models.kv_types import PerStepTemplateKV, TemplateKV

__all__ = [
    "PSNR_EDITS",
    "PSNR_METRIC",
    "PSNR_PROMPTS",
    "add_output_psnr",
    "decode_level",
    "level_psnr",
    "manifest_psnr_edits",
    "output_pixels",
]


#: Held-out edits a level's manifest ``psnr_db`` is the lowest PSNR of. More than one: a level's PSNR varies by a few
#: dB from edit to edit, so a floor picked on one edit has no margin on other users' edits (``sakura bench heldout``
#: checks the floor on edits precompute never saw).
PSNR_EDITS = 3

#: The prompts of the held-out edits (the first one's is generic).
PSNR_PROMPTS = ("a photo", "place it in the marked region", "change the colours")

PSNR_METRIC = (
    f"psnr_db: the lowest output PSNR (images in [-1, 1]) over {PSNR_EDITS} held-out edits (probe user images, generic "
    "prompts) with every shard at this level, each against the same edit with exact KV"
)


def add_output_psnr(
    model,
    kv: TemplateKV | PerStepTemplateKV,
    shards: list[dict],
    blobs: dict[str, bytes],
    seed: int,
    steps: int,
    shift: float,
    report,
):
    """Set ``psnr_db`` on every representation: per level name, all shards (every step's, in per-step mode) at that
    level, the lowest PSNR over the held-out edits of :func:`manifest_psnr_edits`."""
    names = list(dict.fromkeys(r["name"] for sh in shards for r in sh["representations"]))  # step 0's first
    psnr = level_psnr(model, kv, shards, blobs, names, manifest_psnr_edits(model, seed), steps, shift, report)
    for shard in shards:
        for r in shard["representations"]:
            r["psnr_db"] = round(min(psnr[r["name"]]), 3)


def manifest_psnr_edits(model, seed: int) -> list[tuple[np.ndarray, str, int]]:
    """The held-out edits (user image, prompt, seed) a manifest's ``psnr_db`` is the lowest PSNR of: probe crops
    drawn from ``seed``, each with its prompt (:data:`PSNR_PROMPTS`) and seed."""
    from .probes import sample_crop

    size = model.spec.image_size
    out = [(sample_crop(np.random.default_rng([seed, 3, 0x5A4B]), size), PSNR_PROMPTS[0], seed)]
    for k in range(1, PSNR_EDITS):
        rng = np.random.default_rng([seed, 3, 0x5A4B, k])
        out.append((sample_crop(rng, size), PSNR_PROMPTS[k % len(PSNR_PROMPTS)], seed + k))
    return out


def level_psnr(
    model,
    kv: TemplateKV | PerStepTemplateKV,
    shards: list[dict],
    blobs: dict[str, bytes],
    names: list[str],
    edits: list[tuple[np.ndarray, str, int]],
    steps: int,
    shift: float = 1.0,
    report=None,
) -> dict[str, list[float]]:
    """End-to-end output PSNR (dB, images in [-1, 1]) of every level in ``names`` (all shards of the template at
    that level, decoded from ``shards`` / ``blobs``) against the exact-KV edit, for each edit ``(user image, prompt,
    seed)`` of ``steps`` steps (per-step ``kv``: its own schedule): ``{name: [psnr per edit]}``."""
    from ..metrics import psnr_from_mse
    from ..runtime.denoise import run_edit

    report = report or (lambda stage, done, total: None)
    mode = "per-step" if isinstance(kv, PerStepTemplateKV) else "single"

    def pixels(source, edit) -> torch.Tensor:
        user, prompt, seed = edit
        run = run_edit(model, user, prompt, kv_source=source, steps=steps, seed=seed, shift=shift, kv_mode=mode)
        return output_pixels(model, run.tokens)

    exact = [pixels(kv, e) for e in edits]
    out: dict[str, list[float]] = {}
    for i, name in enumerate(names):
        report("psnr", i, len(names))
        approx = decode_level(kv, shards, blobs, name)
        out[name] = [
            psnr_from_mse(float(((pixels(approx, e) - x) ** 2).mean())) for e, x in zip(edits, exact, strict=True)
        ]
    report("psnr", len(names), len(names))
    return out


def output_pixels(model, tokens: torch.Tensor) -> torch.Tensor:
    """An edit's output as pixels in [-1, 1]: pixel-patch tokens clamped, or a latent model's VAE decode."""
    if hasattr(model, "decode_float"):
        return torch.from_numpy(model.decode_float(tokens)) * 2 - 1  # (S, S, 3) from [0, 1]
    return tokens.clamp(-1, 1)


def decode_level(kv, shards: list[dict], blobs: dict[str, bytes], name: str):
    """The whole template decoded at the level called ``name``, typed like ``kv`` (single or per-step)."""
    if isinstance(kv, PerStepTemplateKV):
        per_step = decode_per_step(shards, blobs, name, kv.num_steps)  # (steps, layers, 2, tokens, heads, head_dim)
        return PerStepTemplateKV(per_step, kv.model_id, kv.token_grid, kv.rope_layout, kv.timesteps)
    decoded = decode_kv(level_chains(shards, blobs, name)).float()  # (layers, 2, tokens, heads, head_dim)
    return TemplateKV(decoded, kv.model_id, kv.token_grid, kv.rope_layout, kv.ref_timestep)

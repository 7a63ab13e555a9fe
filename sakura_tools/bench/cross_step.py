"""Cross-step coding of per-step template KV (measurement): bytes per template at equal end-to-end PSNR.

Three stores of one template, each encoded with the SAKURA ladder (every level):

* ``single``: single-mode KV (one KV per layer) — the reference storage;
* ``per-step-independent``: each step's KV encoded on its own (S x the single-mode storage at a level);
* ``per-step-cross``: closed-loop prediction across steps — step 0 is coded as is, step s codes the residual
  ``KV_s - KV^_{s-1}`` against the *decoded* previous step at the same level (so errors do not accumulate); the
  residual is small (adjacent steps differ only through the timestep modulation), so the same bits buy a smaller
  error. Decoding step s needs steps 0..s at that level (they stream in that order anyway).

End-to-end PSNR: per-step edits (``run_edit(kv_mode="per-step")``) with every step's decoded KV against the same
edits with exact KV (single-mode edits for ``single``), averaged over the user images. Bytes at equal PSNR are
interpolated (log-bytes, linear in dB) on each store's level curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from sakura_core.kv import decode_kv, encode_kv, get_codec
from sakura_core.metrics import psnr_from_mse
from sakura_core.models.edit_model import EditModel, load_image
from sakura_core.models.kv_types import PerStepTemplateKV, TemplateKV
from sakura_core.precompute.attention_capture import capture_attention
from sakura_core.precompute.importance import importance_from_captures
from sakura_core.precompute.probes import ProbeConfig, make_probes
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.schedule import flow_timesteps

__all__ = ["CrossStepConfig", "bytes_at_psnr", "run_cross_step"]


@dataclass(frozen=True)
class CrossStepConfig:
    """Settings of the cross-step measurement.

    Attributes:
        template: template sample name or image path; users: the user images of the held-out edits.
        steps, shift: the per-step schedule; prompt: the edits' prompt; probes: importance probes per step.
    """

    template: str = "astronaut"
    users: tuple[str, ...] = ("coffee", "chelsea")
    steps: int = 4
    shift: float = 1.0
    prompt: str = "place it in the marked region"
    probes: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise ValueError(f"steps must be >= 2 for cross-step coding, got {self.steps}")
        if not self.users:
            raise ValueError("users must name at least one user image")
        if self.probes < 1:
            raise ValueError(f"probes must be >= 1, got {self.probes}")


def _importance(model: EditModel, kv: TemplateKV, packed: torch.Tensor, cfg: ProbeConfig):
    return importance_from_captures(capture_attention(model, kv, make_probes(model, packed, cfg)), kv, seed=cfg.seed)


def _chains_bytes(chains: list[list[bytes]]) -> int:
    return sum(len(b) for chain in chains for b in chain)


def _psnr(outs: list[torch.Tensor], exact: list[torch.Tensor]) -> float:
    mse = [float(((a.clamp(-1, 1) - b.clamp(-1, 1)) ** 2).mean()) for a, b in zip(outs, exact, strict=True)]
    return float(np.mean([psnr_from_mse(m) for m in mse]))


def run_cross_step(model: EditModel, config: CrossStepConfig, say: Callable[[str], None] = lambda s: None) -> dict:
    """Bytes and end-to-end PSNR of every SAKURA level for the three stores; see the module docstring."""
    size, grid = model.spec.image_size, model.spec.grid
    image = load_image(config.template, size)
    ref, packed = model.template_tokens(image), model.pack_image(image)
    times = flow_timesteps(config.steps, config.shift)
    per_step = model.adapter.extract_per_step_kv(ref, grid, times[:-1])
    single = model.adapter.extract_template_kv(ref, grid)
    base_cfg = ProbeConfig(num_probes=config.probes, seed=config.seed)
    imp_single = _importance(model, single, packed, base_cfg)
    kvs = [per_step.at_step(s) for s in range(config.steps)]
    imps = [_importance(model, kv, packed, replace(base_cfg, timesteps=(kv.ref_timestep,))) for kv in kvs]
    users = [load_image(u, size) for u in config.users]
    steps, shift, seed = config.steps, config.shift, config.seed

    def edits(kv, mode: str) -> list[torch.Tensor]:
        return [
            run_edit(model, u, config.prompt, kv_source=kv, kv_mode=mode, steps=steps, shift=shift, seed=seed).tokens
            for u in users
        ]

    exact_single, exact_per_step = edits(single, "single"), edits(per_step, "per-step")
    rows = []
    for level in get_codec("sakura").levels:
        chains = encode_kv("sakura", single, imp_single, level)
        dec = TemplateKV(decode_kv(chains).float(), single.model_id, grid, single.rope_layout, single.ref_timestep)
        rows.append(
            {
                "store": "single",
                "level": level,
                "bytes": _chains_bytes(chains),
                "psnr_db": _psnr(edits(dec, "single"), exact_single),
            }
        )
        for store in ("per-step-independent", "per-step-cross"):
            nbytes, dec_ps = _encode_per_step(per_step, imps, level, cross=store.endswith("cross"))
            rows.append(
                {
                    "store": store,
                    "level": level,
                    "bytes": nbytes,
                    "psnr_db": _psnr(edits(dec_ps, "per-step"), exact_per_step),
                }
            )
        say(f"level {level}: " + ", ".join(f"{r['store']} {r['bytes']} B {r['psnr_db']:.2f} dB" for r in rows[-3:]))
    fp16 = {"single": single.kv.numel() * 2, "per-step": per_step.kv.numel() * 2}
    return {
        "config": {**config.__dict__, "users": list(config.users)},
        "fp16_bytes": fp16,
        "rows": rows,
        "summary": _summary(rows),
    }


def _encode_per_step(per_step: PerStepTemplateKV, imps: list, level: int, cross: bool):
    """(bytes, decoded PerStepTemplateKV) of every step at ``level``: independently, or closed-loop cross-step."""
    nbytes, decoded = 0, []
    prev: torch.Tensor | None = None  # the step before's decoded KV
    for s, imp in enumerate(imps):
        kv = per_step.at_step(s)
        residual = prev if cross else None  # closed loop: coded against the step before's decoded KV
        target = (
            TemplateKV(kv.kv - residual, kv.model_id, kv.token_grid, kv.rope_layout, kv.ref_timestep)
            if residual is not None
            else kv
        )
        chains = encode_kv("sakura", target, imp, level)
        nbytes += _chains_bytes(chains)
        step_kv = decode_kv(chains).float()  # (layers, 2, tokens, heads, head_dim)
        prev = step_kv + residual if residual is not None else step_kv
        decoded.append(prev)
    out = PerStepTemplateKV(
        torch.stack(decoded), per_step.model_id, per_step.token_grid, per_step.rope_layout, per_step.timesteps
    )
    return nbytes, out


def bytes_at_psnr(curve: list[tuple[int, float]], psnr_db: float) -> float | None:
    """Bytes a store needs for ``psnr_db``: log-bytes interpolated linearly in dB between its levels; ``None``
    outside the curve's range."""
    pts = sorted(curve, key=lambda p: p[1])
    for (b0, p0), (b1, p1) in zip(pts, pts[1:], strict=False):
        if p0 <= psnr_db <= p1:
            f = 0.0 if p1 == p0 else (psnr_db - p0) / (p1 - p0)
            return math.exp(math.log(b0) + f * (math.log(b1) - math.log(b0)))
    return None


def _summary(rows: list[dict]) -> list[dict]:
    """At each single-mode level's PSNR: bytes of each per-step store, as a multiple of the single-mode bytes."""
    curves = {s: [(r["bytes"], r["psnr_db"]) for r in rows if r["store"] == s] for s in {r["store"] for r in rows}}
    out = []
    for nbytes, psnr in curves["single"]:
        entry = {"psnr_db": round(psnr, 2), "single_bytes": nbytes}
        for store in ("per-step-independent", "per-step-cross"):
            b = bytes_at_psnr(curves[store], psnr)
            entry[f"{store}_x_single"] = None if b is None else round(b / nbytes, 2)
        out.append(entry)
    return out

"""Whole templates for the page's template decoder (``phone_web/src/template.js``): the demo model (seeded random
weights) precomputed as ``sakura precompute`` does — a single-mode template and a cross-step per-step one (reuse,
residuals with the predictor, closed-loop twins) — with Python's ``decode_template`` at every representation name:
the SHA-256 of the float16 KV, (steps, layers, 2, tokens, heads, head_dim)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from sakura_core.kv.template_codec import decode_template
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.precompute import ProbeConfig, precompute_template

__all__ = ["write_template_vectors"]


def write_template_vectors(out: Path) -> dict:
    """``out/templates.json`` and ``out/blobs/<digest>``; returns the index."""
    torch.set_num_threads(1)
    model = load_demo_model(weights=None)
    image = load_image("astronaut", model.spec.image_size)
    (out / "blobs").mkdir(parents=True, exist_ok=True)
    templates = []
    for mode, steps in (("single", None), ("per-step", 2)):
        extra = {} if steps is None else {"steps": steps, "shift": 1.0}
        t = precompute_template(
            model,
            image,
            f"web-{mode}",
            probes=ProbeConfig(num_probes=2),
            held_out_probes=1,
            psnr_steps=0,
            kv_mode=mode,
            **extra,
        )
        for digest, blob in t.blobs.items():
            (out / "blobs" / digest).write_bytes(blob)
        names = sorted({r["name"] for s in t.manifest["shards"] for r in s["representations"]})
        expect = {}
        for name in names:
            kv = decode_template(t.manifest, t.blobs, name).kv  # float32 from float16: exact
            expect[name] = hashlib.sha256(kv.to(torch.float16).contiguous().numpy().tobytes()).hexdigest()
        templates.append({"name": mode, "manifest": t.manifest, "expect": expect})
    index = {"format": "sakura-template-vectors", "version": 1, "templates": templates}
    (out / "templates.json").write_text(json.dumps(index))
    return index

"""Test fixtures: synthetic templates (random shard blobs and a well-formed manifest) for the store, server, client
and agent tests.

The blobs are seeded random bytes (not KV): they exercise storage, serving, caching and fetching without the
codec. ``synthetic_precompute`` has the signature of ``sakura_core.precompute.precompute_template`` so the write path can
be tested with it too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from cloud_server.store import Store, validate_template_id
from sakura_core.kv.manifest import MANIFEST_VERSION

__all__ = [
    "SyntheticModel",
    "SyntheticTemplate",
    "build_cross_step_synthetic",
    "build_synthetic",
    "make_synthetic_template",
    "synthetic_precompute",
]


@dataclass(frozen=True)
class SyntheticTemplate:
    """``manifest`` + ``blobs`` (digest -> bytes), like the codec's ``PrecomputedTemplate``."""

    manifest: dict
    blobs: dict[str, bytes]


@dataclass(frozen=True)
class SyntheticModel:
    """Stands in for a model where only ``model_id`` matters (no ``spec``: images are not resized)."""

    model_id: str = "0" * 64


def build_synthetic(
    template_id: str,
    *,
    model_id: str,
    num_layers: int = 4,
    level_bytes: tuple[int, ...] = (1024, 4096, 8192),
    token_grid: tuple[int, int] = (16, 16),
    seed: int = 0,
    salt: bytes = b"",
) -> SyntheticTemplate:
    """One shard per layer with one representation per entry of ``level_bytes``.

    Levels ascend in size and quality as in the codec's manifests: the last level is the exact one (distortion 0).
    """
    validate_template_id(template_id)
    rng = np.random.default_rng([seed, *hashlib.sha256(template_id.encode() + salt).digest()[:8]])
    blobs: dict[str, bytes] = {}
    shards = []
    top = len(level_bytes) - 1
    for layer in range(num_layers):
        reps = []
        for level, nbytes in enumerate(level_bytes):
            blob = rng.integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()
            digest = hashlib.sha256(blob).hexdigest()
            blobs[digest] = blob
            reps.append(
                {
                    "level": level,
                    "name": f"synthetic-{level}",
                    "codec": "synthetic",
                    "bytes": nbytes,
                    "total_bytes": nbytes,
                    "distortion": round(0.01 * (top - level), 4),
                    "digest": digest,
                    "requires": [],
                }
            )
        shards.append({"layers": [layer, layer], "representations": reps})
    manifest = {
        "version": MANIFEST_VERSION,
        "model_id": model_id,
        "template_id": template_id,
        "token_grid": list(token_grid),
        "rope_layout": "synthetic",
        "num_layers": num_layers,
        "heads": 1,
        "head_dim": 1,
        "codec": "synthetic",
        "distortion_metric": "synthetic",
        "shards": shards,
    }
    return SyntheticTemplate(manifest, blobs)


def build_cross_step_synthetic(
    template_id: str, *, model_id: str, steps: int = 2, num_layers: int = 2, nbytes: int = 2048
) -> SyntheticTemplate:
    """A per-step manifest coded across steps, as the codec's: step 0's shards self-contained (a base and fp16), each
    shard of step s >= 1 a zero-byte ``reuse`` rung and a residual against step s-1's fp16 (``ref``), then its own
    fp16. Random blobs (not KV): for the schema, the stores and the sources, not the codec."""
    rng = np.random.default_rng(list(hashlib.sha256(template_id.encode()).digest()[:8]))
    blobs: dict[str, bytes] = {}

    def rep(level: int, name: str, size: int, distortion: float, ref: dict | None = None) -> dict:
        blob = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        digest = hashlib.sha256(blob).hexdigest()
        blobs[digest] = blob
        out = {
            "level": level,
            "name": name,
            "codec": "fp16" if name == "fp16" else "synthetic",
            "bytes": size,
            "total_bytes": size,
            "distortion": distortion,
            "digest": digest,
            "requires": [],
        }
        return out if ref is None else {**out, "ref": ref}

    shards, exact = [], {}
    for step in range(steps):
        for layer in range(num_layers):
            if step == 0:
                reps = [rep(0, "synthetic-0", nbytes, 0.05), rep(1, "fp16", 4 * nbytes, 0.0)]
            else:
                ref = {"step": step - 1, "digest": exact[(step - 1, layer)]}
                reuse = {
                    "level": 0,
                    "name": "reuse",
                    "codec": "reuse",
                    "bytes": 0,
                    "total_bytes": 0,
                    "distortion": 0.2,
                    "digest": None,
                    "requires": [],
                    "ref": {"mode": "reuse", **ref},
                }
                reps = [
                    reuse,
                    rep(1, "synthetic-0", nbytes // 4, 0.05, {"mode": "residual", **ref}),
                    rep(2, "fp16", 4 * nbytes, 0.0),
                ]
            exact[(step, layer)] = reps[-1]["digest"]
            shards.append({"step": step, "layers": [layer, layer], "representations": reps})
    t = build_synthetic(template_id, model_id=model_id, num_layers=num_layers)
    schedule = {
        "steps": steps,
        "timesteps": [1 - s / steps for s in range(steps)],
        "shift": 1.0,
        "guidance": None,
        "sampler": "flow-euler",
    }
    return SyntheticTemplate({**t.manifest, "kv_mode": "per-step", "schedule": schedule, "shards": shards}, blobs)


def make_synthetic_template(store: Store, template_id: str, *, model_id: str, **kwargs) -> dict:
    """Build a synthetic template (see ``build_synthetic``), store its shards, then its manifest; return it."""
    t = build_synthetic(template_id, model_id=model_id, **kwargs)
    for digest, blob in t.blobs.items():
        store.put_shard(digest, blob)
    store.put_manifest(template_id, t.manifest)
    return t.manifest


def synthetic_precompute(
    model,
    template_image,
    template_id,
    *,
    codec="synthetic",
    shard_layers=1,
    seed=0,
    progress=None,
    store_profile=None,
):
    """A stand-in for ``precompute_template``: blobs derived from the image bytes, so different images differ. Its
    one-level templates have no rungs to leave out, so ``store_profile`` (which the CLI always passes) changes
    nothing."""
    salt = hashlib.sha256(np.ascontiguousarray(template_image).tobytes()).digest()
    if progress is not None:
        progress("encode", 0, 1)
    t = build_synthetic(template_id, model_id=model.model_id, seed=seed, salt=salt)
    if progress is not None:
        progress("encode", 1, 1)
    return t

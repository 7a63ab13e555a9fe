"""The cross-step rows of ``sakura bench decode``: SAKURA's residual rungs (a per-step template's step s >= 1,
coded against step s - 1) decoded on one thread at phone scale, their reference added as the runtime adds it.

A step-1 layer and its step-0 reference (the demo template's per-step KV, or Gaussian K/V with a small step change)
are tiled to the phone-scale shard as ``sakura bench decode`` tiles one layer; the residual input is
``KV_1 - a * KV_0`` with the per-channel predictor ``a`` fitted as precompute fits it (:mod:`..kv.predictor`), coded
with step 0's rate-distortion thresholds (as ``precompute --kv-mode per-step`` codes its residuals).
Two families, as a per-step manifest carries them: the open-loop residual chain (``sakura-lj``, progressive: the
chain base..level decoded) and the closed-loop twin (``sakura-lj+cl``: one direct blob; its data here is the same
residual: the twin's residual is against the decoded track, of the same statistics, and decode time follows the
bytes and the level). Each decode includes the reference add (:func:`~sakura_core.kv.chain.apply_reference`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .phone_scale import decode_row, level_chain, phone_scale_input
from .timing import best_time_s

__all__ = ["REF_DIGEST", "gaussian_steps", "measure_residual_decode"]

#: the reference's identity in the bench's headers (a residual names the digest of its reference shard)
REF_DIGEST = "ab" * 32


def gaussian_steps(tokens: int, heads: int, head_dim: int, change: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Two steps of Gaussian K/V (2, tokens, heads, head_dim): step 1 = step 0 scaled per channel plus ``change`` of
    fresh noise (a step's KV differs from the last one by the timestep modulation and an update; uniform Gaussian data
    is all or nothing under step 0's thresholds: at 0.1 every residual rung but the top one is empty, at 0.5 the
    rungs from l3 up carry bytes)."""
    rng = np.random.default_rng(1)
    shape = (2, tokens, heads, head_dim)
    s0 = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.8)
    gain = 1.0 + 0.05 * rng.standard_normal((2, 1, heads, head_dim)).astype(np.float32)
    s1 = s0 * gain + np.float32(change) * rng.standard_normal(shape, dtype=np.float32)
    return s0, s1


def _residual_input(step0: np.ndarray, step1: np.ndarray, shard: dict):
    """(residual ShardInput, DecodedReference, fp16 bytes): ``step1 - a * step0`` tiled to ``shard``."""
    from dataclasses import replace

    from sakura_core.kv.chain import DecodedReference
    from sakura_core.kv.predictor import fit_scale_codes, scales_from_codes
    from sakura_core.kv.sakura_codec import level_slopes

    ref, fp16_bytes = phone_scale_input(step0, shard)
    cur, _ = phone_scale_input(step1, shard)
    ref_kv = np.stack([ref.k, ref.v])  # (2, layers, tokens, heads, head_dim)
    cur_kv = np.stack([cur.k, cur.v])
    codes = fit_scale_codes(ref_kv, cur_kv)
    _, n_l, _, h, d = ref_kv.shape
    a = scales_from_codes(codes, n_l, h, d)  # (2, layers, 1, heads, head_dim)
    ref16 = ref_kv.astype(np.float16)
    res = cur_kv - a * ref16.astype(np.float32)  # against the reference as the decoder holds it (float16)
    meta = replace(cur.meta, step=1, ref_step=0, ref_digest=REF_DIGEST, ref_scale=codes)
    # the rate-distortion thresholds of step 0's own shard (a per-step template's residuals use step 0's: a residual
    # with less energy than its step takes fewer bytes at the same distortion), no token dropping
    inp = replace(
        cur,
        k=np.ascontiguousarray(res[0]),
        v=np.ascontiguousarray(res[1]),
        meta=meta,
        k_drop=None,
        level_slopes=level_slopes([ref]),
    )
    return inp, DecodedReference(0, REF_DIGEST, ref16[0], ref16[1]), fp16_bytes


def measure_residual_decode(
    step0: np.ndarray, step1: np.ndarray, shard: dict, repeats: int, target_mbit_s: float
) -> list[dict]:
    """One row per (family, level) of SAKURA's residual rungs: wire bytes, ratio vs fp16, decode seconds (best of
    ``repeats`` after one untimed decode, the reference add included), fp16 MB/s and wire Mbit/s."""
    from sakura_core.kv.chain import decode_chain
    from sakura_core.kv.codec_registry import get_codec

    inp, ref, fp16_bytes = _residual_input(step0, step1, shard)
    codec = get_codec("sakura")
    rows = []
    families = (
        ("residual", lambda lv: codec.encode(inp, level_chain(codec, lv))),
        ("closed", lambda lv: codec.direct_blobs(inp, [lv])),
    )
    for family, encode in families:
        for level in codec.levels:
            blobs = encode(level)
            wire = sum(len(b) for b in blobs)
            seconds = best_time_s(partial(decode_chain, blobs, ref), repeats, warmup=True)
            name = codec.level_name(level) + ("+cl" if family == "closed" else "")
            rows.append(decode_row(f"sakura-{family}", level, name, wire, fp16_bytes, seconds, target_mbit_s))
    return rows

"""The cross-step predictor of a residual shard: per (K or V, layer, head, channel) a scale ``a`` on the reference.

A cross-step residual of step s codes ``KV_s - a * KV_r`` (per channel ``a``, least squares over the shard's tokens
on the exact KV, mean removed: the per-channel offset is the residual's own mean, which the codec already carries);
it decodes to ``a * (the reference as decoded) + the decoded residual``. Adjacent steps differ through the timestep
modulation, which scales channels as much as it shifts them: the scale removes residual energy that the mean alone
leaves, so the residual costs fewer bytes at the same distortion.

Wire form: one int8 code per channel in the residual's base blob header (``ShardHeader.ref_scale``, shape
(2, layers, heads, head_dim) = K then V): ``a = 1 + code / SCALE_DENOM``, so ``a`` in [0.5, 1.496] in steps of
1/256 (a scale outside is clipped; the residual takes the rest). No scale (``None``) = plain difference (``a = 1``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SCALE_DENOM", "fit_scale_codes", "scale_codes_size", "scales_from_codes"]

SCALE_DENOM = 256.0


def scale_codes_size(layers: int, heads: int, head_dim: int) -> int:
    """Bytes of a shard's scale codes: one int8 per (K or V, layer, head, channel)."""
    return 2 * layers * heads * head_dim


def fit_scale_codes(ref: np.ndarray, cur: np.ndarray) -> bytes:
    """Least-squares per-channel scale of ``cur`` on ``ref`` (both (2, layers, tokens, heads, head_dim) float, the
    exact KV of the reference step and of this step), as int8 codes (K then V, layer, head, channel)."""
    ref = np.asarray(ref, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    rc = ref - ref.mean(axis=2, keepdims=True)
    cc = cur - cur.mean(axis=2, keepdims=True)
    den = (rc * rc).sum(axis=2)
    a = np.where(den > 0, (rc * cc).sum(axis=2) / np.where(den > 0, den, 1.0), 1.0)  # (2, layers, heads, head_dim)
    codes = np.clip(np.rint((a - 1.0) * SCALE_DENOM), -128, 127).astype(np.int8)
    return codes.tobytes()


def scales_from_codes(codes: bytes, layers: int, heads: int, head_dim: int) -> np.ndarray:
    """The scales ``a`` of the codes: float32 (2, layers, 1, heads, head_dim), broadcastable over tokens."""
    c = np.frombuffer(codes, dtype=np.int8, count=scale_codes_size(layers, heads, head_dim))
    return (1.0 + c.astype(np.float32) / np.float32(SCALE_DENOM)).reshape(2, layers, 1, heads, head_dim)

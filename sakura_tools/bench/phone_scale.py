"""Phone-scale inputs of the benchmarks: decode throughput per codec level measured on a phone-scale shard (the
regime maps over link rate x device speed are in :mod:`.regime`).

Decode speed depends on the shard size (per-call overheads dominate the demo's ~100 KB shards), so each measured
level is re-encoded on one phone-scale layer — the demo template's real K/V tiled to ``tokens`` x ``heads*head_dim``
(same value statistics, phone size) — and its decode timed on one thread (best of ``repeats``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PHONE_SHARD", "decode_row", "level_chain", "phone_scale_input"]

PHONE_SHARD = {"tokens": 1024, "heads": 16, "head_dim": 64}  # 4 MiB of fp16 K+V: one phone-class DiT layer


def _tile(x: np.ndarray, tokens: int, channels: int) -> np.ndarray:
    """(tokens0, heads0, hd0) -> (tokens, channels) by tiling (values keep their statistics)."""
    flat = x.reshape(x.shape[0], -1)  # (tokens0, channels0)
    reps = (-(-tokens // flat.shape[0]), -(-channels // flat.shape[1]))
    return np.tile(flat, reps)[:tokens, :channels]


def phone_scale_input(layer_kv: np.ndarray, shard: dict | None = None):
    """``(ShardInput, fp16 bytes)`` of one phone-scale layer: ``layer_kv`` (2, tokens, heads, head_dim) of one demo
    layer (K, V) tiled to ``shard`` (default :data:`PHONE_SHARD`); uniform importance."""
    from sakura_core.kv.codec_registry import ShardInput, ShardMeta

    s = {**PHONE_SHARD, **(shard or {})}
    t, h, d = s["tokens"], s["heads"], s["head_dim"]
    k = _tile(np.asarray(layer_kv[0], dtype=np.float32), t, h * d).reshape(1, t, h, d)  # (1, tokens, heads, hd)
    v = _tile(np.asarray(layer_kv[1], dtype=np.float32), t, h * d).reshape(1, t, h, d)
    meta = ShardMeta("0" * 64, "phone-scale", "flux2-ref-t10", 0, (t // 32, 32), 24)
    return ShardInput(np.ascontiguousarray(k), np.ascontiguousarray(v), meta), 2 * k.size * 2


def level_chain(codec, level: int) -> list[int]:
    """The levels a chain up to ``level`` of ``codec`` encodes (a progressive codec: every level up to it)."""
    return [lv for lv in codec.levels if lv <= level] if codec.progressive else [level]


def decode_row(
    codec: str, level: int, name: str, wire: int, fp16_bytes: int, seconds: float, target_mbit_s: float
) -> dict:
    """One row of ``sakura bench decode``: wire bytes, ratio vs fp16, decode seconds, fp16 MB/s, wire Mbit/s and
    whether that meets ``target_mbit_s``."""
    mbit = 8 * wire / seconds / 1e6
    return {
        "codec": codec,
        "level": level,
        "name": name,
        "wire_bytes": wire,
        "ratio_vs_fp16": fp16_bytes / wire,
        "decode_s": seconds,
        "fp16_mb_s": fp16_bytes / seconds / 1e6,
        "wire_mbit_s": mbit,
        "meets_target": mbit >= target_mbit_s,
    }

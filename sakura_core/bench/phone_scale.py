"""Phone-scale inputs of the e2e simulation: decode throughput per codec level measured on a phone-scale shard, and
the regime map over link rate x device speed.

Decode speed depends on the shard size (per-call overheads dominate the demo's ~100 KB shards), so each measured
level is re-encoded on one phone-scale layer — the demo template's real K/V tiled to ``tokens`` x ``heads*head_dim``
(same value statistics, phone size) — and its decode timed on one thread (best of ``repeats``).
"""

from __future__ import annotations

import numpy as np

from ..fetch.traces import Trace
from ..policy.policies import POLICIES
from ..runtime.oracle import fixed_split_policy
from ..runtime.profiles import DeviceProfile
from ..runtime.simulate import kv_mode_view, simulate

__all__ = ["PHONE_SHARD", "decode_row", "format_regime", "level_chain", "phone_scale_input", "regime_map"]

PHONE_SHARD = {"tokens": 1024, "heads": 16, "head_dim": 64}  # 4 MiB of fp16 K+V: one phone-class DiT layer


def _tile(x: np.ndarray, tokens: int, channels: int) -> np.ndarray:
    """(tokens0, heads0, hd0) -> (tokens, channels) by tiling (values keep their statistics)."""
    flat = x.reshape(x.shape[0], -1)  # (tokens0, channels0)
    reps = (-(-tokens // flat.shape[0]), -(-channels // flat.shape[1]))
    return np.tile(flat, reps)[:tokens, :channels]


def phone_scale_input(layer_kv: np.ndarray, shard: dict | None = None):
    """``(ShardInput, fp16 bytes)`` of one phone-scale layer: ``layer_kv`` (2, tokens, heads, head_dim) of one demo
    layer (K, V) tiled to ``shard`` (default :data:`PHONE_SHARD`); uniform importance."""
    from ..kv.codec_registry import ShardInput, ShardMeta

    s = {**PHONE_SHARD, **(shard or {})}
    t, h, d = s["tokens"], s["heads"], s["head_dim"]
    k = _tile(np.asarray(layer_kv[0], dtype=np.float32), t, h * d).reshape(1, t, h, d)  # (1, tokens, heads, hd)
    v = _tile(np.asarray(layer_kv[1], dtype=np.float32), t, h * d).reshape(1, t, h, d)
    meta = ShardMeta("0" * 64, "phone-scale", "flux2-ref-t10", 0, (t // 32, 32), 24)
    return ShardInput(np.ascontiguousarray(k), np.ascontiguousarray(v), meta), 2 * k.size * 2


def level_chain(codec, level: int) -> list[int]:
    """The levels a chain up to ``level`` of ``codec`` encodes (a progressive codec: every level up to it)."""
    return [lv for lv in codec.levels if lv <= level] if codec.progressive else [level]


def decode_row(codec: str, level: int, name: str, wire: int, fp16_bytes: int, seconds: float, target_mbit_s: float
               ) -> dict:  # fmt: skip
    """One row of ``sakura bench decode``: wire bytes, ratio vs fp16, decode seconds, fp16 MB/s, wire Mbit/s and
    whether that meets ``target_mbit_s``."""
    mbit = 8 * wire / seconds / 1e6
    return {"codec": codec, "level": level, "name": name, "wire_bytes": wire, "ratio_vs_fp16": fp16_bytes / wire,
            "decode_s": seconds, "fp16_mb_s": fp16_bytes / seconds / 1e6, "wire_mbit_s": mbit,
            "meets_target": mbit >= target_mbit_s}  # fmt: skip


def regime_map(
    profile: DeviceProfile, ladders: dict, floors: dict, tflops: list[float], mbits: list[float], kv_mode="single"
) -> dict:
    """Per (device TFLOP/s, link Mbit/s): latency of compute on the device (on-device-cached; in per-step mode the
    template at every step), fetch every shard at the floor level (split 0) and the best hybrid split; the winner
    and its margin over the next best. ``ladders`` match ``kv_mode_view(profile, kv_mode)``."""
    base = profile
    kv_mode_view(profile, kv_mode)  # validates kv_mode; ladders have steps x layers shards in per-step mode
    L = profile.model.layers
    names = ["compute", "fetch", "hybrid"]
    cells = []
    for tf in tflops:
        prof = profile.with_speed(tf * 1e12)
        row = []
        for mbit in mbits:
            trace = Trace.constant(mbit)
            lat = [
                simulate(POLICIES["on-device-cached"](), trace, prof, ladders, floors).latency_s,
                simulate(fixed_split_policy(0), trace, prof, ladders, floors).latency_s,
                min(simulate(fixed_split_policy(k), trace, prof, ladders, floors).latency_s for k in range(1, L)),
            ]
            order = sorted(range(3), key=lat.__getitem__)
            row.append({"latency_s": lat, "winner": names[order[0]], "margin": lat[order[1]] / lat[order[0]]})
        cells.append(row)
    return {"tflop_per_s": list(tflops), "mbit_per_s": list(mbits), "cells": cells, "geometry": base.model.name,
            "kv_mode": kv_mode}  # fmt: skip


def format_regime(regime: dict) -> str:
    """Rows: device TFLOP/s; columns: link Mbit/s; cell: winner (C compute, F fetch, H hybrid) x margin."""
    mb = regime["mbit_per_s"]
    lines = [
        f"regime map ({regime['geometry']}, {regime.get('kv_mode', 'single')} KV): C = compute on device, "
        "F = fetch all, H = hybrid split; x = latency of the next best / the winner's",
        format("TFLOP/s | Mbit/s", ">17") + "".join(f"{b:>10g}" for b in mb),
    ]
    for tf, row in zip(regime["tflop_per_s"], regime["cells"], strict=True):
        lines.append(f"{tf:>17g}" + "".join(f"{c['winner'][0].upper():>3}{c['margin']:>6.2f}x" for c in row))
    return "\n".join(lines)

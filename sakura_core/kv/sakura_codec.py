"""The SAKURA codec: importance-aware, rate-distortion-allocated, progressive KV compression.

Quantisation. Every value gets an 8-bit *fine code*, keys and values alike per channel (min/max over the shard's
tokens, one range per (K or V, layer, head, channel): per-channel value ranges give less value error than per-token
ranges at 2-4 bits on the trained demo model, and need no per-token side information). A
unit — one (K or V, layer, token, head) row of ``head_dim`` values — is represented at a width ``w`` in
{0, 1, 2, 3, 4, 5, 6, 8} by the top ``w`` bits of its codes, reconstructed at the centre of the bin they select.
Width 0 drops the unit: it is reconstructed as the per-channel mean (so it still attends, at an average logit with
an average value).

Allocation. Each unit's distortion at each width is the squared reconstruction error weighted by the attention
sensitivity from :mod:`sakura_core.precompute.importance` (keys: per channel; values: per unit; a dropped key: the exact
effect of its moved logit) — attention-output squared error, the same unit in every layer. The lower convex
hull of each unit's (bits, distortion) points gives upgrade segments; sorted by slope (distortion saved per bit)
they form one order, and level ``j`` takes every segment worth at least a slope threshold ``lambda_j``. The
thresholds are set once per template (:func:`prepare_sakura`) so that level ``j`` averages ``level_bits[j]`` raw
bits per value over the whole template — bits go to the layers that need them — while every shard is still
encoded on its own. (Without weights, each shard gets ``level_bits[j]`` itself.) Every level is a prefix of the
same order, so level ``j + 1`` only adds bits to level ``j``: the ladder is progressive.

Bitstream. Level ``j + 1``'s blob carries, for each upgraded unit, the next ``w_new - w_old`` bits of its codes
(grouped by how many bits were added, packed whole symbols per byte, one zstd frame per group) and the width
deltas. The base blob also carries the per-channel ranges and the means used for dropped units. Decoding a chain
base..j equals decoding the direct level-j blob bit for bit.

Sections of a level blob: ``[head, group_1, ..., group_n]``; ``head`` = zstd(meta (base only: float16
(3, 2, layers, heads, head_dim) = channel minima, maxima, means of K and V; a cross-step residual with a predictor
scale in its header: float16 means + uint8 log codes of the distances to the minima and maxima, (2, 2, layers, heads,
head_dim), see ``sakura_decode._SPAN``) | width deltas (uint8, (2, layers, tokens, heads))), ``group_m`` =
zstd(packed symbols).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .codec_parts import check_levels, f16_ceil, f16_floor, zstd_compress
from .codec_registry import Codec, ShardInput, register_codec
from .container import pack_shard, shard_digest
from .sakura_decode import (
    _W,
    WIDTHS,
    _fine_codes,
    _finish,
    _pack_symbols,
    _step,
    _transition_groups,
    compact_ranges,
    decode_sakura,
    span_codes,
)
from .sakura_dequant import Params, reconstruct  # the encoder measures exactly what the decoder will output

__all__ = [
    "WIDTHS",
    "SakuraConfig",
    "allocate_widths",
    "decode_sakura",
    "encode_sakura",
    "encode_sakura_direct",
    "level_slopes",
    "prepare_sakura",
]

#: Bit widths a unit can take; the codec stores width *indices* into this tuple.


@dataclass(frozen=True)
class SakuraConfig:
    """Ladder and entropy-stage settings of the SAKURA codec.

    Attributes:
        level_bits: bit budget of each level in raw bits per K/V value (before zstd; fp16 = 16), strictly
            increasing; one level per entry. Default: 9 levels, cheap rungs from 1.2 bits up, finer rungs around
            35-40 dB output PSNR (1.5, 1.75, 2.0, 2.4), then 3.0, 4.5 and a top one (9.0) with room to put every
            unit at 8 bits. zstd then shrinks each level further (`sakura bench codec`).
        uniform_mix: the allocation weighs each unit by ``importance + uniform_mix * mean importance`` (per layer
            and tensor): 0 trusts the probe-estimated sensitivities fully, large values approach a uniform
            allocation (a guard against requests unlike the probes). 0 by default: on the demo weights every larger
            mix lowered the output PSNR at equal bytes.
        zstd_level: zstd compression level of the entropy stage (1..22; higher = smaller, slower encode; decode
            speed barely changes).
    """

    level_bits: tuple[float, ...] = (1.2, 1.33, 1.5, 1.75, 2.0, 2.4, 3.0, 4.5, 9.0)
    uniform_mix: float = 0.0
    zstd_level: int = 19

    def __post_init__(self) -> None:
        bits = tuple(float(b) for b in self.level_bits)
        if len(bits) < 1 or any(b <= 0 or b > 16 for b in bits) or list(bits) != sorted(set(bits)):
            raise ValueError(
                f"level_bits must be strictly increasing values in (0, 16] bits per value, got {self.level_bits}"
            )
        if not (math.isfinite(self.uniform_mix) and self.uniform_mix >= 0):
            raise ValueError(f"uniform_mix must be a finite number >= 0, got {self.uniform_mix}")
        if not 1 <= self.zstd_level <= 22:
            raise ValueError(f"zstd_level must be in [1, 22], got {self.zstd_level}")

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(len(self.level_bits)))


DEFAULT_CONFIG = SakuraConfig()


# ---- encoder --------------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    params: Params
    meta: bytes  # a base blob's per-channel ranges and means (sakura_decode._base_params reads them)
    fine: np.ndarray  # (2, layers, tokens, heads, head_dim) uint8
    level_idx: list[np.ndarray]  # per level: (2, layers, tokens, heads) uint8 width indices


def _hull_segments(dist: np.ndarray, rate_bits: np.ndarray):
    """Upgrade segments on each unit's lower convex hull of (bits, distortion), best slope first.

    Returns (unit, to_width_index, slope, bits), all sorted by decreasing slope (distortion saved per bit); a unit's
    own segments keep their order, so any prefix is a valid allocation.
    """
    n_u, n_w = dist.shape
    rows = np.arange(n_u)
    cur = np.zeros(n_u, dtype=np.int64)
    seg_unit, seg_to, seg_slope, seg_bits, seg_iter = [], [], [], [], []
    cols = np.arange(n_w)[None, :]
    for it in range(n_w - 1):
        d_cur = dist[rows, cur][:, None]
        r_cur = rate_bits[rows, cur][:, None]
        d_bits = rate_bits - r_cur
        valid = (cols > cur[:, None]) & (d_bits > 0)
        slope = np.where(valid, (d_cur - dist) / np.where(d_bits > 0, d_bits, 1.0), -np.inf)
        best = np.argmax(slope, axis=1)
        best_slope = slope[rows, best]
        ok = best_slope > 0
        if not ok.any():
            break
        seg_unit.append(rows[ok])
        seg_to.append(best[ok])
        seg_slope.append(best_slope[ok])
        seg_bits.append(d_bits[rows, best][ok])
        seg_iter.append(np.full(int(ok.sum()), it))
        cur = np.where(ok, best, cur)
    if not seg_unit:
        empty = np.zeros(0)
        return empty.astype(np.int64), empty.astype(np.int64), empty, empty
    unit, to = np.concatenate(seg_unit), np.concatenate(seg_to)
    slope, bits = np.concatenate(seg_slope), np.concatenate(seg_bits)
    order = np.lexsort((np.concatenate(seg_iter), -slope))
    return unit[order], to[order], slope[order], bits[order]


def allocate_widths(
    dist: np.ndarray,
    rate_bits: np.ndarray,
    budgets_bits: Sequence[float] | None = None,
    slopes: Sequence[float] | None = None,
) -> list[np.ndarray]:
    """Nested rate-distortion allocation of one width index per unit, one allocation per budget (or slope).

    Args:
        dist: (units, widths) distortion of each unit at each width.
        rate_bits: (units, widths) bits each unit costs at each width (0 at index 0, increasing).
        budgets_bits: increasing total bit budgets: each allocation is the longest best-slope-first prefix that fits.
        slopes: alternatively, decreasing slope thresholds (distortion per bit): each allocation takes every upgrade
            worth at least that much — with thresholds shared by all shards of a template, the template's bits go
            where they cut distortion most, whichever shard that is.

    Returns:
        per budget (slope), (units,) width indices; each allocation is >= the previous one unit by unit.
    """
    if (budgets_bits is None) == (slopes is None):
        raise ValueError("pass exactly one of budgets_bits and slopes")
    n_u = dist.shape[0]
    unit, to, slope, bits = _hull_segments(dist, rate_bits)
    if budgets_bits is not None:
        cum = np.cumsum(bits)
        takes = [int(np.searchsorted(cum, b, side="right")) for b in budgets_bits]
    else:
        assert slopes is not None  # exactly one of the two (checked above)
        takes = [int(np.searchsorted(-slope, -lam, side="right")) for lam in slopes]
    out = []
    for n_take in takes:
        idx = np.zeros(n_u, dtype=np.int64)
        np.maximum.at(idx, unit[:n_take], to[:n_take])
        out.append(idx.astype(np.uint8))
    return out


def level_slopes(shards: Sequence[ShardInput], config: SakuraConfig = DEFAULT_CONFIG) -> tuple[float, ...]:
    """Slope thresholds that give a whole template (all ``shards``) ``config.level_bits`` raw bits per value at
    each level, spending them where they cut distortion most across shards (the weights must be in the same units
    in every shard: attention-output error, optionally scaled by measured layer gains in
    :func:`sakura_core.kv.template_codec.shard_inputs`)."""
    slopes, bits = [], []
    n_values = 0
    for shard in shards:
        *_, dist, rate = _cached_distortions(shard, config)
        _, _, s, b = _hull_segments(dist.reshape(-1, len(WIDTHS)), rate.reshape(-1, len(WIDTHS)))
        slopes.append(s)
        bits.append(b)
        n_values += 2 * shard.k.size
    s = np.concatenate(slopes)
    order = np.argsort(-s, kind="stable")
    s, cum = s[order], np.cumsum(np.concatenate(bits)[order])
    out = []
    for b in config.level_bits:
        n = int(np.searchsorted(cum, b * n_values, side="right"))
        out.append(float(s[n - 1]) if n else math.inf)
    return tuple(out)


def prepare_sakura(shards: Sequence[ShardInput], config: SakuraConfig = DEFAULT_CONFIG) -> list[ShardInput]:
    """Template-level step before encoding shards one by one: share slope thresholds across the shards (when they
    carry importance weights; without weights each shard keeps its own bit budget)."""
    if not shards or any(s.k_weight is None or s.v_weight is None for s in shards):
        return list(shards)
    shards = [dataclasses.replace(s, prepared=(config, _distortions(s, config))) for s in shards]
    slopes = level_slopes(shards, config)
    return [dataclasses.replace(s, level_slopes=slopes) for s in shards]


def _cached_distortions(shard: ShardInput, config: SakuraConfig):
    """:func:`_distortions`, reusing what :func:`prepare_sakura` computed for this shard and config."""
    if shard.prepared is not None and shard.prepared[0] == config:
        return shard.prepared[1]
    return _distortions(shard, config)


def _mix(weight: np.ndarray, mix: float) -> np.ndarray:
    """``weight + mix * mean(weight)`` with the mean per layer (axis 0), as float64."""
    w = np.asarray(weight, dtype=np.float64)
    return w + mix * w.mean(axis=tuple(range(1, w.ndim)), keepdims=True)


def _distortions(shard: ShardInput, config: SakuraConfig):
    """Quantiser parameters, fine codes, and each unit's (distortion, bits) at every width."""
    x = np.stack([np.asarray(shard.k, dtype=np.float32), np.asarray(shard.v, dtype=np.float32)])
    _, n_l, t, h, d = x.shape  # (2, layers, tokens, heads, head_dim)
    mean16 = x.mean(axis=2).astype(np.float16)  # (2, layers, heads, head_dim)
    if shard.meta.ref_scale is not None:  # a predicted residual: compact ranges around the mean
        m32 = mean16.astype(np.float32)
        lo_code, hi_code = (
            span_codes(np.maximum(m32 - x.min(axis=2), 0)),
            span_codes(np.maximum(x.max(axis=2) - m32, 0)),
        )
        lo, hi = compact_ranges(mean16, lo_code, hi_code)
        meta = mean16.astype("<f2").tobytes() + lo_code.tobytes() + hi_code.tobytes()
    else:
        lo16, hi16 = f16_floor(x.min(axis=2)), f16_ceil(x.max(axis=2))
        lo, hi = lo16.astype(np.float32), hi16.astype(np.float32)
        meta = np.stack([lo16, hi16, mean16]).astype("<f2").tobytes()
    params = Params(lo=lo, step=(hi - lo) / np.float32(255.0), mean=mean16.astype(np.float32))
    fine = _fine_codes(x, params.lo[:, :, None], params.step[:, :, None])  # (2, layers, tokens, heads, head_dim)
    kw = np.ones(x.shape[1:], np.float64) if shard.k_weight is None else _mix(shard.k_weight, config.uniform_mix)
    vw = np.ones(x.shape[1:4], np.float64) if shard.v_weight is None else _mix(shard.v_weight, config.uniform_mix)
    n_w = len(WIDTHS)
    dist = np.empty((2, n_l, t, h, n_w), dtype=np.float64)
    acc = torch.from_numpy(fine)
    for wi, w in enumerate(WIDTHS):
        idx = np.full((2, n_l, t, h), wi, dtype=np.uint8)
        top = acc >> (8 - w) if w else acc * 0  # the top w bits of each code, right-aligned
        k_hat, v_hat = (y.float().numpy() for y in reconstruct(idx, top, params))
        dist[0, ..., wi] = (kw * (x[0] - k_hat) ** 2).sum(-1)
        dist[1, ..., wi] = vw * ((x[1] - v_hat) ** 2).sum(-1)
    if shard.k_drop is not None and shard.k_weight is not None:
        dist[0, ..., 0] = _mix(shard.k_drop, config.uniform_mix)
    rate = np.empty_like(dist)
    rate[...] = _W.astype(np.float64) * d
    return params, meta, fine, dist, rate


def _plan(shard: ShardInput, config: SakuraConfig) -> _Plan:
    params, meta, fine, dist, rate = _cached_distortions(shard, config)
    n_w = len(WIDTHS)
    if shard.level_slopes is not None:
        if len(shard.level_slopes) != len(config.level_bits):
            raise ValueError(f"shard has {len(shard.level_slopes)} level slopes, the config {len(config.level_bits)}")
        flat = allocate_widths(dist.reshape(-1, n_w), rate.reshape(-1, n_w), slopes=shard.level_slopes)
    else:
        budgets = [b * 2 * shard.k.size for b in config.level_bits]
        flat = allocate_widths(dist.reshape(-1, n_w), rate.reshape(-1, n_w), budgets_bits=budgets)
    level_idx = [a.reshape(dist.shape[:4]) for a in flat]
    return _Plan(params, meta, fine, level_idx)


def _level_blob(
    plan: _Plan,
    shard: ShardInput,
    level: int,
    prev_idx: np.ndarray | None,
    new_idx: np.ndarray,
    parent: str | None,
    config: SakuraConfig,
) -> bytes:
    n_l, t, h, d = shard.k.shape
    base = prev_idx is None
    prev = np.zeros_like(new_idx) if prev_idx is None else prev_idx
    head = [plan.meta] if base else []
    head.append((new_idx.astype(np.int16) - prev).astype(np.uint8).tobytes())
    sections = [zstd_compress(b"".join(head), config.zstd_level)]
    w_new, added, groups = _transition_groups(prev, new_idx)
    fine = plan.fine.reshape(-1, d)
    for m in groups:
        units = np.flatnonzero(added == m)
        sym = (fine[units] >> (8 - w_new[units]).astype(np.uint8)[:, None]) & np.uint8((1 << m) - 1)
        sections.append(zstd_compress(_pack_symbols(sym, m), config.zstd_level))
    return pack_shard(shard.header("sakura", level, parent), sections)


def encode_sakura(
    shard: ShardInput, levels: Sequence[int] | None = None, config: SakuraConfig = DEFAULT_CONFIG
) -> list[bytes]:
    """Encode ``levels`` (default: the whole ladder) as a progressive chain: the first blob is a base at
    ``levels[0]``, each next one refines its predecessor. ``encode_sakura(s, [j])`` is the direct level-j blob."""
    levels = check_levels(config.levels if levels is None else levels, "sakura", config.levels)
    plan = _plan(shard, config)
    blobs: list[bytes] = []
    prev_idx = None
    parent = None
    for level in levels:
        new_idx = plan.level_idx[level]
        blob = _level_blob(plan, shard, level, prev_idx, new_idx, parent, config)
        blobs.append(blob)
        prev_idx, parent = new_idx, shard_digest(blob)
    return blobs


def encode_sakura_direct(
    shard: ShardInput, levels: Sequence[int] | None = None, config: SakuraConfig = DEFAULT_CONFIG
) -> list[bytes]:
    """The direct blob of each level (``encode_sakura(shard, [j])[0]`` for every ``j``, one plan for all)."""
    levels = check_levels(config.levels if levels is None else levels, "sakura", config.levels)
    plan = _plan(shard, config)
    return [_level_blob(plan, shard, level, None, plan.level_idx[level], None, config) for level in levels]


register_codec(
    Codec(
        "sakura",
        DEFAULT_CONFIG.levels,
        True,
        False,
        encode_sakura,
        decode_sakura,
        "importance-aware RD widths {0,1,2,3,4,5,6,8}, per-channel ranges, progressive + zstd",
        decode_step=_step,
        decode_finish=_finish,
        prepare=prepare_sakura,
        encode_direct=encode_sakura_direct,
    )
)

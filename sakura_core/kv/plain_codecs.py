"""The simple baseline codecs: fp16 (the lossless reference), uniform int8 and int4 (no entropy coding)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .codec_parts import check_levels, expect_len, expect_sections, f16_ceil, f16_floor, finite_f16, single_blob
from .codec_registry import F16_MAX, Codec, Parsed, ShardInput, register_codec
from .container import ShardCorruptError, pack_shard

__all__ = ["decode_fp16", "decode_int4", "decode_int8", "encode_fp16", "encode_int4", "encode_int8"]


# ---- fp16: the lossless reference -----------------------------------------------------------------------------------


def encode_fp16(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """Raw little-endian float16 K and V (sections: K bytes, V bytes). Lossless w.r.t. the fp16-rounded input."""
    check_levels(levels, "fp16", (0,))
    k = np.ascontiguousarray(shard.k, dtype="<f2")
    v = np.ascontiguousarray(shard.v, dtype="<f2")
    return [pack_shard(shard.header("fp16", 0), [k.tobytes(), v.tobytes()])]


def decode_fp16(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    header, sections = single_blob(parsed, "fp16")
    expect_sections(sections, 2, header)
    nbytes = header.num_elements * 2
    expect_len(sections[0], nbytes, "fp16 K")
    expect_len(sections[1], nbytes, "fp16 V")
    k = np.frombuffer(sections[0], dtype="<f2").reshape(header.tensor_shape).astype(np.float16)
    v = np.frombuffer(sections[1], dtype="<f2").reshape(header.tensor_shape).astype(np.float16)
    if not (torch.isfinite(torch.from_numpy(k)).all() and torch.isfinite(torch.from_numpy(v)).all()):
        raise ShardCorruptError("fp16: non-finite values (KV is always finite)")
    return k, v


# ---- uniform int8 / int4: per (layer, token, head) asymmetric min/max, no entropy coding ---------------------------


def _minmax_params(x: np.ndarray, axis, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """fp16 (lo, step) such that lo + step * [0, levels - 1] covers the range of ``x`` along ``axis``."""
    lo = f16_floor(x.min(axis=axis, keepdims=True))
    hi = x.max(axis=axis, keepdims=True)
    step = f16_ceil((hi - lo.astype(np.float32)) / (levels - 1))
    return lo, step


def _quantize_uniform(x: np.ndarray, lo: np.ndarray, step: np.ndarray, levels: int) -> np.ndarray:
    s = step.astype(np.float32)
    safe = np.where(s > 0, s, 1.0).astype(np.float32)
    q = np.rint((x - lo.astype(np.float32)) / safe)
    return np.clip(q, 0, levels - 1).astype(np.uint8)


def _levels_of(bits: int) -> int:
    """Quantisation levels of the uniform codecs: int4 uses 15 (codes 0..14, so zero-centred data has an exact
    middle code), int8 all 256."""
    return 15 if bits == 4 else 256


def _encode_uniform(shard: ShardInput, bits: int, name: str) -> bytes:
    levels = _levels_of(bits)
    sections = []
    for x in (shard.k, shard.v):
        x = np.asarray(x, dtype=np.float32)
        lo, step = _minmax_params(x, axis=-1, levels=levels)  # (layers, tokens, heads, 1)
        codes = _quantize_uniform(x, lo, step, levels)
        if bits == 4:
            flat = codes.reshape(-1)
            if flat.size % 2:
                flat = np.concatenate([flat, np.zeros(1, np.uint8)])
            codes = (flat[0::2] << 4) | flat[1::2]
        params = np.concatenate([lo, step], axis=-1).astype("<f2")  # (layers, tokens, heads, 2)
        sections += [params.tobytes(), codes.tobytes()]
    return pack_shard(shard.header(name, 0), sections)


def _decode_uniform(parsed: Parsed, bits: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    header, sections = single_blob(parsed, name)
    expect_sections(sections, 4, header)
    n_l, t, h, d = header.tensor_shape
    n_params = n_l * t * h * 2 * 2
    n_codes = header.num_elements if bits == 8 else (header.num_elements + 1) // 2
    out = []
    for i, what in ((0, "K"), (2, "V")):
        expect_len(sections[i], n_params, f"{name} {what} params")
        expect_len(sections[i + 1], n_codes, f"{name} {what} codes")
        params = finite_f16(np.frombuffer(sections[i], dtype="<f2"), f"{name} {what} params")
        params = params.reshape(n_l, t, h, 2).astype(np.float32)
        top = np.abs(params[..., 0]) + (_levels_of(bits) - 1) * params[..., 1]
        if (params[..., 1] < 0).any() or top.max(initial=0.0) > F16_MAX:
            raise ShardCorruptError(f"{name} {what} params: negative step or range beyond float16")
        raw = np.frombuffer(sections[i + 1], dtype=np.uint8)
        if bits == 4:
            codes: np.ndarray = np.empty(raw.size * 2, dtype=np.uint8)
            codes[0::2] = raw >> 4
            codes[1::2] = raw & 0x0F
            codes = codes[: header.num_elements]
            if codes.max(initial=0) > 14:
                raise ShardCorruptError(f"{name} {what}: code out of range")
        else:
            codes = raw
        codes = codes.reshape(n_l, t, h, d)
        x = params[..., :1] + codes.astype(np.float32) * params[..., 1:]
        out.append(x.astype(np.float16))
    return out[0], out[1]


def encode_int8(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """Uniform 8-bit codes per (layer, token, head) group of head_dim values; fp16 (min, step) per group.

    Error bound: ``|x - x_hat| <= step / 2`` plus the float16 rounding of the output, ``step ~ range / 255``.
    """
    check_levels(levels, "int8", (0,))
    return [_encode_uniform(shard, 8, "int8")]


def decode_int8(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    return _decode_uniform(parsed, 8, "int8")


def encode_int4(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """Uniform 4-bit codes (15 levels) per (layer, token, head) group, two codes per byte; fp16 (min, step).

    Error bound: ``|x - x_hat| <= step / 2`` plus fp16 output rounding, ``step ~ range / 14``.
    """
    check_levels(levels, "int4", (0,))
    return [_encode_uniform(shard, 4, "int4")]


def decode_int4(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    return _decode_uniform(parsed, 4, "int4")


register_codec(Codec("fp16", (0,), False, True, encode_fp16, decode_fp16, "uncompressed float16 (lossless reference)"))
register_codec(Codec("int8", (0,), False, False, encode_int8, decode_int8, "uniform int8 per token-head"))
register_codec(Codec("int4", (0,), False, False, encode_int4, decode_int4, "uniform int4 per token-head"))

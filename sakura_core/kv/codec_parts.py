"""Helpers shared by the codecs: zstd frames of an exact size, per-thread work buffers, section and level checks,
float16 rounding."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
import zstandard

from .codec_registry import Codec, Parsed
from .container import ShardCorruptError, ShardHeader

__all__ = [
    "CHUNK_VALUES",
    "SCRATCH_MAX_BYTES",
    "check_levels",
    "expect_len",
    "expect_sections",
    "f16_ceil",
    "f16_floor",
    "finite_f16",
    "scratch",
    "single_blob",
    "zstd_compress",
    "zstd_exact",
]


def zstd_compress(data: bytes, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False).compress(data)


_TLS = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread (they are not thread-safe; zstd releases the GIL while it decodes)."""
    d = getattr(_TLS, "zstd", None)
    if d is None:
        d = _TLS.zstd = zstandard.ZstdDecompressor()
    return d


def zstd_exact(section: memoryview | bytes, expected: int, what: str) -> bytes:
    """Decompress one zstd frame whose decompressed size must be exactly ``expected`` bytes (checked first)."""
    try:
        size = zstandard.frame_content_size(section)
    except zstandard.ZstdError as e:
        raise ShardCorruptError(f"{what}: not a zstd frame ({e})") from e
    if size != expected:
        raise ShardCorruptError(f"{what}: zstd frame declares {size} bytes, expected {expected}")
    try:
        out = _decompressor().decompress(section)
    except zstandard.ZstdError as e:
        raise ShardCorruptError(f"{what}: zstd frame does not decode ({e})") from e
    if len(out) != expected:
        raise ShardCorruptError(f"{what}: decoded {len(out)} bytes, expected {expected}")
    return out


#: Values dequantised per step: a 1 MiB float32 work buffer (chosen because it decodes faster than 64 Ki values or a
#: whole tensor per step; `sakura bench decode` measures it).
CHUNK_VALUES = 1 << 18
#: A larger work buffer is allocated per call, not kept.
SCRATCH_MAX_BYTES = 64 << 20


def scratch(name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D work buffer of ``n`` elements kept per thread and reused (a fresh multi-MB tensor costs its page faults
    on every decode: about as much as the arithmetic); its contents are garbage, and it never leaves the decoder."""
    if n * dtype.itemsize > SCRATCH_MAX_BYTES:
        return torch.empty(n, dtype=dtype)
    bufs = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = {}
    buf = bufs.get((name, dtype))
    if buf is None or buf.shape[0] < n:
        buf = bufs[name, dtype] = torch.empty(n, dtype=dtype)
    return buf[:n]


def expect_len(section: memoryview | bytes, expected: int, what: str) -> None:
    if len(section) != expected:
        raise ShardCorruptError(f"{what}: section has {len(section)} bytes, expected {expected}")


def expect_sections(sections: list, n: int, header: ShardHeader) -> None:
    if len(sections) != n:
        raise ShardCorruptError(f"{header.codec} level {header.level} blob has {len(sections)} sections, expected {n}")


def single_blob(parsed: Parsed, codec: str) -> tuple[ShardHeader, list[memoryview]]:
    if len(parsed) != 1 or parsed[0][0].parent is not None:
        raise ShardCorruptError(f"{codec} is not progressive: decode takes exactly one base blob")
    return parsed[0]


def finite_f16(a: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(a).all():
        raise ShardCorruptError(f"{what}: non-finite values")
    return a


def check_levels(levels: Sequence[int], codec: Codec | str, allowed: Sequence[int]) -> list[int]:
    name = codec if isinstance(codec, str) else codec.name
    levels = [int(x) for x in levels]
    if not levels:
        raise ValueError(f"{name}: pass at least one level")
    bad = [x for x in levels if x not in allowed]
    if bad:
        raise ValueError(f"{name}: unknown level(s) {bad}; levels are {list(allowed)}")
    if levels != sorted(set(levels)):
        raise ValueError(f"{name}: levels must be strictly increasing, got {levels}")
    return levels


def f16_floor(x: np.ndarray) -> np.ndarray:
    """Largest float16 <= x (elementwise)."""
    h = x.astype(np.float16)
    too_big = h.astype(np.float32) > x
    h[too_big] = np.nextafter(h[too_big], np.float16(-np.inf))
    return h


def f16_ceil(x: np.ndarray) -> np.ndarray:
    """Smallest float16 >= x (elementwise)."""
    h = x.astype(np.float16)
    too_small = h.astype(np.float32) < x
    h[too_small] = np.nextafter(h[too_small], np.float16(np.inf))
    return h

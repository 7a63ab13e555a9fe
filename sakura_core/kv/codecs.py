"""Codec registry and the simple baselines: fp16 (lossless reference), uniform int8 and int4.

A codec is a pair of pure functions behind one registry entry (:class:`Codec`):

* ``encode(shard, levels) -> list[bytes]``: one container blob per requested level. For a progressive codec the
  blobs form a chain — blob ``i`` refines blob ``i - 1`` (its header names the parent digest) and the first is a
  base; for the others each blob stands alone and ``levels`` must hold one level.
* ``decode(parsed) -> (k, v)``: ``parsed`` is the validated chain ``[(header, sections), ...]`` (base first), as
  :func:`sakura_core.kv.chain.parse_chain` returns it; ``k`` and ``v`` are float16 arrays
  (layers, tokens, heads, head_dim).

Every decoder checks each section's length against the geometry in the header before it allocates, so a corrupt
blob raises a :class:`~sakura_core.kv.container.ShardFormatError`, never a wrong tensor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from .container import ShardCorruptError, ShardHeader, pack_shard

__all__ = [
    "CODECS",
    "Codec",
    "ShardInput",
    "ShardMeta",
    "get_codec",
    "register_codec",
]

Parsed = list[tuple[ShardHeader, list[memoryview]]]
_F16_MAX = 65504.0


@dataclass(frozen=True)
class ShardMeta:
    """Identity of a shard: which model, template and layers its KV belongs to.

    Attributes:
        model_id: content id of the model (hex).
        template_id: template id.
        rope_layout: RoPE layout of the template tokens.
        layer_first: index of the shard's first layer in the model (execution order).
        token_grid: (rows, cols) of the template tokens.
        num_model_layers: depth of the whole model (CacheGen scales its layer boundaries with it).
    """

    model_id: str
    template_id: str
    rope_layout: str
    layer_first: int
    token_grid: tuple[int, int]
    num_model_layers: int


@dataclass(frozen=True)
class ShardInput:
    """What an encoder gets: the exact K and V of the shard's layers and (optionally) their importance weights.

    Attributes:
        k, v: float32 arrays (layers, tokens, heads, head_dim).
        meta: the shard's identity (goes into every blob header).
        k_weight: (layers, tokens, heads, head_dim) sensitivity of the attention output to squared key error, or
            ``None`` for uniform weights.
        v_weight: (layers, tokens, heads) sensitivity to squared value error, or ``None``.
        k_drop: (layers, tokens, heads) distortion of replacing a key by the mean key (same units as the weights), or
            ``None`` to use the weighted squared error for that too.
        level_slopes: template-wide rate-distortion thresholds set by :meth:`Codec.prepare_shards` (SAKURA), or
            ``None`` for a per-shard bit budget.
        prepared: codec-private results of :meth:`Codec.prepare_shards` reused by ``encode`` (not compared).
    """

    k: np.ndarray
    v: np.ndarray
    meta: ShardMeta
    k_weight: np.ndarray | None = None
    v_weight: np.ndarray | None = None
    k_drop: np.ndarray | None = None
    level_slopes: tuple[float, ...] | None = None
    prepared: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.k.ndim != 4 or self.k.shape != self.v.shape:
            raise ValueError(
                f"k and v must both be (layers, tokens, heads, head_dim), got {self.k.shape} and {self.v.shape}"
            )
        rows, cols = self.meta.token_grid
        if rows * cols != self.k.shape[1]:
            raise ValueError(f"token_grid {self.meta.token_grid} does not match {self.k.shape[1]} tokens")
        for name, x in (("k", self.k), ("v", self.v)):
            if not np.isfinite(x).all() or np.abs(x).max(initial=0.0) > _F16_MAX:
                raise ValueError(f"{name} must be finite and within the float16 range (|x| <= {_F16_MAX})")
        if self.k_weight is not None and self.k_weight.shape != self.k.shape:
            raise ValueError(f"k_weight must have shape {self.k.shape}, got {self.k_weight.shape}")
        if self.v_weight is not None and self.v_weight.shape != self.k.shape[:3]:
            raise ValueError(f"v_weight must have shape {self.k.shape[:3]}, got {self.v_weight.shape}")
        if self.k_drop is not None and self.k_drop.shape != self.k.shape[:3]:
            raise ValueError(f"k_drop must have shape {self.k.shape[:3]}, got {self.k_drop.shape}")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.k.shape)

    def header(self, codec: str, level: int, parent: str | None = None) -> ShardHeader:
        n_l, _, heads, head_dim = self.k.shape
        m = self.meta
        return ShardHeader(
            codec=codec,
            level=level,
            model_id=m.model_id,
            template_id=m.template_id,
            rope_layout=m.rope_layout,
            layer_first=m.layer_first,
            layer_last=m.layer_first + n_l - 1,
            token_grid=tuple(m.token_grid),
            heads=heads,
            head_dim=head_dim,
            dtype="float16",
            parent=parent,
        )


@dataclass(frozen=True)
class Codec:
    """One registry entry.

    Attributes:
        name: registry key, also written into every blob header.
        levels: the codec's ladder, smallest representation first.
        progressive: whether level ``j + 1`` is level ``j`` plus an enhancement blob.
        lossless: whether decode returns the fp16-rounded input bit-exactly.
        encode, decode: the pure functions (see the module docstring).
        description: one line for tables and manifests.
        level_names: display names of levels (default ``name-l{level}``).
        decode_step, decode_finish: optional incremental decoding of a progressive chain (used by
            :class:`~sakura_core.kv.chain.ChainDecoder`): ``state = decode_step(state_or_None, header, sections)``
            applies one more blob without modifying its input state; ``decode_finish(state, header) -> (k, v)``.
        prepare: optional template-level step over all shards before encoding (SAKURA shares its rate-distortion
            slope thresholds across shards, so a level's bits go to the layers that need them).
    """

    name: str
    levels: tuple[int, ...]
    progressive: bool
    lossless: bool
    encode: Callable[[ShardInput, Sequence[int]], list[bytes]]
    decode: Callable[[Parsed], tuple[np.ndarray, np.ndarray]]
    description: str = ""
    level_names: dict[int, str] = field(default_factory=dict)
    decode_step: Callable[[object, ShardHeader, list[memoryview]], object] | None = None
    decode_finish: Callable[[object, ShardHeader], tuple[np.ndarray, np.ndarray]] | None = None
    prepare: Callable[[Sequence[ShardInput]], list[ShardInput]] | None = None

    def prepare_shards(self, shards: Sequence[ShardInput]) -> list[ShardInput]:
        """Template-level preparation before encoding the shards one by one (identity for most codecs)."""
        return list(shards) if self.prepare is None else self.prepare(shards)

    def level_name(self, level: int) -> str:
        return self.level_names.get(level, self.name if len(self.levels) == 1 else f"{self.name}-l{level}")


CODECS: dict[str, Codec] = {}


def register_codec(codec: Codec) -> Codec:
    if codec.name in CODECS:
        raise ValueError(f"codec {codec.name!r} is already registered")
    CODECS[codec.name] = codec
    return codec


def get_codec(name: str) -> Codec:
    try:
        return CODECS[name]
    except KeyError:
        raise KeyError(f"unknown codec {name!r}; known codecs: {', '.join(sorted(CODECS))}") from None


# ---- helpers shared by the codecs ---------------------------------------------------------------------------------


def _zstd(data: bytes, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False).compress(data)


_TLS = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread (they are not thread-safe; zstd releases the GIL while it decodes)."""
    d = getattr(_TLS, "zstd", None)
    if d is None:
        d = _TLS.zstd = zstandard.ZstdDecompressor()
    return d


def _unzstd(section: memoryview | bytes, expected: int, what: str) -> bytes:
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


def _expect_len(section: memoryview | bytes, expected: int, what: str) -> None:
    if len(section) != expected:
        raise ShardCorruptError(f"{what}: section has {len(section)} bytes, expected {expected}")


def _expect_sections(sections: list, n: int, header: ShardHeader) -> None:
    if len(sections) != n:
        raise ShardCorruptError(f"{header.codec} level {header.level} blob has {len(sections)} sections, expected {n}")


def _single(parsed: Parsed, codec: str) -> tuple[ShardHeader, list[memoryview]]:
    if len(parsed) != 1 or parsed[0][0].parent is not None:
        raise ShardCorruptError(f"{codec} is not progressive: decode takes exactly one base blob")
    return parsed[0]


def _finite_f16(a: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(a).all():
        raise ShardCorruptError(f"{what}: non-finite values")
    return a


def _check_levels(levels: Sequence[int], codec: Codec | str, allowed: Sequence[int]) -> list[int]:
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


# ---- fp16: the lossless reference -----------------------------------------------------------------------------------


def encode_fp16(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """Raw little-endian float16 K and V (sections: K bytes, V bytes). Lossless w.r.t. the fp16-rounded input."""
    _check_levels(levels, "fp16", (0,))
    k = np.ascontiguousarray(shard.k, dtype="<f2")
    v = np.ascontiguousarray(shard.v, dtype="<f2")
    return [pack_shard(shard.header("fp16", 0), [k.tobytes(), v.tobytes()])]


def decode_fp16(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    header, sections = _single(parsed, "fp16")
    _expect_sections(sections, 2, header)
    nbytes = header.num_elements * 2
    _expect_len(sections[0], nbytes, "fp16 K")
    _expect_len(sections[1], nbytes, "fp16 V")
    k = np.frombuffer(sections[0], dtype="<f2").reshape(header.tensor_shape).astype(np.float16)
    v = np.frombuffer(sections[1], dtype="<f2").reshape(header.tensor_shape).astype(np.float16)
    if not (torch.isfinite(torch.from_numpy(k)).all() and torch.isfinite(torch.from_numpy(v)).all()):
        raise ShardCorruptError("fp16: non-finite values (KV is always finite)")
    return k, v


# ---- uniform int8 / int4: per (layer, token, head) asymmetric min/max, no entropy coding ---------------------------


def _f16_floor(x: np.ndarray) -> np.ndarray:
    """Largest float16 <= x (elementwise)."""
    h = x.astype(np.float16)
    too_big = h.astype(np.float32) > x
    h[too_big] = np.nextafter(h[too_big], np.float16(-np.inf))
    return h


def _f16_ceil(x: np.ndarray) -> np.ndarray:
    """Smallest float16 >= x (elementwise)."""
    h = x.astype(np.float16)
    too_small = h.astype(np.float32) < x
    h[too_small] = np.nextafter(h[too_small], np.float16(np.inf))
    return h


def _minmax_params(x: np.ndarray, axis, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """fp16 (lo, step) such that lo + step * [0, levels - 1] covers the range of ``x`` along ``axis``."""
    lo = _f16_floor(x.min(axis=axis, keepdims=True))
    hi = x.max(axis=axis, keepdims=True)
    step = _f16_ceil((hi - lo.astype(np.float32)) / (levels - 1))
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
    header, sections = _single(parsed, name)
    _expect_sections(sections, 4, header)
    n_l, t, h, d = header.tensor_shape
    n_params = n_l * t * h * 2 * 2
    n_codes = header.num_elements if bits == 8 else (header.num_elements + 1) // 2
    out = []
    for i, what in ((0, "K"), (2, "V")):
        _expect_len(sections[i], n_params, f"{name} {what} params")
        _expect_len(sections[i + 1], n_codes, f"{name} {what} codes")
        params = _finite_f16(np.frombuffer(sections[i], dtype="<f2"), f"{name} {what} params")
        params = params.reshape(n_l, t, h, 2).astype(np.float32)
        top = np.abs(params[..., 0]) + (_levels_of(bits) - 1) * params[..., 1]
        if (params[..., 1] < 0).any() or top.max(initial=0.0) > _F16_MAX:
            raise ShardCorruptError(f"{name} {what} params: negative step or range beyond float16")
        raw = np.frombuffer(sections[i + 1], dtype=np.uint8)
        if bits == 4:
            codes = np.empty(raw.size * 2, dtype=np.uint8)
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
    _check_levels(levels, "int8", (0,))
    return [_encode_uniform(shard, 8, "int8")]


def decode_int8(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    return _decode_uniform(parsed, 8, "int8")


def encode_int4(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """Uniform 4-bit codes (15 levels) per (layer, token, head) group, two codes per byte; fp16 (min, step).

    Error bound: ``|x - x_hat| <= step / 2`` plus fp16 output rounding, ``step ~ range / 14``.
    """
    _check_levels(levels, "int4", (0,))
    return [_encode_uniform(shard, 4, "int4")]


def decode_int4(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    return _decode_uniform(parsed, 4, "int4")


register_codec(Codec("fp16", (0,), False, True, encode_fp16, decode_fp16, "uncompressed float16 (lossless reference)"))
register_codec(Codec("int8", (0,), False, False, encode_int8, decode_int8, "uniform int8 per token-head"))
register_codec(Codec("int4", (0,), False, False, encode_int4, decode_int4, "uniform int4 per token-head"))

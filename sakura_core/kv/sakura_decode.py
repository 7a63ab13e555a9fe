"""Decoder of the SAKURA codec (runs on the phone): symbol unpacking, width bookkeeping and the incremental decode
steps a progressive chain applies blob by blob; the dequantisation the encoder also measures with is
:func:`.sakura_dequant.reconstruct`.

Keys and values are quantised alike: one range per (tensor, layer, head, channel) over the shard's tokens, 8-bit
fine codes. A unit at width ``w`` holds the top ``w`` bits of each of its fine codes (right-aligned: a refinement
shifts them up and appends its bits); decoding takes the centre of the bin they select. (Plain binary, not Gray
codes: Gray-coding leaves the compressed sizes practically unchanged.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .codec_parts import scratch, zstd_exact
from .codec_registry import Parsed
from .container import ShardCorruptError, ShardHeader
from .sakura_dequant import WIDTHS, Params, reconstruct, rows_view

__all__ = ["MAX_SPAN", "compact_ranges", "decode_sakura", "meta_size", "span_codes"]

_W = np.array(WIDTHS, dtype=np.int16)
_W8 = _W.astype(np.uint8)
#: Bits a unit gains going from width index ``i`` to ``j``, at ``i * 8 + j`` (0 where ``j <= i``).
_ADDED = np.maximum(_W8[None, :].astype(np.int16) - _W8[:, None], 0).astype(np.uint8).reshape(-1)


# ---- symbols and width bookkeeping -------------------------------------------------------------------------------


def _fine_codes(x: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """8-bit fine codes of ``x`` on the grid ``lo + i * step``."""
    safe = np.where(step > 0, step, np.float32(1.0)).astype(np.float32)
    return np.clip(np.rint((x - lo) / safe), 0, 255).astype(np.uint8)


def _words(a: np.ndarray) -> np.ndarray | None:
    """A C-contiguous uint8 array as uint64 words (same memory; numpy handles an unaligned one), or ``None`` when its
    size is not a multiple of 8."""
    if a.size % 8 or not a.flags.c_contiguous:
        return None
    return a.reshape(-1).view(np.uint64)


def _shift_in(dst: np.ndarray, m: int, src: np.ndarray) -> None:
    """``dst = dst << m | src`` in place (uint8, one shape; every byte of ``dst`` < 2**(8 - m), of ``src`` < 2**m):
    on 64-bit words when both allow it (no bit crosses into the next byte; numpy's uint8 shifts are several times
    slower), else byte by byte."""
    dw, sw = _words(dst), _words(src)
    if dw is not None and sw is not None:
        np.left_shift(dw, np.uint64(m), out=dw)
        np.bitwise_or(dw, sw, out=dw)
        return
    np.left_shift(dst, np.uint8(m), out=dst)
    np.bitwise_or(dst, src, out=dst)


# ---- symbol packing --------------------------------------------------------------------------------------------------
def _per_byte(m: int) -> int:
    return {1: 8, 2: 4, 4: 2}.get(m, 1)


def _pack_symbols(sym: np.ndarray, m: int) -> bytes:
    """Pack m-bit symbols whole into bytes. m = 1: ``np.packbits`` (8 per byte, MSB first). m = 2 or 4: planar,
    ``per`` = 4 or 2 symbols per byte — byte ``j`` holds symbols ``j, j + Q, j + 2Q, ...`` (``Q`` = number of
    bytes), most significant first, so unpacking is a few contiguous shifts. Other m: one symbol per byte."""
    flat = sym.reshape(-1).astype(np.uint8)
    per = _per_byte(m)
    if m == 1:
        return np.packbits(flat).tobytes()
    if per == 1:
        return flat.tobytes()
    q = -(-flat.size // per)
    planes: np.ndarray = np.zeros(per * q, np.uint8)
    planes[: flat.size] = flat
    planes = planes.reshape(per, q)
    out = np.zeros(q, np.uint8)
    for i in range(per):
        out |= planes[i] << np.uint8(m * (per - 1 - i))
    return out.tobytes()


def _packed_size(n_sym: int, m: int) -> int:
    return -(-n_sym // _per_byte(m))


def _unpack_symbols(raw: bytes, m: int, n_sym: int) -> np.ndarray:
    """Inverse of :func:`_pack_symbols`; ``raw`` has exactly ``_packed_size(n_sym, m)`` bytes. The result is only to be
    read, before the next unpack on this thread (a view of ``raw`` or of a work buffer)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    per = _per_byte(m)
    if m == 1:
        return np.unpackbits(b, count=n_sym)
    if per == 1:
        if b.max(initial=0) >= (1 << m):
            raise ShardCorruptError(f"sakura: {m}-bit symbol out of range")
        return b
    q = b.size
    out = scratch("symbols", per * q, torch.uint8).numpy()
    src, dst = _words(b), _words(out)
    mask: np.unsignedinteger
    first = 0  # the first plane needs no mask in bytes (nothing above it); in words the next byte's bits shift in
    if src is not None and dst is not None:  # a plane's low m bits of each byte never come from the next byte
        q, mask, first = q // 8, np.uint64(((1 << m) - 1) * 0x0101010101010101), -1
    else:
        src, dst, mask = b, out, np.uint8((1 << m) - 1)
    for i in range(per):
        plane = dst[i * q : (i + 1) * q]
        np.right_shift(src, src.dtype.type(m * (per - 1 - i)), out=plane)
        if i != first:
            np.bitwise_and(plane, mask, out=plane)
    return out[:n_sym]


def _transition_groups(prev_idx: np.ndarray, new_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Flat per-unit new widths and added bits, and the sorted list of added-bit counts present."""
    w_new = _W[new_idx.reshape(-1)]
    added = w_new - _W[prev_idx.reshape(-1)]
    counts = np.bincount(added, minlength=9)
    return w_new, added, [int(m) for m in np.flatnonzero(counts[1:]) + 1]


def _added_bits(prev: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A blob's new width indices ``prev + delta`` (checked), the bits each unit gains (flat uint8) and the sorted
    added-bit counts present."""
    if delta.max(initial=0) >= len(WIDTHS):
        raise ShardCorruptError("sakura: width delta out of range")
    new = prev + delta
    if new.max(initial=0) >= len(WIDTHS):
        raise ShardCorruptError("sakura: width index out of range")
    added = _W8.take(new.reshape(-1)) if not prev.any() else _ADDED.take((prev << 3 | new).reshape(-1))
    counts = np.bincount(added, minlength=9)
    return new, added, [int(m) for m in np.flatnonzero(counts[1:]) + 1]


# ---- decoder --------------------------------------------------------------------------------------------------------


@dataclass
class _State:
    idx: np.ndarray  # (2, layers, tokens, heads) uint8
    acc: np.ndarray  # (2 * layers * tokens * heads, head_dim) uint8
    params: Params


#: Compact ranges of a predicted residual (a base blob whose header has a predictor scale): per channel the mean
#: (float16) and its distance to the minimum and to the maximum as a log code ``c`` (uint8): ``_SPAN[c]`` =
#: 2 ** ((c - 168) / 8) (0 for c = 0; 5e-7 .. 1878), rounded outward by the encoder — 4 bytes a channel instead of 6
#: (min, max, mean in float16); a residual's ranges are small and many, so its side information is what this saves.
_SPAN = np.concatenate([[0.0], 2.0 ** ((np.arange(1, 256) - 168) / 8)]).astype(np.float32)
MAX_SPAN = float(_SPAN[-1])


def meta_size(n_l: int, h: int, d: int, compact: bool) -> int:
    """Bytes of a base blob's per-channel ranges and means (``compact``: a predicted residual's)."""
    return (4 if compact else 6) * 2 * n_l * h * d


def span_codes(dist: np.ndarray) -> np.ndarray:
    """The smallest log codes whose span covers ``dist`` (>= 0, float32), uint8; a distance over ``MAX_SPAN`` is
    refused (ValueError: a residual that large is no cross-step residual — code that step without the predictor)."""
    dist = dist.astype(np.float32)
    if dist.size and float(dist.max()) > MAX_SPAN:
        raise ValueError(
            f"a residual channel spans {float(dist.max()):.4g} from its mean, over the compact ranges' "
            f"{MAX_SPAN:.4g}: encode this step without the cross-step predictor"
        )
    return np.searchsorted(_SPAN, dist, side="left").astype(np.uint8)


def compact_ranges(mean16: np.ndarray, lo_code: np.ndarray, hi_code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) float32 of a predicted residual's compact ranges: the mean minus / plus the codes' spans."""
    mean = mean16.astype(np.float32)
    return mean - _SPAN[lo_code], mean + _SPAN[hi_code]


def _base_params(head: bytes, n_l: int, h: int, d: int, compact: bool = False) -> Params:
    """The per-channel ranges and means at the start of a base blob's head section (``compact``: mean + log codes,
    see ``_SPAN``)."""
    n = 2 * n_l * h * d
    if compact:
        mean = np.frombuffer(head, dtype="<f2", count=n).reshape(2, n_l, h, d)
        codes = np.frombuffer(head, dtype=np.uint8, count=2 * n, offset=2 * n).reshape(2, 2, n_l, h, d)
        lo, hi = compact_ranges(mean, codes[0], codes[1])
        meta = np.stack([lo, hi, mean.astype(np.float32)])
    else:
        meta = np.frombuffer(head, dtype="<f2", count=3 * n).reshape(3, 2, n_l, h, d).astype(np.float32)
    if not np.isfinite(meta).all() or (meta[1] < meta[0]).any():
        raise ShardCorruptError("sakura: channel ranges / means are not finite or inverted")
    return Params(lo=meta[0], step=(meta[1] - meta[0]) / np.float32(255.0), mean=meta[2])


def _apply(state: _State | None, header: ShardHeader, sections: list[memoryview], transient: bool = False) -> _State:
    """Apply one blob of a chain to ``state`` (``None`` before the base), in place; ``transient``: the state lives only
    until this thread's next decode (its codes sit in a reused work buffer)."""
    n_l, t, h, d = header.tensor_shape
    n_units = 2 * n_l * t * h
    base = state is None
    if base != (header.parent is None):
        raise ShardCorruptError("sakura: the first blob of a chain must be a base and the others refinements")
    if not sections:
        raise ShardCorruptError("sakura: blob has no sections")
    compact = header.ref_scale is not None  # a predicted residual's base: compact ranges
    meta_bytes = meta_size(n_l, h, d, compact) if base else 0
    head = zstd_exact(sections[0], meta_bytes + n_units, "sakura head")
    if state is None:
        params = _base_params(head, n_l, h, d, compact)
        prev = np.zeros((2, n_l, t, h), np.uint8)
        if transient:
            acc = scratch("acc", n_units * d, torch.uint8).numpy().reshape(n_units, d)
            acc.fill(0)
        else:
            acc = np.zeros((n_units, d), dtype=np.uint8)
    else:
        params, prev, acc = state.params, state.idx, state.acc
    delta = np.frombuffer(head, dtype=np.uint8, count=n_units, offset=meta_bytes).reshape(2, n_l, t, h)
    new, added, groups = _added_bits(prev, delta)
    if len(sections) != 1 + len(groups):
        raise ShardCorruptError(f"sakura: blob has {len(sections)} sections, its widths need {1 + len(groups)}")
    for m, section in zip(groups, sections[1:], strict=True):
        units = np.flatnonzero(added == m)
        n_sym = units.size * d
        raw = zstd_exact(section, _packed_size(n_sym, m), f"sakura {m}-bit group")
        sym = _unpack_symbols(raw, m, n_sym).reshape(units.size, d)
        if base:  # nothing there yet: no gather
            np.put(rows_view(acc), units, rows_view(sym))
        elif units.size == n_units:  # every unit gains m bits: no gather/scatter
            _shift_in(acc, m, sym)
        else:  # gather, refine, scatter back, a row at a time
            upd = scratch("refine", units.size * d, torch.uint8).numpy().reshape(units.size, d)
            np.take(rows_view(acc), units, out=rows_view(upd), mode="clip")
            _shift_in(upd, m, sym)
            np.put(rows_view(acc), units, rows_view(upd))
    return _State(new, acc, params)


def decode_sakura(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    """Decode a validated chain base..level; returns float16 K, V (layers, tokens, heads, head_dim)."""
    state = None
    for header, sections in parsed:
        state = _apply(state, header, sections, transient=True)
    if state is None:
        raise ShardCorruptError("sakura: an empty chain has nothing to decode")
    return _finish(state, parsed[-1][0])


def _finish(state: _State, header: ShardHeader) -> tuple[np.ndarray, np.ndarray]:
    n_l, t, h, d = header.tensor_shape
    k, v = reconstruct(state.idx, torch.from_numpy(state.acc).reshape(2, n_l, t, h, d), state.params)
    return k.numpy(), v.numpy()


def _step(state: _State | None, header: ShardHeader, sections: list[memoryview]) -> _State:
    """One incremental step that leaves ``state`` untouched (so a rejected blob changes nothing)."""
    if state is not None:
        state = _State(state.idx.copy(), state.acc.copy(), state.params)  # params are never written after the base
    return _apply(state, header, sections)

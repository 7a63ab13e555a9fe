"""Decoder of the SAKURA codec (runs on the phone): symbol unpacking, the shared reconstruction the encoder also
measures with, and the incremental decode steps a progressive chain applies blob by blob.

Keys and values are quantised alike: one range per (tensor, layer, head, channel) over the shard's tokens, 8-bit
fine codes. A unit at width ``w`` holds the top ``w`` bits of each of its fine codes (right-aligned: a refinement
shifts them up and appends its bits); decoding takes the centre of the bin they select. (Gray-coding the codes was
measured too: it changed the compressed sizes by under 0.3 %.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from .codec_parts import CHUNK_VALUES, scratch, zstd_exact
from .codec_registry import Parsed
from .container import ShardCorruptError, ShardHeader

__all__ = ["MAX_SPAN", "compact_ranges", "decode_sakura", "meta_size", "span_codes"]

WIDTHS = (0, 1, 2, 3, 4, 5, 6, 8)
_W = np.array(WIDTHS, dtype=np.int16)
_W8 = _W.astype(np.uint8)
#: Bits a unit gains going from width index ``i`` to ``j``, at ``i * 8 + j`` (0 where ``j <= i``).
_ADDED = np.maximum(_W8[None, :].astype(np.int16) - _W8[:, None], 0).astype(np.uint8).reshape(-1)


# ---- shared reconstruction (encoder measures exactly what the decoder will output) --------------------------------


@dataclass
class _Params:
    lo: np.ndarray  # (2, layers, heads, head_dim) float32 (from float16): K and V channel minima
    step: np.ndarray  # (2, layers, heads, head_dim): fine-code step
    mean: np.ndarray  # (2, layers, heads, head_dim): what a dropped unit decodes to


def _fine_codes(x: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """8-bit fine codes of ``x`` on the grid ``lo + i * step``."""
    safe = np.where(step > 0, step, np.float32(1.0)).astype(np.float32)
    return np.clip(np.rint((x - lo) / safe), 0, 255).astype(np.uint8)


def _reconstruct(idx: np.ndarray, acc: torch.Tensor, p: _Params) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise: the centre of each unit's bin, ``lo + step * (code * 2**(8 - w) + (2**(8 - w) - 1) / 2)`` in
    float32 (the scale-and-shift as two roundings, multiply then add), then float16; a dropped unit (width 0) is the
    mean of its (tensor, layer, head) channels.

    ``idx``: (2, layers, tokens, heads) width indices; ``acc``: (2, layers, tokens, heads, head_dim) uint8, the top
    ``w`` bits of each fine code (right-aligned, so each byte is < 2**w). Returns float16 K and V (layers, tokens,
    heads, head_dim). The bin-centre code is exact in float32, so it is built in integers (one shift and one OR
    per unit, 8 bytes at a time) and one constant 0.5: the result is bit for bit the multiply-add form.
    """
    _, n_l, t, h, d = acc.shape
    widx = idx.reshape(-1)
    w = _W8.take(widx)  # (units,)
    centre = _centre_codes(acc.reshape(-1, d), widx).view(2 * n_l, t, h, d)  # centre + 0.5, or the code (w = 8)
    top = w == 8  # a full-width unit's centre is its code: nothing to subtract
    half = None if top.all() else 0.5 if not top.any() else np.where(top, np.float32(0.0), np.float32(0.5))
    if isinstance(half, np.ndarray):
        half = torch.from_numpy(half.reshape(2 * n_l, t, h, 1))
    step = torch.from_numpy(p.step).view(2 * n_l, 1, h, d)
    lo = torch.from_numpy(p.lo).view(2 * n_l, 1, h, d)
    out = torch.empty((2, n_l, t, h, d), dtype=torch.float16)
    out_blocks = out.view(2 * n_l, t, h, d)
    per_block = t * h * d
    if per_block * 2 * n_l <= CHUNK_VALUES:  # a small shard: one slab (per-slab overheads would dominate)
        slabs = [(slice(None), slice(None))]
    else:  # a (tensor, layer) block, a few tokens at a time: the float32 work stays in the core's cache
        rows = max(1, CHUNK_VALUES // (h * d))
        slabs = [(slice(b, b + 1), slice(r, r + rows)) for b in range(2 * n_l) for r in range(0, t, rows)]
    buf = scratch("code", min(per_block * 2 * n_l, max(CHUNK_VALUES, h * d)), torch.float32)
    for blk, tok in slabs:
        src = centre[blk, tok]
        code = buf[: src.numel()].view(src.shape)
        code.copy_(src)
        if isinstance(half, torch.Tensor):
            code.sub_(half[blk, tok])
        elif half is not None:
            code.sub_(half)
        code.mul_(step[blk]).add_(lo[blk])
        out_blocks[blk, tok].copy_(code)
    _fill_dropped(out.numpy().reshape(-1, d), w, p.mean, t, h)
    return out[0], out[1]


def _fill_dropped(out: np.ndarray, w: np.ndarray, mean: np.ndarray, t: int, h: int) -> None:
    """Write each dropped unit's (tensor, layer, head) channel means into its row of ``out`` (units, head_dim)."""
    dropped = np.flatnonzero(w == 0)  # flat (tensor, layer, token, head) units
    if not dropped.size:
        return
    d = out.shape[1]
    block = _unit_blocks(out.shape[0] // (t * h), t, h).take(dropped)  # flat (tensor, layer, head)
    means = np.ascontiguousarray(mean.astype(np.float16).reshape(-1, d))
    fill = scratch("fill", dropped.size * d, torch.float16).numpy().reshape(dropped.size, d)
    np.take(_rows(means), block, out=_rows(fill), mode="clip")  # in range by construction; "raise" buffers `out`
    np.put(_rows(out), dropped, _rows(fill))  # rows copied whole (one opaque item: numpy moves it with one memcpy)


@functools.lru_cache(maxsize=8)
def _unit_blocks(n_blocks: int, t: int, h: int) -> np.ndarray:
    """(n_blocks * t * h,) int32, read-only: the flat (tensor, layer, head) of each flat (tensor, layer, token, head)
    unit."""
    blocks = np.arange(n_blocks, dtype=np.int32)[:, None, None] * h + np.arange(h, dtype=np.int32)[None, None, :]
    out = np.ascontiguousarray(np.broadcast_to(blocks, (n_blocks, t, h))).reshape(-1)
    out.flags.writeable = False
    return out


_BYTES = np.uint64(0x0101010101010101)  # one in each byte of a 64-bit word
_SHIFT = np.array([0] + [8 - w for w in WIDTHS[1:]], dtype=np.int64)  # per width: left-align its bits (w=0: 0)
_BIAS = np.array([1 << (7 - w) if w < 8 else 0 for w in WIDTHS], dtype=np.uint64)  # the half-bin bit below them
_BIAS_WORDS = (_BIAS * _BYTES).view(np.int64)  # that bit in every byte of a word


def _rows(a: np.ndarray) -> np.ndarray:
    """A C-contiguous 2-D array as a 1-D array of opaque rows (same memory): row gathers and scatters in one go."""
    return a.view(_void(a.shape[1] * a.itemsize)).reshape(a.shape[0])


@functools.cache
def _void(nbytes: int) -> np.dtype:
    return np.dtype((np.void, nbytes))


def _words(a: np.ndarray) -> np.ndarray | None:
    """A C-contiguous uint8 array as uint64 words (same memory), or ``None`` when its size or address is not a
    multiple of 8."""
    if a.size % 8 or a.ctypes.data % 8 or not a.flags.c_contiguous:
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


def _centre_codes(acc: torch.Tensor, widx: np.ndarray) -> torch.Tensor:
    """(units, head_dim) uint8: ``acc << (8 - w) | 1 << (7 - w)`` per unit of width ``WIDTHS[widx]`` (``acc`` for
    w = 8), in this thread's work buffer (read it before the next call).

    As float, this minus 0.5 (w < 8) is the bin centre in fine-code units. With ``head_dim % 8 == 0`` the shift runs
    on 64-bit words: every byte of ``acc`` is < 2**w, so no bit crosses into the next byte."""
    acc = acc.contiguous()
    out = scratch("centre", acc.numel(), torch.uint8).view(acc.shape)
    if acc.shape[1] % 8 == 0 and acc.data_ptr() % 8 == 0:
        words = out.view(torch.int64)  # (units, head_dim / 8)
        shift = torch.from_numpy(_SHIFT.take(widx)).view(-1, 1)
        torch.bitwise_left_shift(acc.view(torch.int64), shift, out=words)
        words.bitwise_or_(torch.from_numpy(_BIAS_WORDS.take(widx)).view(-1, 1))
        return out
    shift, bias = _SHIFT[widx][:, None], _BIAS[widx][:, None]
    torch.bitwise_left_shift(acc, torch.from_numpy(shift.astype(np.uint8)), out=out)
    return out.bitwise_or_(torch.from_numpy(bias.astype(np.uint8)))


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
    planes = np.zeros(per * q, np.uint8)
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
    first = 0  # the first plane needs no mask in bytes (nothing above it); in words the next byte's bits shift in
    if src is not None and dst is not None:  # a plane's low m bits of each byte never come from the next byte
        q, mask, first = q // 8, np.uint64(((1 << m) - 1) * int(_BYTES)), -1
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
    params: _Params


#: Compact ranges of a predicted residual (a base blob whose header has a predictor scale): per channel the mean
#: (float16) and its distance to the minimum and to the maximum as a log code ``c`` (uint8): ``_SPAN[c]`` =
#: 2 ** ((c - 168) / 8) (0 for c = 0; 5e-7 .. 1868), rounded outward by the encoder — 4 bytes a channel instead of 6
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
        raise ValueError(f"a residual channel spans {float(dist.max()):.4g} from its mean, over the compact ranges' "
                         f"{MAX_SPAN:.4g}: encode this step without the cross-step predictor")  # fmt: skip
    return np.searchsorted(_SPAN, dist, side="left").astype(np.uint8)


def compact_ranges(mean16: np.ndarray, lo_code: np.ndarray, hi_code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) float32 of a predicted residual's compact ranges: the mean minus / plus the codes' spans."""
    mean = mean16.astype(np.float32)
    return mean - _SPAN[lo_code], mean + _SPAN[hi_code]


def _base_params(head: bytes, n_l: int, h: int, d: int, compact: bool = False) -> _Params:
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
    return _Params(lo=meta[0], step=(meta[1] - meta[0]) / np.float32(255.0), mean=meta[2])


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
    if base:
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
            np.put(_rows(acc), units, _rows(sym))
        elif units.size == n_units:  # every unit gains m bits: no gather/scatter
            _shift_in(acc, m, sym)
        else:  # gather, refine, scatter back, a row at a time
            upd = scratch("refine", units.size * d, torch.uint8).numpy().reshape(units.size, d)
            np.take(_rows(acc), units, out=_rows(upd), mode="clip")
            _shift_in(upd, m, sym)
            np.put(_rows(acc), units, _rows(upd))
    return _State(new, acc, params)


def decode_sakura(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    """Decode a validated chain base..level; returns float16 K, V (layers, tokens, heads, head_dim)."""
    state = None
    for header, sections in parsed:
        state = _apply(state, header, sections, transient=True)
    return _finish(state, parsed[-1][0])


def _finish(state: _State, header: ShardHeader) -> tuple[np.ndarray, np.ndarray]:
    n_l, t, h, d = header.tensor_shape
    k, v = _reconstruct(state.idx, torch.from_numpy(state.acc).reshape(2, n_l, t, h, d), state.params)
    return k.numpy(), v.numpy()


def _step(state: _State | None, header: ShardHeader, sections: list[memoryview]) -> _State:
    """One incremental step that leaves ``state`` untouched (so a rejected blob changes nothing)."""
    if state is not None:
        state = _State(state.idx.copy(), state.acc.copy(), state.params)  # params are never written after the base
    return _apply(state, header, sections)

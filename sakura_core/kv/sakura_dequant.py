"""Dequantisation of the SAKURA codec, shared by the decoder (phone) and the encoder, which measures its distortion
with exactly what the decoder will output: from each unit's width and the top bits of its fine codes to float16 K
and V, bit for bit the multiply-add form of the bin centre (``sakura_decode`` holds the wire format).

Where a phone-scale decode's time goes and the rules that keep it fast: DEVELOPERS.md "Changing the SAKURA decoder".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from .codec_parts import CHUNK_VALUES, scratch

__all__ = ["SPARSE_KEPT", "WIDTHS", "Params", "reconstruct", "rows_view"]

WIDTHS = (0, 1, 2, 3, 4, 5, 6, 8)
_W8 = np.array(WIDTHS, dtype=np.uint8)


@dataclass
class Params:
    """Per-channel dequantisation parameters of a shard (from its base blob)."""

    lo: np.ndarray  # (2, layers, heads, head_dim) float32 (from float16): K and V channel minima
    step: np.ndarray  # (2, layers, heads, head_dim): fine-code step
    mean: np.ndarray  # (2, layers, heads, head_dim): what a dropped unit decodes to


#: A (tensor, layer) block with fewer kept (width > 0) units than this fraction is dequantised unit by unit (the kept
#: rows gathered, their head's ranges gathered alongside: more work per value) instead of densely (every value, the
#: dropped ones overwritten): a cheap rung drops most of a block. 0.3: chosen because the two break even at about a
#: third kept on phone-scale rungs (`sakura bench decode`).
SPARSE_KEPT = 0.3


def reconstruct(idx: np.ndarray, acc: torch.Tensor, p: Params) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise: the centre of each unit's bin, ``lo + step * (code * 2**(8 - w) + (2**(8 - w) - 1) / 2)`` in
    float32 (the scale-and-shift as two roundings, multiply then add), then float16; a dropped unit (width 0) is the
    mean of its (tensor, layer, head) channels.

    ``idx``: (2, layers, tokens, heads) width indices; ``acc``: (2, layers, tokens, heads, head_dim) uint8, the top
    ``w`` bits of each fine code (right-aligned, so each byte is < 2**w). Returns float16 K and V (layers, tokens,
    heads, head_dim). The bin-centre code is exact in float32, so it is built in integers (one shift and one OR
    per unit, 8 bytes at a time) and one constant 0.5: the result is bit for bit the multiply-add form.
    """
    _, n_l, t, h, d = acc.shape
    widx = idx.reshape(2 * n_l, t * h)
    w = _W8.take(widx)  # (blocks, units)
    top = w == 8  # a full-width unit's centre is its code: nothing to subtract
    half: float | np.ndarray | torch.Tensor | None = (
        None if top.all() else 0.5 if not top.any() else np.where(top, np.float32(0.0), np.float32(0.5))
    )
    if isinstance(half, np.ndarray):
        half = torch.from_numpy(half.reshape(2 * n_l, t, h, 1))
    step = torch.from_numpy(p.step).view(2 * n_l, 1, h, d)
    lo = torch.from_numpy(p.lo).view(2 * n_l, 1, h, d)
    means = torch.from_numpy(p.mean.astype(np.float16).reshape(2 * n_l, h, d))
    out = torch.empty((2, n_l, t, h, d), dtype=torch.float16)
    out_blocks, acc_blocks = out.view(2 * n_l, t, h, d), acc.reshape(2 * n_l, t * h, d)
    small = 2 * n_l * t * h * d <= CHUNK_VALUES  # one slab for all (per-block overheads would dominate)
    kept = np.count_nonzero(w, axis=1)
    for g in [slice(None)] if small else [slice(b, b + 1) for b in range(2 * n_l)]:
        if not small and not isinstance(half, torch.Tensor) and kept[g.start] < SPARSE_KEPT * t * h:
            b = g.start
            _sparse_block(out_blocks[b], acc_blocks[b], widx[b], half, step[b, 0], lo[b, 0], means[b])
            continue
        centre = _centre_codes(acc_blocks[g].reshape(-1, d), widx[g].reshape(-1))  # centre + 0.5, or the code
        _dense_blocks(
            out_blocks[g],
            centre.view(-1, t, h, d),
            half[g] if isinstance(half, torch.Tensor) else half,
            step[g],
            lo[g],
        )
        _fill_dropped(out_blocks[g], w[g], means[g])
    return out[0], out[1]


def _dense_blocks(out: torch.Tensor, centre: torch.Tensor, half, step: torch.Tensor, lo: torch.Tensor) -> None:
    """Every value of (tensor, layer) blocks, (blocks, tokens, heads, head_dim), a few tokens at a time (the float32
    work stays in the core's cache); ``half``: None, 0.5 or a (blocks, tokens, heads, 1) tensor; ``step``, ``lo``:
    (blocks, 1, heads, head_dim)."""
    n_b, t, h, d = centre.shape
    rows = max(1, CHUNK_VALUES // (n_b * h * d))
    buf = scratch("code", n_b * min(t, rows) * h * d, torch.float32)
    for r in range(0, t, rows):
        src = centre[:, r : r + rows]
        code = buf[: src.numel()].view(src.shape)
        code.copy_(src)
        if isinstance(half, torch.Tensor):
            code.sub_(half[:, r : r + rows])
        elif half is not None:
            code.sub_(half)
        code.mul_(step).add_(lo)
        out[:, r : r + rows].copy_(code)


def _fill_dropped(out: torch.Tensor, w: np.ndarray, means: torch.Tensor) -> None:
    """Write each dropped unit's channel means (``means``: (blocks, heads, head_dim)) into its row of ``out``
    (blocks, tokens, heads, head_dim); ``w``: (blocks, tokens * heads) widths."""
    dropped = np.flatnonzero(w == 0)  # flat (block, token, head) units
    if not dropped.size:
        return
    n_b, t, h, d = out.shape
    channels = _unit_channels(n_b, t, h).take(dropped)  # flat (block, head)
    fill = scratch("fill", dropped.size * d, torch.float16).numpy().reshape(dropped.size, d)
    np.take(rows_view(means.numpy().reshape(-1, d)), channels, out=rows_view(fill), mode="clip")  # in range
    np.put(rows_view(out.numpy().reshape(-1, d)), dropped, rows_view(fill))  # rows copied whole: one memcpy each


@functools.lru_cache(maxsize=8)
def _unit_channels(n_b: int, t: int, h: int) -> np.ndarray:
    """(n_b * t * h,) int64, read-only: the flat (block, head) of each flat (block, token, head) unit."""
    out = (np.arange(n_b)[:, None, None] * h + np.arange(h)[None, None, :]).repeat(t, axis=1).reshape(-1)
    out.flags.writeable = False
    return out


def _sparse_block(out: torch.Tensor, acc: torch.Tensor, widx: np.ndarray, half, step, lo, means) -> None:
    """One mostly dropped block: ``out`` (tokens, heads, head_dim) filled with the channel means, then each kept
    unit's row, a few at a time (``half``: None or 0.5; ``step``, ``lo``, ``means``: (heads, head_dim))."""
    t, h, d = out.shape
    out.copy_(means.expand(t, h, d))
    kept = np.flatnonzero(widx)  # (token, head) units of width > 0
    out_rows, acc_rows = rows_view(out.numpy().reshape(-1, d)), rows_view(acc.numpy())
    rows = max(1, CHUNK_VALUES // d)
    for r in range(0, kept.size, rows):
        units = kept[r : r + rows]
        n = units.size
        codes = scratch("sparse", n * d, torch.uint8)
        np.take(acc_rows, units, out=rows_view(codes.numpy().reshape(n, d)), mode="clip")
        centre = _centre_codes(codes.view(n, d), widx.take(units))
        heads = torch.from_numpy(_unit_heads(t, h).take(units))
        x, ranges = (
            scratch("code", n * d, torch.float32).view(n, d),
            scratch("ranges", n * d, torch.float32).view(n, d),
        )
        x.copy_(centre)
        if half is not None:
            x.sub_(half)
        x.mul_(torch.index_select(step, 0, heads, out=ranges))
        x.add_(torch.index_select(lo, 0, heads, out=ranges))
        res = scratch("fill", n * d, torch.float16).view(n, d)
        res.copy_(x)
        np.put(out_rows, units, rows_view(res.numpy()))


@functools.lru_cache(maxsize=8)
def _unit_heads(t: int, h: int) -> np.ndarray:
    """(t * h,) int64, read-only: the head of each flat (token, head) unit of a block."""
    out = np.tile(np.arange(h, dtype=np.int64), t)
    out.flags.writeable = False
    return out


_BYTES = np.uint64(0x0101010101010101)  # one in each byte of a 64-bit word
_SHIFT = np.array([0] + [8 - w for w in WIDTHS[1:]], dtype=np.int64)  # per width: left-align its bits (w=0: 0)
_BIAS = np.array([1 << (7 - w) if w < 8 else 0 for w in WIDTHS], dtype=np.uint64)  # the half-bin bit below them
_BIAS_WORDS = (_BIAS * _BYTES).view(np.int64)  # that bit in every byte of a word


def rows_view(a: np.ndarray) -> np.ndarray:
    """A C-contiguous 2-D array as a 1-D array of opaque rows (same memory): row gathers and scatters in one go."""
    return a.view(_void(a.shape[1] * a.itemsize)).reshape(a.shape[0])


@functools.cache
def _void(nbytes: int) -> np.dtype:
    return np.dtype((np.void, nbytes))


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

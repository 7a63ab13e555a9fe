"""Decode a representation: a chain of blobs (base first, then the enhancements that refine it), validated link by link.

The runtime calls :func:`decode_representation` with the blobs of one representation as the manifest lists them
(``requires`` + the representation's own digest). Every blob is parsed and checked (magic, version, lengths,
checksum) before decoding; the chain must be one codec, one shard (model, template, layers, geometry), strictly
increasing levels, and each refinement must name the sha256 of the blob before it. Any mismatch raises a
:class:`~sakura_core.kv.container.ShardFormatError` subclass that says what is wrong — never a silently wrong tensor.

:class:`ChainDecoder` does the same incrementally: push the base, read the tensors, push an enhancement later and
read the upgraded tensors — a progressive codec then only applies the new blob instead of re-decoding the chain.

A cross-step residual (per-step KV of step s coded as ``KV_s - KV_r`` against an earlier step r of the same layers;
its header names r and the reference shard's identity, the digest of its exact fp16 blob) decodes to the
reference's decoded KV — at whatever level the client holds it — plus the decoded residual: pass that
:class:`DecodedReference`. Without it, or with another one, decoding raises :class:`MissingReferenceError` /
:class:`~sakura_core.kv.container.ShardChainError` naming what it needs: never a residual used as KV.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .codec_parts import CHUNK_VALUES, scratch
from .codec_registry import CODECS, get_codec
from .container import (
    ShardChainError,
    ShardHeader,
    UnknownCodecError,
    parse_shard,
    shard_digest,
)
from .predictor import scales_from_codes

__all__ = [
    "ChainDecoder",
    "DecodedReference",
    "MissingReferenceError",
    "apply_reference",
    "decode_chain",
    "decode_representation",
    "parse_chain",
]


class MissingReferenceError(ShardChainError):
    """A cross-step residual was to be decoded without its reference shard's decoded KV."""


@dataclass(frozen=True)
class DecodedReference:
    """The decoded KV of a reference shard, as a cross-step residual needs it.

    Attributes:
        step: the reference shard's sampler step.
        digest: its identity: the digest of its exact (fp16) representation, as residual headers name it.
        k, v: its decoded K and V (any representation of it), float16 (layers, tokens, heads, head_dim).
    """

    step: int
    digest: str
    k: np.ndarray
    v: np.ndarray


def apply_reference(header: ShardHeader, k, v, reference: DecodedReference | None, scale: bytes | None = None):
    """The shard's KV from its decoded chain: ``k, v`` themselves for a self-contained shard, the reference's KV plus
    them for a cross-step residual — the reference scaled per channel by the chain base's predictor ``scale``
    (``ShardHeader.ref_scale``, :mod:`.predictor`) when it has one (float16 numpy arrays in, float16 out)."""
    need = header.reference
    if need is None:
        return k, v
    if reference is None:
        raise MissingReferenceError(
            f"layers {header.layer_first}-{header.layer_last} of step {header.step} are coded against step {need[0]} "
            f"(shard {need[1][:12]}…), which is not decoded: decode that shard first, or fetch a self-contained "
            "representation"
        )
    if (reference.step, reference.digest) != need:
        raise ShardChainError(
            f"step {header.step} layers {header.layer_first}-{header.layer_last} is coded against step {need[0]} "
            f"shard {need[1][:12]}…, but the reference given is step {reference.step} shard {reference.digest[:12]}…"
        )
    rk, rv = np.asarray(reference.k), np.asarray(reference.v)
    if rk.shape != tuple(header.tensor_shape) or rv.shape != tuple(header.tensor_shape):
        raise ShardChainError(f"reference KV has shape {rk.shape}, the shard needs {header.tensor_shape}")
    a = None if scale is None else scales_from_codes(scale, header.num_layers, header.heads, header.head_dim)
    return _add16(rk, k, None if a is None else a[0]), _add16(rv, v, None if a is None else a[1])


def _add16(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """float16 ``scale * a + b`` (``a``, ``b``: float16 (layers, tokens, heads, head_dim)), each step one float32
    rounding: widen, multiply, add, narrow. In torch (numpy's float16 conversions are not vectorised: they would be
    most of a residual's decode time), the same IEEE operations, so the same bits; a slab of tokens at a time in two
    reused float32 buffers (cache-sized, no page faults)."""
    n_l, t, h, d = a.shape
    out = torch.empty(a.shape, dtype=torch.float16)
    ta, tb = torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))
    rows = max(1, CHUNK_VALUES // (h * d))
    acc = scratch("ref_acc", rows * h * d, torch.float32).view(rows, h, d)
    res = scratch("ref_res", rows * h * d, torch.float32).view(rows, h, d)
    sc = None if scale is None else torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32))
    for layer in range(n_l):
        for r in range(0, t, rows):
            x, y = acc[: min(rows, t - r)], res[: min(rows, t - r)]
            x.copy_(ta[layer, r : r + rows])
            if sc is not None:
                x.mul_(sc[layer])  # (1, heads, head_dim) over the slab's tokens
            y.copy_(tb[layer, r : r + rows])
            x.add_(y)
            out[layer, r : r + rows].copy_(x)
    return out.numpy()


Parsed = list[tuple[ShardHeader, list[memoryview]]]


def _check_link(index: int, header: ShardHeader, first: ShardHeader | None, prev: ShardHeader | None, prev_digest):
    """Raise ShardChainError unless ``header`` can follow ``prev`` (``first`` = the chain's base) in a chain."""
    if first is None:
        if header.parent is not None:
            raise ShardChainError(
                f"first blob ({header.codec} level {header.level}, layers {header.layer_first}-"
                f"{header.layer_last}) refines {header.parent[:12]}…: pass its base blob(s) first"
            )
        if header.codec not in CODECS:
            raise UnknownCodecError(f"shard codec {header.codec!r} is not known; known: {sorted(CODECS)}")
        return
    assert prev is not None  # first and prev come from the same chain: both None or both set
    if header.ref_scale is not None:
        raise ShardChainError(
            f"blob {index} (level {header.level}) is a refinement carrying a predictor scale: only "
            "a chain's base carries it"
        )
    if header.codec != first.codec:
        raise ShardChainError(f"blob {index} is codec {header.codec!r}, the chain's base is {first.codec!r}")
    if not get_codec(first.codec).progressive:
        raise ShardChainError(f"codec {first.codec!r} is not progressive: a representation is exactly one blob")
    if not header.same_shard(first):
        raise ShardChainError(
            f"blob {index} belongs to another shard: model {header.model_id[:12]}…, template "
            f"{header.template_id!r}, layers {header.layer_first}-{header.layer_last} vs model "
            f"{first.model_id[:12]}…, template {first.template_id!r}, layers {first.layer_first}-{first.layer_last}"
        )
    if header.level <= prev.level:
        raise ShardChainError(f"blob {index} has level {header.level}, not above the previous level {prev.level}")
    expected = prev_digest()
    if header.parent != expected:
        raise ShardChainError(
            f"blob {index} (level {header.level}) refines {str(header.parent)[:12]}…, but the blob before it is "
            f"{expected[:12]}…: the chain is out of order or mixes encodings"
        )


def parse_chain(blobs: Sequence[bytes]) -> Parsed:
    """Parse and cross-check a chain of blobs; returns ``[(header, sections), ...]`` in chain order."""
    if not blobs:
        raise ShardChainError("decode needs at least one blob (the base of the representation)")
    parsed: Parsed = []
    for i, blob in enumerate(blobs):
        header, sections = parse_shard(blob)
        first = parsed[0][0] if parsed else None
        prev = parsed[-1][0] if parsed else None
        _check_link(i, header, first, prev, lambda i=i: shard_digest(blobs[i - 1]))
        parsed.append((header, sections))
    return parsed


def decode_chain(
    blobs: Sequence[bytes], reference: DecodedReference | None = None
) -> tuple[ShardHeader, np.ndarray, np.ndarray]:
    """Validate and decode a chain (plus its reference, for a cross-step residual); returns the top blob's header
    and float16 numpy K, V (layers, tokens, heads, head_dim)."""
    parsed = parse_chain(blobs)
    header = parsed[-1][0]
    if header.reference is None and reference is not None:
        raise ShardChainError(f"a self-contained shard (step {header.step}) was given a reference to add")
    k, v = get_codec(header.codec).decode(parsed)
    _check_shapes(header, k, v)
    k, v = apply_reference(header, k, v, reference, parsed[0][0].ref_scale)
    return header, k, v


def _check_shapes(header: ShardHeader, k, v) -> None:
    expected = header.tensor_shape
    if tuple(k.shape) != expected or tuple(v.shape) != expected:  # a codec bug, not a data error: say so loudly
        raise RuntimeError(f"codec {header.codec!r} decoded shapes {k.shape}/{v.shape}, header says {expected}")


def decode_representation(
    blobs: Sequence[bytes], reference: DecodedReference | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one representation of one shard: ``blobs`` = the chain base..level, in order (``reference``: the
    decoded reference shard of a cross-step residual).

    Returns K and V, each float16 (layers_in_shard, tokens, heads, head_dim). Raises a
    :class:`~sakura_core.kv.container.ShardFormatError` subclass on any corrupt, truncated, foreign or
    out-of-order blob, and :class:`MissingReferenceError` for a residual without its reference.
    """
    _, k, v = decode_chain(blobs, reference)
    return torch.from_numpy(k), torch.from_numpy(v)


class ChainDecoder:
    """Incremental decoder of one shard's chain: :meth:`push` blobs in chain order, :meth:`tensors` at any point.

    Each pushed blob is validated like :func:`parse_chain` does (a rejected blob leaves the decoder unchanged). A
    progressive codec with incremental hooks (SAKURA) applies only the new blob; other codecs decode the chain.
    One instance per shard and thread. A cross-step residual's :meth:`tensors` add ``reference`` (set it, or
    :meth:`set_reference` when it is decoded; an upgraded reference is set again).
    """

    def __init__(self, reference: DecodedReference | None = None) -> None:
        self._blobs: list[bytes] = []
        self._parsed: Parsed = []
        self._state: object = None  # the codec's incremental decoding state (Codec.decode_step)
        self.reference = reference

    def set_reference(self, reference: DecodedReference | None) -> None:
        self.reference = reference

    @property
    def header(self) -> ShardHeader | None:
        """Header of the latest blob (its level is the level :meth:`tensors` returns), or ``None`` before any."""
        return self._parsed[-1][0] if self._parsed else None

    def push(self, blob: bytes, check: Callable[[ShardHeader], None] | None = None) -> ShardHeader:
        """Parse ``blob``, check it follows the chain, then ``check(header)`` (the caller's test of the header
        against what it expects, e.g. ``kv.binding.check_shard_geometry``), all before anything is decompressed."""
        header, sections = parse_shard(blob)
        first = self._parsed[0][0] if self._parsed else None
        prev = self._parsed[-1][0] if self._parsed else None
        _check_link(len(self._parsed), header, first, prev, lambda: shard_digest(self._blobs[-1]))
        if check is not None:
            check(header)
        codec = get_codec(header.codec)
        if codec.decode_step is not None:
            self._state = codec.decode_step(self._state, header, sections)
        self._blobs.append(blob)
        self._parsed.append((header, sections))
        return header

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V (float16, (layers, tokens, heads, head_dim)) at the latest pushed level."""
        if not self._parsed:
            raise ShardChainError("no blob pushed yet: push the representation's base first")
        header = self._parsed[-1][0]
        codec = get_codec(header.codec)
        if codec.decode_step is not None and codec.decode_finish is not None:
            k, v = codec.decode_finish(self._state, header)
        else:
            k, v = codec.decode(self._parsed)
        _check_shapes(header, k, v)
        k, v = apply_reference(header, np.asarray(k), np.asarray(v), self.reference, self._parsed[0][0].ref_scale)
        return torch.as_tensor(k), torch.as_tensor(v)

"""Decode a representation: a chain of blobs (base first, then the enhancements that refine it), validated link by link.

The runtime calls :func:`decode_representation` with the blobs of one representation as the manifest lists them
(``requires`` + the representation's own digest). Every blob is parsed and checked (magic, version, lengths,
checksum) before decoding; the chain must be one codec, one shard (model, template, layers, geometry), strictly
increasing levels, and each refinement must name the sha256 of the blob before it. Any mismatch raises a
:class:`~sakura_core.kv.container.ShardFormatError` subclass that says what is wrong — never a silently wrong tensor.

:class:`ChainDecoder` does the same incrementally: push the base, read the tensors, push an enhancement later and
read the upgraded tensors — a progressive codec then only applies the new blob instead of re-decoding the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .codec_registry import CODECS, get_codec
from .container import (
    ShardChainError,
    ShardHeader,
    UnknownCodecError,
    parse_shard,
    shard_digest,
)

__all__ = ["ChainDecoder", "decode_chain", "decode_representation", "parse_chain"]

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


def decode_chain(blobs: Sequence[bytes]) -> tuple[ShardHeader, np.ndarray, np.ndarray]:
    """Validate and decode a chain; returns the top blob's header and float16 numpy K, V
    (layers, tokens, heads, head_dim)."""
    parsed = parse_chain(blobs)
    header = parsed[-1][0]
    k, v = get_codec(header.codec).decode(parsed)
    _check_shapes(header, k, v)
    return header, k, v


def _check_shapes(header: ShardHeader, k, v) -> None:
    expected = header.tensor_shape
    if tuple(k.shape) != expected or tuple(v.shape) != expected:  # a codec bug, not a data error: say so loudly
        raise RuntimeError(f"codec {header.codec!r} decoded shapes {k.shape}/{v.shape}, header says {expected}")


def decode_representation(blobs: Sequence[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one representation of one shard: ``blobs`` = the chain base..level, in order.

    Returns K and V, each float16 (layers_in_shard, tokens, heads, head_dim). Raises a
    :class:`~sakura_core.kv.container.ShardFormatError` subclass on any corrupt, truncated, foreign or
    out-of-order blob.
    """
    _, k, v = decode_chain(blobs)
    return torch.from_numpy(k), torch.from_numpy(v)


class ChainDecoder:
    """Incremental decoder of one shard's chain: :meth:`push` blobs in chain order, :meth:`tensors` at any point.

    Each pushed blob is validated like :func:`parse_chain` does (a rejected blob leaves the decoder unchanged). A
    progressive codec with incremental hooks (SAKURA) applies only the new blob; other codecs decode the chain.
    One instance per shard and thread.
    """

    def __init__(self) -> None:
        self._blobs: list[bytes] = []
        self._parsed: Parsed = []
        self._state = None

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
        if codec.decode_step is not None:
            k, v = codec.decode_finish(self._state, header)
        else:
            k, v = codec.decode(self._parsed)
        _check_shapes(header, k, v)
        return torch.as_tensor(k), torch.as_tensor(v)

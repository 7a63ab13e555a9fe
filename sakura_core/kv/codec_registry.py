"""The codec registry: what an encoder gets (:class:`ShardInput`, :class:`ShardMeta`) and one entry per codec.

A codec is a pair of pure functions behind one registry entry (:class:`Codec`):

* ``encode(shard, levels) -> list[bytes]``: one container blob per requested level. For a progressive codec the
  blobs form a chain — blob ``i`` refines blob ``i - 1`` (its header names the parent digest) and the first is a
  base; for the others each blob stands alone and ``levels`` must hold one level.
* ``decode(parsed) -> (k, v)``: ``parsed`` is the validated chain ``[(header, sections), ...]`` (base first), as
  :func:`sakura_core.kv.chain.parse_chain` returns it; ``k`` and ``v`` are float16 arrays
  (layers, tokens, heads, head_dim).

Every decoder checks each section's length against the geometry in the header before it allocates, so a corrupt
blob raises a :class:`~sakura_core.kv.container.ShardFormatError`, never a wrong tensor. The codecs themselves live in
:mod:`.plain_codecs` (fp16, int8, int4), :mod:`.sakura_codec` and :mod:`.cachegen`; their shared helpers in
:mod:`.codec_parts`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .container import ShardHeader

__all__ = ["CODECS", "F16_MAX", "Codec", "Parsed", "ShardInput", "ShardMeta", "get_codec", "register_codec"]

Parsed = list[tuple[ShardHeader, list[memoryview]]]
F16_MAX = 65504.0  # the largest finite float16


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
        step: the sampler step of per-step KV (``None``: single-mode KV).
        ref_step, ref_digest: a cross-step residual's reference — the step and base-blob digest of the shard (same
            layers) whose decoded KV the decoded residual is added to; ``None`` for a self-contained shard.
        ref_scale: the residual's per-channel predictor scale codes (:mod:`.predictor`; the base blob's header
            carries them), ``None`` for a plain difference.
    """

    model_id: str
    template_id: str
    rope_layout: str
    layer_first: int
    token_grid: tuple[int, int]
    num_model_layers: int
    step: int | None = None
    ref_step: int | None = None
    ref_digest: str | None = None
    ref_scale: bytes | None = None


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
    prepared: tuple[object, object] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.k.ndim != 4 or self.k.shape != self.v.shape:
            raise ValueError(
                f"k and v must both be (layers, tokens, heads, head_dim), got {self.k.shape} and {self.v.shape}"
            )
        rows, cols = self.meta.token_grid
        if rows * cols != self.k.shape[1]:
            raise ValueError(f"token_grid {self.meta.token_grid} does not match {self.k.shape[1]} tokens")
        for name, x in (("k", self.k), ("v", self.v)):
            if not np.isfinite(x).all() or np.abs(x).max(initial=0.0) > F16_MAX:
                raise ValueError(f"{name} must be finite and within the float16 range (|x| <= {F16_MAX})")
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
            token_grid=(m.token_grid[0], m.token_grid[1]),
            heads=heads,
            head_dim=head_dim,
            dtype="float16",
            parent=parent,
            step=m.step,
            ref_step=m.ref_step,
            ref_digest=m.ref_digest,
            ref_scale=m.ref_scale if parent is None else None,  # the chain's base carries the predictor
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
        encode_direct: optional ``(shard, levels) -> blobs``, each a direct (self-contained) blob of its level, the
            same bytes as ``encode(shard, [level])[0]`` with the per-shard work done once (see :meth:`direct_blobs`).
    """

    name: str
    levels: tuple[int, ...]
    progressive: bool
    lossless: bool
    encode: Callable[[ShardInput, Sequence[int]], list[bytes]]
    decode: Callable[[Parsed], tuple[np.ndarray, np.ndarray]]
    description: str = ""
    level_names: dict[int, str] = field(default_factory=dict)
    # the state is each codec's own type, opaque to the registry and the chain decoder
    decode_step: Callable[[Any, ShardHeader, list[memoryview]], Any] | None = None
    decode_finish: Callable[[Any, ShardHeader], tuple[np.ndarray, np.ndarray]] | None = None
    prepare: Callable[[Sequence[ShardInput]], list[ShardInput]] | None = None
    encode_direct: Callable[[ShardInput, Sequence[int]], list[bytes]] | None = None

    def direct_blobs(self, shard: ShardInput, levels: Sequence[int]) -> list[bytes]:
        """One direct blob per level of ``levels`` (a progressive codec's chain would refine instead)."""
        if self.encode_direct is not None:
            return self.encode_direct(shard, levels)
        return [self.encode(shard, [level])[0] for level in levels]

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

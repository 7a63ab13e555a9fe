"""Shard container: one immutable, content-addressed blob holding one encoded representation of a shard's KV.

Layout (little endian, no pickle)::

    fixed header   _FIXED (see below): magic "SKKV", format version, header size, flags, dtype, level,
                   layer range, token grid, heads, head_dim, parent digest (32 bytes, zero for a base),
                   sampler step (0xFFFF: none, single-mode KV), reference step (0xFFFF: none) and reference
                   digest (32 bytes, zero for none: the base blob of the shard this one is coded against),
                   section count and the lengths of the four strings
    strings        codec name, model id, template id, RoPE layout (utf-8)
    scale codes    only with flag 0x04: a cross-step residual base's predictor, int8 (2, layers, heads,
                   head_dim) (:mod:`.predictor`)
    section table  one uint32 length per payload section
    sections       codec-defined payload (zstd frames, raw arrays, ...)
    trailer        crc32 of everything before it

The blob's name is ``sha256(blob)`` (:func:`shard_digest`); a refinement blob names the blob it refines by that
digest, so a chain can be checked link by link. A cross-step blob (per-step KV coded as a residual against another
step's decoded KV of the same layers) names that step and that shard's base blob, so a decoder can refuse a wrong
reference; a per-step blob says its step, so a shard served in another step's slot is caught (:mod:`.binding`);
version 1 blobs (no ``step``, no reference) are refused naming the fix. :func:`parse_shard` validates every length and
limit against the blob's actual size before anything is allocated, and raises a specific :class:`ShardFormatError`
subclass.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from .header_checks import DTYPE_CODES, header_problems
from .predictor import scale_codes_size
from .shard_errors import (
    ShardChainError,
    ShardCorruptError,
    ShardFormatError,
    ShardMagicError,
    ShardOversizedError,
    ShardTruncatedError,
    ShardVersionError,
    UnknownCodecError,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_BLOB_BYTES",
    "MAX_ELEMENTS",
    "ShardChainError",
    "ShardCorruptError",
    "ShardFormatError",
    "ShardHeader",
    "ShardMagicError",
    "ShardOversizedError",
    "ShardTruncatedError",
    "ShardVersionError",
    "UnknownCodecError",
    "pack_shard",
    "parse_shard",
    "shard_digest",
]

MAGIC = b"SKKV"
FORMAT_VERSION = 2

#: Largest blob accepted by the decoder (bytes).
MAX_BLOB_BYTES = 1 << 30
#: Largest K (or V) tensor a shard may describe, in elements: layers * tokens * heads * head_dim.
MAX_ELEMENTS = 1 << 28
MAX_SECTIONS = 32

# magic, version, header_size, flags, dtype, level, layer_first, layer_last, grid_rows, grid_cols, heads, head_dim,
# parent digest, step, ref_step, ref digest, n_sections, len(codec), len(model_id), len(template_id), len(rope_layout)
_FIXED = struct.Struct("<4sHHBBHHHHHHH32sHH32sBBBBB")
_TRAILER = struct.Struct("<I")
_FLAG_REFINES = 0x01
_FLAG_REFERENCE = 0x02
_FLAG_SCALE = 0x04  # a cross-step predictor's scale codes follow the strings
_KNOWN_FLAGS = _FLAG_REFINES | _FLAG_REFERENCE | _FLAG_SCALE
_NO_STEP = 0xFFFF
_DTYPES = {code: name for name, code in DTYPE_CODES.items()}
_ZERO_DIGEST = bytes(32)


def shard_digest(blob: bytes) -> str:
    """Content address of a blob: hex sha256 over every byte of it."""
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class ShardHeader:
    """What a shard blob says about itself.

    Attributes:
        codec: codec name (registry key), e.g. ``"sakura"``.
        level: representation level within the codec's ladder (0 = smallest).
        model_id: content id of the model the KV belongs to (hex).
        template_id: template id (``[a-z0-9-]{1,64}``).
        rope_layout: RoPE position layout of the template tokens.
        layer_first, layer_last: inclusive range of model layers in the shard.
        token_grid: (rows, cols) of the template tokens.
        heads, head_dim: attention geometry.
        dtype: dtype of the reconstructed tensors (``"float16"`` or ``"float32"``).
        parent: hex digest of the blob this one refines (a progressive enhancement), or ``None`` for a base.
        step: the sampler step whose KV this is (per-step KV), or ``None`` (single-mode KV, valid at every step).
        ref_step, ref_digest: the step and base-blob digest of the shard (same layers) this one is coded against
            (a cross-step residual: decoded KV = the reference's decoded KV + this chain's), or ``None``.
        ref_scale: a residual base blob's predictor (:mod:`.predictor`): int8 scale codes, (2, layers, heads,
            head_dim) — decoded KV = scale * reference + this chain's; ``None`` = plain difference. Refinements of
            the chain do not repeat it (the chain's base carries it).
    """

    codec: str
    level: int
    model_id: str
    template_id: str
    rope_layout: str
    layer_first: int
    layer_last: int
    token_grid: tuple[int, int]
    heads: int
    head_dim: int
    dtype: str = "float16"
    parent: str | None = None
    step: int | None = None
    ref_step: int | None = None
    ref_digest: str | None = None
    ref_scale: bytes | None = None

    def __post_init__(self) -> None:
        problems = header_problems(self)
        if problems:
            raise ValueError(f"invalid shard header: {problems}")

    @property
    def num_layers(self) -> int:
        return self.layer_last - self.layer_first + 1

    @property
    def num_tokens(self) -> int:
        return self.token_grid[0] * self.token_grid[1]

    @property
    def tensor_shape(self) -> tuple[int, int, int, int]:
        """Shape of K (and of V) in this shard: (layers, tokens, heads, head_dim)."""
        return (self.num_layers, self.num_tokens, self.heads, self.head_dim)

    @property
    def num_elements(self) -> int:
        n_l, t, h, d = self.tensor_shape
        return n_l * t * h * d

    def same_shard(self, other: ShardHeader) -> bool:
        """True when both headers describe the same KV slice (model, template, layers, geometry, dtype)."""
        return (
            self.model_id == other.model_id
            and self.template_id == other.template_id
            and self.rope_layout == other.rope_layout
            and self.layer_first == other.layer_first
            and self.layer_last == other.layer_last
            and tuple(self.token_grid) == tuple(other.token_grid)
            and self.heads == other.heads
            and self.head_dim == other.head_dim
            and self.dtype == other.dtype
            and self.step == other.step
            and self.ref_step == other.ref_step
            and self.ref_digest == other.ref_digest
        )

    @property
    def reference(self) -> tuple[int, str] | None:
        """(step, base digest) of the shard this one is coded against, or ``None`` for a self-contained shard."""
        if self.ref_step is None or self.ref_digest is None:  # both or neither (header_problems)
            return None
        return (self.ref_step, self.ref_digest)


def pack_shard(header: ShardHeader, sections: list[bytes]) -> bytes:
    """Serialise a header and payload sections into one blob (deterministic: same input, same bytes)."""
    if len(sections) > MAX_SECTIONS:
        raise ValueError(f"a shard holds at most {MAX_SECTIONS} sections, got {len(sections)}")
    strings = [s.encode("utf-8") for s in (header.codec, header.model_id, header.template_id, header.rope_layout)]
    scale = header.ref_scale or b""
    header_size = _FIXED.size + sum(len(s) for s in strings) + len(scale) + 4 * len(sections)
    fixed = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        header_size,
        (_FLAG_REFINES if header.parent else 0)
        | (_FLAG_REFERENCE if header.ref_digest else 0)
        | (_FLAG_SCALE if scale else 0),
        DTYPE_CODES[header.dtype],
        header.level,
        header.layer_first,
        header.layer_last,
        header.token_grid[0],
        header.token_grid[1],
        header.heads,
        header.head_dim,
        bytes.fromhex(header.parent) if header.parent else _ZERO_DIGEST,
        _NO_STEP if header.step is None else header.step,
        _NO_STEP if header.ref_step is None else header.ref_step,
        bytes.fromhex(header.ref_digest) if header.ref_digest else _ZERO_DIGEST,
        len(sections),
        *(len(s) for s in strings),
    )
    table = struct.pack(f"<{len(sections)}I", *(len(s) for s in sections))
    body = b"".join([fixed, *strings, scale, table, *sections])
    if len(body) + _TRAILER.size > MAX_BLOB_BYTES:
        raise ValueError(f"shard of {len(body)} bytes exceeds MAX_BLOB_BYTES={MAX_BLOB_BYTES}")
    return body + _TRAILER.pack(zlib.crc32(body))


class _Fixed(NamedTuple):
    """The fields of the fixed header, in ``_FIXED``'s order."""

    magic: bytes
    version: int
    header_size: int
    flags: int
    dtype_code: int
    level: int
    layer_first: int
    layer_last: int
    rows: int
    cols: int
    heads: int
    head_dim: int
    parent_raw: bytes
    step: int
    ref_step: int
    ref_raw: bytes
    n_sections: int
    len_codec: int
    len_model: int
    len_template: int
    len_rope: int


def parse_shard(blob: bytes | bytearray | memoryview) -> tuple[ShardHeader, list[memoryview]]:
    """Validate a blob and split it into its header and payload sections (zero-copy views into ``blob``).

    Raises:
        ShardOversizedError: blob larger than :data:`MAX_BLOB_BYTES`, or a tensor over :data:`MAX_ELEMENTS`.
        ShardMagicError, ShardVersionError: not a shard / a format version this build cannot read.
        ShardTruncatedError: fewer bytes than the header declares.
        ShardCorruptError: checksum mismatch, trailing bytes, or an invalid field.
    """
    view = memoryview(blob).cast("B") if not isinstance(blob, bytes) else memoryview(blob)
    _check_prefix(view)
    f = _Fixed._make(_FIXED.unpack_from(view, 0))
    lengths = _section_lengths(view, f)
    header = _header(view, f)
    sections = []
    pos = f.header_size
    for size in lengths:
        sections.append(view[pos : pos + size])
        pos += size
    return header, sections


def _check_prefix(view: memoryview) -> None:
    """Size limit, magic, format version, and room for the fixed header."""
    n = len(view)
    if n > MAX_BLOB_BYTES:
        raise ShardOversizedError(f"shard blob of {n} bytes exceeds the limit of {MAX_BLOB_BYTES} bytes")
    if n < len(MAGIC):
        raise ShardTruncatedError(f"shard blob of {n} bytes is shorter than the magic")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise ShardMagicError(f"not a SAKURA shard: starts with {bytes(view[:4])!r}, expected {MAGIC!r}")
    if n < len(MAGIC) + 2:
        raise ShardTruncatedError(f"shard blob of {n} bytes ends inside the header")
    (version,) = struct.unpack_from("<H", view, len(MAGIC))
    if version != FORMAT_VERSION:
        raise ShardVersionError(
            f"shard format version {version} is not supported (this build reads version {FORMAT_VERSION}); "
            + (
                "the template was encoded before shards carried their step and reference: re-encode it "
                "(sakura precompute ... --overwrite)"
                if version < FORMAT_VERSION
                else "upgrade the client"
            )
        )
    if n < _FIXED.size + _TRAILER.size:
        raise ShardTruncatedError(f"shard blob of {n} bytes is shorter than the fixed header ({_FIXED.size} bytes)")


def _section_lengths(view: memoryview, f: _Fixed) -> tuple[int, ...]:
    """The section table, once the declared sizes match the blob exactly and its checksum holds."""
    n = len(view)
    if f.n_sections > MAX_SECTIONS:
        raise ShardCorruptError(f"shard declares {f.n_sections} sections, at most {MAX_SECTIONS} are allowed")
    header_size = f.header_size
    scale = scale_codes_size(f.layer_last - f.layer_first + 1, f.heads, f.head_dim) if f.flags & _FLAG_SCALE else 0
    strings = f.len_codec + f.len_model + f.len_template + f.len_rope
    expected_header = _FIXED.size + strings + scale + 4 * f.n_sections
    if header_size != expected_header:
        raise ShardCorruptError(f"shard header size field {header_size} != {expected_header} computed from its fields")
    if n < header_size + _TRAILER.size:
        raise ShardTruncatedError(f"shard blob of {n} bytes ends inside its {header_size}-byte header")
    lengths = struct.unpack_from(f"<{f.n_sections}I", view, header_size - 4 * f.n_sections)
    total = header_size + sum(lengths) + _TRAILER.size
    if total > MAX_BLOB_BYTES:
        raise ShardOversizedError(f"shard declares {total} bytes, over the limit of {MAX_BLOB_BYTES}")
    if n < total:
        raise ShardTruncatedError(f"shard blob has {n} bytes but its header declares {total}")
    if n > total:
        raise ShardCorruptError(f"shard blob has {n - total} trailing bytes after the declared {total}")
    (crc,) = _TRAILER.unpack_from(view, n - _TRAILER.size)
    if zlib.crc32(view[: n - _TRAILER.size]) != crc:
        raise ShardCorruptError("shard checksum mismatch: the blob was corrupted in storage or transfer")
    return lengths


def _header(view: memoryview, f: _Fixed) -> ShardHeader:
    """The validated :class:`ShardHeader`: flags, dtype, parent digest, the four strings, every field's range."""
    if f.flags & ~_KNOWN_FLAGS:
        raise ShardCorruptError(f"shard has unknown flag bits 0x{f.flags & ~_KNOWN_FLAGS:02x}")
    if f.dtype_code not in _DTYPES:
        raise ShardCorruptError(f"shard has unknown dtype code {f.dtype_code}")
    refines = bool(f.flags & _FLAG_REFINES)
    if refines == (f.parent_raw == _ZERO_DIGEST):
        raise ShardCorruptError("shard refinement flag and parent digest disagree")
    has_ref = bool(f.flags & _FLAG_REFERENCE)
    if has_ref == (f.ref_raw == _ZERO_DIGEST) or has_ref == (f.ref_step == _NO_STEP):
        raise ShardCorruptError("shard reference flag, reference step and reference digest disagree")
    pos = _FIXED.size
    strings = []
    for size in (f.len_codec, f.len_model, f.len_template, f.len_rope):
        try:
            strings.append(bytes(view[pos : pos + size]).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ShardCorruptError(f"shard header string at byte {pos} is not utf-8") from e
        pos += size
    try:
        header = ShardHeader(
            codec=strings[0],
            level=f.level,
            model_id=strings[1],
            template_id=strings[2],
            rope_layout=strings[3],
            layer_first=f.layer_first,
            layer_last=f.layer_last,
            token_grid=(f.rows, f.cols),
            heads=f.heads,
            head_dim=f.head_dim,
            dtype=_DTYPES[f.dtype_code],
            parent=f.parent_raw.hex() if refines else None,
            step=None if f.step == _NO_STEP else f.step,
            ref_step=f.ref_step if has_ref else None,
            ref_digest=f.ref_raw.hex() if has_ref else None,
            ref_scale=bytes(view[pos : f.header_size - 4 * f.n_sections]) if f.flags & _FLAG_SCALE else None,
        )
    except ValueError as e:
        raise ShardCorruptError(f"shard header field out of range: {e}") from e
    if header.num_elements > MAX_ELEMENTS:
        raise ShardOversizedError(
            f"shard describes {header.num_elements} elements per tensor {header.tensor_shape}, "
            f"over the limit of {MAX_ELEMENTS}"
        )
    return header

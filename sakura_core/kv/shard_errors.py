"""The errors a shard decoder raises: one base class (:class:`ShardFormatError`, a ``ValueError``) and a subclass per
kind of problem, so a caller can fall back on any of them and still say which it was. Re-exported by
:mod:`.container`."""

from __future__ import annotations

__all__ = [
    "ShardChainError",
    "ShardCorruptError",
    "ShardFormatError",
    "ShardMagicError",
    "ShardOversizedError",
    "ShardTruncatedError",
    "ShardVersionError",
    "UnknownCodecError",
]


class ShardFormatError(ValueError):
    """A shard blob is not a valid SAKURA shard (base class of every decode-side format error)."""


class ShardMagicError(ShardFormatError):
    """The blob does not start with the SAKURA shard magic (not a shard, or the wrong file)."""


class ShardVersionError(ShardFormatError):
    """The blob's format version is not one this decoder reads."""


class ShardTruncatedError(ShardFormatError):
    """The blob is shorter than its header says (an interrupted download?)."""


class ShardCorruptError(ShardFormatError):
    """The blob's bytes are inconsistent: checksum mismatch, bad field, bad payload."""


class ShardOversizedError(ShardFormatError):
    """The blob, or the tensor it describes, exceeds the decoder's limits."""


class ShardChainError(ShardFormatError):
    """Blobs passed as a refinement chain do not belong together (wrong order, other shard, missing link)."""


class UnknownCodecError(ShardFormatError):
    """The blob names a codec this build does not know."""

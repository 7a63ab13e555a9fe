"""Template KV on the server and the phone: shard container, codecs (SAKURA + baselines), token importance,
precompute and manifest.

Public surface (what the cloud server and the runtime call):

* :func:`precompute_template` -> :class:`PrecomputedTemplate` (manifest + blobs by digest);
* :func:`decode_representation` (a chain of blobs -> K, V tensors), :func:`validate_manifest`, :func:`shard_digest`;
* :data:`CODECS` registry with :func:`encode_kv` / :func:`decode_kv` for whole templates (benchmarks);
* the container's error classes, all subclasses of :class:`ShardFormatError` (a ``ValueError``).
"""

from . import cachegen as _cachegen  # noqa: F401  (registers "cachegen")
from . import sakura_codec as _sakura_codec  # noqa: F401  (registers "sakura")
from .attention_capture import capture_attention
from .binding import ShardBindingError, ShardSlot, check_shard_binding, slot_from_manifest
from .chain import ChainDecoder, decode_chain, decode_representation, parse_chain
from .codecs import CODECS, Codec, ShardInput, ShardMeta, get_codec
from .container import (
    ShardChainError,
    ShardCorruptError,
    ShardFormatError,
    ShardHeader,
    ShardMagicError,
    ShardOversizedError,
    ShardTruncatedError,
    ShardVersionError,
    UnknownCodecError,
    parse_shard,
    shard_digest,
)
from .importance import TokenImportance, attention_error, estimate_importance
from .manifest import ManifestError, validate_manifest
from .precompute import PrecomputedTemplate, decode_kv, encode_kv, level_chains, precompute_template, shard_inputs
from .probes import ProbeConfig
from .sakura_codec import SakuraConfig

__all__ = [
    "CODECS",
    "ChainDecoder",
    "Codec",
    "ManifestError",
    "PrecomputedTemplate",
    "ProbeConfig",
    "ShardBindingError",
    "ShardSlot",
    "SakuraConfig",
    "ShardChainError",
    "ShardCorruptError",
    "ShardFormatError",
    "ShardHeader",
    "ShardInput",
    "ShardMagicError",
    "ShardMeta",
    "ShardOversizedError",
    "ShardTruncatedError",
    "ShardVersionError",
    "TokenImportance",
    "UnknownCodecError",
    "attention_error",
    "capture_attention",
    "check_shard_binding",
    "decode_chain",
    "decode_kv",
    "decode_representation",
    "encode_kv",
    "estimate_importance",
    "get_codec",
    "level_chains",
    "parse_chain",
    "parse_shard",
    "precompute_template",
    "shard_digest",
    "shard_inputs",
    "slot_from_manifest",
    "validate_manifest",
]

"""The template-KV wire format, shared by the server and the phone: shard container, codecs (SAKURA + baselines),
chain decoding and the manifest. Server-side work that produces them (importance probes, precompute) lives in
:mod:`sakura_core.precompute`.

Public surface:

* :func:`decode_representation` (a chain of blobs -> K, V tensors), :func:`parse_manifest` (the typed
  :class:`Manifest`; :func:`validate_manifest`), :func:`shard_digest`;
* :data:`CODECS` registry with :func:`encode_kv` / :func:`decode_kv` for whole templates (benchmarks);
* the container's error classes, all subclasses of :class:`ShardFormatError` (a ``ValueError``).
"""

from . import cachegen as _cachegen  # noqa: F401  (registers "cachegen")
from . import plain_codecs as _plain_codecs  # noqa: F401  (registers "fp16", "int8", "int4")
from . import sakura_codec as _sakura_codec  # noqa: F401  (registers "sakura")
from .binding import ShardBindingError, ShardSlot, check_shard_binding, slot_from_manifest
from .chain import ChainDecoder, decode_chain, decode_representation, parse_chain
from .codec_registry import CODECS, Codec, ShardInput, ShardMeta, get_codec
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
from .manifest import (
    Manifest,
    ManifestError,
    ModelMismatchError,
    ScheduleMismatchError,
    check_schedule,
    manifest_kv_mode,
    parse_manifest,
    shards_for_step,
    validate_manifest,
)
from .sakura_codec import SakuraConfig
from .template_codec import ImportanceWeights, decode_kv, decode_template, encode_kv, level_chains, shard_inputs

__all__ = [
    "CODECS",
    "ChainDecoder",
    "ImportanceWeights",
    "Codec",
    "Manifest",
    "ManifestError",
    "ModelMismatchError",
    "ShardBindingError",
    "ShardSlot",
    "SakuraConfig",
    "ScheduleMismatchError",
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
    "UnknownCodecError",
    "check_shard_binding",
    "check_schedule",
    "decode_chain",
    "decode_kv",
    "decode_template",
    "decode_representation",
    "encode_kv",
    "get_codec",
    "level_chains",
    "manifest_kv_mode",
    "parse_chain",
    "parse_manifest",
    "parse_shard",
    "shard_digest",
    "shard_inputs",
    "slot_from_manifest",
    "shards_for_step",
    "validate_manifest",
]

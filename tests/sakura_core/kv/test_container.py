"""Shard container: byte-exact round trip, and a specific error for every kind of bad input."""

import hashlib
import struct
import zlib

import pytest

from sakura_core.kv import container as c
from sakura_core.kv.container import (
    ShardCorruptError,
    ShardHeader,
    ShardMagicError,
    ShardOversizedError,
    ShardTruncatedError,
    ShardVersionError,
    pack_shard,
    parse_shard,
    shard_digest,
)

HEADER = ShardHeader(
    codec="sakura",
    level=3,
    model_id="ab" * 32,
    template_id="astro-1",
    rope_layout="flux2-ref-t10",
    layer_first=2,
    layer_last=3,
    token_grid=(16, 16),
    heads=4,
    head_dim=24,
    parent="cd" * 32,
)
SECTIONS = [b"first section", b"", bytes(range(256)) * 3]


def _repack_crc(body: bytes) -> bytes:
    """Replace the trailer with a valid crc32 of ``body`` (a crafted blob, not a transmission error)."""
    return body + struct.pack("<I", zlib.crc32(body))


def test_round_trip_is_byte_exact_and_digest_is_sha256():
    blob = pack_shard(HEADER, SECTIONS)
    header, sections = parse_shard(blob)
    assert header == HEADER
    assert [bytes(s) for s in sections] == SECTIONS
    assert pack_shard(header, [bytes(s) for s in sections]) == blob
    assert shard_digest(blob) == hashlib.sha256(blob).hexdigest()
    assert header.tensor_shape == (2, 256, 4, 24)


def test_base_header_has_no_parent():
    base = ShardHeader("fp16", 0, "ab" * 32, "t", "flux2-ref-t10", 0, 0, (2, 2), 1, 8)
    header, _ = parse_shard(pack_shard(base, [b"x"]))
    assert header.parent is None


def test_wrong_magic():
    blob = pack_shard(HEADER, SECTIONS)
    with pytest.raises(ShardMagicError, match="not a SAKURA shard"):
        parse_shard(b"PK\x03\x04" + blob[4:])


def test_wrong_version_is_reported_before_anything_else():
    blob = bytearray(pack_shard(HEADER, SECTIONS))
    blob[4:6] = struct.pack("<H", c.FORMAT_VERSION + 1)
    with pytest.raises(
        ShardVersionError, match=f"version {c.FORMAT_VERSION + 1} is not supported.*upgrade the client"
    ):
        parse_shard(bytes(blob))


def test_a_version_1_blob_is_refused_naming_the_fix():
    blob = bytearray(pack_shard(HEADER, SECTIONS))
    blob[4:6] = struct.pack("<H", 1)
    with pytest.raises(ShardVersionError, match=r"before shards carried their step.*sakura precompute .* --overwrite"):
        parse_shard(bytes(blob))


def test_every_truncation_is_reported_as_truncated():
    blob = pack_shard(HEADER, SECTIONS)
    for n in range(len(blob)):
        with pytest.raises(ShardTruncatedError):
            parse_shard(blob[:n])


def test_flipped_byte_fails_the_checksum():
    blob = bytearray(pack_shard(HEADER, SECTIONS))
    blob[-10] ^= 0x01
    with pytest.raises(ShardCorruptError, match="checksum"):
        parse_shard(bytes(blob))


def test_trailing_bytes_are_corrupt():
    with pytest.raises(ShardCorruptError, match="trailing"):
        parse_shard(pack_shard(HEADER, SECTIONS) + b"\0")


def test_oversized_blob_is_rejected_before_parsing(monkeypatch):
    blob = pack_shard(HEADER, SECTIONS)
    monkeypatch.setattr(c, "MAX_BLOB_BYTES", len(blob) - 1)
    with pytest.raises(ShardOversizedError, match="exceeds the limit"):
        parse_shard(blob)


def test_oversized_geometry_is_rejected():
    huge = ShardHeader("fp16", 0, "ab" * 32, "t", "r", 0, 4095, (4096, 4096), 1024, 1024)
    with pytest.raises(ShardOversizedError, match="elements"):
        parse_shard(pack_shard(huge, []))


def test_section_table_claiming_more_than_the_blob_is_truncated_not_allocated():
    blob = pack_shard(HEADER, SECTIONS)
    header_size = struct.unpack_from("<H", blob, 6)[0]
    body = bytearray(blob[:-4])
    struct.pack_into("<I", body, header_size - 4, 0xFFFFFFF0)  # last section claims ~4 GiB
    with pytest.raises((ShardTruncatedError, ShardOversizedError)):
        parse_shard(_repack_crc(bytes(body)))


def test_inconsistent_header_size_is_corrupt():
    body = bytearray(pack_shard(HEADER, SECTIONS)[:-4])
    struct.pack_into("<H", body, 6, struct.unpack_from("<H", body, 6)[0] + 1)
    with pytest.raises(ShardCorruptError, match="header size"):
        parse_shard(_repack_crc(bytes(body)))


def test_bad_string_field_is_corrupt():
    body = pack_shard(HEADER, SECTIONS)[:-4]
    bad = body.replace(b"astro-1", b"ASTRO/1")  # violates the template id pattern
    with pytest.raises(ShardCorruptError, match="template_id"):
        parse_shard(_repack_crc(bad))


def test_parent_flag_mismatch_is_corrupt():
    body = bytearray(pack_shard(HEADER, SECTIONS)[:-4])
    body[8] = 0  # clear the refinement flag, keep the parent digest
    with pytest.raises(ShardCorruptError, match="parent"):
        parse_shard(_repack_crc(bytes(body)))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("template_id", "Bad_ID", "template_id"),
        ("model_id", "xyz", "model_id"),
        ("codec", "", "codec"),
        ("layer_last", 1, "layer range"),
        ("heads", 0, "heads"),
        ("dtype", "int8", "dtype"),
        ("parent", "abc", "parent"),
    ],
)
def test_header_validation_names_the_field(field, value, message):
    kwargs = {**HEADER.__dict__, field: value}
    with pytest.raises(ValueError, match=message):
        ShardHeader(**kwargs)

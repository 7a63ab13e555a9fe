"""The job body: byte-exact round trip, and refusal of corrupt, truncated, wrong-version and over-limit input."""

import hashlib
import json
import struct

import numpy as np
import pytest
import zstandard

from android_bridge.wire import MAGIC, VERSION, WireError, WireLimits, decode_job_body, encode_job_body

JOB = {"template_id": "tpl-a", "cloud_url": "http://127.0.0.1:1", "prompt": "é ✓ a hat", "steps": 4, "seed": 7}


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)


def _split(body: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack_from("<I", body, 8)
    return json.loads(body[12 : 12 + n]), body[12 + n :]


def _join(header: dict, payload: bytes, version: int = VERSION) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<4sHHI", MAGIC, version, 0, len(raw)) + raw + payload


def test_round_trip_is_byte_exact_for_every_dtype():
    parts = {
        "image": _image(),
        "f32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
        "f16": np.arange(6, dtype=np.float16),
        "i64": np.array([[1, -2], [3, 2**40]], dtype=np.int64),
        "big_endian": np.arange(5, dtype=">f4"),
        "empty": np.zeros((0, 3), np.uint8),
    }
    job, got = decode_job_body(encode_job_body(JOB, parts))
    assert job == JOB and list(got) == list(parts)
    for name, arr in parts.items():
        assert got[name].shape == arr.shape and got[name].dtype == arr.dtype.newbyteorder("=")
        assert got[name].tobytes() == arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def test_header_carries_sha256_of_the_raw_bytes():
    img = _image()
    header, _ = _split(encode_job_body(JOB, {"image": img}))
    (meta,) = header["parts"]
    assert meta == {
        "name": "image",
        "dtype": "uint8",
        "shape": [8, 8, 3],
        "raw_bytes": 192,
        "zstd_bytes": meta["zstd_bytes"],
        "sha256": hashlib.sha256(img.tobytes()).hexdigest(),
    }


def test_sha256_mismatch_is_refused():
    header, payload = _split(encode_job_body(JOB, {"image": _image(0)}))
    other = zstandard.ZstdCompressor().compress(_image(1).tobytes())
    header["parts"][0]["zstd_bytes"] = len(other)
    with pytest.raises(WireError, match="sha256 mismatch"):
        decode_job_body(_join(header, other))


@pytest.mark.parametrize("cut", [3, 11, 20, -1])
def test_truncated_bodies_are_refused(cut):
    body = encode_job_body(JOB, {"image": _image()})
    with pytest.raises(WireError, match="truncated|shorter"):
        decode_job_body(body[:cut])


def test_wrong_magic_version_flags_and_trailing_bytes():
    body = encode_job_body(JOB, {"image": _image()})
    with pytest.raises(WireError, match="bad magic"):
        decode_job_body(b"PK\x03\x04" + body[4:])
    with pytest.raises(WireError, match="version 2 is not supported"):
        decode_job_body(body[:4] + struct.pack("<H", 2) + body[6:])
    with pytest.raises(WireError, match="unknown flags"):
        decode_job_body(body[:6] + struct.pack("<H", 1) + body[8:])
    with pytest.raises(WireError, match="trailing"):
        decode_job_body(body + b"x")


def test_corrupt_zstd_frame_is_refused():
    header, payload = _split(encode_job_body(JOB, {"image": _image()}))
    bad = bytes([payload[0] ^ 0xFF]) + payload[1:]
    with pytest.raises(WireError, match="corrupt zstd|sha256"):
        decode_job_body(_join(header, bad))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("dtype", "object", "not allowed"),
        ("shape", [2, 2, 2, 2, 2], "shape"),
        ("shape", [-1], "shape"),
        ("raw_bytes", 5, "raw_bytes 5 != prod"),
        ("sha256", "xyz", "64 lowercase hex"),
        ("name", "", "name"),
        ("zstd_bytes", -3, "non-negative"),
    ],
)
def test_malformed_part_metadata_is_refused_before_decompressing(field, value, match):
    header, payload = _split(encode_job_body(JOB, {"image": _image()}))
    header["parts"][0][field] = value
    with pytest.raises(WireError, match=match):
        decode_job_body(_join(header, payload))


def test_limits_are_enforced_before_allocation():
    body = encode_job_body(JOB, {"image": _image(), "b": _image(1)})
    with pytest.raises(WireError, match="over the limit of 100"):
        decode_job_body(body, WireLimits(max_part_bytes=100))
    with pytest.raises(WireError, match="at most 1 parts"):
        decode_job_body(body, WireLimits(max_parts=1))
    with pytest.raises(WireError, match="header of .* over the limit"):
        decode_job_body(body, WireLimits(max_header_bytes=10))
    with pytest.raises(WireError, match="parts total"):
        decode_job_body(body, WireLimits(max_total_raw_bytes=300))


def test_header_must_be_json_with_a_job_and_no_duplicate_parts():
    with pytest.raises(WireError, match="not UTF-8 JSON"):
        decode_job_body(struct.pack("<4sHHI", MAGIC, VERSION, 0, 3) + b"{x}")
    with pytest.raises(WireError, match="'job' object"):
        decode_job_body(_join({"parts": []}, b""))
    header, payload = _split(encode_job_body(JOB, {"image": _image()}))
    header["parts"].append(dict(header["parts"][0]))
    with pytest.raises(WireError, match="duplicate"):
        decode_job_body(_join(header, payload + payload))


def test_encoder_refuses_unsupported_tensors():
    with pytest.raises(WireError, match="not allowed"):
        encode_job_body(JOB, {"x": np.array(["a"])})
    with pytest.raises(WireError, match="dimensions"):
        encode_job_body(JOB, {"x": np.zeros((1, 1, 1, 1, 1), np.uint8)})
    with pytest.raises(TypeError):
        encode_job_body(["not", "a", "dict"], {})

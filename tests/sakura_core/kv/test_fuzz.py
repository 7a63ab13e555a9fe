"""Fuzzing the decoders with random mutations: only format errors, no hang, never a silently wrong tensor.

Two attackers. A *channel* corrupts bytes in transit: the container checksum must catch every change, so decoding
raises a ShardFormatError. A *forger* mutates the payload and re-seals the checksum: the decoder must still raise
only ShardFormatError (never IndexError, MemoryError, ...) — or, if the forged blob happens to be well-formed, its
digest differs from the manifest's, which is the check the client applies before decoding.
"""

import struct
import zlib
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sakura_core.kv import ShardFormatError, decode_chain, get_codec

_SETTINGS = settings(
    max_examples=60,
    deadline=timedelta(seconds=10),  # a hang fails the test
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 64)),
    st.tuples(st.just("set32"), st.integers(0, 1 << 20), st.integers(0, 2**32 - 1)),
)


def _mutate(blob: bytes, ops) -> bytes:
    b = bytearray(blob)
    for op, pos, val in ops:
        if not b:
            break
        i = pos % len(b)
        if op == "flip":
            b[i] ^= val
        elif op == "truncate":
            del b[i:]
        elif op == "insert":
            b.insert(i, val)
        elif op == "delete":
            del b[i : i + val]
        elif op == "set32" and len(b) >= 4:
            i = min(i, len(b) - 4)
            b[i : i + 4] = struct.pack("<I", val)
    return bytes(b)


def _reseal(blob: bytes) -> bytes:
    """Recompute the trailer checksum (what a forger would do)."""
    if len(blob) < 4:
        return blob
    body = blob[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.fixture(scope="module")
def chains():
    from sakura_core.kv import ShardInput, ShardMeta

    rng = np.random.default_rng(7)
    shape = (1, 16, 2, 8)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    w = rng.exponential(size=shape).astype(np.float32)
    shard = ShardInput(
        k, v, ShardMeta("ab" * 32, "fuzz", "flux2-ref-t10", 0, (4, 4), 6), k_weight=w, v_weight=w[..., 0]
    )
    out = {name: get_codec(name).encode(shard, [0]) for name in ("fp16", "int8", "int4", "cachegen")}
    out["sakura"] = get_codec("sakura").encode(shard, [0, 1, 2])
    return out


def _check(chain: list[bytes], index: int, mutated: bytes, sealed: bool) -> None:
    original = chain[index]
    candidate = chain[:index] + [mutated] + chain[index + 1 :]
    try:
        _, k, v = decode_chain(candidate)
    except ShardFormatError:
        return
    if mutated == original:
        return
    # decoded without a format error: only possible for a re-sealed forgery, and the digest check catches it
    assert sealed, "a blob changed in transit decoded without an error"
    # inside a chain the next blob names its parent by digest: a changed base must break that link
    assert index == len(chain) - 1, f"a changed blob {index} of a {len(chain)}-blob chain decoded without an error"
    assert k.shape == v.shape and np.isfinite(k).all() and np.isfinite(v).all()


@pytest.mark.parametrize("name", ["fp16", "int8", "int4", "cachegen", "sakura"])
@_SETTINGS
@given(ops=st.lists(_mutation, min_size=1, max_size=4), sealed=st.booleans(), which=st.integers(0, 2))
def test_random_mutations_never_decode_silently(chains, name, ops, sealed, which):
    chain = chains[name]
    index = which % len(chain)
    mutated = _mutate(chain[index], ops)
    if sealed:
        mutated = _reseal(mutated)
    _check(chain, index, mutated, sealed)


@pytest.mark.parametrize("name", ["int4", "cachegen", "sakura"])
@_SETTINGS
@given(pos=st.integers(0, 1 << 20), val=st.integers(1, 255))
def test_forged_payload_bytes_raise_only_format_errors(chains, name, pos, val):
    chain = chains[name]
    blob = chain[-1]
    header_size = struct.unpack_from("<H", blob, 6)[0]
    body = bytearray(blob[:-4])
    i = header_size + pos % (len(body) - header_size)  # inside the payload
    body[i] ^= val
    _check(chain, len(chain) - 1, _reseal(bytes(body) + b"\0\0\0\0"), True)

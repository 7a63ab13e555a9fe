"""Cross-step shards: the container's step and reference, residual decoding against the reference shard's decoded
KV, and the errors for a missing, wrong, corrupt or truncated reference or residual."""

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from sakura_core.kv import (
    ShardBindingError,
    ShardChainError,
    ShardCorruptError,
    ShardFormatError,
    ShardHeader,
    ShardSlot,
    check_shard_binding,
    get_codec,
)
from sakura_core.kv.chain import ChainDecoder, DecodedReference, MissingReferenceError, decode_chain
from sakura_core.kv.container import pack_shard, parse_shard

MODEL_ID = "ab" * 32
REF = "cd" * 32  # the reference shard's identity (its fp16 digest)


def _residual(make_shard, ref_digest=REF):
    """(reference K, V float16, residual shard of step 1 coded against step 0, exact step-1 K, V)."""
    base, step1 = make_shard(seed=4), make_shard(seed=4)
    rng = np.random.default_rng(9)
    k1 = base.k + 0.05 * rng.standard_normal(base.k.shape).astype(np.float32)  # adjacent steps differ a little
    v1 = base.v + 0.05 * rng.standard_normal(base.v.shape).astype(np.float32)
    ref_k, ref_v = base.k.astype(np.float16), base.v.astype(np.float16)  # the reference as decoded (fp16 here)
    meta = dataclasses.replace(step1.meta, step=1, ref_step=0, ref_digest=ref_digest)
    res = dataclasses.replace(step1, k=k1 - base.k, v=v1 - base.v, meta=meta, k_drop=None)
    return ref_k, ref_v, res, k1, v1


def test_step_and_reference_round_trip_through_the_container():
    h = ShardHeader("sakura", 2, MODEL_ID, "tmpl", "r", 3, 3, (8, 8), 2, 16, step=2, ref_step=1, ref_digest=REF)
    parsed, _ = parse_shard(pack_shard(h, [b"x"]))
    assert parsed == h and parsed.reference == (1, REF)
    single = dataclasses.replace(h, step=None, ref_step=None, ref_digest=None)
    assert parse_shard(pack_shard(single, [b"x"]))[0].step is None


@pytest.mark.parametrize(
    "fields, problem",
    [
        (dict(step=1, ref_step=1), "earlier step"),
        (dict(step=None, ref_step=0), "earlier step"),
        (dict(step=2, ref_step=0, ref_digest=None), "both"),
        (dict(step=70000), "step"),
    ],
)
def test_invalid_step_or_reference_is_refused(fields, problem):
    fields = (
        {"ref_digest": REF, **fields} if "ref_digest" not in fields and fields.get("ref_step") is not None else fields
    )
    with pytest.raises(ValueError, match=problem):
        ShardHeader("sakura", 0, MODEL_ID, "tmpl", "r", 0, 0, (8, 8), 2, 16, **fields)


def test_a_reference_flag_without_its_digest_is_corrupt():
    h = ShardHeader("sakura", 0, MODEL_ID, "tmpl", "r", 0, 0, (8, 8), 2, 16, step=1, ref_step=0, ref_digest=REF)
    blob = bytearray(pack_shard(h, [b"x"]))
    ref_at = blob.index(bytes.fromhex(REF))
    blob[ref_at : ref_at + 32] = bytes(32)
    blob[-4:] = struct.pack("<I", zlib.crc32(bytes(blob[:-4])))  # a consistent checksum: the fields disagree
    with pytest.raises(ShardCorruptError, match="reference flag"):
        parse_shard(bytes(blob))


def test_a_residual_decodes_to_its_reference_plus_the_residual(make_shard):
    ref_k, ref_v, res, k1, v1 = _residual(make_shard)
    chain = get_codec("sakura").encode(res)  # every level, top last: within a fine step of the residual
    header, k, v = decode_chain(chain, DecodedReference(0, REF, ref_k, ref_v))
    assert header.reference == (0, REF) and header.step == 1
    kstep = (res.k.max(1, keepdims=True) - res.k.min(1, keepdims=True)) / 255
    ref_err = np.abs(ref_k.astype(np.float32) - (k1 - res.k))  # the reference's own (fp16) error adds
    assert (np.abs(k.astype(np.float32) - k1) <= 0.5 * kstep * 1.01 + ref_err + np.abs(k1) * 2**-10 + 1e-3).all()
    zero = DecodedReference(0, REF, np.zeros_like(ref_k), np.zeros_like(ref_v))
    _, k0, _ = decode_chain(chain, zero)
    assert np.abs(k0.astype(np.float32) - res.k).max() < np.abs(res.k).max()  # without its reference: a residual


def test_a_residual_without_or_with_another_reference_is_refused(make_shard):
    ref_k, ref_v, res, *_ = _residual(make_shard)
    chain = get_codec("sakura").encode(res, [0])
    with pytest.raises(MissingReferenceError, match="coded against step 0.*decode that shard first"):
        decode_chain(chain)
    with pytest.raises(ShardChainError, match="reference given is step 0 shard efefef"):
        decode_chain(chain, DecodedReference(0, "ef" * 32, ref_k, ref_v))
    with pytest.raises(ShardChainError, match="reference given is step 1"):
        decode_chain(chain, DecodedReference(1, REF, ref_k, ref_v))
    with pytest.raises(ShardChainError, match="shape"):
        decode_chain(chain, DecodedReference(0, REF, ref_k[:, :5], ref_v[:, :5]))
    with pytest.raises(ShardChainError, match="self-contained"):
        decode_chain(get_codec("fp16").encode(make_shard(seed=4), [0]), DecodedReference(0, REF, ref_k, ref_v))


def test_a_corrupt_or_truncated_residual_is_refused(make_shard):
    ref_k, ref_v, res, *_ = _residual(make_shard)
    blob = get_codec("sakura").encode(res, [0])[0]
    ref = DecodedReference(0, REF, ref_k, ref_v)
    with pytest.raises(ShardFormatError):
        decode_chain([blob[: len(blob) - 7]], ref)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    with pytest.raises(ShardFormatError):
        decode_chain([bytes(flipped)], ref)


def test_the_chain_decoder_needs_the_reference_to_read_tensors(make_shard):
    ref_k, ref_v, res, *_ = _residual(make_shard)
    chain = get_codec("sakura").encode(res, [0, 1])
    dec = ChainDecoder()
    dec.push(chain[0])
    with pytest.raises(MissingReferenceError):
        dec.tensors()
    dec.set_reference(DecodedReference(0, REF, ref_k, ref_v))
    dec.push(chain[1])
    k, _ = dec.tensors()
    _, k_direct, _ = decode_chain(chain, DecodedReference(0, REF, ref_k, ref_v))
    assert np.array_equal(k.numpy(), k_direct)


def test_binding_refuses_a_shard_of_another_step_or_reference():
    h = ShardHeader("sakura", 2, MODEL_ID, "tmpl", "r", 3, 3, (8, 8), 2, 16, step=2, ref_step=1, ref_digest=REF)
    check_shard_binding(h, ShardSlot("tmpl", MODEL_ID, (3, 3), "sakura", "sakura-l2", step=2, reference=(1, REF)))
    with pytest.raises(ShardBindingError, match=r"step 2 \(expected 1\)"):
        check_shard_binding(h, ShardSlot("tmpl", MODEL_ID, (3, 3), "sakura", "sakura-l2", step=1, reference=(1, REF)))
    with pytest.raises(ShardBindingError, match="reference step 1 base cdcd.*expected step 1 base efef"):
        check_shard_binding(
            h, ShardSlot("tmpl", MODEL_ID, (3, 3), "sakura", "sakura-l2", step=2, reference=(1, "ef" * 32))
        )
    with pytest.raises(ShardBindingError, match=r"step None \(expected 2\)"):
        check_shard_binding(
            dataclasses.replace(h, step=None, ref_step=None, ref_digest=None),
            ShardSlot("tmpl", MODEL_ID, (3, 3), "sakura", "sakura-l2", step=2, reference=None),
        )

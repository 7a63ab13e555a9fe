"""The cross-step predictor: per-channel scale codes fitted on exact KV, carried by a residual's base blob header,
applied by the chain decoder (decoded = scale * reference + residual); and the errors for a misplaced, truncated or
corrupt scale."""

import dataclasses
import struct
import zlib

import numpy as np
import pytest
import zstandard as zstd

from sakura_core.kv import ShardCorruptError, ShardHeader, ShardTruncatedError, get_codec
from sakura_core.kv.chain import ChainDecoder, DecodedReference, decode_chain
from sakura_core.kv.container import pack_shard, parse_shard
from sakura_core.kv.predictor import SCALE_DENOM, fit_scale_codes, scale_codes_size, scales_from_codes
from sakura_core.kv.sakura_decode import MAX_SPAN, compact_ranges, meta_size, span_codes

MODEL_ID = "ab" * 32
REF = "cd" * 32


def _scaled_step(make_shard, a_k=1.1, a_v=0.9):
    """(reference K, V fp16, residual shard of step 1 with its scale codes, exact step-1 K, V): step 1 is the
    reference scaled per channel (``a_k``/``a_v`` on half the channels) plus a small change."""
    base = make_shard(seed=4)
    rng = np.random.default_rng(11)
    d = base.k.shape[-1]
    ak = np.where(np.arange(d) < d // 2, a_k, 1.0).astype(np.float32)
    av = np.where(np.arange(d) < d // 2, a_v, 1.0).astype(np.float32)
    k1 = ak * base.k + 0.02 * rng.standard_normal(base.k.shape).astype(np.float32)
    v1 = av * base.v + 0.02 * rng.standard_normal(base.v.shape).astype(np.float32)
    codes = fit_scale_codes(np.stack([base.k, base.v]), np.stack([k1, v1]))
    a = scales_from_codes(codes, *base.k.shape[:1], *base.k.shape[2:])  # (2, layers, 1, heads, head_dim)
    meta = dataclasses.replace(base.meta, step=1, ref_step=0, ref_digest=REF, ref_scale=codes)
    res = dataclasses.replace(base, k=k1 - a[0] * base.k, v=v1 - a[1] * base.v, meta=meta, k_drop=None)
    return base.k.astype(np.float16), base.v.astype(np.float16), res, k1, v1


def test_the_fit_recovers_a_channel_scale_within_half_a_code():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 1, 64, 2, 8))
    a = 1.0 + rng.uniform(-0.3, 0.3, (2, 1, 1, 2, 8))
    cur = a * ref + 0.5  # an offset does not bias the scale (the mean is removed)
    got = scales_from_codes(fit_scale_codes(ref, cur), 1, 2, 8)
    assert np.abs(got - a).max() <= 0.5 / SCALE_DENOM + 1e-6
    flat = scales_from_codes(fit_scale_codes(ref, ref * 3.0), 1, 2, 8)  # out of range: clipped, not wrapped
    assert np.allclose(flat, 1 + 127 / SCALE_DENOM)


def test_the_predictor_cuts_the_residual_the_codec_sees(make_shard):
    ref_k, _, res, k1, _ = _scaled_step(make_shard)
    plain = k1 - ref_k.astype(np.float32)
    centred = lambda x: x - x.mean(axis=1, keepdims=True)  # noqa: E731  (the codec removes the channel mean)
    assert (centred(res.k) ** 2).sum() < 0.1 * (centred(plain) ** 2).sum()


def test_a_scaled_residual_decodes_to_the_scaled_reference_plus_the_residual(make_shard):
    ref_k, ref_v, res, k1, v1 = _scaled_step(make_shard)
    chain = get_codec("sakura").encode(res)
    assert parse_shard(chain[0])[0].ref_scale == res.meta.ref_scale  # the base blob carries it
    assert all(parse_shard(b)[0].ref_scale is None for b in chain[1:])  # refinements do not repeat it
    ref = DecodedReference(0, REF, ref_k, ref_v)
    _, k, v = decode_chain(chain, ref)
    for got, exact, r in ((k, k1, res.k), (v, v1, res.v)):
        # the top level: within half a fine step, of a range up to 2 ** (1/8) wider than the residual's (compact
        # ranges), + fp16 rounding of the reference and of the sum
        step = 2 ** (1 / 8) * (r.max(1, keepdims=True) - r.min(1, keepdims=True)) / 255
        bound = 0.5 * step * 1.01 + np.abs(exact) * 2**-9 + 1e-4
        assert (np.abs(got.astype(np.float32) - exact) <= bound).all()
    dec = ChainDecoder(ref)
    for blob in chain:
        dec.push(blob)
    assert np.array_equal(dec.tensors()[0].numpy(), k)  # incremental = whole chain, scale applied once


def test_a_scale_without_a_reference_or_of_another_size_is_refused():
    h = ShardHeader("sakura", 0, MODEL_ID, "tmpl", "r", 0, 0, (8, 8), 2, 16, step=1, ref_step=0, ref_digest=REF)
    size = scale_codes_size(1, 2, 16)
    assert parse_shard(pack_shard(dataclasses.replace(h, ref_scale=bytes(size)), [b"x"]))[0].ref_scale == bytes(size)
    with pytest.raises(ValueError, match="needs a reference"):
        dataclasses.replace(h, step=None, ref_step=None, ref_digest=None, ref_scale=bytes(size))
    with pytest.raises(ValueError, match=f"ref_scale has {size - 1} bytes.*needs {size}"):
        dataclasses.replace(h, ref_scale=bytes(size - 1))


def test_a_refinement_carrying_a_scale_is_refused(make_shard):
    _, _, res, *_ = _scaled_step(make_shard)
    base, refinement = get_codec("sakura").encode(res, [0, 1])
    header, sections = parse_shard(refinement)
    forged = pack_shard(dataclasses.replace(header, ref_scale=res.meta.ref_scale), [bytes(s) for s in sections])
    with pytest.raises(Exception, match="refinement carrying a predictor scale"):
        decode_chain([base, forged], DecodedReference(0, REF, res.k.astype(np.float16), res.v.astype(np.float16)))


def test_a_corrupt_or_truncated_scale_is_refused(make_shard):
    _, _, res, *_ = _scaled_step(make_shard)
    blob = bytearray(get_codec("sakura").encode(res, [0])[0])
    with pytest.raises(ShardTruncatedError):
        parse_shard(bytes(blob[:100]))
    flags_at = 8  # magic (4), version (2), header size (2), then the flags byte
    unflagged = bytearray(blob)
    unflagged[flags_at] &= ~0x04  # the scale flag cleared: the header size no longer adds up
    unflagged[-4:] = struct.pack("<I", zlib.crc32(bytes(unflagged[:-4])))
    with pytest.raises(ShardCorruptError, match="header size"):
        parse_shard(bytes(unflagged))
    at = blob.index(res.meta.ref_scale)
    blob[at] ^= 0x55  # a flipped scale code: the checksum catches it
    with pytest.raises(ShardCorruptError, match="checksum"):
        parse_shard(bytes(blob))


def test_compact_ranges_cover_the_residual_and_stay_within_one_code_of_it():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 1, 64, 2, 8)) * np.exp(rng.uniform(-8, 2, (2, 1, 1, 2, 8)))).astype(np.float32)
    mean16 = x.mean(axis=2).astype(np.float16)
    m = mean16.astype(np.float32)
    lo_code, hi_code = span_codes(m - x.min(axis=2)), span_codes(x.max(axis=2) - m)
    lo, hi = compact_ranges(mean16, lo_code, hi_code)
    assert (lo <= x.min(axis=2)).all() and (hi >= x.max(axis=2)).all()
    assert ((hi - m) <= 2 ** (1 / 8) * (x.max(axis=2) - m) * 1.0001).all()  # outward by under one code
    assert ((m - lo) <= 2 ** (1 / 8) * (m - x.min(axis=2)) * 1.0001).all()
    assert meta_size(1, 2, 8, compact=True) == 4 * 2 * 16 < meta_size(1, 2, 8, compact=False)
    with pytest.raises(ValueError, match="without the cross-step predictor"):
        span_codes(np.array([2 * MAX_SPAN], np.float32))  # no silently clipped range


def test_a_predicted_residual_base_with_corrupt_ranges_is_refused(make_shard):
    _, _, res, *_ = _scaled_step(make_shard)
    header, sections = parse_shard(get_codec("sakura").encode(res, [0])[0])
    n = 2 * header.num_layers * header.heads * header.head_dim
    head = bytearray(zstd.ZstdDecompressor().decompress(bytes(sections[0])))
    head[0:2] = np.float16(np.inf).tobytes()  # a mean that is not finite
    forged = pack_shard(header, [zstd.ZstdCompressor().compress(bytes(head)), *(bytes(x) for x in sections[1:])])
    with pytest.raises(ShardCorruptError, match="not finite"):
        decode_chain([forged], DecodedReference(0, REF, res.k.astype(np.float16), res.v.astype(np.float16)))
    short = zstd.ZstdCompressor().compress(bytes(head[: 3 * n]))  # the six-byte layout's length is not this one's
    with pytest.raises(ShardCorruptError):
        decode_chain(
            [pack_shard(header, [short, *(bytes(x) for x in sections[1:])])],
            DecodedReference(0, REF, res.k.astype(np.float16), res.v.astype(np.float16)),
        )

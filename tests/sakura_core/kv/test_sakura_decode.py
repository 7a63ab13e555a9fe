"""The fast SAKURA decoder against a plain numpy reference written from the wire format (module docstrings of
``sakura_codec`` / ``sakura_decode``): bit for bit at every rung, for self-contained and cross-step residual shards,
both head_dim paths (64-bit words and bytes), through ``decode_chain`` and the incremental ``ChainDecoder``, with
the per-thread work buffers shared between decoders; corrupt symbols are still refused."""

import dataclasses

import numpy as np
import pytest
import zstandard

from sakura_core.kv import ShardCorruptError
from sakura_core.kv.chain import ChainDecoder, DecodedReference, decode_chain, parse_chain
from sakura_core.kv.codec_registry import get_codec
from sakura_core.kv.container import pack_shard, parse_shard
from sakura_core.kv.predictor import fit_scale_codes, scales_from_codes
from sakura_core.kv.sakura_codec import WIDTHS, encode_sakura

LEVELS = list(get_codec("sakura").levels)


def _unpack(raw: bytes, m: int, n: int) -> np.ndarray:
    b = np.frombuffer(raw, np.uint8)
    if m == 1:
        return np.unpackbits(b)[:n]
    if m in (2, 4):  # planar: byte j holds symbols j, j + Q, ... most significant first
        per = 8 // m
        return np.concatenate([(b >> (m * (per - 1 - i))) & ((1 << m) - 1) for i in range(per)])[:n]
    return b[:n]


def _reference_decode(blobs):
    """K, V float16 of a sakura chain, computed value by value in numpy float32 (multiply, then add), then float16."""
    acc = widx = None
    for header, sections in parse_chain(blobs):
        n_l, t, h, d = header.tensor_shape
        n = 2 * n_l * h * d
        compact = header.ref_scale is not None
        head = zstandard.ZstdDecompressor().decompress(sections[0])
        if acc is None:
            if compact:  # mean (float16) and log-coded distances to the minimum and maximum
                mean = np.frombuffer(head, "<f2", n).astype(np.float32)
                lo_c, hi_c = np.frombuffer(head, np.uint8, 2 * n, 2 * n).reshape(2, n)
                span = np.concatenate([[0.0], 2.0 ** ((np.arange(1, 256) - 168) / 8)]).astype(np.float32)
                lo, hi = mean - span[lo_c], mean + span[hi_c]
            else:
                lo, hi, mean = np.frombuffer(head, "<f2", 3 * n).astype(np.float32).reshape(3, n)
            head = head[(4 if compact else 6) * n :]
            lo, mean = lo.reshape(2, n_l, 1, h, d), mean.reshape(2, n_l, 1, h, d)
            step = ((hi - lo.reshape(-1)) / np.float32(255.0)).reshape(2, n_l, 1, h, d)
            acc = np.zeros((2 * n_l * t * h, d), np.int64)
            widx = np.zeros(2 * n_l * t * h, np.int64)
        new = widx + np.frombuffer(head, np.uint8)
        added = np.array(WIDTHS)[new] - np.array(WIDTHS)[widx]
        for m, section in zip(sorted(set(added) - {0}), sections[1:], strict=True):
            units = np.flatnonzero(added == m)
            raw = zstandard.ZstdDecompressor().decompress(section)
            acc[units] = (acc[units] << m) | _unpack(raw, m, units.size * d).reshape(units.size, d)
        widx = new
    w = np.array(WIDTHS)[widx][:, None]
    mult = np.where(w > 0, 2.0 ** (8 - w), 256.0)
    centre = (acc * mult + (mult - 1) / 2).astype(np.float32).reshape(2, n_l, t, h, d)  # exact
    out = (centre * step + lo).astype(np.float16)  # (2, layers, tokens, heads, head_dim)
    dropped = (widx == 0).reshape(2, n_l, t, h)
    out[dropped] = np.broadcast_to(mean.astype(np.float16), out.shape)[dropped]
    return out[0], out[1]


def _reference_add(ref, res, scale):
    out = ref.astype(np.float32)
    if scale is not None:
        out *= scale
    return (out + res.astype(np.float32)).astype(np.float16)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def _residual(make_shard, head_dim):
    """(reference, a cross-step residual ShardInput of step 1 against step 0, coded with a predictor scale)."""
    base = make_shard(seed=3, head_dim=head_dim, grid=(8, 16))
    rng = np.random.default_rng(5)
    k1 = 0.97 * base.k + 0.05 * rng.standard_normal(base.k.shape).astype(np.float32)
    v1 = 1.02 * base.v + 0.05 * rng.standard_normal(base.v.shape).astype(np.float32)
    rk, rv = base.k.astype(np.float16), base.v.astype(np.float16)
    codes = fit_scale_codes(np.stack([rk, rv]).astype(np.float32), np.stack([k1, v1]))
    a = scales_from_codes(codes, *base.k.shape[:1], *base.k.shape[2:])
    meta = dataclasses.replace(base.meta, step=1, ref_step=0, ref_digest="cd" * 32, ref_scale=codes)
    res = dataclasses.replace(base, k=k1 - a[0] * rk, v=v1 - a[1] * rv, meta=meta, k_drop=None)
    return DecodedReference(0, "cd" * 32, rk, rv), res, a


@pytest.fixture(params=[None, 200], ids=["one-slab", "slabs"])
def slabs(request, monkeypatch):
    """Decode in one slab (these shards are small) or, like a phone-scale shard, a few tokens at a time."""
    if request.param is not None:
        monkeypatch.setattr("sakura_core.kv.sakura_dequant.CHUNK_VALUES", request.param)
        monkeypatch.setattr("sakura_core.kv.chain.CHUNK_VALUES", request.param)


@pytest.fixture(params=[0.0, 1.01], ids=["dense", "sparse"])
def sparse(request, monkeypatch):
    """Dequantise every block densely, or (with slabs) every block with a dropped unit unit by unit."""
    monkeypatch.setattr("sakura_core.kv.sakura_dequant.SPARSE_KEPT", request.param)


@pytest.mark.parametrize("head_dim", [16, 12])  # 64-bit words / the byte path (head_dim % 8 != 0)
@pytest.mark.parametrize("weights", [True, False])
def test_every_rung_decodes_bit_for_bit_like_the_reference(make_shard, head_dim, weights, slabs, sparse):
    shard = make_shard(seed=1, head_dim=head_dim, grid=(8, 16), weights=weights)
    chain = encode_sakura(shard, LEVELS)
    for level in LEVELS:
        _, k, v = decode_chain(chain[: level + 1])
        rk, rv = _reference_decode(chain[: level + 1])
        assert np.array_equal(_bits(k), _bits(rk)) and np.array_equal(_bits(v), _bits(rv)), level
        direct = encode_sakura(shard, [level])
        _, dk, _ = decode_chain(direct)
        assert np.array_equal(_bits(dk), _bits(k)), level


def test_the_rungs_cover_every_width_and_dropped_units(make_shard):
    """The fixture of the test above reaches each branch of the decoder: dropped, partial and full widths, mixed."""
    shard = make_shard(seed=1, grid=(8, 16))
    seen = set()
    for level in LEVELS:
        header, sections = parse_chain(encode_sakura(shard, [level]))[0]
        head = zstandard.ZstdDecompressor().decompress(sections[0])
        seen |= set(np.frombuffer(head[6 * 2 * shard.k[0, 0].size :], np.uint8).tolist())
    assert seen == set(range(len(WIDTHS)))


@pytest.mark.parametrize("head_dim", [16, 12])
def test_a_residual_decodes_bit_for_bit_like_the_reference(make_shard, head_dim, slabs, sparse):
    ref, res, a = _residual(make_shard, head_dim)
    chain = encode_sakura(res, LEVELS)
    for level in LEVELS:
        _, k, v = decode_chain(chain[: level + 1], ref)
        dk, dv = _reference_decode(chain[: level + 1])
        assert np.array_equal(_bits(k), _bits(_reference_add(ref.k, dk, a[0]))), level
        assert np.array_equal(_bits(v), _bits(_reference_add(ref.v, dv, a[1]))), level


def test_incremental_decoders_keep_their_state_while_others_decode(make_shard):
    """Work buffers are per thread and reused: a ChainDecoder's codes must not live in them."""
    a, b = make_shard(seed=1, grid=(8, 16)), make_shard(seed=2, grid=(8, 16))
    chain_a, chain_b = encode_sakura(a, LEVELS), encode_sakura(b, LEVELS)
    dec_a, dec_b = ChainDecoder(), ChainDecoder()
    for level in LEVELS:
        dec_a.push(chain_a[level])
        decode_chain(chain_b)  # every work buffer written with another shard's data
        dec_b.push(chain_b[level])
        for dec, chain in ((dec_a, chain_a), (dec_b, chain_b)):
            k, v = dec.tensors()
            rk, rv = _reference_decode(chain[: level + 1])
            assert np.array_equal(_bits(k.numpy()), _bits(rk)) and np.array_equal(_bits(v.numpy()), _bits(rv))


def _repack(blob: bytes, edit) -> bytes:
    header, sections = parse_shard(blob)
    return pack_shard(header, edit([bytes(x) for x in sections]))


def test_a_symbol_wider_than_its_group_is_refused(make_shard):
    """The 64-bit path relies on each byte holding at most its width's bits: a 3-bit symbol of 8 must not decode."""
    shard = make_shard(seed=1, grid=(8, 16))
    blob = encode_sakura(shard, [2])[0]
    header, sections = parse_chain([blob])[0]
    head = zstandard.ZstdDecompressor().decompress(sections[0])
    added = np.array(WIDTHS)[np.frombuffer(head[6 * 2 * shard.k[0, 0].size :], np.uint8)]
    groups = sorted(set(added) - {0})
    assert 3 in groups
    at = 1 + groups.index(3)

    def widen(secs):
        raw = bytearray(zstandard.ZstdDecompressor().decompress(secs[at]))
        raw[0] = 8
        return [*secs[:at], zstandard.ZstdCompressor().compress(bytes(raw)), *secs[at + 1 :]]

    with pytest.raises(ShardCorruptError, match="3-bit symbol out of range"):
        decode_chain([_repack(blob, widen)])

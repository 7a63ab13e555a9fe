"""Codecs: lossless round trips, stated error bounds (seeded), progressive == direct, chain validation."""

import numpy as np
import pytest
import zstandard

from sakura_core.kv import (
    CODECS,
    ShardChainError,
    ShardCorruptError,
    ShardFormatError,
    decode_chain,
    decode_representation,
    get_codec,
    parse_shard,
    shard_digest,
)
from sakura_core.kv.cachegen import LEVEL_BINS, cachegen_bins
from sakura_core.kv.codec_parts import f16_ceil
from sakura_core.kv.container import pack_shard
from sakura_core.kv.sakura_codec import WIDTHS, SakuraConfig, allocate_widths, encode_sakura

FP16_EPS = 2.0**-11  # relative rounding of a float16 output


def _f16(x):
    return np.asarray(x, dtype=np.float16)


def test_registry_has_every_codec():
    assert {"fp16", "int8", "int4", "cachegen", "sakura"} <= set(CODECS)
    with pytest.raises(KeyError, match="known codecs"):
        get_codec("zip")


def test_fp16_round_trip_is_byte_exact(shard):
    (blob,) = get_codec("fp16").encode(shard, [0])
    _, k, v = decode_chain([blob])
    assert k.tobytes() == _f16(shard.k).tobytes() and v.tobytes() == _f16(shard.v).tobytes()
    again = type(shard)(k.astype(np.float32), v.astype(np.float32), shard.meta)
    assert get_codec("fp16").encode(again, [0]) == [blob]  # re-encoding the decoded tensor gives the same bytes


@pytest.mark.parametrize("name, levels", [("int8", 256), ("int4", 15)])
def test_uniform_codecs_meet_their_bound(name, levels, make_shard):
    shard = make_shard(seed=1)
    (blob,) = get_codec(name).encode(shard, [0])
    _, k, v = decode_chain([blob])
    for x, x_hat in ((shard.k, k), (shard.v, v)):
        step = (x.max(-1, keepdims=True) - x.min(-1, keepdims=True)) / (levels - 1)
        bound = 0.5 * step * (1 + 1e-3) + np.abs(x) * FP16_EPS + 1e-6
        assert (np.abs(x_hat.astype(np.float32) - x) <= bound).all()


def test_sakura_top_level_is_within_one_fine_step(make_shard):
    shard = make_shard(seed=2)
    blobs = encode_sakura(shard)
    _, k, v = decode_chain(blobs)
    kstep = (shard.k.max(1, keepdims=True) - shard.k.min(1, keepdims=True)) / 255  # keys: per channel
    vstep = (shard.v.max(1, keepdims=True) - shard.v.min(1, keepdims=True)) / 255  # values too
    assert (np.abs(k.astype(np.float32) - shard.k) <= 0.5 * kstep * 1.01 + np.abs(shard.k) * FP16_EPS + 1e-3).all()
    assert (np.abs(v.astype(np.float32) - shard.v) <= 0.5 * vstep * 1.01 + np.abs(shard.v) * FP16_EPS + 1e-3).all()


def test_sakura_ladder_shrinks_error_as_it_grows(make_shard):
    shard = make_shard(seed=3)
    blobs = encode_sakura(shard)
    sizes = np.cumsum([len(b) for b in blobs])
    errs = []
    for j in range(len(blobs)):
        _, k, v = decode_chain(blobs[: j + 1])
        err = (shard.k_weight * (k - shard.k) ** 2).sum() + (shard.v_weight[..., None] * (v - shard.v) ** 2).sum()
        errs.append(err)
    assert len(blobs) >= 4
    assert (np.diff(sizes) > 0).all()
    assert (np.diff(errs) < 0).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_sakura_progressive_chain_equals_direct_level(seed, make_shard):
    shard = make_shard(seed=seed, grid=(6, 7), heads=3, head_dim=12)
    chain = encode_sakura(shard)
    for level in range(len(chain)):
        (direct,) = encode_sakura(shard, [level])
        _, k_c, v_c = decode_chain(chain[: level + 1])
        _, k_d, v_d = decode_chain([direct])
        assert k_c.tobytes() == k_d.tobytes() and v_c.tobytes() == v_d.tobytes()
    # a partial chain starting above level 0 (base at 2, then 4) also equals the direct level 4
    skip = encode_sakura(shard, [2, 4])
    _, k_s, _ = decode_chain(skip)
    _, k_d, _ = decode_chain(encode_sakura(shard, [4]))
    assert k_s.tobytes() == k_d.tobytes()
    # the registry's direct blobs (one plan for every level) are the per-level direct blobs, byte for byte
    levels = list(range(len(chain)))
    assert get_codec("sakura").direct_blobs(shard, levels) == [encode_sakura(shard, [j])[0] for j in levels]


def test_sakura_spends_bits_where_the_weights_are(make_shard):
    shard = make_shard(seed=4, weights=False)
    n_l, t, h, d = shard.k.shape
    kw = np.full(shard.k.shape, 1e-3, np.float32)
    vw = np.full(shard.k.shape[:3], 1e-3, np.float32)
    kw[:, : t // 4] = 10.0  # the first quarter of the tokens matters
    vw[:, : t // 4] = 10.0
    weighted = type(shard)(shard.k, shard.v, shard.meta, k_weight=kw, v_weight=vw)
    cfg = SakuraConfig(uniform_mix=0.0)
    _, k, _ = decode_chain(encode_sakura(weighted, [2], cfg))
    err = np.abs(k.astype(np.float32) - shard.k).mean(axis=(0, 2, 3))
    assert err[: t // 4].mean() < 0.3 * err[t // 4 :].mean()


def test_allocation_is_nested_and_within_budget():
    rng = np.random.default_rng(0)
    n = 200
    rate = np.tile(np.array(WIDTHS, float) * 8, (n, 1))
    dist = np.sort(rng.exponential(size=(n, len(WIDTHS))), axis=1)[:, ::-1] * rng.exponential(size=(n, 1))
    budgets = [100.0, 800.0, 3000.0, 20000.0]
    allocs = allocate_widths(dist, rate, budgets)
    for a, b in zip(allocs, allocs[1:], strict=False):
        assert (b >= a).all()
    for a, budget in zip(allocs, budgets, strict=True):
        assert rate[np.arange(n), a].sum() <= budget


def test_cachegen_bins_follow_the_released_config_scaled_to_depth():
    kb, vb = cachegen_bins(1, 32)
    assert kb[:10].tolist() == [32] * 10 and kb[10:20].tolist() == [16] * 10 and vb[:2].tolist() == [32, 32]
    kb6, vb6 = cachegen_bins(0, 6)
    assert kb6.tolist() == [16, 16, 16, 16, 12, 12] and vb6.tolist() == [16, 12, 12, 12, 12, 12]
    assert set(LEVEL_BINS) == {0, 1, 2}


@pytest.mark.parametrize("level", [0, 1, 2])
def test_cachegen_entropy_coding_is_lossless_and_quantisation_bounded(level, make_shard):
    shard = make_shard(seed=5, layer_first=4, grid=(16, 20))  # 320 tokens: two 256-token streams per channel
    (blob,) = get_codec("cachegen").encode(shard, [level])
    _, k, v = decode_chain([blob])
    kb, vb = cachegen_bins(level, shard.meta.num_model_layers)
    for x, x_hat, bins in ((shard.k, k, kb[4]), (shard.v, v, vb[4])):
        n_l, t, h, d = x.shape
        flat = x.reshape(n_l, t, h * d)
        amax = f16_ceil(np.abs(flat).max(-1, keepdims=True)).astype(np.float32)  # as shipped: rounded up
        c = bins // 2 - 1
        ref = (np.clip(np.rint(flat * (c / amax) + c), 0, 2 * c) - c) / c * amax  # quantise-dequantise, no coder
        got = x_hat.astype(np.float32).reshape(n_l, t, h * d)
        assert np.allclose(got, ref.astype(np.float16).astype(np.float32), atol=1e-3, rtol=2e-3)
        assert (np.abs(got - flat) <= 0.5 * amax / c * 1.01 + np.abs(flat) * FP16_EPS + 2e-3).all()


def test_cachegen_tables_are_counted_in_the_size(make_shard):
    shard = make_shard(seed=6)
    (blob,) = get_codec("cachegen").encode(shard, [2])
    _, sections = parse_shard(blob)
    channels = shard.k.shape[2] * shard.k.shape[3]
    assert len(sections[2]) == channels * (32 + 1) * 2  # one 33-entry uint16 CDF per (layer, channel)


# ---- chains -------------------------------------------------------------------------------------------------


def test_decode_representation_returns_float16_tensors(shard):
    k, v = decode_representation(encode_sakura(shard, [0, 1]))
    assert k.dtype == v.dtype and str(k.dtype) == "torch.float16"
    assert tuple(k.shape) == shard.k.shape


def test_chain_must_start_with_a_base(shard):
    chain = encode_sakura(shard, [0, 1, 2])
    with pytest.raises(ShardChainError, match="pass its base"):
        decode_chain(chain[1:])


def test_chain_out_of_order_or_missing_link_is_rejected(shard):
    chain = encode_sakura(shard, [0, 1, 2])
    with pytest.raises(ShardChainError):
        decode_chain([chain[0], chain[2]])
    with pytest.raises(ShardChainError):
        decode_chain([chain[0], chain[2], chain[1]])


def test_chain_mixing_shards_is_rejected(make_shard):
    a = encode_sakura(make_shard(seed=0), [0, 1])
    b = encode_sakura(make_shard(seed=0, layer_first=1), [0, 1])
    with pytest.raises(ShardChainError, match="another shard"):
        decode_chain([a[0], b[1]])


def test_non_progressive_codec_takes_one_blob(shard):
    blobs = get_codec("cachegen").encode(shard, [0, 1])
    with pytest.raises(ShardChainError):
        decode_chain(blobs)


def test_empty_chain_is_rejected():
    with pytest.raises(ShardChainError):
        decode_chain([])


# ---- crafted blobs: valid container, bad payload ----------------------------------------------------------------


def _repack(blob: bytes, mutate) -> bytes:
    header, sections = parse_shard(blob)
    return pack_shard(header, mutate([bytes(s) for s in sections]))


@pytest.mark.parametrize("name", sorted(["fp16", "int8", "int4", "cachegen", "sakura"]))
def test_every_decoder_rejects_a_missing_section(shard, name):
    blob = get_codec(name).encode(shard, [0])[0]
    with pytest.raises(ShardCorruptError):
        decode_chain([_repack(blob, lambda s: s[:-1])])


@pytest.mark.parametrize("name", sorted(["fp16", "int8", "int4", "cachegen", "sakura"]))
def test_every_decoder_rejects_a_short_section(shard, name):
    blob = get_codec(name).encode(shard, [0])[0]
    with pytest.raises(ShardCorruptError):
        decode_chain([_repack(blob, lambda s: [*s[:-1], s[-1][:-4]])])


def test_sakura_rejects_a_frame_that_inflates_beyond_the_geometry(shard):
    blob = encode_sakura(shard, [0])[0]
    bomb = zstandard.ZstdCompressor().compress(bytes(50_000_000))
    with pytest.raises(ShardCorruptError, match="declares"):
        decode_chain([_repack(blob, lambda s: [bomb, *s[1:]])])


def test_sakura_rejects_widths_beyond_the_ladder(shard):
    blob = encode_sakura(shard, [0])[0]
    n_l, t, h, d = shard.k.shape

    def bad_head(sections):
        head = bytearray(zstandard.ZstdDecompressor().decompress(sections[0]))
        meta = 6 * n_l * h * d * 2  # float16 (3, 2, layers, heads, head_dim): channel minima, maxima, means
        head[meta] = 200  # width delta of the first unit
        return [zstandard.ZstdCompressor().compress(bytes(head)), *sections[1:]]

    with pytest.raises(ShardCorruptError, match="width"):
        decode_chain([_repack(blob, bad_head)])


@pytest.mark.parametrize("name", ["fp16", "int8", "int4", "cachegen", "sakura"])
def test_every_decoder_rejects_wrong_magic_version_and_truncation(shard, name):
    blob = get_codec(name).encode(shard, [0])[0]
    with pytest.raises(ShardFormatError):
        decode_chain([b"XXXX" + blob[4:]])
    with pytest.raises(ShardFormatError):
        decode_chain([blob[:4] + b"\x09\x00" + blob[6:]])
    with pytest.raises(ShardFormatError):
        decode_chain([blob[: len(blob) // 2]])
    assert shard_digest(blob) != shard_digest(blob[:-1])


# ---- incremental decoding ------------------------------------------------------------------------------------


def test_chain_decoder_upgrades_incrementally_and_matches_chain_decode(shard):
    from sakura_core.kv import ChainDecoder

    chain = encode_sakura(shard)
    dec = ChainDecoder()
    for j, blob in enumerate(chain):
        assert dec.push(blob).level == j
        k, v = dec.tensors()
        _, k_ref, v_ref = decode_chain(chain[: j + 1])
        assert k.numpy().tobytes() == k_ref.tobytes() and v.numpy().tobytes() == v_ref.tobytes()


def test_chain_decoder_rejects_bad_blobs_and_stays_usable(shard):
    from sakura_core.kv import ChainDecoder

    chain = encode_sakura(shard, [0, 1, 2])
    dec = ChainDecoder()
    with pytest.raises(ShardChainError):
        dec.tensors()
    with pytest.raises(ShardChainError):
        dec.push(chain[1])  # not a base
    dec.push(chain[0])
    before = dec.tensors()[0].clone()
    with pytest.raises(ShardChainError):
        dec.push(chain[2])  # skips level 1
    forged = _repack(chain[1], lambda s: [s[0], *[x[:-1] for x in s[1:]]])
    with pytest.raises(ShardFormatError):
        dec.push(forged)
    assert dec.header.level == 0 and dec.tensors()[0].equal(before)
    dec.push(chain[1])
    _, k_ref, _ = decode_chain(chain[:2])
    assert dec.tensors()[0].numpy().tobytes() == k_ref.tobytes()


def test_chain_decoder_takes_one_blob_of_a_non_progressive_codec(shard):
    from sakura_core.kv import ChainDecoder

    a, b = get_codec("int8").encode(shard, [0])[0], get_codec("fp16").encode(shard, [0])[0]
    dec = ChainDecoder()
    dec.push(a)
    with pytest.raises(ShardChainError):
        dec.push(b)
    assert tuple(dec.tensors()[0].shape) == shard.k.shape


def test_template_wide_slopes_move_bits_to_the_sensitive_shard(make_shard):
    import dataclasses

    from sakura_core.kv.sakura_codec import prepare_sakura

    a = make_shard(seed=8, layer_first=0)
    b = make_shard(seed=9, layer_first=1)
    b = dataclasses.replace(b, k_weight=b.k_weight * 100, v_weight=b.v_weight * 100, k_drop=b.k_drop * 100)
    level = 2
    own = [sum(len(x) for x in encode_sakura(s, range(level + 1))) for s in (a, b)]
    shared = prepare_sakura([a, b])
    assert shared[0].level_slopes == shared[1].level_slopes
    glob = [sum(len(x) for x in encode_sakura(s, range(level + 1))) for s in shared]
    assert glob[1] > 1.3 * own[1] and glob[0] < 0.8 * own[0]
    assert 0.8 < sum(glob) / sum(own) < 1.2  # the same template-wide budget, spent elsewhere

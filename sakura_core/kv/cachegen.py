"""CacheGen adapted to DiT template KV, as its released code (LMCache's CacheGen serde) works.

What the released encoder does, and this module reproduces:

* K and V are viewed as (layers, tokens, channels) with channels = heads * head_dim;
* per-token symmetric max-abs quantisation: ``sym = round(x * C / max|x| + C)``, ``C = bins // 2 - 1``, with the
  token's max-abs over all channels kept (float16) — bins depend on the layer (three levels, below);
* one histogram per (layer, channel) over a chunk of tokens, normalised to a strictly increasing 16-bit CDF that
  is shipped with the data (counted in the size); as released, every table has ``max bins over the model + 1``
  entries (the released code encodes all layers of a chunk together; here a shard's layers get the same tables);
* arithmetic (range) coding with those tables, one stream per (layer, channel) per <= 256 tokens, the stream
  lengths (int32) shipped too; chunks of up to ``CHUNK_TOKENS`` tokens, every chunk encoded at every level.

Bin counts per level (keys: layers < b1 / < b2 / rest; values: layers < bv / rest), from the released config for
32-layer models, with the boundaries scaled to the model's depth ``L``: ``b1 = round(10 L / 32)``,
``b2 = round(20 L / 32)``, ``bv = max(1, round(2 L / 32))``:

=====  ============  ========
level  keys          values
=====  ============  ========
0      16 / 16 / 12  16 / 12
1      32 / 16 / 16  32 / 16
2      32 / 32 / 32  32 / 32
=====  ============  ========

The entropy coder is ``constriction``'s range coder (32-bit words) with categorical models built from the shipped
16-bit tables, so encoder and decoder use bit-identical models. Not progressive: each level is a separate blob.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .codec_parts import check_levels, expect_len, expect_sections, f16_ceil, single_blob
from .codec_registry import Codec, Parsed, ShardInput, register_codec
from .container import ShardCorruptError, pack_shard

__all__ = ["BLOCK_TOKENS", "CHUNK_TOKENS", "LEVEL_BINS", "cachegen_bins", "decode_cachegen", "encode_cachegen"]

#: Tokens per arithmetic-coded stream (the released GPU coder's CACHEGEN_GPU_MAX_TOKENS_PER_CHUNK).
BLOCK_TOKENS = 256
#: Tokens per chunk sharing one set of probability tables (the released code streams 1000-1500-token chunks).
CHUNK_TOKENS = 1500
#: level -> ((key bins for the three layer groups), (value bins for the two layer groups))
LEVEL_BINS = {0: ((16, 16, 12), (16, 12)), 1: ((32, 16, 16), (32, 16)), 2: ((32, 32, 32), (32, 32))}
_PRECISION = 16
_TOTAL = (1 << _PRECISION) - 1  # last CDF entry
_ALLOWED_BINS = frozenset(b for pair in LEVEL_BINS.values() for group in pair for b in group)


def _constriction():
    try:
        import constriction
    except ImportError as e:  # pragma: no cover - constriction is a main dependency
        raise ImportError("the CacheGen baseline needs the 'constriction' package: pip install constriction") from e
    return constriction


def cachegen_bins(level: int, num_model_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Bins for every model layer at ``level``: (key_bins (L,), value_bins (L,))."""
    (k1, k2, k3), (v1, v2) = LEVEL_BINS[level]
    n = num_model_layers
    b1, b2, bv = round(10 * n / 32), round(20 * n / 32), max(1, round(2 * n / 32))
    layers = np.arange(n)
    kb = np.where(layers < b1, k1, np.where(layers < b2, k2, k3))
    vb = np.where(layers < bv, v1, v2)
    return kb.astype(np.int64), vb.astype(np.int64)


def _cdf_table(symbols: np.ndarray, alphabet: int) -> np.ndarray:
    """(tokens, channels) symbols -> (channels, alphabet + 1) strictly increasing uint16 CDF (0 .. 65535).

    As the released code: frequencies / tokens, cumulative, scaled by ``2^16 - 1 - alphabet`` and rounded, plus
    ``arange`` so that every symbol keeps a non-zero probability.
    """
    n_tok, n_ch = symbols.shape
    counts = np.zeros((n_ch, alphabet), dtype=np.float64)
    np.add.at(counts, (np.broadcast_to(np.arange(n_ch), symbols.shape), symbols), 1.0)
    cdf = np.concatenate([np.zeros((n_ch, 1)), np.cumsum(counts / n_tok, axis=1)], axis=1)  # (ch, alphabet + 1)
    cdf = np.rint(cdf * (_TOTAL - alphabet)) + np.arange(alphabet + 1)
    return cdf.astype(np.uint16)


def _models(table: np.ndarray):
    """Categorical models (one per row) from a (rows, alphabet + 1) CDF table."""
    model = _constriction().stream.model.Categorical
    probs = np.diff(table.astype(np.float64), axis=1) / _TOTAL
    return [model(p, perfect=False) for p in probs]


def _split(shard_k: np.ndarray) -> np.ndarray:
    n_l, t, h, d = shard_k.shape
    return np.asarray(shard_k, dtype=np.float32).reshape(n_l, t, h * d)  # (layers, tokens, channels)


def _encode_level(shard: ShardInput, level: int) -> bytes:
    c = _constriction()
    n_l, t, h, d = shard.shape
    n_ch = h * d
    first = shard.meta.layer_first
    kb_all, vb_all = cachegen_bins(level, shard.meta.num_model_layers)
    if first + n_l > shard.meta.num_model_layers:
        raise ValueError(f"shard layers {first}..{first + n_l - 1} exceed the model's {shard.meta.num_model_layers}")
    bins = np.stack([kb_all[first : first + n_l], vb_all[first : first + n_l]])  # (2, layers)
    maxes, tables, symbols = [], [], []
    for ti, x in enumerate((_split(shard.k), _split(shard.v))):
        big_c = (bins[ti] // 2 - 1).astype(np.float32)[:, None, None]  # (layers, 1, 1)
        amax = f16_ceil(np.abs(x).max(axis=-1, keepdims=True))  # (layers, tokens, 1) float16
        safe = np.where(amax > 0, amax.astype(np.float32), np.float32(1.0))
        sym = np.clip(np.rint(x * (big_c / safe) + big_c), 0, 2 * big_c).astype(np.int32)
        alphabet = int((kb_all, vb_all)[ti].max())  # as released: one table width for the whole model's K (V)
        per_chunk = []
        for c0 in range(0, t, CHUNK_TOKENS):
            per_chunk.append(np.stack([_cdf_table(sym[li, c0 : c0 + CHUNK_TOKENS], alphabet) for li in range(n_l)]))
        tables.append(np.stack(per_chunk))  # (chunks, layers, channels, alphabet + 1)
        maxes.append(amax[..., 0])
        symbols.append(sym)
    streams, lengths = [], []
    for ti in range(2):
        for li in range(n_l):
            for ci, c0 in enumerate(range(0, t, CHUNK_TOKENS)):
                models = _models(tables[ti][ci, li])
                for b0 in range(c0, min(c0 + CHUNK_TOKENS, t), BLOCK_TOKENS):
                    b1 = min(b0 + BLOCK_TOKENS, c0 + CHUNK_TOKENS, t)
                    for ch in range(n_ch):
                        enc = c.stream.queue.RangeEncoder()
                        enc.encode(symbols[ti][li, b0:b1, ch], models[ch])
                        words = enc.get_compressed().astype("<u4").tobytes()
                        streams.append(words)
                        lengths.append(len(words))
    alphabets = [int(kb_all.max()), int(vb_all.max())]
    sections = [
        np.concatenate([bins.reshape(-1), alphabets]).astype(np.uint8).tobytes(),
        np.stack(maxes).astype("<f2").tobytes(),
        tables[0].astype("<u2").tobytes(),
        tables[1].astype("<u2").tobytes(),
        np.asarray(lengths, dtype="<u4").tobytes(),
        b"".join(streams),
    ]
    return pack_shard(shard.header("cachegen", level), sections)


def encode_cachegen(shard: ShardInput, levels: Sequence[int] = (0,)) -> list[bytes]:
    """One independent blob per level (CacheGen is not progressive)."""
    levels = check_levels(levels, "cachegen", tuple(LEVEL_BINS))
    return [_encode_level(shard, level) for level in levels]


def _block_ranges(t: int) -> list[tuple[int, int, int]]:
    """(chunk index, start, end) of every coded block of ``t`` tokens."""
    out = []
    for ci, c0 in enumerate(range(0, t, CHUNK_TOKENS)):
        for b0 in range(c0, min(c0 + CHUNK_TOKENS, t), BLOCK_TOKENS):
            out.append((ci, b0, min(b0 + BLOCK_TOKENS, c0 + CHUNK_TOKENS, t)))
    return out


def decode_cachegen(parsed: Parsed) -> tuple[np.ndarray, np.ndarray]:
    c = _constriction()
    header, sections = single_blob(parsed, "cachegen")
    expect_sections(sections, 6, header)
    n_l, t, h, d = header.tensor_shape
    n_ch = h * d
    n_chunks = -(-t // CHUNK_TOKENS)
    blocks = _block_ranges(t)
    expect_len(sections[0], 2 * n_l + 2, "cachegen bins")
    raw_bins = np.frombuffer(sections[0], dtype=np.uint8).astype(np.int64)
    bins, alphabets = raw_bins[:-2].reshape(2, n_l), raw_bins[-2:]
    if not set(bins.reshape(-1).tolist()) <= _ALLOWED_BINS or (alphabets < bins.max(axis=1)).any():
        raise ShardCorruptError(f"cachegen: bin counts {sorted(set(bins.reshape(-1).tolist()))} are not valid")
    if (alphabets > max(_ALLOWED_BINS)).any():
        raise ShardCorruptError(f"cachegen: table width {alphabets.tolist()} is not valid")
    expect_len(sections[1], 2 * n_l * t * 2, "cachegen max tensors")
    maxes = np.frombuffer(sections[1], dtype="<f2").reshape(2, n_l, t).astype(np.float32)
    if not np.isfinite(maxes).all() or (maxes < 0).any():
        raise ShardCorruptError("cachegen: max tensors are not finite and >= 0")
    tables = []
    for ti in range(2):
        alphabet = int(alphabets[ti])
        expect_len(sections[2 + ti], n_chunks * n_l * n_ch * (alphabet + 1) * 2, "cachegen tables")
        tab = np.frombuffer(sections[2 + ti], dtype="<u2").reshape(n_chunks, n_l, n_ch, alphabet + 1)
        if (tab[..., 0] != 0).any() or (tab[..., -1] != _TOTAL).any() or (np.diff(tab.astype(np.int64)) <= 0).any():
            raise ShardCorruptError("cachegen: probability table is not a strictly increasing 16-bit CDF")
        tables.append(tab)
    n_streams = 2 * n_l * len(blocks) * n_ch
    expect_len(sections[4], 4 * n_streams, "cachegen stream lengths")
    lengths = np.frombuffer(sections[4], dtype="<u4").astype(np.int64)
    if (lengths % 4).any() or int(lengths.sum()) != len(sections[5]):
        raise ShardCorruptError("cachegen: stream lengths do not add up to the bytestream")
    words = np.frombuffer(sections[5], dtype="<u4")
    offsets = np.concatenate([[0], np.cumsum(lengths // 4)])
    out = []
    s = 0
    for ti in range(2):
        sym = np.empty((n_l, t, n_ch), dtype=np.int32)
        for li in range(n_l):
            models: list = []  # set at the first block (cur_chunk -1)
            cur_chunk = -1
            for ci, b0, b1 in blocks:
                if ci != cur_chunk:
                    models, cur_chunk = _models(tables[ti][ci, li]), ci
                for ch in range(n_ch):
                    dec = c.stream.queue.RangeDecoder(words[offsets[s] : offsets[s + 1]])
                    try:
                        sym[li, b0:b1, ch] = dec.decode(models[ch], b1 - b0)
                    except (AssertionError, ValueError, RuntimeError) as e:  # constriction: invalid stream
                        raise ShardCorruptError(f"cachegen: stream {s} does not decode ({e})") from e
                    s += 1
        big_c = (bins[ti] // 2 - 1)[:, None, None]
        if (sym > 2 * big_c).any():
            raise ShardCorruptError("cachegen: decoded symbol outside the layer's bins")
        x = (sym.astype(np.float32) - big_c) / big_c.astype(np.float32) * maxes[ti][..., None]
        out.append(x.reshape(n_l, t, h, d).astype(np.float16))
    return out[0], out[1]


register_codec(
    Codec(
        "cachegen",
        tuple(LEVEL_BINS),
        False,
        False,
        encode_cachegen,
        decode_cachegen,
        "CacheGen (released code): per-token max-abs quantisation, per-(layer, channel) 16-bit tables, range coding",
    )
)

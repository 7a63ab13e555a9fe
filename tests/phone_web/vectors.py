"""Conformance vectors for the phone page's decoders: golden shards of every codec level and family this package
writes (fp16, int8, int4, every SAKURA level as a progressive chain and as a direct blob, cross-step residuals with
and without the predictor, closed-loop twins, the zero-byte reuse rung) and bad ones (corrupt, truncated, wrong
version, oversized, broken chains, wrong or missing references, digest mismatches), each with what Python's decoder
makes of it: the decoded float16 K and V, or the name of the error class it raises.

``python tests/phone_web/vectors.py OUT`` writes ``OUT/index.json`` and the blobs; ``phone_web/test/run_vectors.mjs``
decodes them with the page's modules. The KV is seeded noise shaped like real KV (per-channel offsets and scales,
heavy-tailed tokens), so the SAKURA widths take every value and every bit-group size appears.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import zstandard

from sakura_core.fetch.errors import ShardIntegrityError
from sakura_core.kv.binding import ShardSlot, check_shard_binding, check_shard_geometry
from sakura_core.kv.chain import ChainDecoder, DecodedReference, decode_chain
from sakura_core.kv.codec_parts import zstd_compress
from sakura_core.kv.codec_registry import ShardInput, ShardMeta, get_codec
from sakura_core.kv.container import ShardFormatError, ShardHeader, pack_shard, parse_shard
from sakura_core.kv.predictor import fit_scale_codes, scales_from_codes
from sakura_core.kv.sakura_dequant import WIDTHS

__all__ = ["write_vectors"]

MODEL = "ab12" * 16
TEMPLATE = "conformance"
ROPE = "flux2-ref-t10"


def _kv(rng, layers: int, grid: tuple[int, int], heads: int, head_dim: int, extreme: bool = False) -> np.ndarray:
    """(2, layers, tokens, heads, head_dim) float32 KV-like values; ``extreme``: half the channels span from a
    subnormal to thousands, so float32 range arithmetic rounds (a decoder rounding once instead of twice differs)."""
    t = grid[0] * grid[1]
    offset = rng.normal(0, 2, (2, layers, 1, heads, head_dim))
    scale = np.exp(rng.normal(0, 0.7, (2, layers, 1, heads, head_dim)))
    token = np.exp(rng.normal(0, 0.5, (2, layers, t, heads, 1)))
    x = offset + scale * token * rng.standard_t(4, (2, layers, t, heads, head_dim))
    if extreme:
        x[..., ::2] = np.abs(x[..., ::2]) * rng.uniform(100, 3000, (2, layers, 1, heads, (head_dim + 1) // 2))
        x[:, :, 0, :, ::2] = -rng.uniform(1e-8, 5e-7, (2, layers, heads, (head_dim + 1) // 2))
    return x.astype(np.float32)


def _shard(x: np.ndarray, first: int, grid, rng, **meta) -> ShardInput:
    m = ShardMeta(MODEL, TEMPLATE, ROPE, first, tuple(grid), 8, **meta)
    layers, t, heads, _ = x[0].shape
    weights = {  # random importance spreads the widths over every value
        "k_weight": rng.gamma(0.5, 1.0, x[0].shape).astype(np.float32),
        "v_weight": rng.gamma(0.5, 1.0, (layers, t, heads)).astype(np.float32),
    }
    return ShardInput(k=np.ascontiguousarray(x[0]), v=np.ascontiguousarray(x[1]), meta=m, **weights)


def _decoded(blobs, reference=None):
    _, k, v = decode_chain(blobs, reference)
    return k, v


class _Writer:
    def __init__(self, out: Path):
        self.out = out
        self.cases: list[dict] = []
        self.files: dict[str, str] = {}

    def blob(self, data: bytes) -> str:
        name = "b_" + hashlib.sha256(data).hexdigest()[:24] + ".bin"
        if name not in self.files:
            (self.out / name).write_bytes(data)
            self.files[name] = name
        return name

    def array(self, a: np.ndarray) -> str:
        return self.blob(np.ascontiguousarray(a, dtype="<f2").tobytes())

    def case(
        self,
        name: str,
        blobs: list[bytes],
        reference: DecodedReference | None = None,
        *,
        family: str,
        check: tuple[str, int] | None = None,
        reuse: dict | None = None,
        slot: ShardSlot | None = None,
    ) -> None:
        """Decode with Python and record the outcome: K and V, or the error's class name."""
        entry = {"name": name, "family": family, "blobs": [self.blob(b) for b in blobs]}
        if reference is not None:
            entry["reference"] = {
                "step": reference.step,
                "digest": reference.digest,
                "k": self.array(reference.k),
                "v": self.array(reference.v),
            }
        if check is not None:
            entry["check"] = {"digest": check[0], "bytes": check[1]}
        if reuse is not None:
            entry["reuse"] = reuse
        if slot is not None:
            entry["slot"] = {**slot.__dict__, "reference": slot.reference and list(slot.reference)}
        try:
            if check is not None and (hashlib.sha256(blobs[0]).hexdigest() != check[0] or len(blobs[0]) != check[1]):
                raise ShardIntegrityError(check[0], "the bytes do not hash to the digest")  # fetch/client.py's rule
            if reuse is not None:
                if (reference.step, reference.digest) != (reuse["step"], reuse["digest"]):
                    raise AssertionError("a golden reuse vector names its reference")
                k, v = reference.k, reference.v
            elif slot is not None:
                k, v = _decode_for_slot(blobs, slot, reference)
            else:
                k, v = _decoded(blobs, reference)
            entry["expect"] = {"k": self.array(k), "v": self.array(v)}
        except (ShardFormatError, ShardIntegrityError) as e:
            entry["expect"] = {"error": type(e).__name__}
        self.cases.append(entry)


def _decode_for_slot(blobs, slot: ShardSlot, reference):
    """What the runtime's decode lane does with a representation's blobs (runtime/decode_lane.py)."""
    dec = ChainDecoder()
    for blob in blobs:
        dec.push(blob, lambda header: check_shard_geometry(header, slot))
    check_shard_binding(dec.header, slot)
    dec.set_reference(reference)
    k, v = dec.tensors()
    return k.numpy(), v.numpy()


def _slots(w: _Writer, keep: dict, cross: dict) -> None:
    """A representation decoded for its manifest slot, and for a slot it does not belong to."""
    c1, fp16 = keep[("g1", "chain")], keep[("g1", "fp16")]
    good = ShardSlot(TEMPLATE, MODEL, (2, 2), "sakura", "sakura-l3", (4, 6), 2, 16)
    twin, d_j = cross["twin1"]
    ref = (0, cross["fp16_digest"])
    for name, (blobs, slot, reference) in {
        "sakura-l3": (c1[:4], good, None),
        "fp16": ([fp16], replace(good, codec="fp16", level_name="fp16"), None),
        "residual": (cross["scaled"][:4], replace(good, step=1, reference=ref), cross["held"]["sakura-l1"]),
        "twin": ([twin], replace(good, level_name="sakura-l1", step=1, reference=(0, d_j.digest)), d_j),
        "bad/other-layers": (c1[:4], replace(good, layers=(3, 3)), None),
        "bad/other-template": (c1[:4], replace(good, template_id="other"), None),
        "bad/other-model": (c1[:4], replace(good, model_id="cd" * 32), None),
        "bad/other-grid": (c1[:4], replace(good, token_grid=(6, 4)), None),
        "bad/other-heads": (c1[:4], replace(good, heads=4), None),
        "bad/other-head-dim": (c1[:4], replace(good, head_dim=8), None),
        "bad/other-codec": (c1[:4], replace(good, codec="fp16"), None),
        "bad/other-level": (c1[:4], replace(good, level_name="sakura-l4"), None),
        "bad/other-step": (c1[:4], replace(good, step=1), None),
        "bad/residual-slot-without-reference": (cross["scaled"][:4], replace(good, step=1), None),
        "bad/twin-in-open-loop-slot": ([twin], replace(good, level_name="sakura-l1", step=1, reference=ref), d_j),
        # pushed blob by blob: the corrupt payload of blob 1 is found before blob 2's broken link
        "bad/corrupt-payload-before-broken-link": (
            [c1[0], _patch(c1[1], len(c1[1]) - 12, bytes(8)), c1[2]],
            good,
            None,
        ),
    }.items():
        w.case(f"slot/{name}", blobs, reference, family="slot", slot=slot)


def _recrc(blob: bytes) -> bytes:
    """The blob with its CRC trailer recomputed (a corruption the container's checksum does not catch)."""
    body = blob[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _patch(blob: bytes, offset: int, data: bytes, crc: bool = True) -> bytes:
    out = blob[:offset] + data + blob[offset + len(data) :]
    return _recrc(out) if crc else out


def _rounding_blob(rng) -> bytes:
    """A hand-made SAKURA base blob whose channel ranges ``(lo, hi)`` (float16) make ``(hi - lo) / 255`` round
    differently in float32 once (a decoder skipping the subtraction's rounding) than twice, with codes where that
    changes the float16 output: every unit at 8 bits, half the tokens at such a code, half random."""
    lo16 = (rng.integers(1, 1024, 1 << 21).astype(np.uint16) | np.uint16(0x8000)).view(np.float16)  # subnormals < 0
    hi16 = rng.uniform(1000, 60000, 1 << 21).astype(np.float16)
    lo, hi = lo16.astype(np.float32), hi16.astype(np.float32)
    twice = (hi - lo) / np.float32(255)
    once = ((hi.astype(np.float64) - lo.astype(np.float64)) / 255).astype(np.float32)
    keep = np.flatnonzero(twice != once)
    lo16, hi16, lo, twice, once = lo16[keep], hi16[keep], lo[keep], twice[keep], once[keep]
    c = np.arange(256, dtype=np.float32)[:, None]
    differs = (c * twice + lo).astype(np.float16) != (c * once + lo).astype(np.float16)  # (codes, candidates)
    pick = np.flatnonzero(differs.any(axis=0))[:8]  # (2 tensors x 4 channels)
    n_l, t, h, d = 1, 6, 1, 4
    meta = np.stack([lo16[pick], hi16[pick], hi16[pick] / 2]).astype("<f2")
    deltas = np.full(2 * n_l * t * h, 7, np.uint8)  # width index 7 = 8 bits
    codes = rng.integers(0, 256, (2, t, d)).astype(np.uint8)  # (tensor, token, channel)
    codes[:, ::2] = np.argmax(differs[:, pick], axis=0).reshape(2, 1, d)
    header = ShardHeader("sakura", 0, MODEL, TEMPLATE, ROPE, 0, 0, (2, 3), h, d)
    return pack_shard(header, [zstd_compress(meta.tobytes() + deltas.tobytes(), 3), zstd_compress(codes.tobytes(), 3)])


def _golden(w: _Writer, rng) -> dict:
    """Every codec and level on three geometries; returns what the cross-step and bad vectors build on."""
    sakura = get_codec("sakura")
    keep = {}
    for gname, (layers, grid, heads, head_dim) in {
        "g1": (1, (4, 6), 2, 16),  # head_dim % 8 == 0: Python's word paths
        "g2": (2, (3, 5), 3, 12),  # a two-layer shard, head_dim % 8 != 0
        "g3": (1, (3, 3), 1, 5),  # an odd element count (int4's pad nibble), tiny planes
        "g4": (1, (8, 8), 4, 32),  # extreme channel ranges
    }.items():
        x = _kv(rng, layers, grid, heads, head_dim, extreme=gname == "g4")
        shard = sakura.prepare_shards([_shard(x, 2, grid, rng)])[0]
        for codec in ("fp16", "int8", "int4"):
            (blob,) = get_codec(codec).encode(shard, [0])
            w.case(f"{gname}/{codec}", [blob], family=codec)
            keep[(gname, codec)] = blob
        for level, blob in enumerate(get_codec("cachegen").encode(shard, [0, 1, 2])):
            w.case(f"{gname}/cachegen-l{level}", [blob], family="cachegen")
            keep[(gname, f"cachegen-l{level}")] = blob
        chain = sakura.encode(shard, list(sakura.levels))
        direct = sakura.direct_blobs(shard, list(sakura.levels))
        for j in sakura.levels:
            w.case(f"{gname}/sakura-l{j}/chain", chain[: j + 1], family="sakura")
            w.case(f"{gname}/sakura-l{j}/direct", [direct[j]], family="sakura")
        w.case(f"{gname}/sakura-l2+l5+l8/chain", sakura.encode(shard, [2, 5, 8]), family="sakura")
        keep[(gname, "x")], keep[(gname, "chain")], keep[(gname, "grid")] = x, chain, grid
    w.case("crafted/sakura-range-rounding", [_rounding_blob(rng)], family="sakura")
    return keep


def _cross_step(w: _Writer, rng, keep: dict) -> dict:
    """Step 1 of g1 coded against step 0: open-loop residuals (with and without the predictor) decoded against
    several representations of step 0, closed-loop twins against their track, the reuse rung."""
    sakura = get_codec("sakura")
    x0, grid = keep[("g1", "x")], keep[("g1", "grid")]
    x1 = (0.9 * x0 + rng.normal(0, 0.05, x0.shape)).astype(np.float32)
    fp16_digest = hashlib.sha256(keep[("g1", "fp16")]).hexdigest()
    held = {
        name: DecodedReference(0, fp16_digest, *_decoded(blobs))
        for name, blobs in (
            ("fp16", [keep[("g1", "fp16")]]),
            ("sakura-l1", keep[("g1", "chain")][:2]),
            ("sakura-l6", keep[("g1", "chain")][:7]),
        )
    }
    codes = fit_scale_codes(x0, x1)
    a = scales_from_codes(codes, 1, x0.shape[3], x0.shape[4])  # (2, layers, 1, heads, head_dim)
    out = {"fp16_digest": fp16_digest, "held": held}
    for label, scale, pred in (("scaled", codes, a * x0), ("plain", None, x0)):
        meta = {"step": 1, "ref_step": 0, "ref_digest": fp16_digest, "ref_scale": scale}
        shard = sakura.prepare_shards([_shard((x1 - pred).astype(np.float32), 2, grid, rng, **meta)])[0]
        chain = sakura.encode(shard, list(sakura.levels))
        for j in (0, 3, 8):
            for ref_name, ref in held.items():
                w.case(f"g1/step1/residual-{label}/sakura-l{j}/ref-{ref_name}", chain[: j + 1], ref, family="residual")
        out[label] = chain
    for j in (1, 6):  # closed-loop twins: coded against D_j, the track's decoded step 0 at level j
        track = keep[("g1", "chain")][: j + 1]
        d_j = DecodedReference(
            0, hashlib.sha256(track[-1]).hexdigest(), held[f"sakura-l{j}"].k, held[f"sakura-l{j}"].v
        )
        meta = {"step": 1, "ref_step": 0, "ref_digest": d_j.digest, "ref_scale": codes}
        pred = a * np.stack([d_j.k, d_j.v]).astype(np.float32)
        shard = sakura.prepare_shards([_shard((x1 - pred).astype(np.float32), 2, grid, rng, **meta)])[0]
        (twin,) = sakura.direct_blobs(shard, [j])
        w.case(f"g1/step1/sakura-l{j}+cl", [twin], d_j, family="closed")
        w.case(f"g1/step1/sakura-l{j}+cl/open-loop-reference", [twin], held["fp16"], family="bad-reference")
        out[f"twin{j}"] = (twin, d_j)
    for ref_name, ref in held.items():
        w.case(f"g1/step1/reuse/ref-{ref_name}", [], ref, family="reuse", reuse={"step": 0, "digest": fp16_digest})
    return out


def _resection(blob: bytes, fn) -> bytes:
    """The blob re-packed (valid container, valid CRC) with ``fn(sections)``'s payload: a decoder-level fault."""
    header, sections = parse_shard(blob)
    return pack_shard(header, fn([bytes(x) for x in sections]))


def _edit_frame(section: bytes, edit) -> bytes:
    raw = bytearray(zstandard.ZstdDecompressor().decompress(section))
    edit(raw)
    return zstd_compress(bytes(raw), 3)


def _bad_sakura(w: _Writer, keep: dict) -> None:
    """SAKURA and CacheGen payload faults inside valid containers: widths, symbols, ranges, section counts;
    bins, maxima, tables, stream lengths, stream bits."""
    base, l1, cg = keep[("g1", "chain")][0], keep[("g1", "chain")][1], keep[("g4", "cachegen-l1")]
    meta = 6 * 2 * 1 * 2 * 16  # (3, 2, layers, heads, head_dim) float16

    def head(edit):
        return lambda s: [_edit_frame(s[0], edit), *s[1:]]

    def odd_group(s):  # the first group of an m outside 1, 2, 4, 8 (one symbol a byte): a symbol too large
        deltas = np.frombuffer(zstandard.ZstdDecompressor().decompress(s[0])[meta:], np.uint8)
        groups = sorted({WIDTHS[i] for i in deltas} - {0})  # a base: each unit gains its whole width
        g = 1 + next(i for i, m in enumerate(groups) if m in (3, 5, 6, 7))
        return [*s[:g], _edit_frame(s[g], lambda r: r.__setitem__(0, 255)), *s[g + 1 :]]

    cases = {
        "width-delta-8": (base, head(lambda r: r.__setitem__(meta, 8))),
        "width-index-over-7": (l1, head(lambda r: r.__setitem__(slice(0, 4), bytes([7, 7, 7, 7])))),
        "range-infinite": (base, head(lambda r: r.__setitem__(slice(0, 2), b"\x00\x7c"))),
        "range-inverted": (base, head(lambda r: r.__setitem__(slice(0, 2), b"\x00\x7b"))),
        "extra-section": (base, lambda s: [*s, s[-1]]),
        "missing-section": (base, lambda s: s[:-1]),
        "symbol-out-of-range": (base, odd_group),
        "no-sections": (base, lambda s: []),
        "cachegen-bins-13": (cg, lambda s: [bytes([13]) + s[0][1:], *s[1:]]),
        "cachegen-max-inf": (cg, lambda s: [s[0], b"\x00\x7c" + s[1][2:], *s[2:]]),
        "cachegen-table-flat": (cg, lambda s: [*s[:2], s[2][:2] + s[2][:2] + s[2][4:], *s[3:]]),
        "cachegen-lengths": (cg, lambda s: [*s[:4], s[4][:-4] + struct.pack("<I", 4 + len(s[5])), s[5]]),
        "cachegen-stream-zeros": (cg, lambda s: [*s[:5], bytes(len(s[5]))]),  # decodes (to other symbols)
        "cachegen-stream-ones": (cg, lambda s: [*s[:5], b"\xff" * len(s[5])]),
    }
    for name, (blob, fn) in cases.items():
        bad = _resection(blob, fn)
        chain = [base, bad] if blob is l1 else [bad]
        w.case(f"bad-sakura/{name}", chain, family="bad-sakura")


def _bad_container(w: _Writer, keep: dict) -> None:
    fp16, int8, int4 = keep[("g1", "fp16")], keep[("g1", "int8")], keep[("g3", "int4")]
    base = keep[("g1", "chain")][0]
    hs = struct.unpack_from("<H", base, 6)[0]
    bad = {
        "empty": b"",
        "3-bytes": fp16[:3],
        "5-bytes": fp16[:5],
        "fixed-header-cut": fp16[:60],
        "header-cut": fp16[:99],
        "last-byte-missing": fp16[:-1],
        "half": fp16[: len(fp16) // 2],
        "magic": b"SKKW" + fp16[4:],
        "not-a-shard": b"PK\x03\x04" + bytes(200),
        "version-1": _patch(fp16, 4, b"\x01\x00"),
        "version-3": _patch(fp16, 4, b"\x03\x00"),
        "crc": fp16[:-5] + bytes([fp16[-5] ^ 1]) + fp16[-4:],
        "payload-bit-flip": _patch(fp16, 200, b"\x00", False),
        "trailing-byte": _recrc(fp16[:-4] + b"\x00" + fp16[-4:]),
        "header-size": _patch(fp16, 6, struct.pack("<H", hs + 1)),
        "sections-33": _patch(fp16, 92, b"\x21"),
        "unknown-flag": _patch(fp16, 8, b"\x08"),
        "dtype-3": _patch(fp16, 9, b"\x03"),
        "refines-without-parent": _patch(fp16, 8, b"\x01"),
        "reference-flag-alone": _patch(fp16, 8, b"\x02"),
        "scale-flag-alone": _patch(fp16, 8, b"\x04"),
        "layers-inverted": _patch(fp16, 12, struct.pack("<HH", 3, 2)),
        "heads-0": _patch(fp16, 20, b"\x00\x00"),
        "codec-not-utf8": _patch(fp16, 97, b"\xff"),
        "codec-upper": _patch(fp16, 97, b"F"),
        "codec-unknown": _patch(fp16, 97, b"zp16"),
        "model-id-not-hex": _patch(fp16, 101, b"g"),
        "template-id-upper": _patch(fp16, 101 + 64, b"C"),
        "section-over-1gib": _patch(fp16, struct.unpack_from("<H", fp16, 6)[0] - 4, struct.pack("<I", 1 << 30)),
        "elements-over-2^28": _patch(fp16, 16, struct.pack("<HHHH", 4096, 4096, 32, 8)),
        "fp16-nan": _patch(fp16, hs + 10, b"\x00\x7e"),
        "fp16-section-count": _patch(fp16, 92, b"\x01"),
        "int8-negative-step": _patch(int8, struct.unpack_from("<H", int8, 6)[0] + 2, b"\x00\xbc"),
        "int8-params-inf": _patch(int8, struct.unpack_from("<H", int8, 6)[0], b"\x00\x7c"),
        "int4-code-15": _patch(int4, len(int4) - 6, b"\xff"),
        "sakura-head-not-zstd": _patch(base, hs, b"\x00\x00\x00\x00"),
        "sakura-head-size": _patch(base, hs + 5, bytes([base[hs + 5] ^ 0x01])),
        "sakura-group-bytes": _patch(base, len(base) - 12, bytes(8)),
    }
    for name, blob in bad.items():
        w.case(f"bad/{name}", [blob], family="bad-container")


def _bad_chains(w: _Writer, keep: dict, cross: dict) -> None:
    c1, c2, fp16 = keep[("g1", "chain")], keep[("g2", "chain")], keep[("g1", "fp16")]
    held = cross["held"]
    scaled = cross["scaled"]
    twin, d_j = cross["twin1"]
    wrong_step = DecodedReference(1, held["fp16"].digest, held["fp16"].k, held["fp16"].v)
    wrong_digest = DecodedReference(0, hashlib.sha256(c1[0]).hexdigest(), held["fp16"].k, held["fp16"].v)
    short = DecodedReference(0, held["fp16"].digest, held["fp16"].k[:, :-1], held["fp16"].v[:, :-1])
    cases = {
        "empty-chain": ([], None),
        "refinement-first": (c1[1:3], None),
        "link-skipped": ([c1[0], c1[2]], None),
        "out-of-order": ([c1[0], c1[2], c1[1]], None),
        "other-shard": ([c1[0], c2[1]], None),
        "fp16-twice": ([fp16, fp16], None),
        "fp16-then-sakura": ([fp16, c1[1]], None),
        "level-repeated": ([c1[0], _patch(c1[1], 10, b"\x00\x00")], None),
        "sakura-refinement-with-scale-flag": (scaled[:1] + [_patch(scaled[1], 8, b"\x07")], None),
        "residual-without-reference": (scaled[:3], None),
        "residual-wrong-step": (scaled[:3], wrong_step),
        "residual-wrong-digest": (scaled[:3], wrong_digest),
        "residual-short-reference": (scaled[:3], short),
        "self-contained-given-reference": (c1[:2], held["fp16"]),
        "twin-without-reference": ([twin], None),
        "twin-reference-of-another-level": ([twin], held["sakura-l6"]),
    }
    for name, (blobs, ref) in cases.items():
        w.case(f"bad-chain/{name}", blobs, ref, family="bad-chain")
    for name, (blob, digest, size) in {
        "digest-mismatch": (fp16, hashlib.sha256(c1[0]).hexdigest(), len(fp16)),
        "size-mismatch": (fp16, hashlib.sha256(fp16).hexdigest(), len(fp16) + 1),
        "one-bit-flipped": (_patch(fp16, 300, bytes([fp16[300] ^ 4])), hashlib.sha256(fp16).hexdigest(), len(fp16)),
        "digest-ok": (fp16, hashlib.sha256(fp16).hexdigest(), len(fp16)),
    }.items():
        w.case(f"digest/{name}", [blob], family="digest", check=(digest, size))


def write_vectors(out: Path, seed: int = 46) -> dict:
    """Write the vectors to ``out`` (index.json + blobs); returns the index."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = _Writer(out)
    keep = _golden(w, rng)
    cross = _cross_step(w, rng, keep)
    _bad_container(w, keep)
    _bad_sakura(w, keep)
    _bad_chains(w, keep, cross)
    _slots(w, keep, cross)
    index = {"format": "sakura-conformance-vectors", "version": 1, "seed": seed, "cases": w.cases}
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return index


if __name__ == "__main__":
    idx = write_vectors(Path(sys.argv[1]))
    errs = sum("error" in c["expect"] for c in idx["cases"])
    sys.stdout.write(f"{len(idx['cases'])} vectors: {len(idx['cases']) - errs} golden, {errs} refused\n")

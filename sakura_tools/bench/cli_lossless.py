"""``sakura bench lossless-top``: could a template's top rung be lossless and still fit the storage bound? Prints a
table and writes JSON.

Per template (``sakura precompute``'s single-mode template of a sample image, demo model), as fractions of its
uncompressed fp16 KV: the serving store (the chain up to its top rung, :mod:`sakura_core.precompute.store_profile`),
what the container headers of that chain take, and three lossless candidates of the exact fp16 — zstd of the fp16
bytes, zstd of its two byte planes apart (the exponent-and-sign bytes compress, the low mantissa bytes hardly),
and zstd of the XOR between the exact fp16 and the top rung's decoded fp16 (a residual on the top rung: what a
client holding the top would fetch to become exact). The serving store with a lossless top costs the chain plus
that residual; the issue's bound is 1/3.06 = 0.327x.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import numpy as np

from sakura_core.files import atomic_write_json
from sakura_core.kv.chain import decode_chain
from sakura_core.kv.container import parse_shard
from sakura_core.kv.storage import fp16_kv_bytes

__all__ = ["add_arguments", "run"]

_COLUMNS = ("serving", "headers", "fp16_zstd", "byteplane_zstd", "xor_top_zstd", "serving_plus_lossless")


def add_arguments(parser) -> None:
    parser.add_argument("--json", required=True, metavar="FILE", help="write the results as JSON here")
    parser.add_argument(
        "--templates",
        default="astronaut,coffee,chelsea,rocket",
        help="sample images (comma list; default %(default)s)",
    )
    parser.add_argument("--zstd-level", type=int, default=19, help="zstd level of the candidates (default 19)")


def _planes(u16: np.ndarray) -> list[bytes]:
    """(low bytes, high bytes) of fp16 bit patterns: the mantissa's low byte, then sign, exponent and top mantissa."""
    return [(u16 & 0xFF).astype(np.uint8).tobytes(), (u16 >> 8).astype(np.uint8).tobytes()]


def _fp16_bits(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.concatenate([k.ravel(), v.ravel()]).astype(np.float16).view(np.uint16)


def _check_lossless(exact: np.ndarray, approx: np.ndarray, low: bytes, high: bytes) -> None:
    """The residual's two compressed planes XORed onto the top rung's bits give the exact fp16 back, bit for bit."""
    import zstandard

    d = zstandard.ZstdDecompressor()
    planes = [np.frombuffer(d.decompress(x), dtype=np.uint8).astype(np.uint16) for x in (low, high)]
    if not np.array_equal(approx ^ (planes[0] | (planes[1] << 8)), exact):
        raise RuntimeError("the XOR residual on the top rung does not restore the exact fp16")


def measure(manifest: dict, blobs: dict[str, bytes], level: int = 19) -> dict:
    """The figures above for one full-profile template (``manifest``, ``blobs``: a ``precompute_template`` result),
    each over its fp16 KV."""
    import zstandard

    from sakura_core.precompute.store_profile import StoreProfile, apply_store_profile

    z = zstandard.ZstdCompressor(level=level)
    serving, kept = apply_store_profile(manifest, blobs, StoreProfile("serving"), progressive=True)
    tot = dict.fromkeys(_COLUMNS, 0)
    tot["serving"] = sum(len(b) for b in kept.values())
    # header, strings, section table and crc32 trailer: each blob's bytes that are not payload
    tot["headers"] = sum(len(b) - sum(len(s) for s in parse_shard(b)[1]) for b in kept.values())
    for full_shard, shard in zip(manifest["shards"], serving["shards"], strict=True):
        reps = {r["name"]: r for r in full_shard["representations"]}
        _, k, v = decode_chain([blobs[reps["fp16"]["digest"]]])
        exact = _fp16_bits(k, v)
        tot["fp16_zstd"] += len(z.compress(exact.tobytes()))
        tot["byteplane_zstd"] += sum(len(z.compress(p)) for p in _planes(exact))
        top = max(shard["representations"], key=lambda r: r["level"])
        _, kt, vt = decode_chain([blobs[d] for d in top["requires"]] + [blobs[top["digest"]]])
        approx = _fp16_bits(kt, vt)
        low, high = (z.compress(p) for p in _planes(exact ^ approx))
        tot["xor_top_zstd"] += len(low) + len(high)
        _check_lossless(exact, approx, low, high)
    tot["serving_plus_lossless"] = tot["serving"] + tot["xor_top_zstd"]
    fp = fp16_kv_bytes(manifest)
    top_name = max(serving["shards"][0]["representations"], key=lambda r: r["level"])["name"]
    return {"fp16_kv_bytes": fp, "top": top_name, **{c: round(tot[c] / fp, 4) for c in _COLUMNS}}


def run(args) -> int:
    import torch

    from sakura_core.models.edit_model import load_demo_model, load_image
    from sakura_core.precompute import precompute_template

    torch.manual_seed(0)
    model = load_demo_model()
    rows = {}
    print(f"{'template':<12}{'top':<11}" + "".join(f"{c:>22}" for c in _COLUMNS))
    for name in (t.strip() for t in args.templates.split(",") if t.strip()):
        pre = precompute_template(
            model, load_image(name, model.spec.image_size), f"lossless-{name}", store_profile="full"
        )
        rows[name] = measure(pre.manifest, pre.blobs, args.zstd_level)
        print(f"{name:<12}{rows[name]['top']:<11}" + "".join(f"{rows[name][c]:>21.4f}x" for c in _COLUMNS))
    print("x the template's uncompressed fp16 KV (single mode); bound 1/3.06 = 0.327x")
    atomic_write_json(
        args.json,
        {
            "command": f"sakura bench lossless-top --templates {args.templates} --zstd-level {args.zstd_level}",
            "bound_x_fp16": round(1 / 3.06, 4),
            "templates": rows,
        },
    )
    print(f"wrote {args.json}")
    return 0

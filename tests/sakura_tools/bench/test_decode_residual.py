"""``sakura bench decode``'s cross-step rows (bench/decode_residual.py): a per-step template's step 1 coded against
step 0 at phone-scale-like size, decoded with its reference as the runtime decodes it."""

import numpy as np
import pytest

from sakura_core.kv.chain import DecodedReference, ShardChainError, decode_chain
from sakura_core.kv.codec_registry import get_codec
from sakura_tools.bench.decode_residual import REF_DIGEST, _residual_input, gaussian_steps, measure_residual_decode

SHARD = {"tokens": 128, "heads": 4, "head_dim": 16}


def test_every_residual_rung_and_twin_is_timed_with_its_wire_rate():
    s0, s1 = gaussian_steps(**SHARD)
    rows = measure_residual_decode(s0, s1, SHARD, repeats=1, target_mbit_s=500.0)
    levels = get_codec("sakura").levels
    assert [r["name"] for r in rows] == [f"sakura-l{lv}" for lv in levels] + [f"sakura-l{lv}+cl" for lv in levels]
    for r in rows:
        assert r["decode_s"] > 0 and r["wire_mbit_s"] == pytest.approx(8 * r["wire_bytes"] / r["decode_s"] / 1e6)
        assert r["meets_target"] == (r["wire_mbit_s"] >= 500.0)
    # the open-loop chain grows with the level (progressive: base..level); the top rung carries the most bytes
    chain = [r["wire_bytes"] for r in rows[: len(levels)]]
    assert chain == sorted(chain) and chain[-1] > 10 * chain[0]


def test_the_top_rung_decodes_step_1_through_its_reference_and_refuses_another():
    s0, s1 = gaussian_steps(**SHARD)
    inp, ref, _ = _residual_input(s0, s1, SHARD)
    codec = get_codec("sakura")
    blobs = codec.encode(inp, codec.levels)
    _, k, v = decode_chain(blobs, ref)
    err = max(np.abs(k.astype(np.float32)[0] - s1[0]).max(), np.abs(v.astype(np.float32)[0] - s1[1]).max())
    spread = float(np.abs(s1).max())
    assert err < 0.02 * spread  # the top rung plus the reference is step 1 (the residual is all that was coded)
    # without the reference the residual alone is far from step 1: the add is what makes it
    _, k0, _ = decode_chain(blobs, DecodedReference(0, REF_DIGEST, 0 * ref.k, 0 * ref.v))
    assert np.abs(k0.astype(np.float32)[0] - s1[0]).max() > 10 * err
    with pytest.raises(ShardChainError, match="reference given is step 0 shard"):
        decode_chain(blobs, DecodedReference(0, "cd" * 32, ref.k, ref.v))

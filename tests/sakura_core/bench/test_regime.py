"""Regime map: on a slow link a fast device computes; on a fast link a slow device fetches; the margins by hand."""

import pytest

from sakura_core.bench.phone_scale import format_regime, regime_map
from sakura_core.policy.ladder import Level
from sakura_core.runtime.profiles import DeviceProfile, DitGeometry

G = DitGeometry(name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32,
                steps=3)  # fmt: skip


def _ladders(g):
    fp = g.shard_bytes_fp16
    lv = Level("q", fp // 6, fp // 6, 1e-3, 1e-4 / g.layers)
    return {"sakura": [[lv]] * g.layers}, {"sakura": 0}


def _single_mode_margins_by_hand(r, prof):
    """Single mode, 4 layers, 3 steps, shards of 87381 B (fp16 / 6), 40 ms RTT per request, 1 ms decode."""
    # 100 TFLOP/s over 0.1 Mbit/s: computing wins (template pass + 3 cached steps); next best is the hybrid that
    # fetches only the last shard: RTT + 87381 B * 8 / 0.1 Mbit/s (6.99 s) + its decode; all fetched is ~28 s
    assert r["cells"][1][0]["latency_s"][2] > 6.99 and prof.model.shard_bytes_fp16 // 6 == 87381
    fast = prof.with_speed(100e12)
    compute_s = fast.template_pass_s + 3 * fast.step_cached_s  # 1.33e-4 s
    cell = r["cells"][1][0]
    assert cell["latency_s"][0] == pytest.approx(compute_s)
    assert cell["margin"] == pytest.approx((0.04 + 87381 * 8 / 0.1e6 + 1e-3) / compute_s, rel=1e-3)  # ~52900x
    # 0.01 TFLOP/s over 10 Gbit/s: fetching all wins (RTT + decode + 3 cached steps, transfer 0.3 ms); next best is
    # the hybrid computing layer 0's template at step 0 (one full layer, 3 cached, then 2 cached steps)
    slow = prof.with_speed(0.01e12)
    fetch_s = 0.04 + 1e-3 + 4 * 87381 * 8 / 1e10 + 3 * slow.step_cached_s
    hybrid_s = slow.layer_full_s + 3 * slow.layer_cached_s + 2 * slow.step_cached_s
    cell = r["cells"][0][1]
    assert cell["latency_s"][1] == pytest.approx(fetch_s, rel=1e-3)
    assert cell["margin"] == pytest.approx(hybrid_s / fetch_s, rel=1e-3)  # 1.08x
    assert " F  1.08x" in format_regime(r)


def test_winners_follow_link_rate_and_device_speed():
    prof = DeviceProfile("dev", "soc", 1e12, 0.0, 0, model=G)
    for mode in ("single", "per-step"):
        g = G if mode == "single" else DitGeometry(**{**G.__dict__, "layers": 12, "steps": 1})
        lad, fl = _ladders(g)
        r = regime_map(prof, lad, fl, tflops=[0.01, 100.0], mbits=[0.1, 10000.0], kv_mode=mode)
        assert r["cells"][1][0]["winner"] == "compute"  # fast device, slow link
        assert r["cells"][0][1]["winner"] == "fetch"  # slow device, fast link
        assert r["kv_mode"] == mode and "C" in format_regime(r)
        if mode == "single":
            _single_mode_margins_by_hand(r, prof)

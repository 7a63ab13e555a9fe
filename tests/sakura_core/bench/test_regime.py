"""Regime map: on a slow link a fast device computes; on a fast link a slow device fetches."""

from sakura_core.bench.phone_scale import format_regime, regime_map
from sakura_core.policy.ladder import Level
from sakura_core.runtime.profiles import DeviceProfile, DitGeometry

G = DitGeometry(name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32,
                steps=3)  # fmt: skip


def _ladders(g):
    fp = g.shard_bytes_fp16
    lv = Level("q", fp // 6, fp // 6, 1e-3, 1e-4 / g.layers)
    return {"sakura": [[lv]] * g.layers}, {"sakura": 0}


def test_winners_follow_link_rate_and_device_speed():
    prof = DeviceProfile("dev", "soc", 1e12, 0.0, 0, model=G)
    for mode in ("single", "per-step"):
        g = G if mode == "single" else DitGeometry(**{**G.__dict__, "layers": 12, "steps": 1})
        lad, fl = _ladders(g)
        r = regime_map(prof, lad, fl, tflops=[0.01, 100.0], mbits=[0.1, 10000.0], kv_mode=mode)
        assert r["cells"][1][0]["winner"] == "compute"  # fast device, slow link
        assert r["cells"][0][1]["winner"] == "fetch"  # slow device, fast link
        assert all(c["margin"] >= 1.0 for row in r["cells"] for c in row)
        assert r["kv_mode"] == mode and "C" in format_regime(r)

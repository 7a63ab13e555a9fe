"""Regime maps: on a slow link a fast device computes; on a fast link a slow device fetches; the margins by hand;
a policy's speed-up never passes its ceiling (the fluid bound in its place)."""

import json
from pathlib import Path

import pytest

from sakura_core.cli import main
from sakura_core.policy.ladder import Level
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry, get_profile
from sakura_core.runtime.sim_ladders import ShardLadders
from sakura_tools.bench.regime import cells_reaching, format_policy_regime, format_regime, policy_regime, regime_map
from sakura_tools.bench.results_doc import regime_table

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)


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
    prof = DeviceProfile("dev", "soc", DeviceCompute(1e12, 0.0), DeviceMemory(0), model=G)
    for mode in ("single", "per-step"):
        g = G if mode == "single" else G.with_fields(layers=12, steps=1)
        lad, fl = _ladders(g)
        r = regime_map(prof, lad, fl, tflops=[0.01, 100.0], mbits=[0.1, 10000.0], kv_mode=mode)
        assert r["cells"][1][0]["winner"] == "compute"  # fast device, slow link
        assert r["cells"][0][1]["winner"] == "fetch"  # slow device, fast link
        assert r["kv_mode"] == mode and "C" in format_regime(r)
        if mode == "single":
            _single_mode_margins_by_hand(r, prof)


# --- policy_regime: a policy's speed-up over baselines beside its ceiling (the fluid lower bound in its place) ---

LADDERS = Path(__file__).resolve().parents[3] / "docs" / "results" / "ladders"  # the committed ones


def _phone_dit():
    """The phone-class DiT on the phone CPU, per-step KV (4 steps x 24 layers of shards)."""
    lad = ShardLadders.from_dict(json.loads((LADDERS / "phone-dit-512.per-step.json").read_text()))
    return get_profile("snapdragon-8-elite-cpu", "phone-dit-512"), *lad.for_simulator()


def test_no_cell_beats_its_ceiling_and_the_ends_of_the_map_behave():
    prof, lad, fl = _phone_dit()
    r = policy_regime(prof, lad, fl, tflops=[0.2, 50.0], mbits=[0.5, 2000.0], kv_mode="per-step")
    for row in r["cells"]:
        for c in row:
            assert c["latency_s"]["sakura"] >= c["fluid_bound_s"] * (1 - 1e-9)  # the bound is a bound
            for b in ("cachegen", "on-device-cached"):
                assert c["speedup"][b] == pytest.approx(c["latency_s"][b] / c["latency_s"]["sakura"])
                assert c["ceiling"][b] >= c["speedup"][b] * (1 - 1e-9)
    # a fast device on a crawling link: the template is computed, nothing fetched helps (no ceiling over on-device)
    assert r["cells"][1][0]["ceiling"]["on-device-cached"] < 1.02
    assert r["cells"][1][0]["speedup"]["on-device-cached"] > 0.98  # sakura does not lose either
    # a phone CPU on a fast link: fetching the template KV pays, and sakura takes most of what the bound allows
    fast = r["cells"][0][1]
    assert fast["ceiling"]["on-device-cached"] > 1.5
    assert fast["speedup"]["on-device-cached"] > 0.95 * fast["ceiling"]["on-device-cached"]
    text = format_policy_regime(r, "on-device-cached", target=1.5)
    assert "0.2*" in text and "50 " in text and "* its own 0.2" in text
    reach = cells_reaching(r, "on-device-cached", 1.5, "ceiling")
    assert (0.2, 2000.0) in reach and (50.0, 0.5) not in reach
    assert f"within reach (ceiling >= 1.5x) in {len(reach)}" in text


def test_policy_regime_refuses_mismatched_ladders_and_bad_axes():
    prof, lad, fl = _phone_dit()
    with pytest.raises(ValueError, match="single KV on phone-dit-512 has 24 shards; the 'sakura' ladders list 96"):
        policy_regime(prof, lad, fl, [1.0], [10.0], kv_mode="single")
    with pytest.raises(ValueError, match="must be > 0"):
        policy_regime(prof, lad, fl, [1.0], [0.0], kv_mode="per-step")
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        policy_regime(prof, lad, fl, [1.0], [10.0], baselines=("nope",), kv_mode="per-step")


def test_bench_regime_cli_writes_the_map_and_the_results_doc_renders_it(tmp_path, capsys):
    out = tmp_path / "regime.json"
    argv = [
        "bench",
        "regime",
        "--geometry",
        "phone-dit-512",
        "--kv-mode",
        "single",
        "--ladders",
        str(LADDERS),
        "--tflops",
        "0.2,3.5",
        "--mbits",
        "3,300",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["command"].startswith("sakura bench regime ") and data["kv_mode"] == "single"
    assert [len(row) for row in data["cells"]] == [2, 2] and data["baselines"] == ["cachegen", "on-device-cached"]
    printed = capsys.readouterr().out
    assert "sakura vs cachegen on constant links" in printed and "wrote" in printed
    table = regime_table(data)
    c = data["cells"][0][1]
    assert data["command"] in table and f"{c['speedup']['cachegen']:.2f}x ({c['ceiling']['cachegen']:.2f})" in table
    with pytest.raises(SystemExit, match="--mbits needs numbers > 0"):
        main([*argv[:-2], "--mbits", "0,3", "--json", str(out)])


def test_the_oracle_as_a_baseline_runs_its_search_and_sits_between_the_bound_and_sakura():
    prof, lad, fl = _phone_dit()
    c = policy_regime(prof, lad, fl, [0.2], [20.0], baselines=("oracle",), kv_mode="per-step")["cells"][0][0]
    assert c["fluid_bound_s"] * (1 - 1e-9) <= c["latency_s"]["oracle"] <= c["latency_s"]["sakura"] * (1 + 1e-9)
    assert c["speedup"]["oracle"] <= 1 + 1e-9 <= c["ceiling"]["oracle"] * (1 + 1e-9)  # oracle / sakura, oracle / bound

"""``sakura bench e2e --mode sim``: measured codec levels -> phone-scale simulation -> table, JSON, plots."""

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from sakura_core.cli import main

LADDERS = Path(__file__).resolve().parents[3] / "docs" / "results" / "ladders"  # the committed ones


@pytest.mark.slow
def test_sim_bench_writes_consistent_json_and_plots(tmp_path, capsys):
    traces = tmp_path / "norway_3g"  # the folder name gives the class
    traces.mkdir()
    src = resources.files("sakura_core.fetch").joinpath("traces")
    shutil.copy(str(src.joinpath("norway_bus_1")), traces / "norway_bus_1")
    out = tmp_path / "e2e.json"
    rc = main(["bench", "e2e", "--mode", "sim", "--traces", str(traces), "--policies",
               "on-device-cached,fetch-fp16,cachegen,sakura,oracle,free-kv", "--json", str(out),
               "--plots", str(tmp_path / "plots"), "--starts", "2", "--steps", "2", "--no-calibrate",
               "--geometry", "klein4b-512-ref1024",
               "--kv-mode", "single", "--ladders", str(LADDERS)])  # fmt: skip # keep: flags beside their values
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["mode"] == "sim" and "SIMULATION" in data["label"]
    assert {"trace", "trace_class", "policy", "latency_s", "bytes_fetched", "psnr_db", "split_layer"} <= set(
        data["runs"][0]
    )
    assert data["profile"] == "snapdragon-8-elite-cpu" and data["kv_mode"] == "single"
    assert data["geometry"] == "klein4b-512-ref1024" and data["model"]["kv_bytes_fp16"] == 25 * 2 * 4096 * 3072 * 2
    assert {r["trace_class"] for r in data["runs"]} == {"3G"}
    assert set(data["by_class"]) == {"3G", "all"}
    assert data["settings"]["ladders"] == str(LADDERS) and any(line.startswith("ladders: ") for line in data["header"])
    assert data["regime_map"]["cells"]
    assert len(data["runs"]) == (6 + 1) * 2  # each policy and the fluid lower bound, at 2 start offsets
    s = data["summary"]
    assert set(s) == {"on-device-cached", "fetch-fp16", "cachegen", "sakura", "oracle", "free-kv", "fluid-bound"}
    assert s["fluid-bound"]["median_latency_s"] <= s["oracle"]["median_latency_s"]  # what no policy beats
    assert s["free-kv"]["median_latency_s"] <= s["oracle"]["median_latency_s"] <= s["sakura"]["median_latency_s"]
    assert s["sakura"]["median_latency_s"] <= s["on-device-cached"]["median_latency_s"]
    families = {"sakura", "cachegen", "fp16", "cachegen-no-floor"}
    assert set(data["floors"]) == families  # every family's ladders reached the simulator
    for name in ("timeline.png", "trace_levels.png", "regime_map.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "x sakura (med)" in printed and "SIMULATION" in printed


def test_unknown_policy_is_refused():
    with pytest.raises(SystemExit, match="unknown policies"):
        main(["bench", "e2e", "--policies", "nope", "--json", "/dev/null"])


def test_unknown_kv_mode_and_geometry_are_refused():
    with pytest.raises(SystemExit, match="unknown --kv-mode"):
        main(["bench", "e2e", "--kv-mode", "single,twice", "--json", "/dev/null"])
    with pytest.raises(ValueError, match="unknown geometry 'klein9'"):
        main(["bench", "e2e", "--geometry", "klein9", "--json", "/dev/null"])


def test_live_bench_takes_one_kv_mode():
    with pytest.raises(SystemExit, match="--mode live takes one --kv-mode, single or per-step; got 'single,per-step'"):
        main(
            ["bench", "e2e", "--mode", "live", "--kv-mode", "single,per-step", "--traces", ".", "--json", "/dev/null"]
        )


def test_live_bench_replays_its_traces_in_the_simulator(tmp_path, capsys):
    """The live bench's sim check: the same trace, the bench model's measured profile (a LiveProfile, per-step
    ladders of steps x layers shards) and the served ladders through the simulator; live vs simulated speed-up."""
    import argparse

    from sakura_core.fetch.traces import load_traces
    from sakura_core.policy.ladder import Level
    from sakura_core.runtime.live_profile import LiveProfile
    from sakura_tools.bench.cli_live import _sim_check

    (tmp_path / "flat.log").write_text("\n".join(f"{i}.0 2.0" for i in range(100)))  # pensieve format, 2 Mbit/s
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.05, layers=4, steps=2)
    ladders = [[Level("s1", 20_000, 20_000, 0.001, 1e-6, False)] for _ in range(8)]  # per-step: 2 x 4 shards
    name = load_traces(tmp_path)[0].name
    runs = [
        {"trace": name, "policy": "on-device", "latency_s": 1.6},
        {"trace": name, "policy": "sakura", "latency_s": 0.8},
    ]
    out = _sim_check(runs, {name: (ladders, 0)}, profile, argparse.Namespace(traces=str(tmp_path)))
    assert len(out) == 1 and out[0]["trace"] == name and out[0]["live_speedup"] == pytest.approx(2.0)
    sim = out[0]["sim_latency_s"]
    assert sim["on-device"] == pytest.approx(2 * 4 * 0.2)  # the template at both steps, nothing fetched
    # by hand, the best any plan can do on this link: a 20 kB shard takes 0.08 s at 2 Mbit/s after the 40 ms RTT;
    # j template layers on the device cost max(0.2 j + 0.05 (8 - j), 0.04 + 0.08 (8 - j) + 0.001 + 0.05), least
    # at j = 1: 0.651 s (all fetched: 0.731 s). A faster link or smaller shards than these would go below it.
    assert 0.651 - 1e-9 <= sim["sakura"] < sim["on-device"]
    assert out[0]["sim_speedup"] == pytest.approx(1.6 / sim["sakura"])
    assert out[0]["live_over_sim"] == pytest.approx(2.0 / out[0]["sim_speedup"])
    assert f"simulated {out[0]['sim_speedup']:.2f}x" in capsys.readouterr().out

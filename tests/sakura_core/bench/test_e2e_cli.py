"""``sakura bench e2e --mode sim``: measured codec levels -> phone-scale simulation -> table, JSON, plots."""

import json
import shutil
from importlib import resources

import pytest

from sakura_core.cli import main


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
               "--geometry", "klein4b-512-ref1024", "--kv-mode", "single"])  # fmt: skip
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
    assert all("phone_decode_bytes_per_s" in r for r in data["codec_levels"])
    assert data["regime_map"]["cells"]
    assert len(data["runs"]) == 6 * 2
    s = data["summary"]
    assert set(s) == {"on-device-cached", "fetch-fp16", "cachegen", "sakura", "oracle", "free-kv"}
    assert s["free-kv"]["median_latency_s"] <= s["oracle"]["median_latency_s"] <= s["sakura"]["median_latency_s"]
    assert s["sakura"]["median_latency_s"] <= s["on-device-cached"]["median_latency_s"]
    fams = {r["family"] for r in data["codec_levels"]}
    assert fams == {"sakura", "cachegen", "fp16"}
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

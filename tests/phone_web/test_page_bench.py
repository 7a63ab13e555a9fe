"""``sakura bench e2e --mode page`` at its smallest (one trace, two steps): the page in headless Chromium under a
trace-shaped link and a 4x CPU throttle, each policy's report, the simulator's replay with the page's profile. The
JSON's figures hold together (no wall-clock assert: the machine's load moves every time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ci_deps import import_or_skip, require_or_skip

from sakura_tools.bench.page_driver import CHROMIUM

from .page_driver import WEB


def test_the_page_bench_compares_live_with_simulated(tmp_path):
    require_or_skip((WEB / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.min.mjs").is_file(),
                    "phone_web's npm packages are not installed (run `npm ci` in phone_web/)")  # fmt: skip
    require_or_skip(shutil.which(CHROMIUM) or Path(CHROMIUM).is_file(), f"no Chromium at {CHROMIUM}")
    import_or_skip("playwright.sync_api", "the page bench needs playwright (pip install playwright)")
    from sakura_core.cli import main

    traces, out = tmp_path / "traces", tmp_path / "page.json"
    assert main(["traces", "synth", "--out", str(traces)]) == 0
    argv = ["bench", "e2e", "--mode", "page", "--traces", str(traces), "--page-traces", "walk113-6-0.4",
            "--steps", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["mode"] == "page" and rep["traces"] == ["walk113-6-0.4"] and rep["cpu_throttle"] == 4.0
    runs = {r["policy"]: r for r in rep["runs"]}
    assert sorted(runs) == sorted(["on-device", "fetch-fp16", "sakura"])
    for r in runs.values():
        busy = r["busy_s"]
        assert r["bound_s"] == max(busy["fetch"], busy["decode"], busy["compute"]) > 0
        assert r["latency_s"] >= r["bound_s"], r  # the edit cannot end before its busiest lane is done
        assert r["latency_over_bound"] == pytest.approx(r["latency_s"] / r["bound_s"])
    # on-device fetches only the template image; fetch-fp16 every shard at fp16, the most bytes
    on_device, fp16 = runs["on-device"]["bytes_fetched"], runs["fetch-fp16"]["bytes_fetched"]
    assert on_device <= runs["sakura"]["bytes_fetched"] <= fp16 and on_device < fp16
    assert rep["profile"]["layer_full_s"] > rep["profile"]["layer_cached_s"] > 0
    # each run keeps the page's report (its timeline and decisions, for a diagnosis); the edits ran on the page
    # session's decode pool, started and warmed with the model, not on workers started cold for each edit
    assert all(r["report"]["timeline"] and r["report"]["where"]["decode"].endswith("(the page's, warm)")
               for r in runs.values())  # fmt: skip
    # the template image is fetched before the lanes where the template pass runs (not alongside the first shards)
    image_s = {p: r["report"]["timings_s"]["template_image"] for p, r in runs.items()}
    assert image_s["sakura"] > image_s["fetch-fp16"] and image_s["on-device"] > image_s["fetch-fp16"], image_s
    (row,) = rep["comparison"]
    assert sorted(row["sim_latency_s"]) == sorted(runs) and all(v > 0 for v in row["sim_latency_s"].values())
    for base in ("on-device", "fetch-fp16"):
        s = row[f"speedup_vs_{base}"]
        assert s["live"] == pytest.approx(runs[base]["latency_s"] / runs["sakura"]["latency_s"])
        assert s["sim"] == pytest.approx(row["sim_latency_s"][base] / row["sim_latency_s"]["sakura"])
        assert s["live_over_sim"] == pytest.approx(s["live"] / s["sim"])
    assert set(rep["targets"]) == {"sakura_fastest_each_trace", "live_over_sim_within_20pct",
                                   "latency_within_1_15x_bound"}  # fmt: skip
    assert rep["targets"]["latency_within_1_15x_bound"] == all(r["latency_over_bound"] <= 1.15 for r in runs.values())

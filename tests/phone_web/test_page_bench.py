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
    require_or_skip(
        (WEB / "node_modules" / "onnxruntime-web" / "dist" / "ort.wasm.min.mjs").is_file(),
        "phone_web's npm packages are not installed (run `npm ci` in phone_web/)",
    )
    require_or_skip(shutil.which(CHROMIUM) or Path(CHROMIUM).is_file(), f"no Chromium at {CHROMIUM}")
    import_or_skip("playwright.sync_api", "the page bench needs playwright (pip install playwright)")
    from sakura_core.cli import main

    traces, out = tmp_path / "traces", tmp_path / "page.json"
    assert main(["traces", "synth", "--out", str(traces)]) == 0
    argv = [
        "bench",
        "e2e",
        "--mode",
        "page",
        "--traces",
        str(traces),
        "--page-traces",
        "walk113-6-0.4",
        "--steps",
        "2",
        "--page-repeats",
        "2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["mode"] == "page" and rep["traces"] == ["walk113-6-0.4"] and rep["cpu_throttle"] == 4.0
    runs = {r["policy"]: r for r in rep["runs"]}
    assert sorted(runs) == sorted(["on-device", "fetch-fp16", "sakura"])
    for r in runs.values():
        busy = r["busy_s"]
        pre = r["report"]["timings_s"]["manifest"] + r["report"]["timings_s"]["template_image"]
        assert r["pre_lanes_s"] == pytest.approx(pre)  # the serial work before the lanes, measured per run
        assert r["bound_s"] == pytest.approx(pre + max(busy["fetch"], busy["decode"], busy["compute"]))
        assert r["bound_s"] > 0
        assert r["latency_s"] >= r["bound_s"], r  # the edit cannot end before its busiest lane is done
        assert r["latency_over_bound"] == pytest.approx(r["latency_s"] / r["bound_s"])
    # on-device fetches only the template image; fetch-fp16 every shard at fp16, the most bytes
    on_device, fp16 = runs["on-device"]["bytes_fetched"], runs["fetch-fp16"]["bytes_fetched"]
    assert on_device <= runs["sakura"]["bytes_fetched"] <= fp16 and on_device < fp16
    assert rep["profile"]["layer_full_s"] > rep["profile"]["layer_cached_s"] > 0
    # each run keeps the page's report (its timeline and decisions, for a diagnosis); the edits ran on the page
    # session's decode pool, started and warmed with the model, not on workers started cold for each edit
    assert all(
        r["report"]["timeline"] and r["report"]["where"]["decode"].endswith("(the page's, warm)")
        for r in runs.values()
    )
    # the template image is fetched before the lanes where the template pass runs (not alongside the first shards)
    image_s = {p: r["report"]["timings_s"]["template_image"] for p, r in runs.items()}
    assert image_s["sakura"] > image_s["fetch-fp16"] and image_s["on-device"] > image_s["fetch-fp16"], image_s
    (row,) = rep["comparison"]
    # the page's fetch lane sends its requests ahead (fetch_wire.js), and the replay sends them as the page did
    assert all(r["request_ahead"] is True and r["report"]["request_ahead"] is True for r in runs.values())
    assert row["request_ahead"] == {p: r["request_ahead"] for p, r in runs.items()}
    assert sorted(row["sim_latency_s"]) == sorted([*runs, "oracle"]) and all(
        v > 0 for v in row["sim_latency_s"].values()
    )
    # two tries a policy, interleaved; the compared run is the faster (the lower middle of two)
    for p, r in runs.items():
        assert len(row["live_repeats_s"][p]) == 2 and r["latency_s"] == min(row["live_repeats_s"][p])
    # the oracle (sakura's ladders, the trace known) is the ceiling: no policy's replay beats it by more than noise
    sim = row["sim_latency_s"]
    assert sim["oracle"] <= min(sim.values()) * 1.02, sim
    assert row["ceiling_vs_on-device"] == pytest.approx(sim["on-device"] / sim["oracle"])
    for base in ("on-device", "fetch-fp16"):
        s = row[f"speedup_vs_{base}"]
        assert s["live"] == pytest.approx(runs[base]["latency_s"] / runs["sakura"]["latency_s"])
        assert s["sim"] == pytest.approx(row["sim_latency_s"][base] / row["sim_latency_s"]["sakura"])
        assert s["live_over_sim"] == pytest.approx(s["live"] / s["sim"])
    assert set(rep["targets"]) == {
        "sakura_fastest_each_trace",
        "live_over_sim_within_20pct",
        "latency_within_1_15x_bound",
    }
    assert rep["targets"]["latency_within_1_15x_bound"] == all(r["latency_over_bound"] <= 1.15 for r in runs.values())


class _FakeBench:
    """Page edits whose latencies come from a list, in the order asked (a report with just what a run reads)."""

    def __init__(self, latencies):
        self.latencies, self.asked = list(latencies), []

    def edit(self, template, policy, steps, trace, cpu_throttle):
        self.asked.append((trace.name, policy))
        total = self.latencies.pop(0)
        return {
            "timings_s": {"total": total, "manifest": 0.0, "template_image": 0.0},
            "bytes_fetched": 0,
            "busy_s": {"fetch": 0.0, "decode": 0.0, "compute": total},
            "rtt_s": 0.05,
            "split_layers": [0],
        }


def test_repeated_page_edits_are_interleaved_and_the_median_is_compared():
    from types import SimpleNamespace

    from sakura_tools.bench.cli_page import PAGE_POLICIES, _run_all

    trace = SimpleNamespace(name="t")
    # three rounds of the three policies: on-device 3, 1, 2 s; fetch-fp16 5, 9, 7; sakura 0.4, 0.6, 0.5
    bench = _FakeBench([3, 5, 0.4, 1, 9, 0.6, 2, 7, 0.5])
    runs = {r["policy"]: r for r in _run_all(bench, [trace], steps=2, throttle=4.0, repeats=3)}
    assert bench.asked == [("t", p) for p in PAGE_POLICIES] * 3  # a round of every policy, then the next
    assert {p: r["latency_s"] for p, r in runs.items()} == {"on-device": 2, "fetch-fp16": 7, "sakura": 0.5}
    assert runs["fetch-fp16"]["repeats_latency_s"] == [5, 9, 7] and len(runs["sakura"]["_reports"]) == 3


def _event(lane: str, start: float, end: float, level: str, layer: int = 0) -> dict:
    return {"lane": lane, "start": start, "end": end, "layer": layer, "level": level}


def test_the_page_profile_charges_the_decodes_beside_the_dit_as_measured():
    """Hand-derived: the DiT's step 0.06 s and a template-pass layer 0.01 s alone; a pass layer a decode overlaps
    all along, on 3 cores' worth of sharing (the DiT at 3/4 of its speed while it decodes), takes 0.01 * 4/3 s: the
    profile keeps the medians of the events alone and measures 3 cores; the decode took 4x the ladder's seconds."""
    from sakura_tools.bench.cli_page import contention_cores, page_profile

    shared = 0.01 * 4 / 3
    timeline = [
        _event("compute", 0.0, 0.01, "template"),
        _event("compute", 0.01, 0.02, "template"),
        _event("compute", 0.02, 0.02 + shared, "template"),
        _event("decode", 0.02, 0.02 + shared, "s2", 7),
        _event("compute", 0.1, 0.16, "step"),
        _event("compute", 0.2, 0.26, "step"),
    ]
    report = {"timeline": timeline}
    assert contention_cores([report]) == pytest.approx(3.0)
    profile = page_profile([report], layers=6, steps=4, decode_s={(7, "s2"): shared / 4})
    assert profile.layer_cached_s == pytest.approx(0.06 / 6)
    assert profile.layer_full_s == pytest.approx(0.06 / 6 + 0.01)  # the shared pass layer is not the median
    assert profile.dit_cpu_cores == pytest.approx(3.0) and profile.cpu_slowdown == pytest.approx(4.0)
    # no decode beside the DiT, or no slowdown beside one: nothing to charge
    alone = {"timeline": [e for e in timeline if e["lane"] != "decode"]}
    assert contention_cores([alone]) == 0.0
    assert page_profile([alone], 6, 4).dit_cpu_cores == 0.0 and page_profile([alone], 6, 4).cpu_slowdown == 1.0
    # a decode that halts the DiT (it took twice its time alone) is one core; one that takes it three times is half
    for slower, cores in ((2, 1.0), (3, 0.5)):
        halted = {
            "timeline": timeline[:2]
            + [_event("compute", 0.02, 0.02 + 0.01 * slower, "template"), _event("decode", 0.02, 0.05, "s2")]
            + timeline[4:]
        }
        assert contention_cores([halted]) == pytest.approx(cores)


def test_the_page_profile_of_a_recorded_run_shares_the_cpu():
    """The recorded page bench (docs/results/page/page_bench.json, 2-core host, 4x throttle): the sakura and
    fetch-fp16 runs' DiT was slower beside the decodes than alone, so the profile charges it (and its medians are
    the events alone, below the recorded medians of every event); an on-device run (no decode) charges nothing."""
    from sakura_tools.bench.cli_page import contention_cores, page_profile

    rec = json.loads((Path(__file__).parents[2] / "docs" / "results" / "page" / "page_bench.json").read_text())
    reports = [r["report"] for r in rec["runs"]]
    profile = page_profile(reports, rec["template"]["layers"], rec["template"]["steps"])
    assert profile.dit_cpu_cores > 0
    assert profile.layer_full_s > profile.layer_cached_s > 0
    assert (
        profile.layer_full_s - profile.layer_cached_s
        < rec["profile"]["layer_full_s"] - rec["profile"]["layer_cached_s"]
    )
    assert all(contention_cores([r["report"]]) == 0.0 for r in rec["runs"] if r["policy"] == "on-device")

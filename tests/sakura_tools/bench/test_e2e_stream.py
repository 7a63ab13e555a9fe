"""``sakura bench e2e --json FILE.jsonl`` (issue 50, item 1): every run streamed as it is simulated, read back whole
by ``load_e2e`` (what ``sakura bench results`` renders), a cut-off or corrupt file refused with its line and the fix;
events kept only for the policies ``--events`` names; memory that does not grow with the runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sakura_core.cli import main
from sakura_core.fetch.synth import random_walk, write_pensieve
from sakura_tools.bench.e2e_stream import E2eStreamError, JsonlSink, load_e2e, open_sink

ROOT = Path(__file__).resolve().parents[3]


def _write(path: Path, n_results: int = 2, runs: int = 3) -> None:
    sink = JsonlSink(path, {"command": "sakura bench e2e --x", "argv": ["--x"]})
    for i in range(n_results):
        for k in range(runs):
            sink.run({"trace": f"t{k}", "policy": "sakura", "latency_s": 1.5 + k, "psnr_db": float("nan")})
        sink.result({"kv_mode": "single", "geometry": "g", "profile": f"p{i}", "by_class": {}, "runs": ["dropped"]})
    sink.close(12.5)


def test_a_streamed_file_reads_back_whole(tmp_path):
    path = tmp_path / "e2e.jsonl"
    _write(path)
    data = load_e2e(path)
    assert data["command"] == "sakura bench e2e --x" and data["seconds"] == 12.5
    assert [r["profile"] for r in data["results"]] == ["p0", "p1"]
    runs = data["results"][1]["runs"]
    assert [r["latency_s"] for r in runs] == [1.5, 2.5, 3.5] and runs[0]["psnr_db"] != runs[0]["psnr_db"]  # NaN kept
    assert "runs" not in load_e2e(path, with_runs=False)["results"][0]
    assert len(path.read_text().splitlines()) == 1 + 2 * 4 + 1  # header, 3 runs + a result each, end


def test_a_cut_off_file_is_refused_naming_the_command(tmp_path):
    path = tmp_path / "e2e.jsonl"
    _write(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # the run stopped before its end record
    with pytest.raises(E2eStreamError, match=r"cut off after 2 results: no 'end' record.*sakura bench e2e --x"):
        load_e2e(path)
    path.write_text("".join(lines[:5]) + lines[5][:20])  # cut inside a line
    with pytest.raises(E2eStreamError, match="line 6 is cut off"):
        load_e2e(path)


def test_a_corrupt_line_is_refused_with_its_number(tmp_path):
    path = tmp_path / "e2e.jsonl"
    _write(path)
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"latency_s":', '"latency_s"', 1)
    path.write_text("".join(lines))
    with pytest.raises(E2eStreamError, match="line 4 is not JSON"):
        load_e2e(path)
    path.write_text('{"record": "run", "result": 0}\n')
    with pytest.raises(E2eStreamError, match="not a sakura-e2e-runs header"):
        load_e2e(path)
    path.write_text("")
    with pytest.raises(E2eStreamError, match="empty"):
        load_e2e(path)


def test_an_aborted_sink_leaves_a_file_that_is_refused(tmp_path):
    path = tmp_path / "e2e.jsonl"
    sink = open_sink(path, {"command": "c"})
    sink.run({"policy": "sakura"})
    sink.abort()
    with pytest.raises(E2eStreamError, match="no 'end' record"):
        load_e2e(path)


def _traces(folder: Path, n: int, same: bool = False) -> Path:
    folder.mkdir()
    for seed in range(n):
        write_pensieve(random_walk(0 if same else seed, 20.0, 0.3, seconds=120), folder / f"walk{seed}.log")
    return folder


def _e2e(traces: Path, out: Path, *extra: str) -> None:
    argv = ["bench", "e2e", "--traces", str(traces), "--policies", "sakura,on-device", "--profile",
            "snapdragon-8-elite-gpu", "--kv-mode", "single", "--geometry", "phone-dit-512", "--starts", "1",
            "--ladders", str(ROOT / "docs/results/ladders"), "--planning", "1", "--no-calibrate", "--no-regime-map",
            "--json", str(out), *extra]  # fmt: skip # keep: flags beside their values
    assert main(argv) == 0


def test_the_e2e_command_streams_runs_and_keeps_events_only_where_asked(tmp_path):
    traces = _traces(tmp_path / "traces", 2)
    _e2e(traces, tmp_path / "a.jsonl", "--events", "sakura")
    data = load_e2e(tmp_path / "a.jsonl")
    runs = data["results"][0]["runs"]
    assert {r["policy"] for r in runs} == {"fluid-bound", "sakura", "on-device"} and len(runs) == 2 * 3
    assert all(r["events"] for r in runs if r["policy"] == "sakura")
    assert not any("events" in r for r in runs if r["policy"] != "sakura")
    assert "--events sakura" in data["command"]
    _e2e(traces, tmp_path / "b.json")  # a .json name: one JSON at the end, the same figures
    whole = json.loads((tmp_path / "b.json").read_text())
    assert whole["summary"] == data["results"][0]["summary"] and not any("events" in r for r in whole["runs"])


_RSS = """
import resource, sys
from sakura_core.cli import main
main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_rss_kib(tmp_path: Path, traces: Path, name: str) -> int:
    argv = ["bench", "e2e", "--traces", str(traces), "--policies", "sakura,on-device", "--profile",
            "snapdragon-8-elite-gpu", "--kv-mode", "single", "--geometry", "klein4b-512-ref1024", "--starts", "2",
            "--ladders", str(ROOT / "docs/results/ladders"), "--planning", "1", "--no-calibrate", "--no-regime-map",
            "--events", "sakura,on-device",
            "--json", str(tmp_path / name)]  # fmt: skip # keep: flags beside their values
    out = subprocess.run([sys.executable, "-c", _RSS, *argv], cwd=ROOT, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_memory_does_not_grow_with_the_runs(tmp_path):
    """Runs whose events are kept (streamed to the file) do not pile up in memory: twelve copies of a trace peak
    within 40 MiB of two copies (the same largest run; a process holding the runs grows with each)."""
    few = _peak_rss_kib(tmp_path, _traces(tmp_path / "few", 2, same=True), "few.jsonl")
    many_traces = _traces(tmp_path / "many", 12, same=True)
    many = _peak_rss_kib(tmp_path, many_traces, "many.jsonl")
    runs = load_e2e(tmp_path / "many.jsonl")["results"][0]["runs"]
    assert len(runs) == 12 * 2 * 3 and all(r["events"] for r in runs if r["policy"] != "fluid-bound")
    assert many - few < 40 * 1024, (few, many)

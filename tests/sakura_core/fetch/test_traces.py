"""Trace parsing (three formats, auto-detected) and exact transfer arithmetic over piecewise-constant rates."""

import json

import numpy as np
import pytest

from sakura_core.fetch.traces import MAHIMAHI_BIN_S, Trace, TraceFormatError, load_trace, load_traces


def test_pensieve_sabre_and_mahimahi_are_detected_and_agree(tmp_path):
    (tmp_path / "cooked").write_text("0.0\t8.0\n1.0\t16.0\n2.0\t8.0\n")
    (tmp_path / "sabre.json").write_text(
        json.dumps(
            [
                {"duration_ms": 1000, "bandwidth_kbps": 8000, "latency_ms": 30},
                {"duration_ms": 1000, "bandwidth_kbps": 16000, "latency_ms": 30},
            ]
        )
    )
    # Mahimahi: 1 Mbyte/s = 666.7 packets/s; 2 packets every 3 ms for 1 s
    ms = [t for t in range(0, 1000, 3) for _ in range(2)]
    (tmp_path / "mm.down").write_text("\n".join(map(str, ms)) + "\n")
    (tmp_path / "README.md").write_text("not a trace")
    traces = {t.name: t for t in load_traces(tmp_path)}
    assert set(traces) == {"cooked", "sabre", "mm"}
    c, s, m = traces["cooked"], traces["sabre"], traces["mm"]
    assert c.rate_at(0.5) == pytest.approx(1e6) and c.rate_at(1.5) == pytest.approx(2e6)
    assert s.rate_at(0.5) == pytest.approx(1e6) and s.rate_at(1.5) == pytest.approx(2e6) and s.latency_ms == 30
    assert m.durations_s[0] == MAHIMAHI_BIN_S
    assert m.delivered(1.0) == pytest.approx(len(ms) * 1500, rel=1e-9)


def test_finish_time_inverts_delivered_and_loops():
    t = Trace("x", np.array([1.0, 2.0, 1.0]), np.array([100.0, 0.0, 300.0]))
    assert t.period_s == 4.0 and t.period_bytes == 400.0
    assert t.finish_time(0, 50) == pytest.approx(0.5)
    assert t.finish_time(0, 100) == pytest.approx(1.0)  # ends exactly at the edge of the zero-rate gap
    assert t.finish_time(0, 150) == pytest.approx(3.0 + 50 / 300)  # waits out the gap
    assert t.finish_time(3.5, 400) == pytest.approx(7.5)  # wraps around the period
    for start, n in [(0.3, 10), (2.5, 999), (9.1, 1234)]:
        end = t.finish_time(start, n)
        assert t.bytes_between(start, end) == pytest.approx(n)


def test_finish_times_is_finish_time_for_every_size():
    """The vectorised form the fluid bound uses (the scalar one stays: ~5x faster per call on the simulator's path)
    agrees with it everywhere: inside the zero-rate gap's edges, at whole periods, past several, and for nothing."""
    t = Trace("x", np.array([1.0, 2.0, 1.0]), np.array([100.0, 0.0, 300.0]))
    sizes = np.array([0.0, -5.0, 50.0, 100.0, 150.0, 400.0, 800.0, 1234.5, 3999.0, 4000.0])
    for start in (0.0, 0.3, 1.0, 2.5, 3.999, 9.1):
        got = t.finish_times(start, sizes.reshape(2, 5))
        assert got.shape == (2, 5)
        assert got.ravel().tolist() == pytest.approx([t.finish_time(start, float(n)) for n in sizes])


def test_finish_chain_is_finish_time_chained_bit_for_bit():
    """The oracle's exact plan evaluations chain transfers through one call (issue 50: a 50-step oracle 19 -> 6 s of
    CPU); each end equals the scalar form's on the edit's clock (the trace read at offset + t), to the last bit, so
    no plan changes: across the zero-rate gap, whole periods, a request of nothing and an offset."""
    rng = np.random.default_rng(3)
    t = Trace("x", np.array([1.0, 2.0, 1.0, 0.7]), np.array([100.0, 0.0, 300.0, 55.5]))
    gaps = rng.uniform(0.0, 0.4, 300) * (rng.random(300) < 0.7)
    sizes = rng.uniform(0.0, 900.0, 300) * (rng.random(300) < 0.9)
    for start, offset in ((0.0, 0.0), (0.3, 2.5), (7.7, 13.1), (1.0, 1e4 + 0.1)):
        want, now = [], start
        for gap, n in zip(gaps, sizes, strict=True):
            now = t.finish_time(offset + (now + gap), float(n)) - offset
            want.append(now)
        assert t.finish_chain(start, gaps, sizes, offset) == want


@pytest.mark.parametrize(
    "content, match",
    [
        ("0.0\tabc\n1.0\t2\n", "not numbers"),
        ("0 1 2\n", "unknown trace format"),
        ("[]", "non-empty JSON list"),
        ('[{"duration_ms": 10}]', "bandwidth_kbps"),
        ("0.0\t0\n1.0\t0\n", "delivers no bytes"),
        ("5\n3\n", "non-decreasing"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path, content, match):
    p = tmp_path / "bad"
    p.write_text(content)
    with pytest.raises(TraceFormatError, match=match):
        load_trace(p)


def test_shipped_traces_load():
    from importlib import resources

    folder = resources.files("sakura_core.fetch").joinpath("traces")
    traces = load_traces(str(folder))
    assert len(traces) >= 3
    assert all(t.mean_mbit_per_s > 0 for t in traces)


def test_txt_traces_load_and_skipped_files_are_named(tmp_path, caplog):
    import logging

    from sakura_core.fetch.traces import scan_traces

    (tmp_path / "oboe_trace_1.txt").write_text("0.0\t1.5\n1.0\t2.5\n2.0\t0.5\n")  # Pensieve-style, .txt
    (tmp_path / "README.md").write_text("# about\n")
    (tmp_path / "notes.txt").write_text("these are my notes about the traces\n")
    with caplog.at_level(logging.WARNING, logger="sakura_core.fetch.traces"):
        scan = scan_traces(tmp_path)
    assert [t.name for t in scan.traces] == ["oboe_trace_1"]  # old: every .txt was dropped without a word
    skipped = {p.rsplit("/", 1)[-1]: why for p, why in scan.skipped}
    assert set(skipped) == {"README.md", "notes.txt"}
    assert "not a trace" in skipped["notes.txt"]
    assert "notes.txt" in caplog.text and "README.md" in caplog.text


def test_trace_classes_from_folders_and_from_a_classes_file(tmp_path):
    import json

    from sakura_core.fetch.trace_classes import classify_path
    from sakura_core.fetch.traces import scan_traces

    assert classify_path("ucc_5g_download/ucc5g_driving_1") == "5G"
    assert classify_path("mahimahi/ATT-LTE-driving-2016.down") == "4G"
    assert classify_path("sabre_3g_hsdpa_json/report.2010.json") == "3G"
    assert classify_path("pensieve_cooked_fcc/trace_1_http---www.yahoo.com") == "broadband"
    assert classify_path("sabre_4glogs/x") == "other"  # "4glogs" is not the word 4g
    line = "0.0\t1.0\n1.0\t2.0\n"
    (tmp_path / "lte_city").mkdir()
    (tmp_path / "lte_city" / "a").write_text(line)
    (tmp_path / "b").write_text(line)
    scan = scan_traces(tmp_path)
    assert {t.name: t.trace_class for t in scan.traces} == {"a": "4G", "b": "other"}
    (tmp_path / "trace_classes.json").write_text(json.dumps({"b": "5G"}))
    scan = scan_traces(tmp_path)
    assert {t.name: t.trace_class for t in scan.traces} == {"a": "4G", "b": "5G"}
    (tmp_path / "trace_classes.json").write_text(json.dumps({"b": "6G"}))
    with pytest.raises(ValueError, match="unknown classes"):
        scan_traces(tmp_path)

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

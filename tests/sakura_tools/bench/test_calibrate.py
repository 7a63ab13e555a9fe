"""The CPU calibration's fit: exact recovery on noiseless points, errors reported per forward."""

import pytest

from sakura_tools.bench.calibrate import fit_cost_model


def test_fit_recovers_speed_and_overhead_and_reports_errors():
    e, o = 50e9, 2e-3
    rows = [
        {"flops": f, "layers": n, "measured_s": f / e + n * o} for f, n in [(1e9, 6), (5e9, 6), (2e10, 6), (4e9, 2)]
    ]
    flop_s, overhead = fit_cost_model(rows)
    assert flop_s == pytest.approx(e, rel=1e-6) and overhead == pytest.approx(o, rel=1e-6)
    assert all(abs(r["error"]) < 1e-6 for r in rows)
    rows[0]["measured_s"] *= 2  # a slow outlier: the cost model no longer fits, and the errors say so
    fit_cost_model(rows)
    assert max(abs(r["error"]) for r in rows) > 0.05


def test_negative_overhead_is_refitted_through_the_origin():
    rows = [{"flops": 1e9, "layers": 6, "measured_s": 0.001}, {"flops": 1e10, "layers": 6, "measured_s": 0.2}]
    _, overhead = fit_cost_model(rows)
    assert overhead == 0.0

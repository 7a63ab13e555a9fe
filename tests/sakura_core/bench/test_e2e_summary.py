"""Per-class summaries of the e2e benchmark: each trace class gets its own medians and ratios vs sakura."""

import pytest

from sakura_core.bench.e2e import summarize_by_class


def _run(trace, cls, policy, latency):
    return {"trace": trace, "trace_class": cls, "start_s": 0.0, "policy": policy, "latency_s": latency,
            "psnr_db": 40.0}  # fmt: skip


def test_summary_is_per_class_and_ratios_are_against_sakura_of_the_same_run():
    runs = [
        _run("a", "3G", "sakura", 10.0), _run("a", "3G", "on-device-cached", 10.0),
        _run("b", "5G", "sakura", 2.0), _run("b", "5G", "on-device-cached", 8.0),
        _run("c", "5G", "sakura", 4.0), _run("c", "5G", "on-device-cached", 8.0),
    ]  # fmt: skip
    out = summarize_by_class(runs)
    assert list(out) == ["3G", "5G", "all"]
    assert out["3G"]["ratios_vs_sakura"]["on-device-cached"]["median_ratio_vs_sakura"] == pytest.approx(1.0)
    assert out["5G"]["ratios_vs_sakura"]["on-device-cached"]["median_ratio_vs_sakura"] == pytest.approx(3.0)
    assert out["5G"]["traces"] == 2
    assert out["all"]["summary"]["sakura"]["median_latency_s"] == pytest.approx(4.0)  # median of 10, 2, 4

"""Per-class summaries of the e2e benchmark: each trace class gets its own medians and ratios vs sakura."""

import pytest

from sakura_tools.bench.e2e import summarize_by_class


def _run(trace, cls, policy, latency):
    return {
        "trace": trace,
        "trace_class": cls,
        "start_s": 0.0,
        "policy": policy,
        "latency_s": latency,
        "psnr_db": 40.0,
    }


def test_summary_is_per_class_and_ratios_are_against_sakura_of_the_same_run():
    runs = [
        _run("a", "3G", "sakura", 10.0),
        _run("a", "3G", "on-device-cached", 10.0),
        _run("b", "5G", "sakura", 2.0),
        _run("b", "5G", "on-device-cached", 8.0),
        _run("c", "5G", "sakura", 4.0),
        _run("c", "5G", "on-device-cached", 8.0),
    ]
    out = summarize_by_class(runs)
    assert list(out) == ["3G", "5G", "all"]
    assert out["3G"]["ratios_vs_sakura"]["on-device-cached"]["median_ratio_vs_sakura"] == pytest.approx(1.0)
    assert out["5G"]["ratios_vs_sakura"]["on-device-cached"]["median_ratio_vs_sakura"] == pytest.approx(3.0)
    assert out["5G"]["traces"] == 2
    assert out["all"]["summary"]["sakura"]["median_latency_s"] == pytest.approx(4.0)  # median of 10, 2, 4


def test_the_ceiling_is_the_fluid_bounds_speed_up_per_run_and_the_headline_prints_it():
    from sakura_tools.bench.e2e_summary import FLUID_BOUND, format_headline, headline

    runs = [
        _run("a", "4G", "sakura", 10.0),
        _run("a", "4G", "cachegen", 12.0),
        _run("a", "4G", FLUID_BOUND, 8.0),
        _run("b", "4G", "sakura", 5.0),
        _run("b", "4G", "cachegen", 9.0),
        _run("b", "4G", FLUID_BOUND, 3.0),
        _run("c", "4G", "sakura", 4.0),
        _run("c", "4G", "cachegen", 4.0),  # no bound run: no ceiling from c
    ]
    h = headline(runs)
    assert h["speedup_median"]["cachegen"] == pytest.approx(1.2)  # median of 1.2, 1.8, 1.0
    assert h["speedup_ceiling_median"]["cachegen"] == pytest.approx((12 / 8 + 9 / 3) / 2)  # 1.5 and 3.0
    assert "ceiling: the fluid bound's speed-up (no policy passes it with these bytes): cachegen 2.25x" in (
        format_headline(h)
    )

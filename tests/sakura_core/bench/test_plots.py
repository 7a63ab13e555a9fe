"""The timeline plot: a short bandwidth label in titles, and a legend for every lane colour."""

from __future__ import annotations

import pytest

from sakura_core.bench.plots import bandwidth_label, plot_timeline


def test_bandwidth_label():
    assert bandwidth_label("trace:/tmp/abs/path/to/norway_bus_1") == "trace norway_bus_1"
    assert bandwidth_label("fixed:10") == "fixed 10 Mbit/s"
    assert bandwidth_label("live") == "live"


def test_timeline_has_a_legend_for_both_greens(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the timeline plot needs matplotlib")
    import matplotlib.pyplot as plt

    seen = {}
    real_close = plt.close

    def keep(fig):  # read the legend before the figure is closed
        seen["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        seen["title"] = fig.axes[0].get_title()
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    events = [
        {"lane": "fetch", "start": 0.0, "end": 0.5},
        {"lane": "compute", "start": 0.0, "end": 0.2, "level": "template"},
        {"lane": "compute", "start": 0.5, "end": 0.9, "level": 2},
    ]
    plot_timeline(events, tmp_path / "t.png", title="sakura, trace norway_bus_1")
    assert (tmp_path / "t.png").stat().st_size > 0
    assert seen["labels"] == ["fetch", "decode", "compute (fetched KV)", "compute (template on device)", "stall"]
    assert seen["title"] == "sakura, trace norway_bus_1"

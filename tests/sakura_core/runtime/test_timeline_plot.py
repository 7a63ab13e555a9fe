"""The timeline plot: a legend for every lane colour, both greens told apart."""

from __future__ import annotations

import pytest

from sakura_core.runtime.timeline_plot import plot_timeline


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
    assert seen["labels"] == [
        "fetch",
        "decode",
        "compute (template KV injected: fetched or kept)",
        "compute (template tokens on the device)",
        "stall",
    ]
    assert seen["title"] == "sakura, trace norway_bus_1"

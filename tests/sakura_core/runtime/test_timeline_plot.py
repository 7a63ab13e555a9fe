"""The timeline plot: a legend for every lane colour, both greens told apart."""

from __future__ import annotations

from sakura_core.runtime.timeline_plot import plot_timeline


def test_timeline_has_a_legend_for_both_greens(tmp_path, monkeypatch):
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


def test_decisions_get_a_row_and_the_drops_and_fallbacks_their_reasons(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    seen = {}
    real_close = plt.close

    def keep(fig):
        ax = fig.axes[0]
        seen["rows"] = [t.get_text() for t in ax.get_yticklabels()]
        seen["labels"] = [t.get_text() for t in ax.get_legend().get_texts()]
        texts = [t.get_text() for t in ax.texts]
        seen["notes"] = [t for t in texts if t.startswith("1: ")]
        seen["numbers"] = [t for t in texts if not t.startswith("1: ")]
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    events = [{"lane": "compute", "start": 0.0, "end": 2.0, "level": "template"}]
    decisions = [{"t": 0.1 * i, "layer": i, "level": 3, "reason": f"floor {i}"} for i in range(10)]
    decisions += [
        {"t": 1.5, "layer": 4, "level": "drop", "reason": "template dropped at layer 4"},
        {"t": 1.6, "layer": 5, "level": -1, "reason": "device computes step 0 layer 5 for now"},
        {"t": 1.9, "layer": 6, "level": "device", "reason": "shards late: template pass on the device is sooner"},
    ]
    plot_timeline(events, tmp_path / "d.png", title="t", decisions=decisions)
    assert seen["rows"][-1] == "decisions"
    assert {
        "decision: fetch",
        "decision: template dropped",
        "decision: fallback",
        "decision: device computes (for now)",
    } <= set(seen["labels"])
    notes = seen["notes"][0]
    # at most 6 notes, the drop and the fallback always among them, in time order
    assert len(notes.splitlines()) == 6 and seen["numbers"] == ["1", "2", "3", "4", "5", "6"]
    assert "template dropped at layer 4" in notes and "template pass on the device is sooner" in notes
    times = [float(line.split("t=")[1].split(" s")[0]) for line in notes.splitlines()]
    assert times == sorted(times)

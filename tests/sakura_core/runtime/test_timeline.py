"""The pipeline bound from pure busy time, on scripted runs with known compute and link."""

import pytest

from sakura_core.runtime.timeline import lane_busy_s, lower_bound, merge_spans

L, C, F = 6, 0.1, 0.1  # layers, compute seconds per layer, transfer seconds per shard


def _serial_run():
    """The fetch lane asks for shard l only when compute reaches layer l: every layer stalls for its transfer.
    Compute spans run hook to hook (they include the stall, as the live pipeline records them)."""
    ev = []
    for layer in range(L):
        t = layer * (C + F)
        ev.append({"lane": "fetch", "start": t, "end": t + F, "layer": layer})
        ev.append({"lane": "stall", "start": t, "end": t + F, "layer": layer})
        ev.append({"lane": "compute", "start": t, "end": t + F + C, "layer": layer})
    return ev, L * (C + F)


def _overlapped_run():
    """Shard l + 1 streams while layer l computes: one stall (the first shard), then no waiting."""
    ev = [{"lane": "fetch", "start": i * F, "end": (i + 1) * F, "layer": i} for i in range(L)]
    ev.append({"lane": "stall", "start": 0.0, "end": F, "layer": 0})
    ev += [{"lane": "compute", "start": F + i * C, "end": F + (i + 1) * C, "layer": i} for i in range(L)]
    ev[-L]["start"] = 0.0  # the first compute span holds the first stall
    return ev, F + L * C


def test_a_run_with_stalls_is_not_reported_near_one():
    ev, latency = _serial_run()
    old = latency / max(lane_busy_s(ev, "compute"), lane_busy_s(ev, "fetch"))  # the old measure
    assert old == pytest.approx(1.0)
    b = lower_bound(ev, latency)
    assert b["compute_busy_s"] == pytest.approx(L * C) and b["fetch_busy_s"] == pytest.approx(L * F)
    assert b["stall_s"] == pytest.approx(L * F)
    assert b["latency_over_bound"] == pytest.approx(2.0)


def test_a_well_overlapped_run_is_near_its_bound():
    ev, latency = _overlapped_run()
    b = lower_bound(ev, latency)
    assert b["bound_s"] == pytest.approx(L * C)
    assert 1.0 <= b["latency_over_bound"] <= (F + L * C) / (L * C) + 1e-9  # only the first shard's wait


def test_merge_and_subtract():
    assert merge_spans([(2, 3), (0, 1), (0.5, 1.5), (4, 4)]) == [(0, 1.5), (2, 3)]
    ev = [
        {"lane": "compute", "start": 0, "end": 10},
        {"lane": "stall", "start": 2, "end": 3},
        {"lane": "stall", "start": 2.5, "end": 4},
        {"lane": "stall", "start": 9, "end": 12},
    ]
    assert lane_busy_s(ev, "compute", minus=("stall",)) == pytest.approx(10 - 2 - 1)

"""Synthetic development traces: deterministic, the shapes they promise, and a round trip through the trace reader."""

import numpy as np
import pytest

from sakura_core.cli import main
from sakura_core.fetch.synth import ON_OFF, WALKS, development_set, on_off, random_walk
from sakura_core.fetch.traces import load_traces


def test_walks_are_seeded_clipped_and_start_at_their_mean():
    a, b = random_walk(7, 20, 0.3), random_walk(7, 20, 0.3)
    assert np.array_equal(a.rates_bytes_per_s, b.rates_bytes_per_s)
    assert not np.array_equal(a.rates_bytes_per_s, random_walk(8, 20, 0.3).rates_bytes_per_s)
    mbit = a.rates_bytes_per_s * 8 / 1e6
    assert mbit.min() >= 0.2 - 1e-9 and mbit.max() <= 400 + 1e-9 and len(mbit) == 900
    steps = np.diff(np.log(mbit))
    assert 0.2 < steps.std() < 0.4  # the per-second log sigma it was asked for
    assert random_walk(1, 5, 0.0).rates_bytes_per_s == pytest.approx(5e6 / 8)  # sigma 0: constant


def test_on_off_alternates_from_high_and_has_outages():
    t = on_off(3, 60, 0, 15)
    assert t.rates_bytes_per_s[0] == 60e6 / 8 and t.rates_bytes_per_s[1] == 0.0
    assert set(t.rates_bytes_per_s[::2]) == {60e6 / 8} and set(t.rates_bytes_per_s[1::2]) == {0.0}
    assert t.durations_s.sum() >= 2000 and 5 < t.durations_s.mean() < 30
    with pytest.raises(ValueError, match="high_mbit > 0"):
        on_off(1, 0, 0, 10)


def test_cli_writes_the_development_set_and_the_reader_gets_it_back(tmp_path, capsys):
    assert main(["traces", "synth", "--out", str(tmp_path / "syn")]) == 0
    assert "wrote 25 traces" in capsys.readouterr().out
    back = {t.name: t for t in load_traces(tmp_path / "syn")}
    want = development_set()
    assert len(want) == len(WALKS) + len(ON_OFF) == len(back) == 25
    for t in want:
        got = back[t.name]
        for s in (0.5, 100.0, 600.0, 850.0):  # every segment kept its rate and duration (1 ms resolution)
            assert got.rate_at(s) == pytest.approx(t.rate_at(s), rel=1e-5, abs=1.0)


def test_slow_walks_stay_slow_revert_to_their_mean_and_have_outages():
    from sakura_core.fetch.synth import SLOW_WALKS, slow_walk

    a = slow_walk(5, 1.5, 0.3, 1, 3)
    assert np.array_equal(a.rates_bytes_per_s, slow_walk(5, 1.5, 0.3, 1, 3).rates_bytes_per_s)
    mbit = a.rates_bytes_per_s * 8 / 1e6
    live = mbit[mbit > 0]
    assert live.max() <= 8.0 + 1e-9 and live.min() >= 0.05 - 1e-9 and len(mbit) == 1200
    assert 0.7 < np.exp(np.log(live).mean()) < 3.0  # mean-reverting: the geometric mean stays near 1.5 Mbit/s
    outage_s = int((mbit == 0).sum())
    assert 60 < outage_s < 300  # ~1 a minute of ~3 s: ~60 s of outage in 20 minutes (at least 1 s each)
    assert (slow_walk(5, 1.5, 0.3, 0, 3).rates_bytes_per_s > 0).all()  # no outages asked: none
    assert len(SLOW_WALKS) == 8
    with pytest.raises(ValueError, match="outage_s > 0"):
        slow_walk(1, 1, 0.1, 1, 0)


def test_oboe_like_links_hold_stable_segments_within_their_range():
    from sakura_core.fetch.synth import oboe_like

    t = oboe_like(9, 2, 10, 5)
    mbit = t.rates_bytes_per_s * 8 / 1e6
    assert mbit.min() >= 2 - 1e-9 and mbit.max() <= 10 + 1e-9
    assert t.durations_s.min() >= 0.5 and 3 < t.durations_s.mean() < 8 and t.durations_s.sum() >= 1200
    assert len(set(mbit.round(6))) > 0.9 * len(mbit)  # every segment draws its own rate: the link jumps
    with pytest.raises(ValueError, match="low_mbit <= high_mbit"):
        oboe_like(1, 10, 2, 5)


def test_cli_writes_the_slow_set_in_class_folders_the_reader_classifies(tmp_path, capsys):
    assert main(["traces", "synth", "--set", "slow", "--out", str(tmp_path / "slow")]) == 0
    out = capsys.readouterr().out
    assert "wrote 16 traces" in out and "set slow, seed 300" in out
    got = load_traces(tmp_path / "slow")
    classes = (
        {t.trace_class for t in got if t.name.startswith("slow")},
        {t.trace_class for t in got if t.name.startswith("oboe")},
    )
    assert classes == ({"3G"}, {"broadband"}) and len(got) == 16
    assert main(["traces", "synth", "--out", str(tmp_path / "dev")]) == 0  # the default set is unchanged
    assert "wrote 25 traces" in capsys.readouterr().out

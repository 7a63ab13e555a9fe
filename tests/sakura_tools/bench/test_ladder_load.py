"""A ladder file's decode times carry the load average they were measured at, and reading one measured on a busy
machine (or one that does not say) warns: the committed ladders were once timed at load 8-15, ~1.6x slow for every
codec, which flattered sakura against the decode-bound cachegen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sakura_tools.bench.e2e_ladders import QUIET_LOAD_PER_CORE, load_note, load_or_measure_ladders
from sakura_tools.bench.geometry_ladders import LadderConfig

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "results" / "ladders" / "phone-dit-512.single.json"


def test_note_names_the_load_and_the_fix():
    quiet = QUIET_LOAD_PER_CORE * 2
    assert load_note({"load_average": [0.4, quiet], "cpu_count": 2}) is None
    busy = load_note({"load_average": [0.4, 9.2], "cpu_count": 2})
    assert busy is not None and "load average 9.2" in busy and "delete the file" in busy
    # the same load on a host with more cores is quiet
    assert load_note({"load_average": [0.4, 9.2], "cpu_count": 16}) is None
    assert "unrecorded" in load_note({"cpu_count": 2})


@pytest.mark.parametrize("loads, warned", [([0.5, 0.9], False), ([7.5, 11.0], True), (None, True)])
def test_reading_a_ladder_file_warns_when_it_was_timed_under_load(tmp_path, loads, warned):
    data = json.loads(COMMITTED.read_text())
    data["source"]["load_average"], data["source"]["cpu_count"] = loads, 2
    folder = tmp_path / "ladders"
    folder.mkdir()
    (folder / COMMITTED.name).write_text(json.dumps(data))
    said: list[str] = []

    def no_model():
        raise AssertionError("a ladder file that exists is read, not measured")

    out = load_or_measure_ladders([("phone-dit-512", "single")], str(folder), LadderConfig(), no_model, said.append)
    assert out[("phone-dit-512", "single")].geometry == "phone-dit-512"
    notes = [s for s in said if "decode times measured at" in s]
    assert bool(notes) == warned, said
    if loads:
        assert not warned or "load average 11.0" in notes[0]

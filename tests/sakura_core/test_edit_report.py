"""The report's summary never contradicts its figures (issue 44): it says what was fetched AND what of it was used,
and after a fallback what the device computed here instead of the split it planned (hand-built runs, strings
derived by hand)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sakura_core.edit_report import REPORT_KEYS, KVUse, edit_report
from sakura_core.fetch.link import LinkSpec
from sakura_core.runtime.deferral import LATE_FALLBACK_REASON
from sakura_core.runtime.lane_types import LaneResult
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import RunReport

LATE = {"t": 0.3, "layer": 0, "level": "device", "reason": LATE_FALLBACK_REASON}


RESULT_FIELDS = {f.name for f in dataclasses.fields(LaneResult)}


def _report(layers: int = 4, steps: int = 2, **run) -> dict:
    """The report of a hand-built run: ``run`` holds fields of the run's ``LaneResult`` and of the ``RunReport``."""
    result = dict(policy="sakura", latency_s=1.234, bytes_fetched=0, split_layer=layers)
    result.update((k, v) for k, v in run.items() if k in RESULT_FIELDS)
    own = {k: v for k, v in run.items() if k not in RESULT_FIELDS}
    return edit_report(
        RunReport(LaneResult(**result), image=np.zeros((2, 2, 3), np.uint8), tokens=None, **own),
        template_id="t",
        template={},
        link=LinkSpec.fixed(8),
        steps=steps,
        seed=0,
        latency_target_s=None,
        floor_level="s1",
        profile=LiveProfile(0.1, 0.05, layers, steps),
        executed_on={"kind": "local"},
    )


def test_bytes_used_sits_after_bytes_fetched_and_every_key_stays():
    assert REPORT_KEYS[REPORT_KEYS.index("bytes_fetched") + 1] == "bytes_used"
    for key in ("summary", "levels_used", "split_layer", "split_layers", "fallbacks", "peak_kv_bytes", "timeline"):
        assert key in REPORT_KEYS
    assert tuple(_report()) == REPORT_KEYS


def test_fetched_but_unused_kv_says_used_none():
    """The face-swap example: 133.6 KiB arrived, the template ran through every layer, no KV was injected."""
    r = _report(bytes_fetched=136806)
    assert r["summary"] == (
        "sakura: 1.23 s, fetched 133.6 KiB, used none: computing was faster here (every layer computed here), "
        "fixed 8 Mbit/s"
    )
    assert r["levels_used"] == "none used" and r["bytes_used"] == 0


def test_nothing_fetched():
    r = _report()
    assert r["summary"] == "sakura: 1.23 s, nothing fetched, every layer computed here, fixed 8 Mbit/s"
    assert r["levels_used"] == "none fetched"


def test_a_fallback_of_every_layer_is_not_reported_as_the_split():
    """`make demo`'s sakura row: split planned at layer 0, shards late, every layer's KV made on the device."""
    r = _report(
        bytes_fetched=136806,
        split_layer=0,
        split_layers=[0],
        decisions=[LATE],
        levels_used={layer: ["device", "device"] for layer in range(4)},
        fallbacks=["shard 0 late: the device computes the template KV of every layer until ..."],
    )
    assert r["summary"] == (
        "sakura: 1.23 s, fetched 133.6 KiB, used none, planned split at layer 0 of 4; fell back: every layer "
        "computed here (shards late: template pass on the device is sooner), fixed 8 Mbit/s"
    )
    assert r["split_layer"] == 0 and r["bytes_used"] == 0  # the figures are kept as they are


def test_a_fallback_that_stopped_early_names_both_parts():
    r = _report(
        bytes_fetched=4096,
        bytes_used=2048,
        split_layer=0,
        split_layers=[0],
        decisions=[LATE, LATE],
        levels_used={0: ["device"] * 2, 1: ["device"] * 2, 2: ["s1", "s3"], 3: ["s1"] * 2},
    )
    assert r["summary"] == (
        "sakura: 1.23 s, fetched 4.0 KiB, used 2.0 KiB (layers 2-3), planned split at layer 0 of 4; fell back: "
        "layers 0-1 computed here (shards late: template pass on the device is sooner), fixed 8 Mbit/s"
    )


def test_a_fallback_below_layers_computed_before_the_split_is_every_layer():
    r = _report(
        bytes_fetched=4096,
        split_layer=2,
        split_layers=[2],
        decisions=[LATE],
        levels_used={2: ["device"] * 2, 3: ["device"] * 2},
    )
    assert "used none, planned split at layer 2 of 4; fell back: every layer computed here (" in r["summary"]


def test_per_step_counts_shards():
    why = "shard 2 not ready after 120 s"
    r = _report(
        layers=2,
        bytes_fetched=3072,
        bytes_used=2048,
        split_layer=1,
        split_layers=[1, 0],
        kv_mode="per-step",
        layers_per_step=2,
        decisions=[{"t": 1.0, "layer": 2, "level": "device", "reason": why}],
        levels_used={0: ["template"], 1: ["s1"], 2: ["device"], 3: ["s1+cl"]},
    )
    assert r["summary"] == (
        "sakura: 1.23 s, fetched 3.0 KiB, used 2.0 KiB (2 of 4 shards), planned splits per step [1, 0] of 2; fell "
        "back: 1 of 4 shards computed here (shard 2 not ready after 120 s), fixed 8 Mbit/s"
    )
    assert r["levels_used"] == {"step 0": ["template", "s1"], "step 1": ["device", "s1+cl"]}
    # the template tokens below step 0's split and the fallback's shards are every shard: said so
    r = _report(
        layers=2,
        bytes_fetched=3072,
        split_layer=1,
        split_layers=[1, 0],
        kv_mode="per-step",
        layers_per_step=2,
        decisions=[{"t": 1.0, "layer": 1, "level": "device", "reason": why}],
        levels_used={0: ["template"], 1: ["device"], 2: ["device"], 3: ["device"]},
    )
    assert (
        "used none, planned splits per step [1, 0] of 2; fell back: every layer computed here (shard 2" in r["summary"]
    )
    use = KVUse(4096, 4096, layers=2, split_layer=0, split_layers=(0, 0), fetched=(0, 1, 2, 3))
    assert use.describe() == "fetched 4.0 KiB, used 4.0 KiB (every layer of every step), splits per step [0, 0] of 2"


@pytest.mark.parametrize(
    ("fetched", "phrase"),
    [
        ((5,), "layer 5"),
        ((0, 1, 3), "layers 0-1, 3"),
        ((1, 2, 3, 4, 5), "layers 1-5"),
        (tuple(range(6)), "every layer"),
    ],
)
def test_the_layers_used_are_named(fetched, phrase):
    use = KVUse(bytes_fetched=10240, bytes_used=8192, layers=6, split_layer=min(fetched), fetched=fetched)
    assert use.fetch_clause() == f"fetched 10.0 KiB, used 8.0 KiB ({phrase})"

"""`sakura demo`'s served part says what each run did (issue 44): a sakura run that planned its split at layer 0 and
fell back to computing every layer here (its image then equals the exact edit) is not printed as "split 0". The
server's edits are stood in for by that run (the live pipeline producing it is tested in
``tests/sakura_core/runtime/test_pipeline_bytes_used.py``); publishing is skipped."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from sakura_core import cli_demo
from sakura_core.demo import served
from sakura_core.edit import EditOutcome
from sakura_core.edit_report import edit_report
from sakura_core.runtime.deferral import LATE_FALLBACK_REASON
from sakura_core.runtime.lane_types import LaneResult
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import RunReport

STEPS = 2
FETCHED = 136806  # bytes: 133.6 KiB arrived, too late to be used


def _fell_back(request, layers: int, size: int) -> EditOutcome:
    """A run whose split was planned at layer 0 (every step's, per-step) and whose shards were all late: the device
    computed every layer's template KV (as ``PipelinedEdit`` reports it)."""
    per_step = request.template_id.endswith("per-step")
    shards = STEPS * layers if per_step else layers
    uses = 1 if per_step else STEPS
    result = LaneResult(
        policy=request.settings.policy,
        latency_s=0.42,
        bytes_fetched=FETCHED,
        split_layer=0,
        split_layers=[0] * (STEPS if per_step else 1),
        events=[
            {"lane": "compute", "start": 0.0, "end": 0.4, "layer": -1, "level": "fallback template pass from layer 0"},
            {"lane": "fetch", "start": 0.0, "end": 0.42, "layer": 0, "level": "fp16"},
        ],
        decisions=[
            {"t": 0.0, "layer": 0, "level": "drop", "reason": "template dropped at layer 0"},
            {"t": 0.01, "layer": 0, "level": "device", "reason": LATE_FALLBACK_REASON},
        ],
    )
    run = RunReport(
        result,
        image=np.zeros((size, size, 3), np.uint8),
        tokens=None,
        fallbacks=["shard 0 late: the device computes the template KV of every layer until the link has the rest"],
        levels_used={g: ["device"] * uses for g in range(shards)},
        kv_mode="per-step" if per_step else "single",
        layers_per_step=layers,
    )
    report = edit_report(
        run,
        template_id=request.template_id,
        template={},
        link=request.settings.link,
        steps=STEPS,
        seed=0,
        latency_target_s=None,
        floor_level="fp16",
        profile=LiveProfile(0.01, 0.005, layers, STEPS),
        executed_on={"kind": "local"},
    )
    return EditOutcome(run.image, report, run)


@pytest.fixture
def fallback_edits(monkeypatch):
    import cloud_server.precompute

    monkeypatch.setattr(cloud_server.precompute, "publish_template", lambda *args, **kwargs: None)

    async def edit_from_server(model, request, user, *, profile):
        return _fell_back(request, model.adapter.num_layers, model.spec.image_size)

    monkeypatch.setattr(served, "edit_from_server", edit_from_server)


def test_the_served_table_says_a_fallback_computed_every_layer(fallback_edits, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli_demo.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path), "--steps", str(STEPS)])
    assert cli_demo.run(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    L = report["model"]["layers"]
    ran = f"planned split at layer 0 of {L}; fell back: every layer computed here ({LATE_FALLBACK_REASON})"
    ran_per_step = (
        f"planned splits per step {[0] * STEPS} of {L}; fell back: every layer computed here ({LATE_FALLBACK_REASON})"
    )
    lines = printed.splitlines()
    # the progress line of each edit, and the table's row
    sakura = [line for line in lines if line.startswith("phone: single   sakura ")]
    assert len(sakura) == 1 and sakura[0].endswith(f"133.6 KiB fetched       0.0 KiB used  {ran}")
    row = [line for line in lines if line.startswith("single    sakura ")]
    assert len(row) == 1 and row[0].endswith(f"  {ran}") and " 133.6 " in row[0]
    row = [line for line in lines if line.startswith("per-step  sakura ")]
    assert len(row) == 1 and row[0].endswith(f"  {ran_per_step}")
    assert not any(line.endswith("split 0") for line in lines)
    runs = {(r["kv_mode"], r["policy"]): r for r in report["served"]["runs"]}
    single = runs["single", "sakura"]
    assert single["ran"] == ran and single["bytes_fetched"] == FETCHED and single["bytes_used"] == 0
    assert single["summary"].startswith(f"sakura: 0.42 s, fetched 133.6 KiB, used none, {ran}, trace norway_bus_1")
    assert runs["per-step", "sakura"]["ran"] == ran_per_step

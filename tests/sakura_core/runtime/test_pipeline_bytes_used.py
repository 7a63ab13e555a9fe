"""What a live run fetched vs what it used (issue 44): ``RunReport.bytes_used`` counts the blobs whose KV the compute
lane injected, never the shards it fetched and then computed here, and the report's summary says both — a run that
fetched KV and kept the template on the device says "used none", and a run that fell back after its split says what
it computed here instead of only where it planned to split."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sakura_core.edit_report import edit_report
from sakura_core.fetch.link import LinkSpec
from sakura_core.policy.plan import FetchPlan
from sakura_core.policy.policies import Decision, Policy
from sakura_core.runtime.deferral import LATE_FALLBACK_REASON
from sakura_core.runtime.lane_parts import EditInputs, RunControls
from sakura_core.runtime.pipeline import LiveSettings, PipelinedEdit, RuntimeConfig

from .fp16_setup import fp16_only_setup

STEPS = 2


@pytest.fixture(scope="module")
def setup(demo_model, demo_template):
    base = fp16_only_setup(demo_model, demo_template, STEPS)
    fp16_bytes = [lad[0].rep.nbytes for lad in base[4]]  # per layer: the one blob of its fp16 representation
    return (*base, fp16_bytes)


class _FetchAllDropAt(Policy):
    """Fetches every shard at fp16; keeps the template tokens on the device below ``drop_at`` (all of them when
    ``drop_at`` is the layer count: the shards fetched are never used)."""

    name, family = "fetch-all", "fp16"

    def __init__(self, drop_at: int) -> None:
        self.drop_at = drop_at

    def choose(self, ctx, g):
        return Decision(0, "fp16")

    def keep_template(self, ctx, g):
        return g < self.drop_at


class _LateFromTheStart(_FetchAllDropAt):
    """Drops the template at layer 0; when a shard is late, the device is sooner (every shard is)."""

    def __init__(self) -> None:
        super().__init__(0)

    def recompute_late(self, ctx, g):
        return True


def _report(run, profile):
    return edit_report(
        run,
        template_id="tpl",
        template={},
        link=LinkSpec.fixed(50),
        steps=STEPS,
        seed=0,
        latency_target_s=None,
        floor_level="fp16",
        profile=profile,
        executed_on={"kind": "local"},
    )


def _run_after_every_fetch(setup, policy):
    """Run ``policy`` with the compute lane held before its first layer until the link has delivered every shard:
    what is fetched does not depend on how fast this machine computes."""
    model, tpl, usr, pre, rungs, profile, _ = setup
    L = model.adapter.num_layers
    delivered, all_here = [], threading.Event()

    async def fetch_blob(digest, nbytes):
        delivered.append(digest)
        if len(delivered) == L:
            all_here.set()
        return pre.blobs[digest]

    def on_layer(step, layer):
        if (step, layer) == (0, 0):
            assert all_here.wait(60), "the link did not deliver every shard"

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(policy, rungs, 0),
        profile,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
        controls=RunControls(on_layer=on_layer),
    )
    return asyncio.run(edit.run())


def test_kv_fetched_and_never_used_is_fetched_not_used(setup):
    """The face-swap example on a fast CPU: the link brought KV, the template ran through every layer."""
    fp16_bytes, profile = setup[6], setup[5]
    L = len(fp16_bytes)
    run = _run_after_every_fetch(setup, _FetchAllDropAt(L))
    assert run.result.bytes_fetched == sum(fp16_bytes) and run.bytes_used == 0 and run.result.split_layer == L
    report = _report(run, profile)
    kib = sum(fp16_bytes) / 1024
    assert report["summary"] == (
        f"fetch-all: {run.result.latency_s:.2f} s, fetched {kib:.1f} KiB, used none: computing was faster here (every "
        "layer computed here), fixed 50 Mbit/s"
    )
    assert report["bytes_fetched"] == sum(fp16_bytes) and report["bytes_used"] == 0
    assert report["levels_used"] == "none used"  # not "none fetched": every shard was


def test_shards_fetched_below_the_split_are_not_counted_as_used(setup):
    fp16_bytes, profile = setup[6], setup[5]
    L = len(fp16_bytes)
    run = _run_after_every_fetch(setup, _FetchAllDropAt(3))
    assert run.result.split_layer == 3 and sorted(run.levels_used) == list(range(3, L))
    assert run.result.bytes_fetched == sum(fp16_bytes) and run.bytes_used == sum(fp16_bytes[3:])
    report = _report(run, profile)
    assert L > 4 and report["summary"] == (
        f"fetch-all: {run.result.latency_s:.2f} s, fetched {sum(fp16_bytes) / 1024:.1f} KiB, used "
        f"{sum(fp16_bytes[3:]) / 1024:.1f} KiB (layers 3-{L - 1}), split at layer 3 of {L}, fixed 50 Mbit/s"
    )


def test_a_fallback_after_the_split_is_what_the_summary_says(setup):
    """`make demo`'s sakura row: the split was planned at layer 0, the shards were late and the device computed
    every layer — the summary says so, not only "split at layer 0"."""
    model, tpl, usr, pre, rungs, profile, _ = setup
    L = model.adapter.num_layers

    async def never(digest, nbytes):  # the link delivers nothing before the edit is over
        await asyncio.Event().wait()

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        never,
        FetchPlan(_LateFromTheStart(), rungs, 0),
        profile,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
    )
    run = asyncio.run(edit.run())
    assert run.result.split_layer == 0 and run.levels_used == {layer: ["device"] * STEPS for layer in range(L)}
    assert run.result.bytes_fetched == 0 and run.bytes_used == 0
    report = _report(run, profile)
    assert report["summary"] == (
        f"fetch-all: {run.result.latency_s:.2f} s, nothing fetched, planned split at layer 0 of {L}; fell back: every "
        f"layer computed here ({LATE_FALLBACK_REASON}), fixed 50 Mbit/s"
    )

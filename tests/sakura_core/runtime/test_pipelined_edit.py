"""PipelinedEdit as an object: reset() gives a fresh run, no lane's state leaks from one run into the next, and
nothing a run started outlives it."""

import asyncio
import threading

import pytest
import torch

from sakura_core.fetch.shaper import ShaperConfig, TraceShaper
from sakura_core.fetch.traces import Trace
from sakura_core.policy.plan import FetchPlan
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy, make_policy
from sakura_core.runtime.lane_parts import EditInputs
from sakura_core.runtime.pipeline import LiveSettings, PipelinedEdit, RuntimeConfig

from .fp16_setup import fp16_only_setup

STEPS = 2
MBIT = 50.0


@pytest.fixture(scope="module")
def setup(demo_model, demo_template):
    return fp16_only_setup(demo_model, demo_template, STEPS)


def _edit(setup, corrupt_once=()):
    """A fetch-fp16 edit (deterministic decisions) over a fixed 50 Mbit/s link; ``corrupt_once`` digests arrive
    corrupted the first time they are fetched."""
    model, tpl, usr, pre, rungs, profile = setup
    shaper = TraceShaper(Trace.constant(MBIT), ShaperConfig(rtt_s=0.0))
    pending = set(corrupt_once)

    async def fetch_blob(digest, nbytes):
        blob = pre.blobs[digest]
        await shaper.throttle(len(blob))
        if digest in pending:
            pending.discard(digest)
            return blob[:-10] + b"\x00" * 10
        return blob

    return PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(make_policy("fetch-fp16"), rungs, 0),
        profile,
        trace=Trace.constant(MBIT),
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
    )


def _summary(rep):
    """Everything in a report that does not depend on wall-clock timing (stalls and times do)."""
    return {
        "policy": rep.result.policy,
        "bytes": rep.result.bytes_fetched,
        "split": rep.result.split_layer,
        # the fetch and compute lanes log from their own threads: their interleaving is timing, not behaviour
        "decisions": sorted((d["layer"], str(d["level"]), d["reason"]) for d in rep.result.decisions),
        "events": sorted((e["lane"], e["layer"], e["level"]) for e in rep.result.events if e["lane"] != "stall"),
        "fallbacks": list(rep.fallbacks),
        "levels_used": {k: list(v) for k, v in rep.levels_used.items()},
    }


def test_two_runs_of_one_instance_equal_two_fresh_instances(setup):
    edit = _edit(setup)
    a1 = asyncio.run(edit.run())
    a2 = asyncio.run(edit.run())
    b1 = asyncio.run(_edit(setup).run())
    b2 = asyncio.run(_edit(setup).run())
    L = setup[0].adapter.num_layers
    assert a1.result.bytes_fetched > 0 and a1.result.split_layer == 0 and len(a1.levels_used) == L
    for rep in (a2, b1, b2):
        assert _summary(rep) == _summary(a1)
        assert torch.equal(rep.tokens, a1.tokens)
        assert (rep.image == a1.image).all()


def test_reset_clears_every_lane(setup):
    edit = _edit(setup)
    first = asyncio.run(edit.run())
    held, decoders = edit.held, edit.decoder.decoders
    assert held.kv and decoders and held.kv_bytes > 0 and all(ev.is_set() for ev in held.ready.values())
    edit.reset()
    assert not (edit.log.events or edit.log.decisions or edit.log.fallbacks or edit.compute.levels_used)
    assert not (
        held.kv or edit.decoder.decoders or held.failed or held.device_kv or held.kv_bytes or held.peak_kv_bytes
    )
    assert not any(ev.is_set() for ev in held.ready.values())
    L = setup[0].adapter.num_layers
    assert edit.fetch.bytes_fetched == 0 and edit.compute.split_layer == L and edit.compute.span_key is None
    assert edit.st.next_layer == 0 and not edit.st.got and not edit.st.base_done and edit.st.template_alive
    assert first.result.events and first.result.decisions  # the report keeps its own lists


def test_a_failed_shard_does_not_leak_into_the_next_run(setup):
    pre = setup[3]
    fp16 = next(r["digest"] for r in pre.manifest["shards"][2]["representations"] if r["name"] == "fp16")
    edit = _edit(setup, corrupt_once={fp16})
    first = asyncio.run(edit.run())
    first_summary = _summary(first)
    assert any("shard 2" in f for f in first.fallbacks) and first.levels_used[2][0] == "device"
    assert any(e["level"].startswith("fallback template pass") for e in first.result.events)

    second = asyncio.run(edit.run())  # the link now delivers shard 2 intact: the run must fetch and use it
    assert not second.fallbacks and not edit.held.failed and not edit.held.device_kv
    assert set(second.levels_used[2]) == {"fp16"}
    assert not any(e["level"].startswith("fallback template pass") for e in second.result.events)
    # every blob fetched again, none served from run 1 (run 1 may have fetched less: a shard its fallback pass made
    # before the fetch lane reached it is not fetched; when it is, timing decides)
    assert second.result.bytes_fetched >= first.result.bytes_fetched
    assert _summary(first) == first_summary  # run 2 appended nothing to run 1's report
    assert _summary(second) == _summary(asyncio.run(_edit(setup).run()))


class _SkipTwo(Policy):
    """Shard 2 left to the device (no defer) although the template is dropped at layer 0: the compute lane asks
    for it; the policy gives up waiting one poll into the wait (asked at its start, then the asked-for fetch is on
    its way), the device being sooner."""

    name, family = "skip-two", "fp16"

    def __init__(self):
        self.late_asks = 0

    def choose(self, ctx, g):
        return Decision(LEVEL_COMPUTE, "the device computes it") if g == 2 else Decision(0, "fp16")

    def keep_template(self, ctx, g):
        return False

    def recompute_late(self, ctx, g):
        self.late_asks += 1
        return self.late_asks > 1


async def test_a_fetch_the_compute_lane_asked_for_ends_with_the_run(setup):
    """The compute lane asks for shard 2 (the fetch lane skipped it), then gives up on it: that fetch is the run's
    and ends with it — it used to go on after run() returned and append a fallback to the returned report."""
    model, tpl, usr, pre, rungs, profile = setup
    two = {r["digest"] for r in pre.manifest["shards"][2]["representations"]}
    release, seen = asyncio.Event(), {}

    async def fetch_blob(digest, nbytes):
        if digest in two:
            seen["asked"] = True
            try:
                await release.wait()
            except asyncio.CancelledError:
                seen["cancelled"] = True
                raise
        return pre.blobs[digest]

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(_SkipTwo(), rungs, 0),
        profile,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
    )
    rep = await edit.run()
    fallbacks = list(rep.fallbacks)
    release.set()
    for _ in range(20):  # let a fetch that outlived the run finish (it would decode in a pool shut down)
        await asyncio.sleep(0.01)
    assert seen == {"asked": True, "cancelled": True}
    assert rep.fallbacks == fallbacks and rep.levels_used[2] == ["device"] * STEPS


async def test_cancelling_the_run_stops_its_compute_thread(setup):
    """A run cancelled as a task (the agent shutting down) stops its compute thread too, instead of leaving it to
    wait ``shard_wait_s`` for a shard no one fetches any more and then run the rest of the edit."""
    model, tpl, usr, pre, rungs, profile = setup
    waiting = asyncio.Event()
    threads = []
    loop = asyncio.get_running_loop()

    class Patient(type(make_policy("fetch-fp16"))):
        def recompute_late(self, ctx, g):
            threads.append(threading.current_thread())
            loop.call_soon_threadsafe(waiting.set)
            return False

    async def never(digest, nbytes):
        await asyncio.Event().wait()

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        never,
        FetchPlan(Patient(), rungs, 0),
        profile,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS, shard_wait_s=600)),
    )
    task = asyncio.create_task(edit.run())
    await asyncio.wait_for(waiting.wait(), 60)  # the compute lane waits for shard 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    compute = threads[0]
    await asyncio.to_thread(compute.join, 30)  # the shard wait is 600 s: only the stop ends the thread sooner
    assert not compute.is_alive() and compute.name.startswith("sakura-compute")


def test_a_live_link_without_a_trace_is_not_given_a_made_up_one(setup):
    # the real link (no trace): the policy must see no trace, and a rate-reading rule the estimator's rate, not a
    # constant stand-in link
    model, tpl, usr, pre, rungs, profile = setup

    async def fetch_blob(digest, nbytes):
        return pre.blobs[digest]

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(make_policy("cachegen"), rungs, 0),
        profile,
        trace=None,
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
    )
    assert not edit.ctx.has_trace
    edit.st.estimator.observe(1e6, 0.5)  # one sample: 2e6 B/s
    assert edit.ctx.link_rate_now() == pytest.approx(edit.st.estimator.harmonic())
    assert edit.ctx.link_rate_now() < 1e7

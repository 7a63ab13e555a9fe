"""The pipelined runtime: overlapped lanes, adaptive split, fallbacks that never return a wrong image."""

import asyncio
import threading
import time

import pytest

from sakura_core.fetch.shaper import ShaperConfig, TraceShaper
from sakura_core.fetch.traces import Trace
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.policy.ladder import levels_of, rungs_from_manifest
from sakura_core.policy.plan import FetchPlan
from sakura_core.policy.policies import make_policy
from sakura_core.precompute import precompute_template
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.lane_parts import EditInputs, RunControls
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import Cancelled, LiveSettings, PipelinedEdit, RuntimeConfig, run_pipelined_edit

STEPS = 3


@pytest.fixture(scope="module")
def setup():
    model = load_demo_model(weights=None)
    size = model.spec.image_size
    tpl, usr = load_image("astronaut", size), load_image("chelsea", size)
    pre = precompute_template(model, tpl, "tpl", held_out_probes=1)
    kv = model.adapter.extract_template_kv(model.template_tokens(tpl), model.spec.grid)
    exact = run_edit(model, usr, "p", steps=STEPS, kv_source=kv).tokens
    L = model.adapter.num_layers
    # slow device on purpose (seconds per layer as the policies see it) so fetching pays
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=L, steps=STEPS)
    return model, tpl, usr, pre, exact, profile


def _run(setup, policy, mbit=50.0, corrupt=None, cancel=None, fp16_only=False, on_layer=None, log=None):
    model, tpl, usr, pre, exact, profile = setup
    rungs = rungs_from_manifest(pre.manifest, 6e8)
    if fp16_only:
        idx = [r.level.name for r in rungs[0]].index("fp16")
        rungs = [[lad[idx]] for lad in rungs]
    shaper = TraceShaper(Trace.constant(mbit), ShaperConfig(rtt_s=0.0))

    async def fetch_blob(digest, nbytes):
        blob = pre.blobs[digest]
        await shaper.throttle(len(blob))
        if log is not None:
            log.append(digest)
        if corrupt is not None and digest in corrupt:
            return blob[:-10] + b"\x00" * 10
        return blob

    return asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            pre.manifest,
            fetch_blob,
            FetchPlan(make_policy(policy), rungs, 0),
            profile,
            trace=Trace.constant(mbit),
            config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
            controls=RunControls(cancel=cancel, on_layer=on_layer),
        )
    )


def test_ladder_decode_cost_follows_the_decoded_size_not_the_wire_size(setup):
    model, *_ = setup
    pre = setup[3]
    ladders = levels_of(rungs_from_manifest(pre.manifest, 1e8))
    a = model.adapter
    fp16 = 2 * model.spec.num_tokens * a.num_heads * a.head_dim * 2  # one layer's K and V in fp16
    assert {lv.decode_s for lv in ladders[0]} == {fp16 / 1e8}


def test_fetch_fp16_pipeline_reproduces_the_exact_edit(setup):
    rep = _run(setup, "fetch-fp16", fp16_only=True)
    exact = setup[4]
    assert (rep.tokens - exact).abs().max() < 2e-3  # fp16 storage of the KV only
    assert rep.result.split_layer == 0 and rep.result.bytes_fetched > 0
    lanes = {e["lane"] for e in rep.result.events}
    assert {"fetch", "decode", "compute"} <= lanes
    assert all(e["end"] >= e["start"] for e in rep.result.events)


def test_on_device_cached_fetches_nothing_and_is_exact(setup):
    rep = _run(setup, "on-device-cached")
    assert rep.result.bytes_fetched == 0 and rep.result.split_layer == setup[0].adapter.num_layers
    assert (rep.tokens - setup[4]).abs().max() <= 1e-5


def test_sakura_fetches_splits_and_meets_the_levels_measured_psnr(setup):
    from sakura_core.metrics import psnr_from_mse

    rep = _run(setup, "sakura", mbit=20.0)
    L = setup[0].adapter.num_layers
    # the device as the policy sees it is slow (0.1-0.2 s a layer) and a shard is ~10 KB at 20 Mbit/s: fetch pays
    assert rep.result.bytes_fetched > 0 and rep.result.split_layer < L
    assert any(isinstance(d["level"], int) and d["level"] >= 0 for d in rep.result.decisions)
    assert rep.result.decisions and all(d["reason"] for d in rep.result.decisions)
    assert not rep.fallbacks
    # the edit is at least as good as every layer at the worst level it used (that level's measured PSNR)
    psnr = {r["name"]: r["psnr_db"] for r in setup[3].manifest["shards"][0]["representations"]}
    used = {name for names in rep.levels_used.values() for name in names if name != "device"}
    assert used
    got = psnr_from_mse(float(((rep.tokens - setup[4]) ** 2).mean()))
    assert got >= min(psnr[n] for n in used) - 1.0


def test_corrupt_shard_falls_back_and_is_reported(setup):
    pre = setup[3]
    fp16_digest = next(r["digest"] for r in pre.manifest["shards"][2]["representations"] if r["name"] == "fp16")
    rep = _run(setup, "fetch-fp16", fp16_only=True, corrupt={fp16_digest})
    assert any("shard 2" in f for f in rep.fallbacks)
    assert (rep.tokens - setup[4]).abs().max() < 2e-3  # the device computed layer 2 instead: still right


def test_cancel_stops_between_layers(setup):
    ev = threading.Event()
    ev.set()
    with pytest.raises(Cancelled, match="cancelled at step 0"):
        _run(setup, "on-device-cached", cancel=ev)


async def _until(event: threading.Event, real_limit_s: float = 120.0) -> None:
    """On the event loop: wait until ``event`` is set (a bound on real time, so a broken run fails, not hangs)."""
    for _ in range(int(real_limit_s / 0.005)):
        if event.is_set():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"not set within {real_limit_s} s")


def test_upgrades_refine_shards_during_later_steps(setup, manual_clock):
    """Idle link time during later steps upgrades the shards fetched at low levels, and later steps use them. On
    the test's clock (a blob takes its size at 30 Mbit/s of it), with the order made explicit instead of left to
    the machine's speed: step 0 starts once the base fetches are done, the fetches after them (the upgrades) go
    out once step 0 is over, and step 1 starts once the policy wants no more."""
    model, tpl, usr, pre, exact, _ = setup
    L = model.adapter.num_layers
    slow = LiveProfile(layer_full_s=0.4, layer_cached_s=0.2, layers=L, steps=STEPS)  # device slow: fetching pays
    rungs = rungs_from_manifest(pre.manifest, 6e8)
    step0_over, no_more = threading.Event(), threading.Event()
    log, edit = [], None

    class Watched(type(make_policy("sakura"))):
        def upgrade(self, ctx):
            up = super().upgrade(ctx)
            if up is None:
                no_more.set()
            return up

    async def fetch_blob(digest, nbytes):
        if edit.st.base_done:  # an upgrade
            await _until(step0_over)
        blob = pre.blobs[digest]
        manual_clock.advance(len(blob) * 8 / 30e6)
        log.append(digest)
        return blob

    def hook(step, layer):
        if (step, layer) == (0, 0):
            for _ in range(12000):  # at most 60 s of real time
                if edit.st.base_done:
                    break
                time.sleep(0.005)
        elif (step, layer) == (1, 0):
            step0_over.set()
            no_more.wait(60)

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(Watched(), rungs, 0),
        slow,
        trace=Trace.constant(30.0),
        config=RuntimeConfig(live=LiveSettings(steps=STEPS)),
        controls=RunControls(on_layer=hook, clock=manual_clock),
    )
    rep = asyncio.run(edit.run())
    ups = [d for d in rep.result.decisions if d["reason"] == "upgrade"]
    assert ups and not rep.fallbacks and no_more.is_set()
    # an upgrade fetches only its new blobs: the shard's decoder holds the chain before them (no blob twice)
    assert len(log) == len(set(log)) and sum(len(pre.blobs[d]) for d in log) == rep.result.bytes_fetched
    names = [r.level.name for r in rungs[0]]
    upgraded = {d["layer"] for d in ups}
    # every upgraded layer that was fetched was used at a higher level in the later steps than at step 0
    # (incremental chain decode), and none at a lower one
    used = {g: rep.levels_used[g] for g in upgraded if "device" not in rep.levels_used.get(g, ["device"])}
    assert used and all(names.index(lv[-1]) > names.index(lv[0]) for lv in used.values())

"""The pipelined runtime in per-step KV mode: shards g = step * L + layer, a split per step, step s's own KV (or
the device's template pass at step s's time) at every step, and schedule checks."""

import asyncio
import inspect
import threading

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.kv import ScheduleMismatchError, decode_template
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.policy.ladder import Level, rungs_from_manifest
from sakura_core.policy.plan import FetchPlan, plan_fetch
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy, make_policy
from sakura_core.precompute import precompute_template
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.lane_parts import EditInputs, RunControls
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import LiveSettings, PipelinedEdit, RuntimeConfig, run_pipelined_edit
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.simulate import kv_mode_view, simulate

from .fetchers import blob_fetcher

STEPS = 3


@pytest.fixture(scope="module")
def setup():
    model = load_demo_model(weights=None)
    size = model.spec.image_size
    tpl, usr = load_image("astronaut", size), load_image("chelsea", size)
    pre = precompute_template(model, tpl, "tpl-ps", held_out_probes=1, psnr_steps=1, kv_mode="per-step", steps=STEPS)
    L = model.adapter.num_layers
    on_device = run_edit(
        model, usr, "p", steps=STEPS, split_layer=L, template_image=tpl, template_every_step=True, kv_mode="per-step"
    )
    fp16 = decode_template(pre.manifest, pre.blobs, "fp16")  # the exact KV as stored (fp16)
    fp16_edit = run_edit(model, usr, "p", steps=STEPS, kv_source=fp16, kv_mode="per-step")
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=L, steps=STEPS)
    return model, tpl, usr, pre, on_device, fp16_edit, profile


class _SplitAt(Policy):
    """Fetch every shard at the floor; keep the template for layers < k_s at step s."""

    name = "split-at"
    family = "fp16"

    def __init__(self, splits):
        self.splits = splits

    def choose(self, ctx, g):
        if ctx.layer_of(g) < self.splits[ctx.step_of(g)]:
            return Decision(LEVEL_COMPUTE, "the device computes it")
        return Decision(0, "fp16")

    def keep_template(self, ctx, g):
        return ctx.layer_of(g) < self.splits[ctx.step_of(g)]


def _run(setup, policy, corrupt=(), steps=STEPS, plan_policy="fetch-fp16"):
    model, tpl, usr, pre, *_, profile = setup
    plan = plan_fetch(pre.manifest, plan_policy)

    async def fetch_blob(digest, nbytes):
        blob = pre.blobs[digest]
        return blob[:-10] + b"\x00" * 10 if digest in corrupt else blob

    return asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            pre.manifest,
            fetch_blob,
            FetchPlan(policy, plan.rungs, plan.floor),
            profile,
            trace=Trace.constant(50.0),
            config=RuntimeConfig(live=LiveSettings(steps=steps)),
        )
    )


def test_per_step_ladders_are_steps_times_layers_in_execution_order(setup):
    model, _, _, pre, *_ = setup
    L = model.adapter.num_layers
    rungs = rungs_from_manifest(pre.manifest, 6e8)
    assert len(rungs) == STEPS * L
    by_digest = {
        r["digest"]: (sh["step"], sh["layers"][0]) for sh in pre.manifest["shards"] for r in sh["representations"]
    }
    assert [by_digest[lad[0].rep.digest] for lad in rungs] == [(s, i) for s in range(STEPS) for i in range(L)]


def test_fetch_fp16_per_step_equals_the_on_device_per_step_edit(setup):
    *_, on_device, fp16_edit, _ = setup
    rep = _run(setup, make_policy("fetch-fp16"))
    L = setup[0].adapter.num_layers
    assert rep.kv_mode == "per-step" and rep.result.split_layers == [0] * STEPS and not rep.fallbacks
    assert (rep.tokens - fp16_edit.tokens).abs().max() <= 1e-5  # the stored fp16 KV of every step, exactly
    assert (rep.tokens - on_device.tokens).abs().max() < 2e-3  # fp16 storage of the KV only
    assert sorted(rep.levels_used) == list(range(STEPS * L))
    assert rep.levels_by_step()["step 2"] == ["fp16"] * L


def test_on_device_policy_runs_the_template_at_every_step_at_its_time(setup):
    rep = _run(setup, make_policy("on-device"))
    assert rep.result.bytes_fetched == 0 and (rep.tokens - setup[4].tokens).abs().max() <= 1e-5


def test_hybrid_split_is_decided_per_step(setup):
    L = setup[0].adapter.num_layers
    splits = [L, 1, 0][:STEPS]
    rep = _run(setup, _SplitAt(splits))
    assert rep.result.split_layers == splits and not rep.fallbacks
    assert (rep.tokens - setup[4].tokens).abs().max() < 2e-3
    by_step = rep.levels_by_step()
    assert by_step["step 0"] == ["template"] * L
    assert by_step["step 1"] == ["template"] + ["fp16"] * (L - 1)
    # step 0 computed everything: none of its shards crossed the link
    fetched = {e["layer"] for e in rep.result.events if e["lane"] == "fetch"}
    assert fetched == set(range(L + 1, STEPS * L))


def test_corrupt_per_step_shard_falls_back_to_that_steps_template_kv(setup):
    model, _, _, pre, on_device, _, _ = setup
    L = model.adapter.num_layers
    bad = next(sh for sh in pre.manifest["shards"] if sh["step"] == 1 and sh["layers"][0] == 1)
    digest = next(r["digest"] for r in bad["representations"] if r["name"] == "fp16")
    rep = _run(setup, make_policy("fetch-fp16"), corrupt={digest})
    assert any(f"shard {L + 1}" in f for f in rep.fallbacks)
    assert rep.levels_by_step()["step 1"][1] == "device"
    assert any(e["level"] == "fallback template pass from layer 0 (step 1)" for e in rep.result.events)
    assert (rep.tokens - on_device.tokens).abs().max() < 2e-3  # step 1's own KV computed here: still right


def test_a_step_count_the_template_was_not_computed_for_is_refused(setup):
    with pytest.raises(ScheduleMismatchError, match="precomputed for 3 steps .*asks 4 — set steps to 3 .*--steps 4"):
        _run(setup, make_policy("fetch-fp16"), steps=4)


class _Defer(Policy):
    """Fetch every shard at the floor except ``target``: "not now" (deferred) on its first ``no`` asks, then the
    floor (``no=None``: deferred for ever; the template runs that layer)."""

    name = "defer"
    family = "fp16"

    def __init__(self, target, no):
        self.target, self.no = target, no

    def reset(self):
        self.asked = 0

    def choose(self, ctx, g):
        if g == self.target:
            self.asked += 1
            if self.no is None or self.asked <= self.no:
                return Decision(LEVEL_COMPUTE, "not now", defer=True)
        return Decision(0, "fp16")

    def keep_template(self, ctx, g):  # deferred for ever: the template runs through that layer of its step
        t = self.target
        return self.no is None and ctx.step_of(g) == ctx.step_of(t) and ctx.layer_of(g) <= ctx.layer_of(t)


def test_a_deferred_shard_is_asked_again_and_fetched_when_wanted(setup):
    L = setup[0].adapter.num_layers
    target = L + 2  # step 1, layer 2
    pol = _Defer(target, no=2)
    rep = _run(setup, pol)
    asks = [d for d in rep.result.decisions if d["layer"] == target]
    # deferred on the first ask (logged), again on the second (not logged: nothing changed), fetched on the third
    assert [d["level"] for d in asks] == [LEVEL_COMPUTE, 0] and pol.asked == 3
    fetched = [e["layer"] for e in rep.result.events if e["lane"] == "fetch"]
    assert target in fetched and fetched.index(target) > fetched.index(target + 1)  # asked again after later ones
    assert rep.levels_by_step()["step 1"][2] == "fp16" and not rep.fallbacks
    # the simulator plays the same protocol: the same decisions for that shard
    prof = kv_mode_view(get_profile("snapdragon-8-elite-cpu", "phone-dit-512"), "per-step")
    lv = [Level("fp16", 1000, 1000, 1e-3, 0.0, False)]
    n = prof.model.layers
    sim_pol = _Defer(n // 4 + 2, no=2)
    sim = simulate(
        sim_pol,
        Trace.constant(50.0),
        get_profile("snapdragon-8-elite-cpu", "phone-dit-512"),
        {"fp16": [lv] * n},
        {"fp16": 0},
    )
    assert [d["level"] for d in sim.result.decisions if d["layer"] == n // 4 + 2] == [
        LEVEL_COMPUTE,
        0,
    ] and sim_pol.asked == 3


def test_a_shard_deferred_for_ever_is_computed_and_the_lane_ends(setup):
    L = setup[0].adapter.num_layers
    target = L + 2
    rep = _run(setup, _Defer(target, no=None))
    assert target not in {e["layer"] for e in rep.result.events if e["lane"] == "fetch"}
    assert rep.levels_by_step()["step 1"][2] == "template"  # the device ran the template through that layer
    assert not rep.fallbacks
    # asked again while compute had not reached it, never after
    assert len([d for d in rep.result.decisions if d["layer"] == target]) >= 1


POLL_S = 0.1  # how often the compute lane asks the policy while it waits: the profile's cached-layer time


async def _until(event: threading.Event, real_limit_s: float = 120.0) -> None:
    """On the event loop: wait until ``event`` is set (a bound on real time, so a broken run fails, not hangs)."""
    for _ in range(int(real_limit_s / 0.005)):
        if event.is_set():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"not set within {real_limit_s} s")


def _run_with_late_shard(setup, policy, release: threading.Event, clock):
    """A per-step edit (fetch-fp16 ladders, on ``clock``) whose step 1 layer 2 shard arrives only once ``release``
    is set (by the policy: what it saw decides when); the report."""
    model, tpl, usr, pre, *_, profile = setup
    plan = plan_fetch(pre.manifest, "fetch-fp16")
    slow = {
        r["digest"]
        for sh in pre.manifest["shards"]
        if sh["step"] == 1 and sh["layers"][0] == 2
        for r in sh["representations"]
    }

    async def fetch_blob(digest, nbytes):
        if digest in slow:
            await _until(release)
        return pre.blobs[digest]

    return asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            pre.manifest,
            fetch_blob,
            FetchPlan(policy, plan.rungs, plan.floor),
            profile,
            trace=Trace.constant(50.0),
            config=RuntimeConfig(live=LiveSettings(steps=STEPS, shard_wait_s=60.0)),
            controls=RunControls(clock=clock),
        )
    )


def _stall_of(rep, g: int) -> dict:
    return next(e for e in rep.result.events if e["lane"] == "stall" and e["layer"] == g)


class _LateThenDevice(_SplitAt):
    """Split 0 at every step; a late shard of step 1 makes a template pass on the device "sooner" (recompute_late),
    and only then does that shard arrive (``release``); later steps wait for their shards."""

    name = "late-then-device"

    def __init__(self, splits=(0,) * STEPS):
        super().__init__(list(splits))
        self.asked_late = []
        self.release = threading.Event()

    def recompute_late(self, ctx, layer):
        self.asked_late.append(layer)
        late = ctx.step_of(layer) == 1
        if late:
            self.release.set()
        return late


class _Patient(_SplitAt):
    """Split 0 at every step; never gives up on a late shard, noting what it saw while waiting; the late shard
    (``target``) arrives once it has been asked about it three times."""

    name = "patient"

    def __init__(self, target):
        super().__init__([0] * STEPS)
        self.target, self.seen = target, []
        self.release = threading.Event()

    def recompute_late(self, ctx, layer):
        self.seen.append((layer, ctx.now, ctx.stalled_s))
        if sum(g == self.target for g, *_ in self.seen) >= 3:
            self.release.set()
        return False


def test_the_live_pipeline_tells_the_policy_how_long_the_edit_has_waited(setup, manual_clock):
    L = setup[0].adapter.num_layers
    pol = _Patient(L + 2)
    rep = _run_with_late_shard(setup, pol, pol.release, manual_clock)
    late = [(now, stalled) for g, now, stalled in pol.seen if g == L + 2]
    stall = _stall_of(rep, L + 2)
    earlier = sum(
        e["end"] - e["start"] for e in rep.result.events if e["lane"] == "stall" and e["end"] <= stall["start"]
    )
    assert len(late) >= 3
    for k, (now, stalled) in enumerate(late[:3]):  # at the wait's start, then every cached-layer time of the wait
        assert now - stall["start"] == pytest.approx(k * POLL_S, abs=1e-9)  # (lane_rules.late_wait_until)
        assert stalled == pytest.approx(earlier + now - stall["start"])  # the wait in progress is counted as it runs
    stalls = sum(e["end"] - e["start"] for e in rep.result.events if e["lane"] == "stall")
    assert stalls >= late[-1][1] and stall["end"] - stall["start"] >= 2 * POLL_S - 1e-9  # the timeline
    assert rep.levels_by_step()["step 1"] == ["fp16"] * L  # it waited: the shard was used


def _watched_edit(setup, policy, all_first=False, chunks=False, **config):
    """A per-step PipelinedEdit (fetch-fp16 ladders, instant link) and the list its layer hook fills: at each
    (step, layer), what the device holds then. ``all_first``: step 0 starts once every shard is decoded.
    ``chunks``: the fetcher reports its chunks and awaits its wire turns (requests then go ahead)."""
    model, tpl, usr, pre, *_, profile = setup
    plan = plan_fetch(pre.manifest, "fetch-fp16")
    seen = []

    fetch_blob = blob_fetcher(pre.blobs.__getitem__, chunks)

    def look(step, layer):
        if all_first and (step, layer) == (0, 0):
            assert all(edit.held.ready[shard].wait(60) for shard in edit.grid)
        h = edit.held
        with h.lock:  # a consistent look (the fetch lane publishes meanwhile)
            ahead = h.held_from_bytes(edit.grid.step_end(edit.compute.step))  # after the step the lane is in
            seen.append(
                (
                    step,
                    layer,
                    {s.g for s in h.kv},
                    {s.g for s in edit.decoder.decoders},
                    set(edit.device.dropped),
                    h.held_bytes(),
                    h.kv_bytes,
                    ahead,
                )
            )

    edit = PipelinedEdit(
        EditInputs(model, usr, "p", tpl),
        pre.manifest,
        fetch_blob,
        FetchPlan(policy, plan.rungs, plan.floor),
        profile,
        config=RuntimeConfig(**config, live=LiveSettings(steps=STEPS)),
        controls=RunControls(on_layer=look),
    )
    return edit, seen


def test_a_shards_kv_is_freed_once_the_compute_lane_has_passed_it(setup):
    """Per-step KV serves one (step, layer): once the compute lane is past it, its KV, decoder and the drop state of
    earlier steps are gone (the device holds the rest of the running step and what is prefetched, not the whole
    edit's KV); the edit is unchanged."""
    model, *_, fp16_edit, _ = setup
    L = model.adapter.num_layers
    edit, seen = _watched_edit(setup, _SplitAt([1, 2, 0]))
    rep = asyncio.run(edit.run())
    assert (rep.tokens - fp16_edit.tokens).abs().max() <= 1e-5
    # the hook runs before this layer's release: at (step, layer) = shard g nothing before g - 1 is left
    for step, layer, kv, dec, dropped, held, counted, _ in seen:
        g = step * L + layer
        assert min(kv | dec, default=g) >= g - 1 and min(dropped, default=step) >= step - (layer == 0)
        assert held == counted  # the count of KV held is the KV held
    shard = 2 * model.spec.num_tokens * model.adapter.num_heads * model.adapter.head_dim * 2  # fp16 K and V
    held = edit.held
    assert {s.g for s in held.kv} <= {STEPS * L - 1} and held.kv_bytes == len(held.kv) * shard
    assert (
        max(x[5] for x in seen) <= rep.result.peak_kv_bytes <= STEPS * L * shard
        and rep.result.peak_kv_bytes == held.peak_kv_bytes
    )


@pytest.mark.parametrize("chunks", [False, True])
@pytest.mark.parametrize("shards", [0, 2])
def test_prefetch_for_later_steps_stays_within_its_memory(setup, shards, chunks):
    """``prefetch_kv_bytes``: the KV held for steps after the running one never exceeds it (an instant link would
    otherwise prefetch every later step at once); with 0 nothing is fetched ahead. The edit is unchanged. With
    requests ahead (``chunks``) the shards on their way and decoding count too."""
    model, *_, fp16_edit, _ = setup
    L = model.adapter.num_layers
    shard = 2 * model.spec.num_tokens * model.adapter.num_heads * model.adapter.head_dim * 2
    edit, seen = _watched_edit(
        setup, make_policy("fetch-fp16"), chunks=chunks, prefetch_kv_bytes=shards * shard, request_ahead=chunks
    )
    rep = asyncio.run(edit.run())
    assert (rep.tokens - fp16_edit.tokens).abs().max() <= 1e-5 and rep.result.split_layers == [0] * STEPS
    assert all(ahead <= shards * shard for *_, ahead in seen)
    assert rep.result.peak_kv_bytes <= (L + shards) * shard  # one step plus the prefetch room
    unlimited, seen = _watched_edit(setup, make_policy("fetch-fp16"), all_first=True)
    asyncio.run(unlimited.run())
    assert seen[0][-1] == (STEPS - 1) * L * shard  # without the limit the link runs ahead: every later step held
    with pytest.raises(ValueError, match=r"prefetch_kv_bytes must be >= 0 bytes or None \(no limit\), got -1"):
        RuntimeConfig(prefetch_kv_bytes=-1)


def test_live_sakura_sees_a_stalled_transfer_and_does_not_wait_it_out(setup, manual_clock):
    """A fetcher that reports progress (``on_chunk``): step 1 layer 3's shard stops half-way for good, and every
    later shard queues behind it. The policy sees the transfer in progress (``LiveState.link_progress``, as the
    simulator's) and keeps the template or gives up on the link, instead of waiting for a shard predicted long
    ago: the edit ends in seconds (of the test's clock), equal to the on-device one; the stalled fetch is
    abandoned. Without the progress it waits out ``shard_wait_s`` (60 s) for that shard."""
    model, tpl, usr, pre, on_device, _, profile = setup
    plan = plan_fetch(pre.manifest, "fetch-fp16")
    stalled = {
        r["digest"]
        for sh in pre.manifest["shards"]
        if sh["step"] == 1 and sh["layers"][0] == 3
        for r in sh["representations"]
    }

    async def fetch_blob(digest, nbytes, on_chunk=None):
        blob, report = pre.blobs[digest], on_chunk or (lambda n: None)
        half = len(blob) // 2
        report(half)
        if digest in stalled:
            await asyncio.Event().wait()  # never: the run abandons it
        report(len(blob) - half)
        return blob

    rep = asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            pre.manifest,
            fetch_blob,
            FetchPlan(make_policy("sakura"), plan.rungs, plan.floor),
            profile,
            trace=Trace.constant(50.0),
            config=RuntimeConfig(live=LiveSettings(steps=STEPS, shard_wait_s=60.0)),
            controls=RunControls(clock=manual_clock),
        )
    )
    assert rep.result.latency_s < 10.0 and not any("not ready after" in f for f in rep.fallbacks)
    assert (rep.tokens - on_device.tokens).abs().max() < 2e-3
    L = model.adapter.num_layers
    assert "fp16" not in rep.levels_used.get(L + 3, ["-"])  # the stalled shard was never used


def test_the_lane_sends_its_next_request_while_a_transfer_arrives_one_on_the_wire_at_a_time(setup):
    """``RuntimeConfig.request_ahead`` (the default): with a fetcher that awaits what ``on_chunk`` returns (as
    ShardClient does), requests leave while the ones before are on their way (their round trips hidden), but each
    one's bytes wait for the transfer before: the wire carries one at a time. The edit is the fp16 one either way;
    off, or with a fetcher that does not await its turns, no request leaves while another is on its way."""
    model, tpl, usr, pre, _, fp16_edit, profile = setup
    plan = plan_fetch(pre.manifest, "fetch-fp16")
    log: list[tuple[str, str]] = []

    async def fetch_blob(digest, nbytes, on_chunk=None):
        blob = pre.blobs[digest]
        log.append(("request", digest))
        await asyncio.sleep(0.004)  # the round trip
        res = on_chunk(1)
        if inspect.isawaitable(res) and takes_turns:
            await res  # the wire turn
        log.append(("wire", digest))
        await asyncio.sleep(0.004)  # the bytes
        on_chunk(len(blob) - 1)
        log.append(("end", digest))
        return blob

    for ahead, takes_turns in ((True, True), (False, True), (True, False)):
        log.clear()
        rep = asyncio.run(
            run_pipelined_edit(
                EditInputs(model, usr, "p", tpl),
                pre.manifest,
                fetch_blob,
                FetchPlan(make_policy("fetch-fp16"), plan.rungs, plan.floor),
                profile,
                trace=Trace.constant(50.0),
                config=RuntimeConfig(request_ahead=ahead, live=LiveSettings(steps=STEPS)),
            )
        )
        assert (rep.tokens - fp16_edit.tokens).abs().max() <= 1e-5
        on_wire: set[str] = set()
        pending: set[str] = set()  # requested, not ended
        sent_ahead = 0
        for what, digest in log:
            if what == "request":
                sent_ahead += bool(pending)
                pending.add(digest)
            elif what == "wire":
                assert not on_wire, "two transfers on the wire at once"
                on_wire.add(digest)
            else:
                on_wire.discard(digest)
                pending.discard(digest)
        requests = sum(1 for what, _ in log if what == "request")
        if ahead and takes_turns:  # every request after the probe's answer goes ahead (the last may find it idle)
            assert sent_ahead >= requests // 2, (sent_ahead, requests)
        else:  # off, or a fetcher that never awaits its turn (seen at the probe): one request at a time
            assert sent_ahead == 0

"""The simulator's per-step protocol (steps x layers shards, the template restarting at every step with its own
split, later steps prefetched), on a small model where every latency is a sum of known layer times."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import CrossStepLinks, Level
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy, make_policy
from sakura_core.runtime.oracle import fixed_split_policy, simulate_oracle
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=3
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
F, C = P.layer_full_s, P.layer_cached_s  # ~10.3 ms, ~4.6 ms
FP = G.shard_bytes_fp16
Q = Level("q", FP // 6, FP // 6, 1e-3, 1e-4 / 12)
LADDERS = {"sakura": [[Q, Level("fp16", FP, FP, 1e-3, 0.0)]] * 12}
FLOORS = {"sakura": 0}
NO_RTT = SimConfig(rtt_s=0.0)


def _sim(policy, trace, config=NO_RTT):
    return simulate(policy, trace, P, LADDERS, FLOORS, config=config)


def test_on_device_runs_the_template_at_every_step():
    for name in ("on-device", "on-device-cached", "sakura"):
        # 0.1 Mbit/s: a floor shard (87 kB) takes ~7 s, the whole edit ~0.22 s on the device
        r = _sim(make_policy(name), Trace.constant(0.1))
        assert r.result.latency_s == pytest.approx(12 * F + 0.1), name
        assert r.splits == [4, 4, 4], name


def test_one_split_per_step_and_only_the_fetched_steps_pay_bytes():
    # splits 4, 0, 4: step 0 and step 2 run the template (4 F each), step 1 runs cached on shards 4..7, fetched
    # at 1000 Mbit/s (0.7 ms each + 1 ms decode) while step 0 computes: no stall
    r = _sim(fixed_split_policy([4, 0, 4]), Trace.constant(1000))
    assert r.splits == [4, 0, 4] and r.stall_s == 0.0
    assert r.result.latency_s == pytest.approx(8 * F + 4 * C + 0.1)
    assert r.result.bytes_fetched == 4 * Q.nbytes


def test_later_steps_are_prefetched_while_earlier_steps_compute():
    # split 0 everywhere: shard g decodes at 0.7 ms + (g + 1) ms, sooner than compute (4.6 ms a layer) needs it,
    # so only shard 0 is waited for and step 1's shards are on the link before step 1 starts
    r = _sim(fixed_split_policy(0), Trace.constant(1000))
    first = Q.nbytes / 125e6 + 1e-3
    assert r.result.latency_s == pytest.approx(first + 12 * C + 0.1)
    step1_start = min(e["start"] for e in r.result.events if e["lane"] == "compute" and e["layer"] == 4)
    assert all(
        e["start"] < step1_start for e in r.result.events if e["lane"] == "fetch" and e["layer"] in (4, 5, 6, 7)
    )


class _DeferOnce(Policy):
    """Defers step 2's shards the first time it is asked, fetches them the second time; drops at layer 0."""

    name = "defer-once"

    def reset(self):
        self.asked = set()

    def choose(self, ctx, layer):
        if ctx.step_of(layer) == 2 and layer not in self.asked:
            self.asked.add(layer)
            return Decision(LEVEL_COMPUTE, "not now", defer=True)
        return Decision(ctx.floor, "floor")

    def keep_template(self, ctx, layer):
        return False


def test_deferred_shards_are_asked_again_before_later_shards():
    # a deferred shard has the earliest deadline of those not requested: the next link decision asks it again first
    r = _sim(_DeferOnce(), Trace.constant(1000))
    asked = [d["layer"] for d in r.result.decisions if d["level"] != "drop"]
    for g in (8, 9, 10, 11):
        first = asked.index(g)
        assert asked.count(g) == 2 and asked[first + 1] == g
    assert [d["level"] for d in r.result.decisions if d["layer"] == 8] == [LEVEL_COMPUTE, FLOORS["sakura"], "drop"]
    assert r.splits == [0, 0, 0] and r.result.bytes_fetched == 12 * Q.nbytes


class _DeferNextLayer(Policy):
    """Computes shard 0, defers shard 1 for the first half of layer 0, fetches the rest; keeps the template at every
    step's layer 0 and drops at layer 1."""

    name = "defer-next"

    def choose(self, ctx, layer):
        if layer == 0:
            return Decision(LEVEL_COMPUTE, "the lane runs it")
        if layer == 1 and ctx.now < F / 2:
            return Decision(LEVEL_COMPUTE, "not now", defer=True)
        return Decision(ctx.floor, "floor")

    def keep_template(self, ctx, layer):
        return ctx.layer_of(layer) == 0


def test_a_shard_deferred_while_the_lane_runs_the_layer_before_it_is_still_fetched():
    # the simulator's compute_layer is the layer the lane is about to start: while the link catches up to that start
    # (shards 2, 3, ... fetched during layer 0) the lane has not reached layer 1, so the deferred shard 1 is asked
    # again, not dropped (it was: the drop at layer 1 then waited for nothing but a template pass)
    r = _sim(_DeferNextLayer(), Trace.constant(1000))
    asked = [d["level"] for d in r.result.decisions if d["layer"] == 1]
    assert asked[0] == LEVEL_COMPUTE and FLOORS["sakura"] in asked
    assert (
        min(e["start"] for e in r.result.events if e["lane"] == "fetch" and e["layer"] == 1) < F
    )  # while layer 0 ran
    assert r.splits[0] == 1 and not any("fallback" in str(e["level"]) for e in r.result.events)


def test_sakura_against_the_oracle_and_on_device_per_step():
    for mbit in (0.5, 2.0, 8.0, 50.0):
        tr = Trace.constant(mbit)
        s = _sim(make_policy("sakura"), tr)
        o = simulate_oracle(make_policy("oracle"), tr, P, LADDERS, FLOORS, config=NO_RTT)
        dev = _sim(make_policy("on-device"), tr)
        assert o.result.latency_s <= s.result.latency_s * 1.02, mbit
        assert s.result.latency_s <= 1.10 * o.result.latency_s and s.result.latency_s <= 1.02 * dev.result.latency_s, (
            mbit
        )


def test_a_0_kbit_stall_costs_sakura_at_most_2_percent_over_on_device():
    # 50 Mbit/s for 20 ms, then nothing for 100 s: sakura must not wait for the link
    tr = Trace("stall", [0.02, 100.0], [50e6 / 8, 0.0])
    s = _sim(make_policy("sakura"), tr)
    dev = _sim(make_policy("on-device"), tr)
    assert s.result.latency_s <= 1.02 * dev.result.latency_s


def test_the_ladder_count_names_the_kv_mode():
    with pytest.raises(ValueError, match="steps x layers"):
        simulate(make_policy("sakura"), Trace.constant(8), P, {"sakura": LADDERS["sakura"][:5]}, FLOORS)


class _DropAtTwoThenGiveUp(Policy):
    """Template through layers 0, 1 at every step; a late shard is given up on at once (noting the resume cost)."""

    name = "drop-at-2"
    family = "sakura"

    def __init__(self):
        self.resume_s = []

    def choose(self, ctx, g):
        return Decision(LEVEL_COMPUTE, "device") if ctx.layer_of(g) < 2 else Decision(0, "floor")

    def keep_template(self, ctx, g):
        return ctx.layer_of(g) < 2

    def recompute_late(self, ctx, g):
        self.resume_s.append(ctx.resume_pass_s())
        return True


def test_a_late_shard_resumes_the_template_pass_where_the_step_dropped_it():
    # the link is dead: at every step layer 2's shard never comes; the device resumes the template pass at layer 2
    # (layers 2, 3: half a template pass), not from layer 0
    pol = _DropAtTwoThenGiveUp()
    r = _sim(pol, Trace("dead", [100.0, 0.001], [0.0, 1e3]))
    passes = [e for e in r.result.events if e["lane"] == "compute" and "fallback" in str(e["level"])]
    assert [e["level"] for e in passes] == ["fallback template pass from layer 2"] * 3
    assert all(e["end"] - e["start"] == pytest.approx(P.template_pass_s / 2) for e in passes)
    assert pol.resume_s == [pytest.approx(P.template_pass_s / 2)] * 3 and r.splits == [2, 2, 2]
    assert r.result.latency_s == pytest.approx(3 * (2 * F + P.template_pass_s / 2 + 2 * C) + P.fixed_s)


def test_the_kv_held_is_counted_as_the_live_pipeline_frees_it():
    # splits 4, 0, 4 at 1000 Mbit/s: shards 4..7 are decoded by ~5 ms, step 1 starts at 4 F (~41 ms): all four
    # are held at once, then freed as step 1 passes them
    r = _sim(fixed_split_policy([4, 0, 4]), Trace.constant(1000))
    assert r.result.peak_kv_bytes == 4 * FP
    # split 0 everywhere: shard g is decoded at 0.7 ms + (g + 1) ms and freed once the compute lane is past it
    # (first + (g + 1) C); at the last decode, the shards already passed are gone
    r = _sim(fixed_split_policy(0), Trace.constant(1000))
    first = Q.nbytes / 125e6 + 1e-3
    last = Q.nbytes / 125e6 + 12e-3
    passed = sum(first + (g + 1) * C <= last for g in range(12))
    assert 0 < passed < 12 and r.result.peak_kv_bytes == (12 - passed) * FP
    assert _sim(make_policy("on-device"), Trace.constant(1000)).result.peak_kv_bytes == 0  # nothing fetched


def _first_fetch(r):
    return min((e for e in r.result.events if e["lane"] == "fetch"), key=lambda e: e["start"])["layer"]


def test_sakura_probes_with_the_next_steps_first_shard_in_per_step_mode():
    # the compute lane keeps the template at step 0 layer 0 before any shard can arrive: a probe of shard 0 (used
    # only by step 0) was wasted; the next step's first shard is used by every plan that drops there
    r = _sim(make_policy("sakura"), Trace.constant(20))
    assert _first_fetch(r) == 4  # step 1 layer 0
    assert 0 not in [e["layer"] for e in r.result.events if e["lane"] == "fetch"]  # compute was past it: never fetched
    probe = next(d for d in r.result.decisions if "bandwidth probe (no" in d["reason"])
    assert probe["layer"] == 4
    # single mode: every shard serves every step, shard 0 is the probe as before
    single = simulate(
        make_policy("sakura"), Trace.constant(20), P, {"sakura": LADDERS["sakura"][:4]}, FLOORS, config=NO_RTT
    )
    assert _first_fetch(single) == 0


def test_a_cross_step_floor_of_the_next_step_is_the_probe_at_its_floor():
    # steps 1-2 are cross-step residuals against the step before: step 1 layer 0's reference (step 0 layer 0) is the
    # layer the compute lane computes now, so the residual is fetched at its floor (its decode waits for the
    # device's KV, no exact level fetched), not the running step's last shard (on slow links the running step's
    # shards cost several times a later step's residuals and the plan seldom uses them)
    def residual(step):
        return Level("q-res", FP // 20, FP // 20, 1e-3, 1e-4 / 12, links=CrossStepLinks(ref_step=step - 1))

    lads = {"sakura": [LADDERS["sakura"][0]] * 4 + [[residual(g // 4), LADDERS["sakura"][0][1]] for g in range(4, 12)]}
    r = simulate(make_policy("sakura"), Trace.constant(20), P, lads, FLOORS, config=NO_RTT)
    probe = next(d for d in r.result.decisions if "bandwidth probe (no" in d["reason"])
    assert probe["layer"] == 4 and probe["level"] == 0 and _first_fetch(r) == 4
    assert not [d for d in r.result.decisions if d["reason"].startswith("fallback")]  # no exact level fetched for it
    assert 0 not in [e["layer"] for e in r.result.events if e["lane"] == "fetch"]


def test_the_probe_stays_in_the_step_when_no_later_step_has_bytes_to_sample():
    # every shard of steps 1-2 is a zero-byte reuse rung: only step 0's shards can give a sample; its last one (not
    # its first, which the compute lane starts on at once)
    def reuse(step):
        return Level("reuse", 0, 0, 0.0, 1e-3, links=CrossStepLinks(reuse=True, ref_step=step - 1))

    lads = {"sakura": [LADDERS["sakura"][0]] * 4 + [[reuse(g // 4), LADDERS["sakura"][0][1]] for g in range(4, 12)]}
    r = simulate(make_policy("sakura"), Trace.constant(20), P, lads, FLOORS, config=NO_RTT)
    assert _first_fetch(r) == 3

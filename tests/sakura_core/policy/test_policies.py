"""Each policy's decision rules, checked directly on a tiny hand-computed world (no simulator).

The world (every expected number below is derived from it by hand, in the comments):
* 4 layers; the device runs a layer with the template tokens in 1.0 s ("full"), with the template KV injected in
  0.5 s ("cached"); a template-only pass takes 2.0 s; 2 denoising steps; nothing outside the DiT (0 s).
* every shard has three levels, cheapest first: s1 = 1 MB, s2 = 2 MB (s1 + a 1 MB progressive enhancement),
  fp16 = 4 MB; decoding costs 0 s, so only the link counts. The quality floor is s1 (index 0).
* each request pays a 0.05 s round trip (RTT); 1 MB = 1e6 bytes; 1e6 bytes/s = 8 Mbit/s.
* the estimator has one sample at the given rate (harmonic = robust = worst = that rate), or none (prior 62,500 B/s).
* unless a test says otherwise: now = 0, the link and decoder are idle, compute is at layer 0 at t = 0 with the
  template alive. Then a shard's deadline (compute reaching it if the template is dropped after the current layer)
  is 0, 1.0, 1.5, 2.0 s for layers 0..3 (full 1.0 s for layer 0, then 0.5 s per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.estimator import EstimatorConfig, ThroughputEstimator
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import LEVEL_COMPUTE, POLICIES, make_policy

MB = 1_000_000  # bytes
S1 = Level("s1", 1 * MB, 1 * MB, 0.0, 4e-3)
S2 = Level("s2", 2 * MB, 1 * MB, 0.0, 1e-3, progressive=True)
FP16 = Level("fp16", 4 * MB, 4 * MB, 0.0, 0.0)
LADDER = [S1, S2, FP16]


@dataclass(frozen=True)
class Costs:
    """Seconds on the fake device (see the module doc)."""

    layer_full_s: float = 1.0
    layer_cached_s: float = 0.5
    template_pass_s: float = 2.0
    fixed_s: float = 0.0
    steps: int = 2

    @property
    def model(self) -> Costs:
        return self


def _estimator(rate_bytes_per_s: float | None) -> ThroughputEstimator:
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1))
    if rate_bytes_per_s is not None:
        e.observe(rate_bytes_per_s, 1.0)  # one sample: harmonic = robust = worst = the rate
    return e


@dataclass
class FakeState:
    """A PolicyState written by hand: each test sets the clock, the lanes and what has been fetched."""

    estimator: ThroughputEstimator = field(default_factory=lambda: _estimator(None))
    trace: Trace = field(default_factory=lambda: Trace.constant(8))  # 1e6 bytes/s
    profile: Costs = field(default_factory=Costs)
    ladders: list[list[Level]] = field(default_factory=lambda: [LADDER] * 4)
    floor: int = 0
    rtt_s: float = 0.05
    start_s: float = 0.0  # where on the trace the edit started
    layers_per_step: int = 4
    latency_target_s: float | None = None
    now: float = 0.0
    link_free: float = 0.0
    decoder_free: float = 0.0
    compute_layer: int = 0
    compute_t: float = 0.0
    template_alive: bool = True
    dropped_at: int = 0  # where the template was dropped (read once it is): 0 = a late fallback is a whole pass
    stalled_s: float = 0.0
    next_layer: int = 0
    got: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    in_flight: dict[int, float] = field(default_factory=dict)

    def flush_observations(self) -> None:
        """Samples go straight into the estimator here."""


def ctx(rate_bytes_per_s: float | None = None, **state) -> Context:
    """A Context over a FakeState whose estimator has one sample at ``rate_bytes_per_s`` (None: no sample)."""
    return Context(FakeState(estimator=_estimator(rate_bytes_per_s), **state))


def policy(name: str):
    p = make_policy(name)
    p.reset()
    return p


# --- the context's predictions (what every rule below builds on) ---


def test_context_predicts_deadlines_and_transfers_by_hand():
    c = ctx(1e6)
    # template alive at layer 0, t = 0: layer 0 now, layer 1 after one full layer, then 0.5 s per cached layer
    assert [c.deadline(x) for x in range(4)] == [0.0, 1.0, 1.5, 2.0]
    # 2 MB at 1 MB/s + 0.05 s RTT = 2.05 s
    assert c.predict_ready(1, S2, 1e6) == pytest.approx(2.05)
    dropped = ctx(1e6, template_alive=False)
    assert [dropped.deadline(x) for x in range(4)] == [0.0, 0.5, 1.0, 1.5]  # 0.5 s per cached layer


def test_context_rejects_a_state_that_lacks_members():
    with pytest.raises(TypeError, match="lacks profile, ladders"):
        Context(object())


# --- baselines without a rule ---


@pytest.mark.parametrize("name", ["on-device", "on-device-cached"])
def test_on_device_policies_never_fetch_and_keep_the_template(name):
    p, c = policy(name), ctx(1e8)  # even at 800 Mbit/s
    d = p.choose(c, 0)
    assert d.level is None and "never fetches" in d.reason
    assert all(p.keep_template(c, x) for x in range(4))
    assert p.upgrade(ctx(1e8, got={0: [(0, 0.0)]})) is None
    assert not p.recompute_late(c, 0)
    assert p.template_every_step == (name == "on-device")  # on-device runs the template tokens every step


def test_fetch_fp16_always_fetches_the_exact_level_and_drops_at_once():
    p = policy("fetch-fp16")
    for rate in (1e5, 1e8):  # whatever the link
        d = p.choose(ctx(rate, ladders=[[FP16]] * 4), 2)
        assert d.level == 0 and "fp16" in d.reason and "4.00 MB" in d.reason
    assert not p.keep_template(ctx(1e5), 0)
    assert p.family == "fp16"


def test_free_kv_is_a_preloaded_bound_that_never_keeps_the_template():
    p = policy("free-kv")
    assert p.kv_preloaded and p.family == "fp16" and not p.keep_template(ctx(), 0)
    d = p.choose(ctx(), 0)
    assert d.level is None and "preloaded" in d.reason


# --- cachegen: first level (high to low) with bytes/bw < SLO / n_chunks, else recompute ---


@pytest.mark.parametrize(
    ("mbit", "level", "why"),
    [
        # SLO = the 2.0 s template pass; budget = 2.0 s / 4 shards = 0.5 s per shard
        (80, 2, "4.00 MB at 80.00 Mbit/s = 0.40 s < 0.50 s per shard"),  # fp16: 4 MB at 1e7 B/s = 0.4 s
        (40, 1, "2.00 MB at 40.00 Mbit/s = 0.40 s < 0.50 s"),  # fp16 0.8 s too slow; s2 0.4 s fits
        (8, LEVEL_COMPUTE, "no level fits 0.50 s per shard"),  # even s1 takes 1.0 s -> recompute
    ],
)
def test_cachegen_picks_the_first_level_within_its_per_shard_budget(mbit, level, why):
    d = policy("cachegen").choose(ctx(trace=Trace.constant(mbit)), 1)
    assert d.level == level and why in d.reason


def test_cachegen_budget_comes_from_the_latency_target_and_is_strict():
    # target 8 s -> 2.0 s per shard; at 8 Mbit/s fp16 takes 4 s, s2 exactly 2.0 s (not < 2.0), s1 1.0 s
    d = policy("cachegen").choose(ctx(latency_target_s=8.0), 0)
    assert d.level == 0 and "1.00 s < 2.00 s per shard (SLO 8.00 s / 4)" in d.reason


def test_cachegen_recomputes_by_keeping_the_template_and_falls_back_to_the_lowest_level_once_dropped():
    p = policy("cachegen")
    c = ctx(next_layer=2)
    assert p.choose(c, 1).level == LEVEL_COMPUTE and "computes layer 1" in p.choose(c, 1).reason
    assert p.keep_template(c, 0) and p.keep_template(c, 1)  # layer 1 is marked recompute: keep through it
    dropped = p.choose(ctx(template_alive=False), 3)
    assert dropped.level == 0 and "template is dropped" in dropped.reason


def test_cachegen_keeps_the_template_only_for_undecided_shards():
    p = policy("cachegen")  # nothing marked recompute
    assert not p.keep_template(ctx(next_layer=2), 1)  # shard 1 decided (fetched): drop
    assert p.keep_template(ctx(next_layer=2), 2)  # shard 2 not decided yet and not ready: keep


# --- throughput: harmonic mean; fetch all if the floor ladder beats the template pass, highest level in time ---


def test_throughput_computes_when_the_floor_ladder_is_slower_than_the_template_pass():
    p = policy("throughput")
    # 4 shards x 1 MB = 4 MB at 2e6 B/s = 2.0 s, not < 2.0 s template pass -> compute, keep the template
    d = p.choose(ctx(2e6), 0)
    assert d.level is None and "4.00 MB at 16.00 Mbit/s = 2.00 s >= 2.00 s" in d.reason
    assert p.keep_template(ctx(2e6), 3)
    assert p.choose(ctx(4e6), 1).level is None  # decided once per run, not per shard
    p.reset()
    assert p.choose(ctx(4e6), 1).level == 2  # 4 MB at 4e6 B/s = 1.0 s < 2.0 s -> fetch everything
    assert not p.keep_template(ctx(4e6), 1)


@pytest.mark.parametrize(
    ("now", "layer", "level", "why"),
    [
        # fp16: 4 MB at 4e6 B/s = 1.0 s <= 1.0 s to deadline(1)
        (0.0, 1, 2, "fp16 (highest in time): 4.00 MB at 32.00 Mbit/s = 1.00 s, 1.00 s to its deadline"),
        # 0.6 s left: fp16 (1.0 s) is too slow, s2 (0.5 s) fits
        (0.4, 1, 1, "s2 (highest in time): 2.00 MB at 32.00 Mbit/s = 0.50 s, 0.60 s to its deadline"),
        (0.0, 0, 0, "no time left before its deadline"),  # deadline 0: even s1 (0.25 s) is late -> the floor
        (0.3, 0, 0, "its deadline passed 0.30 s ago"),  # a negative slack reads as such, never "-0.30 s"
    ],
)
def test_throughput_fetches_the_highest_level_meeting_its_deadline_ignoring_rtt(now, layer, level, why):
    p = policy("throughput")
    d = p.choose(ctx(4e6, now=now), layer)  # 32 Mbit/s; deadline(1) = 1.0 s, deadline(0) = 0
    assert d.level == level and why in d.reason


def test_throughput_before_its_first_decision_keeps_the_template_until_the_shard_is_ready():
    p = policy("throughput")
    assert not p.keep_template(ctx(1e6, got={0: [(0, 0.0)]}), 0)  # decoded at t=0 = now
    assert p.keep_template(ctx(1e6, got={0: [(0, 0.5)]}), 0)  # decoded only at t=0.5


# --- sakura: probe, split, levels in the link's slack, latency target, drop, late shards, upgrades ---
# (the planner behind it is tested on its own, per-step cases included, in test_planner.py)


def test_sakura_splits_at_the_earliest_predicted_step0_finish():
    p = policy("sakura")
    c = ctx(1e6)  # 8 Mbit/s: best drop 2 (finishes 4.70, 3.65, 3.00, 3.50, 4.00 for drops 0..4) + step 1 (2.0 s)
    for layer in (0, 1):
        d = p.choose(c, layer)
        assert d.level == LEVEL_COMPUTE and "split at layer 2" in d.reason and "8.00 Mbit/s" in d.reason
        assert "predicted finish t=5.00 s" in d.reason
        assert d.defer  # "not now": asked again until the compute lane reaches it (a faster link moves the split)
    assert p.keep_template(c, 0)  # dropping at 0 is not the best drop
    # shard 2 at s2 (2 MB): arrives 2.05 s, shard 3 at 3.10 s -> step 0 ends 3.60 s > 3.00 s: the floor s1
    d = p.choose(c, 2)
    assert d.level == 0 and "s1 (the quality floor" in d.reason and not d.defer


def test_sakura_fetches_everything_on_a_fast_link_and_computes_everything_on_a_slow_one():
    p = policy("sakura")
    # 128 Mbit/s: a floor shard takes 0.05 + 0.0625 s; dropping at 0 ends step 0 at 2.11 s, the best; it still
    # wins at the slowest recent rate and gains more (1.89 s) than a dead link would cost
    # (a 2.0 s template pass + 4 cached layers - 4 full layers = 0 s)
    fast = ctx(16e6)
    assert p.choose(fast, 0).level == 0 and not p.keep_template(fast, 0)
    # 0.8 Mbit/s: a floor shard takes 10.05 s; computing all 4 layers (4.0 s) is best
    slow = ctx(1e5)
    d = p.choose(slow, 3)
    assert d.level == LEVEL_COMPUTE and "the device computes all" in d.reason
    assert p.keep_template(slow, 3)


def test_a_drop_that_pays_at_the_slowest_recent_rate_is_taken():
    # 32 Mbit/s (4e6 B/s, the only sample): shards at 0.30, 0.55, 0.80, 1.05 s; dropping at 0 ends step 0 at
    # ~2.3 s instead of 4.0 s and gains more than a dead link would cost (a 2.0 s pass + 2.0 s cached + 0.5 s of
    # patience - 4.0 s = 0.5 s). The old rule also asked the drop to win at a quarter of the slowest rate (1e6 B/s:
    # step 0 would end at 4.45 s > 4.0 s) and kept the template at step 0 of fast links with one slow sample
    p = policy("sakura")
    assert p.regret_slowdown == 1.0 and not p.keep_template(ctx(4e6), 0)
    p.regret_slowdown = 4.0
    assert p.keep_template(ctx(4e6), 0)


def test_sakura_probes_the_link_with_the_first_shard_at_the_floor():
    # no sample yet: the prior (62,500 B/s) would say "compute everything", but shard 0 is fetched as the probe
    d = policy("sakura").choose(ctx(None), 0)
    assert d.level == 0 and d.reason.startswith("bandwidth probe")


@pytest.mark.parametrize(
    "compute_t",
    [
        # template dropped, shard 0 decoded, 8 Mbit/s; compute at layer 0 from 2.0 s: floor shards 1..3 arrive
        # 1.05, 2.10, 3.15 s, layers end 2.5, 3.0, 3.5, 4.0 s; s2 for shard 1 would push shard 3 to 4.15 s -> 4.65 s
        2.0,
        # from 2.7 s: layers end 3.2, 3.7, 4.2, 4.7 s at the floor and with s2 (shard 3 at 4.15 s < 4.2 s): the link
        # has slack now, but spending it on s2 leaves no margin if the link slows: still the floor (upgrades later)
        2.7,
    ],
)
def test_sakura_takes_the_floor_without_a_target_even_with_slack_in_the_link(compute_t):
    c = ctx(1e6, template_alive=False, compute_t=compute_t, got={0: [(0, 0.0)]}, next_layer=1)
    d = policy("sakura").choose(c, 1)
    assert d.level == 0 and "idle link time refines it later" in d.reason


@pytest.mark.parametrize(
    ("target", "level", "bonus"),
    [
        # 32 Mbit/s, shard 0 decoded, shards 1..3 at 0.30, 0.60, 0.90 s: step 0 ends 2.0 s, the edit 4.0 s;
        # s2 for shard 1 (0.55 s) ends it at 4.05 s -> the floor without a target or with a 3.0 s one
        (None, 0, None),
        (3.0, 0, None),
        (4.2, 1, "slack under the 4.20 s target"),  # s2 4.05 s fits, fp16 (shard 1 at 1.05 s) 4.55 s does not
        (5.0, 2, "slack under the 5.00 s target"),  # fp16 fits
    ],
)
def test_sakura_spends_the_slack_under_a_latency_target_on_quality(target, level, bonus):
    c = ctx(4e6, template_alive=False, got={0: [(0, 0.0)]}, next_layer=1, latency_target_s=target)
    d = policy("sakura").choose(c, 1)
    assert d.level == level
    assert (bonus in d.reason) if bonus else ("slack" not in d.reason)


def test_sakura_drops_the_template_when_the_shards_are_already_there():
    # compute at layer 2 at t=2.0; shards 2 and 3 decoded at 1.05 and 1.9 s: dropping now ends step 0 at 3.0 s,
    # keeping all at 4.0 s, and no link failure can cost anything
    c = ctx(1e6, compute_layer=2, compute_t=2.0, now=2.0, next_layer=4, got={2: [(0, 1.05)], 3: [(0, 1.9)]})
    assert not policy("sakura").keep_template(c, 2)
    # shard 3 only predicted (2.10 s): the drop gains 1.0 s; if the link died now the device would wait a quarter of
    # the template pass from layer 2 (layers 2, 3: 1.0 s) and run it, then 2 cached layers: 2.0 + 0.25 + 1.0 + 1.0
    # = 4.25 s, a 0.25 s loss < 1.0 s: drop
    c = ctx(
        1e6,
        compute_layer=2,
        compute_t=2.0,
        now=2.0,
        link_free=2.1,
        next_layer=4,
        got={2: [(0, 1.05)]},
        in_flight={3: 2.10},
    )
    assert not policy("sakura").keep_template(c, 2)
    # shard 3 predicted at 3.3 s: the drop gains 0.2 s (4.0 -> 3.8 s), less than that 0.25 s: keep
    c = ctx(
        1e6,
        compute_layer=2,
        compute_t=2.0,
        now=2.0,
        link_free=3.3,
        next_layer=4,
        got={2: [(0, 1.05)]},
        in_flight={3: 3.3},
    )
    assert policy("sakura").keep_template(c, 2)
    # nothing fetched: shards 2, 3 would arrive 3.05, 4.10 s; dropping at 3 (shard 3 alone: 3.05 s) is best
    assert policy("sakura").keep_template(ctx(1e6, compute_layer=2, compute_t=2.0, now=2.0), 2)


@pytest.mark.parametrize(
    ("rate", "recompute"),
    [
        # asked first at 1.0 s: a quarter of a template pass (0.5 s) of waiting comes first; at 1.5 s, waiting:
        # shards 1..3 arrive 2.55, 3.60, 4.65 s -> step 0 ends 5.15 s; a template pass ends 1.5 + 2.0 + 3 x 0.5
        # = 5.0 s, sooner -> recompute
        (1e6, True),
        # at 16 Mbit/s the shards arrive 2.05, 2.60, 3.15 s -> step 0 ends 3.65 s < 5.0 s -> wait
        (2e6, False),
    ],
)
def test_sakura_recomputes_on_the_device_when_waiting_for_late_shards_is_slower(rate, recompute):
    p = policy("sakura")
    p.stall_budget = 1.0  # an allowance that does not bind here (the whole fetch-nothing latency)
    assert not p.recompute_late(
        ctx(rate, template_alive=False, compute_layer=1, compute_t=1.0, now=1.0, next_layer=4), 1
    )
    c = ctx(rate, template_alive=False, compute_layer=1, compute_t=1.5, now=1.5, next_layer=4)
    assert p.recompute_late(c, 1) is recompute


def test_sakura_upgrades_the_largest_distortion_drop_per_byte():
    p = policy("sakura")
    # layer 0 has s2 already (fp16 is not progressive); layer 2 has s1: s2 drops mse by 3e-3 per 1 MB
    assert p.upgrade(ctx(1e6, got={0: [(1, 1.0)], 2: [(0, 2.0)]})) == (2, 1)
    assert p.upgrade(ctx(1e6, got={0: [(1, 1.0)]})) is None  # nothing progressive left
    better = [S1, Level("s2", 2 * MB, 1 * MB, 0.0, 0.5e-3, progressive=True), FP16]  # drops 3.5e-3 per MB
    c = ctx(1e6, ladders=[LADDER, LADDER, LADDER, better], got={2: [(0, 2.0)], 3: [(0, 3.0)]})
    assert p.upgrade(c) == (3, 1)


# --- oracle: sakura's rules with exact transfer times from the trace ---


def test_oracle_plans_on_the_trace_without_probing():
    # a fresh estimator (no sample), an 8 Mbit/s trace: the oracle splits at 2 like sakura at 1e6 B/s would,
    # while sakura itself probes with shard 0
    c = ctx(None)
    d = policy("oracle").choose(c, 0)
    assert d.level == LEVEL_COMPUTE and "split at layer 2" in d.reason and "exact transfer times" in d.reason
    assert policy("sakura").choose(c, 0).level == 0
    assert policy("oracle").keep_template(c, 0)


def test_every_policy_is_tested_here():
    tested = {
        "on-device",
        "on-device-cached",
        "fetch-fp16",
        "free-kv",
        "cachegen",
        "throughput",
        "sakura",
        "oracle",
        "cachegen-no-floor",
    }  # cachegen-no-floor: tests/sakura_core/runtime/test_cachegen_floor.py
    assert set(POLICIES) == tested


def test_sakura_keeps_the_template_without_planning_when_a_drop_cannot_pay(monkeypatch):
    # fake device: full 1.0 s, cached 0.5 s per layer, 4 layers; at layer 2 a drop gains at most 2 x 0.5 = 1.0 s
    import sakura_core.policy.sakura as sakura_module

    calls = []
    real = sakura_module.best_plan
    monkeypatch.setattr(sakura_module, "best_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    # shard 2 not requested, 1 MB at 1e6 B/s behind a link busy until 2.5 s: decoded at 3.55 s, 1.55 s after compute
    # reaches layer 2 (2.0 s) > 1.0 s: keep, no plan made
    far = ctx(1e6, compute_layer=2, compute_t=2.0, now=2.0, next_layer=2, in_flight={1: 2.5}, got={0: [(0, 0.5)]})
    assert policy("sakura").keep_template(far, 2) and calls == []
    # the link idle: decoded at 3.05 s (1.05 s > 1.0 s): still no plan; in flight and due at 2.5 s: the plan decides
    assert policy("sakura").keep_template(ctx(1e6, compute_layer=2, compute_t=2.0, now=2.0, next_layer=2), 2)
    assert calls == []
    near = ctx(1e6, compute_layer=2, compute_t=2.0, now=2.0, next_layer=4, in_flight={2: 2.5, 3: 3.55})
    policy("sakura").keep_template(near, 2)
    assert calls

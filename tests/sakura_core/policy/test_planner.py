"""The receding-horizon planner and the sakura policy on small per-step worlds, every number by hand.

The world: per-step KV, 2 steps x 2 layers (shard g = step * 2 + layer); a layer with the template tokens takes 1.0 s
("full"), with the template KV injected 0.25 s ("cached"); a template-only pass 2.0 s; nothing outside the DiT.
Every shard's floor level is 1 MB (1e6 bytes); the round trip is 0 s. Unless a test says otherwise: now = 0,
compute at shard 0 with the template alive, nothing fetched, nothing decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.estimator import EstimatorConfig, ThroughputEstimator
from sakura_core.policy.ladder import Level
from sakura_core.policy.planner import Snapshot, best_plan
from sakura_core.policy.policies import LEVEL_COMPUTE, make_policy

MB = 1_000_000


@dataclass(frozen=True)
class Costs:
    layer_full_s: float = 1.0
    layer_cached_s: float = 0.25
    template_pass_s: float = 2.0
    fixed_s: float = 0.0
    steps: int = 2

    @property
    def model(self) -> Costs:
        return self


def _estimator(rate: float | None) -> ThroughputEstimator:
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1))
    if rate is not None:
        e.observe(rate, 1.0)
    return e


def _ladder(decode_s: float) -> list[Level]:
    return [Level("q", MB, MB, decode_s, 1e-4), Level("fp16", 4 * MB, 4 * MB, decode_s, 0.0)]


@dataclass
class World:
    estimator: ThroughputEstimator = field(default_factory=lambda: _estimator(None))
    trace: Trace = field(default_factory=lambda: Trace.constant(8))
    profile: Costs = field(default_factory=Costs)
    ladders: list[list[Level]] = field(default_factory=lambda: [_ladder(0.0)] * 4)
    floor: int = 0
    rtt_s: float = 0.0
    start_s: float = 0.0
    layers_per_step: int = 2
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
    got: dict = field(default_factory=dict)
    in_flight: dict = field(default_factory=dict)
    progress: tuple | None = None

    def flush_observations(self) -> None:
        """Samples go straight into the estimator."""

    def link_progress(self):
        return self.progress


def ctx(rate=None, **kw) -> Context:
    return Context(World(estimator=_estimator(rate), **kw))


def policy(name="sakura"):
    p = make_policy(name)
    p.reset()
    return p


def test_the_context_reads_the_per_step_shard_index():
    c = ctx(1e6)
    assert c.per_step and c.steps == 2 and [c.step_of(g) for g in range(4)] == [0, 0, 1, 1]
    assert [c.layer_of(g) for g in range(4)] == [0, 1, 0, 1]
    assert c.template_work_s == 4.0  # one 2.0 s template pass per step


def test_a_link_faster_than_decode_is_paced_by_the_decoder():
    # 1e15 B/s: every shard arrives at once; decoding takes 1.0 s each, one at a time.
    # splits (0,0): shards decoded at 1, 2, 3, 4 s -> layers end 1.25, 2.25, 3.25, 4.25 s;
    # (1,1): shards 1 and 3 decoded at 1, 2 s -> step 0: 1.0 (full), 1.25; step 1: 2.25 (full), 2.5 -> 2.5 s;
    # (2,0) ties at 2.5 s (step 0 all full: 2.0; shards 2, 3 at 1, 2 s: 2.25, 2.5); (2,2) = 4.0 s; the planner
    # takes the front-loaded cut (2,0) (its arrivals carry no 1e15-rate rounding, (1,1)'s end 1e-9 s later)
    c = ctx(1e15, ladders=[_ladder(1.0)] * 4)
    snap = Snapshot(c, 1e15)
    assert snap.finish((0, 0)) == pytest.approx(4.25)
    assert snap.finish((2, 0)) == pytest.approx(2.5)
    assert snap.finish((1, 1)) == pytest.approx(2.5)
    plan = best_plan(snap)
    assert plan.splits == (2, 0) and plan.finish_s == pytest.approx(2.5)


def test_a_template_cheaper_than_its_transfer_is_computed():
    # 1e5 B/s: a floor shard takes 10 s, a full layer 1.0 s: computing everything (4.0 s) wins
    c = ctx(1e5)
    plan = best_plan(Snapshot(c, 1e5))
    assert plan.splits == (2, 2) and plan.finish_s == pytest.approx(4.0)
    d = policy().choose(c, 1)
    assert d.level == LEVEL_COMPUTE and "no split: the device computes all" in d.reason
    # a later step's shard is only deferred (the link may still bring it while idle)
    later = policy().choose(c, 3)
    assert later.level == LEVEL_COMPUTE and later.defer and "asked again" in later.reason
    assert policy().keep_template(c, 0)


def test_a_fast_link_fetches_every_shard_and_prefetches_the_next_step():
    # 8e6 B/s: a shard takes 0.125 s; (0,0): ready 0.125, 0.25, 0.375, 0.5 -> layers end 0.375, 0.625, 0.875,
    # 1.125 s; a higher level (4 MB, 0.5 s) for shard 0 would end step 0 later -> the floor
    c = ctx(8e6)
    plan = best_plan(Snapshot(c, 8e6))
    assert plan.splits == (0, 0) and plan.finish_s == pytest.approx(1.125)
    d = policy().choose(c, 2)  # step 1's shard, asked while step 0 computes: fetched (prefetch)
    assert d.level == 0 and "steps 0-1 split at layer 0" in d.reason
    assert not policy().keep_template(c, 0)


def test_a_link_that_collapses_mid_step_keeps_the_template():
    # the estimate says 1e6 B/s and shard 1 was predicted at request to be ready at 3.2 s, but it has been in
    # flight 3.0 s with 0.1 MB received: the in-progress rate 1e5 / 3.0 = 33,333 B/s replaces the estimate, the
    # 0.9 MB left take 27 s: keep the template (step 0 ends at 4.0 s instead of ~30 s)
    base = dict(compute_layer=1, compute_t=3.0, now=3.0, next_layer=2, got={0: [(0, 1.0)]}, in_flight={1: 3.2})
    collapsed = ctx(1e6, progress=(3.0, 1e5, float(MB)), **base)
    assert collapsed.slowed(1e6) == pytest.approx(1e5 / 3.0)
    assert policy().keep_template(collapsed, 1)
    assert Snapshot(collapsed, collapsed.slowed(1e6)).known[1] == pytest.approx(3.0 + 9e5 / (1e5 / 3.0))
    # the same moment with the transfer on time (0.9 MB received in 0.9 s, due at 3.2 s): dropping would end step 0
    # at 3.45 s instead of 4.0 s, a 0.55 s gain; if the link died now, the device would wait a quarter of the
    # template pass from layer 1 (half a pass: 0.25 s), run it (1.0 s) and the cached layer: 4.5 s, a 0.5 s loss:
    # drop. Was that pass a whole one (4.0 s more, as before the hidden state was kept), the drop would wait.
    on_time = ctx(1e6, progress=(0.9, 9e5, float(MB)), **base)
    assert not policy().keep_template(on_time, 1)
    # shard 1 decoded already (nothing exposed to the link): drop (step 0 ends 3.25 s)
    there = ctx(1e6, **dict(base, got={0: [(0, 1.0)], 1: [(0, 2.9)]}, in_flight={}))
    assert not policy().keep_template(there, 1)


def _stalled(p, now, since=2.0, before=0.0, **extra):
    """Shard 1 (template dropped at layer 1) waited for since ``since`` with 0 bytes in, after ``before`` s of
    earlier waits; ``p.recompute_late`` at ``now``."""
    c = ctx(
        1e6,
        template_alive=False,
        dropped_at=1,
        compute_layer=1,
        next_layer=2,
        in_flight={1: 1e9},
        compute_t=now,
        now=now,
        progress=(now, 0.0, float(MB)),
        stalled_s=before + now - since,
        **extra,
    )
    return p.recompute_late(c, 1)


def test_a_0_kbit_stall_after_the_drop_recomputes_on_the_device():
    # template dropped at layer 1 of step 0 at t=1.0; shard 1 requested at 0, 0 bytes after 2.0 s: the
    # in-progress rate is 1 B / 2.0 s, waiting is hopeless -> the template pass resumed at layer 1 (the second half
    # of a pass, 1.0 s) + one cached layer; but a quarter of that (0.25 s) of waiting comes first (short outages
    # end by themselves) — with a waiting allowance that does not bind here (100 % of the fetch-nothing 5.0 s)
    p = policy()
    p.stall_budget = 1.0
    base = dict(template_alive=False, dropped_at=1, compute_layer=1, next_layer=2, in_flight={1: 1e9})
    stalled = ctx(1e6, compute_t=2.0, now=2.0, progress=(2.0, 0.0, float(MB)), **base)
    assert stalled.slowed(1e6) == pytest.approx(0.5)
    assert stalled.resume_pass_s() == pytest.approx(1.0) and stalled.fetch_nothing_s == pytest.approx(5.0)
    assert not _stalled(p, 2.0) and not _stalled(p, 2.2)
    assert _stalled(p, 2.3)
    # without the stall (shard 1 due at 2.2 s): wait (2.45 s) rather than recompute (3.25 s)
    fine = ctx(1e6, **dict(base, compute_t=2.0, now=2.0, in_flight={1: 2.2}))
    assert not policy().recompute_late(fine, 1)


def _budget(stall_budget: float):
    p = policy()
    p.stall_budget = stall_budget
    return p


def test_patience_ends_at_the_last_ask_inside_the_edits_waiting_allowance():
    # the runtime asks again a cached-layer time (0.25 s) later, so patience ends that much before the allowance.
    # The default allowance, 1.5 % of the fetch-nothing 5.0 s = 0.075 s, is shorter than that: the first ask gives up
    assert _stalled(policy(), 2.0)
    # an allowance of 6.5 % (0.325 s): 0.075 s of patience
    p = _budget(0.065)
    assert not _stalled(p, 2.0) and not _stalled(p, 2.05)
    assert _stalled(p, 2.08)  # 0.08 s waited > 0.075 s: the quarter pass (0.25 s) is not waited out
    # earlier waits used the allowance up: no patience at all, the first ask gives up (waiting is hopeless)
    assert _stalled(_budget(0.065), 2.0, before=0.075)
    # but a shard predicted soon is still waited for, allowance or not (2.45 s < 3.25 s)
    c = ctx(
        1e6,
        template_alive=False,
        dropped_at=1,
        compute_layer=1,
        next_layer=2,
        in_flight={1: 2.2},
        compute_t=2.0,
        now=2.0,
        stalled_s=1.0,
    )
    assert not policy().recompute_late(c, 1)


def test_the_oracle_plans_on_the_trace_itself():
    # a 64 Mbit/s trace (8e6 B/s) and no throughput sample: the oracle does not probe, it plans (0,0) like the
    # fast-link case; sakura probes with the floor level of the next step's first shard (step 0's waits for it)
    c = ctx(None, trace=Trace.constant(64))
    d = policy("oracle").choose(c, 0)
    assert d.level == 0 and "exact transfer times" in d.reason
    assert policy().choose(c, 0).defer and "waits for the bandwidth probe" in policy().choose(c, 1).reason
    assert policy().choose(c, 2).reason.startswith("bandwidth probe") and policy().choose(c, 2).level == 0


def test_without_a_trace_the_trace_readers_use_the_estimate():
    # a live link has no trace: the oracle cannot know the future and plans on the estimate (8e6 B/s, like the
    # fast-link case: fetch shard 0 at the floor), cachegen's rule reads the estimator's rate instead of a trace
    c = ctx(8e6, trace=None)
    assert not c.has_trace and c.link_rate_now() == pytest.approx(8e6)
    d = policy("oracle").choose(c, 0)
    assert d.level == 0 and "64.00 Mbit/s" in d.reason and "exact" not in d.reason
    with pytest.raises(ValueError, match="need a trace"):
        c.transfer_end(0.0, MB, None)
    g = policy("cachegen").choose(ctx(8e6, trace=None), 0)
    assert "64.00 Mbit/s" in g.reason  # 1 MB at 64 Mbit/s = 0.125 s < the per-shard budget

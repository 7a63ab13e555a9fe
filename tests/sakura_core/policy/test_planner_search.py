"""The planner's search against brute force on small random per-step worlds (seeded): the cut plans' closed-form
finishes equal the exact model, the search is optimal where front-loading is (every shard still to fetch costs the
same), and ``worth_asking`` never hides a shard ``choose`` would fetch."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.ladder import Level
from sakura_core.policy.planner import Snapshot, best_plan
from sakura_core.policy.policies import LEVEL_COMPUTE, make_policy

from .test_planner import MB, Costs, World, _estimator


@dataclass(frozen=True)
class CpuCosts(Costs):
    dit_cpu_cores: int = 0  # > 0: the DiT shares the CPU with decoding (a decode costs it decode_s / cores)


def _world(rng: random.Random, uniform: bool, known: bool, trace: Trace | None = None) -> tuple[Context, float]:
    S, L = rng.choice([2, 3, 4]), rng.choice([2, 3, 5])
    costs = CpuCosts(
        layer_full_s=1.0,
        layer_cached_s=rng.choice([0.1, 0.25, 0.5]),
        template_pass_s=2.0,
        steps=S,
        dit_cpu_cores=rng.choice([0, 0, 4]),
    )
    ladders = []
    for _ in range(S * L):
        b = MB if uniform else int(MB * rng.choice([0.5, 1.0, 2.0]))
        dec = 0.0 if uniform else rng.choice([0.0, 0.05, 0.3])
        ladders.append([Level("q", b, b, dec, 1e-4), Level("fp16", 4 * b, 4 * b, dec, 0.0)])
    rate = rng.choice([2e5, 5e5, 1e6, 2e6, 1e7])
    c, now = rng.randrange(S * L), rng.uniform(0, 5)
    got, in_flight = {}, {}
    if known:
        for g in range(c, S * L):
            r = rng.random()
            if r < 0.15:
                got[g] = [(0, now - rng.uniform(0, 1))]
            elif r < 0.25:
                in_flight[g] = now + rng.uniform(0, 5)
    alive = rng.random() < 0.6
    world = World(
        estimator=_estimator(rate),
        profile=costs,
        ladders=ladders,
        layers_per_step=L,
        compute_layer=c,
        compute_t=now + rng.uniform(0, 1),
        now=now,
        template_alive=alive,
        dropped_at=L if alive else c % L,
        next_layer=max([c, *[g + 1 for g in (*got, *in_flight)]]),
        got=got,
        in_flight=in_flight,
        rtt_s=rng.choice([0.0, 0.04]),
    )
    if trace is not None:
        world.trace = trace
    return Context(world), rate


def _exhaustive(snap: Snapshot) -> float:
    lo = snap.lows()
    return min(snap.finish(v) for v in itertools.product(*[range(x, snap.L + 1) for x in lo]))


def test_the_cut_plans_closed_form_is_the_exact_model():
    rng = random.Random(1)
    for _ in range(300):
        c, rate = _world(rng, uniform=rng.random() < 0.5, known=True)
        snap = Snapshot(c, rate)
        k0s = list(range(snap.l0, snap.L + 1)) if snap.alive else [snap.l0]
        for use_known, (cuts, finishes) in zip((False, True), snap.cut_table(k0s), strict=True):
            for k0, i, f in zip(k0s, cuts, finishes, strict=True):
                assert f == pytest.approx(snap.finish(snap.cut_splits(k0, int(i), use_known)), abs=1e-9)


def test_exact_finishes_reusing_the_last_chain_equal_a_fresh_snapshots():
    # the exact-transfer search (rate None) reuses the previous evaluation's transfer ends over the requests both
    # share: one snapshot evaluating split vectors one after another (neighbours, as the coordinate descent makes
    # them, and unrelated ones, with another level for the next shard) gives each the fresh snapshot's finish
    rng = random.Random(5)
    walk = Trace("walk", np.array([0.3, 0.5, 0.2, 1.0, 0.4]), np.array([4e5, 0.0, 2e6, 7e5, 1.2e6]))
    for _ in range(150):
        c, _ = _world(rng, uniform=rng.random() < 0.5, known=True, trace=walk)
        track = rng.random() < 0.5
        snap = Snapshot(c, None, track=track)
        v = [rng.randrange(lo, snap.L + 1) for lo in snap.lows()]
        for _ in range(12):
            i = rng.randrange(len(v))
            v[i] = rng.randrange(snap.lows()[i], snap.L + 1)
            first = rng.choice([None, 0.5 * MB, 3 * MB])
            want = Snapshot(c, None, track=track).finish(tuple(v), first)
            assert snap.finish(tuple(v), first) == want


def test_a_decode_on_the_dits_cores_costs_the_compute_lane_its_share():
    # 2 steps x 2 layers, 1e15 B/s (shards arrive at once), decode 0.4 s each, 4 cores: a fetched layer costs
    # 0.25 + 0.4 / 4 = 0.35 s. (0,0): decodes end 0.4, 0.8, 1.2, 1.6; layers end 0.75, 1.15, 1.55, 1.95 s
    world = World(
        estimator=_estimator(1e15), profile=CpuCosts(dit_cpu_cores=4), ladders=[[Level("q", MB, MB, 0.4, 1e-4)]] * 4
    )
    assert Snapshot(Context(world), 1e15).finish((0, 0)) == pytest.approx(1.95)
    world.profile = CpuCosts(dit_cpu_cores=0)  # not shared: 0.65, 1.05, 1.45, 1.85
    assert Snapshot(Context(world), 1e15).finish((0, 0)) == pytest.approx(1.85)


def test_with_equal_shards_and_nothing_requested_the_plan_is_optimal():
    # front-loading is optimal then (an exchange argument: see the planner's docstring), so the best cut is the
    # best split vector of all
    rng = random.Random(2)
    for _ in range(300):
        c, rate = _world(rng, uniform=True, known=False)
        snap = Snapshot(c, rate)
        assert best_plan(snap).finish_s == pytest.approx(_exhaustive(snap), abs=1e-9)


def test_the_plan_is_never_worse_than_the_previous_one():
    rng = random.Random(3)
    for _ in range(200):
        c, rate = _world(rng, uniform=rng.random() < 0.5, known=True)
        snap = Snapshot(c, rate)
        init = tuple(rng.randrange(lo, snap.L + 1) for lo in snap.lows())
        assert best_plan(snap, init).finish_s <= snap.finish(init) + 1e-9


def test_worth_asking_keeps_every_shard_choose_would_fetch():
    rng = random.Random(4)
    for _ in range(200):
        c, rate = _world(rng, uniform=rng.random() < 0.5, known=True)
        shards = list(range(c.compute_layer + 1, c.num_layers))
        p = make_policy("sakura")
        p.reset()
        kept = set(p.worth_asking(c, shards))
        for g in shards:
            d = p.choose(c, g)
            if g not in kept:
                assert d.level == LEVEL_COMPUTE and d.defer, (g, d)


def test_floor_arrays_and_known_ready_array_read_the_state():
    c, _ = _world(random.Random(5), uniform=False, known=True)
    nb, dec = c.floor_arrays()
    assert nb.tolist() == [lad[0].nbytes for lad in c._s.ladders]
    arr = c.known_ready_array()
    for g in range(c.num_layers):
        k = c.known_ready(g)
        assert (np.isnan(arr[g]) and k is None) or arr[g] == k

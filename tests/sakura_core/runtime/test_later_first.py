"""Per-step KV on slow links: a step two or more steps ahead of the compute lane fetches its planned layers last first
(``Sakura.later_first_from``), so a plan that later moves that step's split up still uses every shard fetched. Slow
3G-like walks of seeds the rule was not chosen on (950+; the development set is seed 300), the phone-CPU profile."""

from sakura_core.fetch.synth import slow_walk
from sakura_core.fetch.traces import Trace
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.simulate import simulate

from .test_policy_on_synthetic_links import FLOORS, LADDERS, PROFILE

L = PROFILE.model.layers
WALKS = [(0.8, 0.3, 1, 2), (1.5, 0.3, 1, 3), (1.2, 0.4, 2, 2), (2, 0.2, 0.5, 2)]


def _fetches(r) -> list[tuple[int, int]]:
    """(step, layer) of every fetch, in the order they took the wire."""
    return [divmod(e["layer"], L) for e in r.result.events if e["lane"] == "fetch"]


def _stranded_s(r) -> float:
    """Link seconds spent on shards the edit did not use (below their step's split)."""
    return sum(
        e["end"] - e["start"]
        for e in r.result.events
        if e["lane"] == "fetch" and e["layer"] % L < r.splits[e["layer"] // L]
    )


def test_the_last_step_is_fetched_from_its_last_layer_down_while_it_is_two_steps_ahead():
    r = simulate(make_policy("sakura"), Trace.constant(1.5), PROFILE, LADDERS, FLOORS)
    last = [lay for step, lay in _fetches(r) if step == 3]
    assert last[:5] == [24, 23, 22, 21, 20]  # last first (in execution order the first would be its split, 14)
    assert r.splits[3] == min(last) and r.splits[1:3] == [25, 25]
    waits = [d for d in r.result.decisions if str(d["reason"]).startswith("later layers of step 3 first")]
    assert waits and all(d["level"] == -1 for d in waits)


def test_in_execution_order_when_the_rule_is_off():
    pol = make_policy("sakura")
    pol.later_first_from = 10**6  # the rule before: every step in execution order
    r = simulate(pol, Trace.constant(1.5), PROFILE, LADDERS, FLOORS)
    last = [lay for step, lay in _fetches(r) if step == 3]
    assert last == sorted(last) and not any("later layers" in str(d["reason"]) for d in r.result.decisions)


def test_it_strands_less_link_time_and_ends_sooner_on_fresh_slow_walks():
    seed = 950
    stranded, before, latency, old_latency = 0.0, 0.0, [], []
    for i, params in enumerate(WALKS):
        trace = slow_walk(seed + i, *params)
        r = simulate(make_policy("sakura"), trace, PROFILE, LADDERS, FLOORS)
        old = make_policy("sakura")
        old.later_first_from = 10**6
        o = simulate(old, trace, PROFILE, LADDERS, FLOORS)
        stranded, before = stranded + _stranded_s(r), before + _stranded_s(o)
        latency.append(r.result.latency_s)
        old_latency.append(o.result.latency_s)
    assert stranded < 0.6 * before  # measured: 863 s of link stranded against 1742 s in execution order
    assert sum(latency) < 0.99 * sum(old_latency) and all(
        a <= 1.01 * b for a, b in zip(latency, old_latency, strict=True)
    )

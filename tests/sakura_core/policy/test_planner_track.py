"""The long-edit rule (``planner.track_priced``): where the open-loop floor costs more than ``TRACK_RATIO`` times the
closed-loop twins, sakura prices its plans on the twins' track and compares the held-split family beside the cuts.

The world: per-step KV, 6 steps x 4 layers of a small DiT; step 0 fetches ``lo`` (fp16 / 16), later steps its
closed-loop twin on the track (fp16 / ``twin_div``) or the open-loop ``hi`` (fp16 / ``open_div``) off it. A near
world (twins fp16 / 8, open floor fp16 / 4: 2x, as the serving store at 4 steps) and a far one (fp16 / 64 and fp16 / 2:
32x, as at 28 and 50 steps)."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import CrossStepLinks, Level, with_track_floor
from sakura_core.policy.planner import TRACK_RATIO, Snapshot, best_plan, track_priced
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import fixed_split_policy
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.sim_link import SimLink
from sakura_core.runtime.simulate import SimConfig, _Sim, simulate

G = DitGeometry.of(
    name="small", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32, steps=6
)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1, layer_overhead_s=1e-3), DeviceMemory(0), model=G)
FP = G.shard_bytes_fp16
N = G.steps * G.layers


def _ladders(twin_div: int, open_div: int) -> list[list[Level]]:
    out = []
    for g in range(N):
        step = g // G.layers
        ref = None if step == 0 else step - 1
        twin = (
            None
            if step == 0
            else Level("lo+cl", FP // twin_div, FP // twin_div, 1e-3, 1e-5 / N, links=CrossStepLinks(ref_step=ref))
        )
        out.append(
            [
                Level("lo", FP // 16, FP // 16, 1e-3, 1e-4 / N, links=CrossStepLinks(ref_step=ref, closed=twin)),
                Level("hi", FP // open_div, FP // open_div, 1e-3, 2e-5 / N, links=CrossStepLinks(ref_step=ref)),
                Level("fp16", FP, FP, 1e-3, 0.0),
            ]
        )
    return with_track_floor(out, "hi")


NEAR, FAR = _ladders(8, 4), _ladders(64, 2)


def _ctx(ladders, reroots: bool = True):
    """The context at the edit's start (compute at shard 0, the template alive, nothing fetched); ``reroots``: the
    runtime fetches re-root chains (the simulator does; the live lanes do not)."""
    sim = _Sim(fixed_split_policy(0), Trace.constant(8), 0.0, P, ladders, 0, SimConfig())
    sim.reroots = reroots
    return sim.ctx


def test_the_rule_holds_where_the_open_floor_costs_more_than_track_ratio_times_the_twins():
    assert TRACK_RATIO == 4.0
    assert track_priced(_ctx(FAR)) and not track_priced(_ctx(NEAR))
    assert track_priced(_ctx(_ladders(16, 3)))  # 16 / 3 = 5.3x
    assert not track_priced(_ctx(_ladders(16, 4)))  # exactly 4x: not more
    plain = [[Level("q", FP // 4, FP // 4, 1e-3, 1e-5), Level("fp16", FP, FP, 1e-3, 0.0)]] * N
    assert not track_priced(_ctx(plain))  # no twins: nothing to price


def test_sakura_prices_the_track_only_under_the_rule():
    sakura = make_policy("sakura")
    assert sakura.snapshot(_ctx(FAR), 1e6).track and not sakura.snapshot(_ctx(NEAR), 1e6).track
    assert not sakura.snapshot(_ctx(FAR), None).track  # the exact-transfer search (the oracle's) as before


@pytest.mark.parametrize("rate", [7.92e5, 1.58e6, 3.17e6])
def test_the_held_split_is_chosen_where_the_track_is_cheap(rate):
    """On the far world the best cut computes step 0 (or more) on the device and fetches every later shard: each
    layer it computed then costs the open-loop floor, 32x its twin (where the runtime does not re-root it: the live
    lanes). Priced on the track the planner holds one split for every step instead, and predicts (exactly, with the
    track's bytes) a far earlier finish."""
    ctx = _ctx(FAR, reroots=False)
    track = Snapshot(ctx, rate, track=True)
    cut = best_plan(Snapshot(ctx, rate))  # the planner before the rule
    held = best_plan(track)
    assert len(set(held.splits)) == 1 and len(set(cut.splits)) > 1
    assert held.finish_s == pytest.approx(track.finish(held.splits))
    assert held.finish_s < 0.5 * track.finish(cut.splits)


def test_on_the_near_world_plans_are_unchanged():
    """Below the ratio (the 4-step store) sakura's plans are the cut search's, priced on the track as before."""
    ctx = _ctx(NEAR)
    sakura = make_policy("sakura")
    for rate in (4e5, 1.6e6, 6.4e6):
        assert best_plan(sakura.snapshot(ctx, rate)) == best_plan(Snapshot(ctx, rate))


def test_a_long_edit_on_a_slow_link_finishes_sooner_with_the_rule(monkeypatch):
    """The whole edit, simulated without re-roots (as the live lanes run it): sakura on the far world against sakura
    with the rule switched off (the planner pricing every shard on its track): it keeps the layers on their track
    and ends no later."""
    monkeypatch.setattr(SimLink, "reroots", False)

    class NoRule(type(make_policy("sakura"))):
        @staticmethod
        def snapshot(ctx, rate, fetch_from=None):
            return Snapshot(ctx, rate, fetch_from)

    trace = Trace.constant(25)  # Mbit/s
    ladders = {"sakura": FAR}
    with_rule = simulate(make_policy("sakura"), trace, P, ladders, {"sakura": 0}, config=SimConfig())
    without = simulate(NoRule(), trace, P, ladders, {"sakura": 0}, config=SimConfig())
    assert with_rule.result.latency_s < without.result.latency_s
    assert with_rule.result.bytes_fetched < without.result.bytes_fetched


def test_on_the_far_world_the_probe_stays_in_the_running_step():
    """The next step's first shard is the probe only where it costs no more than the running step's last one as it
    would be fetched: here its reference is computed on the device, so its twin floor goes at the open-loop floor
    (8x step 0's last shard), and the probe is step 0's last shard."""
    r = simulate(make_policy("sakura"), Trace.constant(25), P, {"sakura": FAR}, {"sakura": 0}, config=SimConfig())
    probe = next(d for d in r.result.decisions if "bandwidth probe (no" in d["reason"])
    assert probe["layer"] == P.model.layers - 1
    first = min((e for e in r.result.events if e["lane"] == "fetch"), key=lambda e: e["start"])
    assert first["layer"] == P.model.layers - 1 and first["level"] == "lo"

"""The lanes' rules written once (runtime/lane_rules.py, runtime/deferral.py) and called by the live lanes and the
simulator: the split asked at a shard the policy computes for good, the waits for a late shard, the deferred shards
a fallback pass made, and a landed shard's decode. Each rule directly, then through the simulator."""

import math

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import LEVEL_COMPUTE, Decision, Policy
from sakura_core.runtime.deferral import ask_deferred, drop_made
from sakura_core.runtime.lane_rules import (
    RECHECK_MIN_S,
    ask_keep_template,
    decode_span,
    late_gives_up,
    late_recheck_s,
    late_wait_until,
)
from sakura_core.runtime.profiles import DeviceCompute, DeviceMemory, DeviceProfile, DitGeometry
from sakura_core.runtime.simulate import SimConfig, simulate


class _Asked(Policy):
    """Computes ``compute`` for good, defers ``defer`` (then computes them for good), fetches the rest at level 0;
    notes every ``keep_template`` asked and keeps the template while ``keep`` says so."""

    name = "asked"

    def __init__(self, compute=(), defer=(), keep=lambda g: False):
        self.compute, self.defer, self.keep = set(compute), set(defer), keep
        self.kept_asked: list[int] = []
        self.deferred_asked: list[int] = []

    def choose(self, ctx, g):
        if g in self.defer and g not in self.deferred_asked:
            return Decision(LEVEL_COMPUTE, "not now", defer=True)
        if g in self.compute or g in self.defer:
            return Decision(LEVEL_COMPUTE, "the device computes it")
        return Decision(0, "fetch")

    def worth_asking(self, ctx, shards):
        self.deferred_asked += shards
        return shards

    def keep_template(self, ctx, g):
        self.kept_asked.append(g)
        return self.keep(g)


def test_the_template_is_kept_without_asking_at_a_shard_the_policy_computes_for_good():
    pol = _Asked(keep=lambda g: g == 3)
    assert ask_keep_template(pol, None, 2, computed={2}) is True and pol.kept_asked == []
    assert ask_keep_template(pol, None, 3, computed={2}) is True and pol.kept_asked == [3]
    assert ask_keep_template(pol, None, 4, computed={2}) is False and pol.kept_asked == [3, 4]


def test_a_deferred_shard_computed_for_good_when_asked_again_joins_the_computed_ones():
    pol, deferred, computed = _Asked(defer={5, 6}), [1, 5, 6], set()
    pol.deferred_asked = [5, 6]  # asked before: now the policy computes them for good
    assert ask_deferred(pol, None, deferred, 2, computed) is None
    assert deferred == [] and computed == {5, 6}  # shard 1 was reached: dropped, not computed for good
    assert ask_keep_template(pol, None, 5, computed) is True and pol.kept_asked == []


def test_a_shard_a_fallback_pass_made_leaves_the_shards_still_to_ask_or_fetch():
    deferred, forced = [3, 5, 7], [5]
    for shards in (deferred, forced):
        drop_made(shards, {5, 6}.__contains__)
    assert deferred == [3, 7] and forced == []


def test_a_landed_shard_is_decoded_once_its_bytes_the_decoder_and_its_reference_are_there():
    assert decode_span(2.0, 0.5, 1.0) == (2.0, 2.5)  # the decoder was free: at once
    assert decode_span(2.0, 0.5, 3.0) == (3.0, 3.5)  # behind the decode before
    assert decode_span(2.0, 0.5, 1.0, reference_s=4.0) == (4.0, 4.5)  # a residual waits for its reference


def test_a_late_shard_is_asked_about_every_cached_layer_time_and_given_up_after_the_wait_allowance():
    assert late_recheck_s(0.25) == 0.25 and late_recheck_s(1e-6) == RECHECK_MIN_S  # a client's timer at least
    assert late_wait_until(10.0, 10.0, 0.25) == 10.25  # no allowance (the simulator's): every recheck
    assert late_wait_until(10.0, 10.5, 0.25, wait_s=0.6) == pytest.approx(10.6)  # the allowance ends first
    assert not late_gives_up(1.0, 1.5, 0.75) and late_gives_up(1.0, 1.75, 0.75)
    assert not late_gives_up(10.0, 1e9) and late_wait_until(0.0, 0.0, 1.0, math.inf) == 1.0


G = DitGeometry.of(name="tiny", layers=4, heads=4, head_dim=64, image_tokens=256, template_tokens=512, text_tokens=32)
P = DeviceProfile("dev", "soc", DeviceCompute(2e11, 0.1), DeviceMemory(0), model=G)  # single KV mode: one shard a layer
FP = G.shard_bytes_fp16
LADDERS = {"sakura": [[Level("q", FP // 6, FP // 6, 1e-3, 1e-5)]] * G.layers}


class _Late(_Asked):
    """Fetches every shard (drops the template at layer 0) and notes when it is asked about a late shard."""

    def __init__(self):
        super().__init__()
        self.late_asked: list[tuple[int, float]] = []

    def recompute_late(self, ctx, g):
        self.late_asked.append((g, ctx.now))
        return False


def test_the_simulator_asks_about_a_late_shard_at_the_wait_s_start_then_every_cached_layer_time():
    pol = _Late()
    r = simulate(pol, Trace.constant(0.5), P, LADDERS, {"sakura": 0}, config=SimConfig(rtt_s=0.0))
    asks = [t for g, t in pol.late_asked if g == 0]
    stall = next(e for e in r.result.events if e["lane"] == "stall" and e["layer"] == 0)
    recheck = late_recheck_s(P.layer_cached_s)
    assert len(asks) >= 3 and asks[0] == pytest.approx(stall["start"])
    assert [b - a for a, b in zip(asks, asks[1:], strict=False)] == pytest.approx([recheck] * (len(asks) - 1))


def test_the_simulator_never_asks_the_split_at_a_shard_the_policy_computes_for_good():
    # shards 0 and 1 computed in order, shard 2 deferred and computed for good when asked again (the link idles
    # once shard 3 is requested): the split is asked at shard 3 only, and drops there
    pol = _Asked(compute={0, 1}, defer={2}, keep=lambda g: g < 3)
    r = simulate(pol, Trace.constant(1000), P, LADDERS, {"sakura": 0}, config=SimConfig(rtt_s=0.0))
    assert pol.deferred_asked == [2] and pol.kept_asked == [3] and r.result.split_layer == 3

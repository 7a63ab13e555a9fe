"""The simulator's fetch lane with its requests sent ahead (``SimConfig.request_ahead``, the live lane's
``RuntimeConfig.request_ahead``), on a small world with every number by hand, and what the policy's predictions
charge for round trips in each mode."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.context import Context
from sakura_core.policy.ladder import Level
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.geometry import DitGeometry
from sakura_core.runtime.profiles import PROFILES, get_profile
from sakura_core.runtime.simulate import SimConfig, _Sim, simulate

GEO = DitGeometry.of(
    name="tiny4", layers=4, heads=1, head_dim=64, image_tokens=64, template_tokens=64, text_tokens=0, steps=1
)
CPU = PROFILES["snapdragon-8-elite-cpu"].with_geometry(GEO).with_fields(fixed_s=0.0, layer_overhead_s=1.0)
MB = 1_000_000
LADDERS = {"fp16": [[Level("q", MB, MB, 0.0, 1e-4)]] * 4}
FLOORS = {"fp16": 0}


def _fetches(ahead: bool) -> list[dict]:
    r = simulate(
        make_policy("fetch-fp16"),
        Trace.constant(8),
        CPU,
        LADDERS,
        FLOORS,
        config=SimConfig(rtt_s=0.04, request_ahead=ahead),
    )
    return [e for e in r.result.events if e["lane"] == "fetch"]


def test_one_request_at_a_time_pays_a_round_trip_each():
    # 1 MB at 8 Mbit/s = 1.0 s; each request leaves when the one before has arrived, its bytes 0.04 s later
    f = _fetches(False)
    assert [round(e["start"], 6) for e in f] == [0.0, 1.04, 2.08, 3.12]
    assert [round(e["end"], 6) for e in f] == [1.04, 2.08, 3.12, 4.16]


def test_requests_sent_ahead_hide_the_round_trip_behind_the_transfer_before():
    # shard 0 is the bandwidth probe: shard 1's request waits for its sample (1 MB/s: a window of 2 round trips =
    # 80 kB) and leaves at 1.04, bytes 1.08-2.08; shard 2's leaves once 80 kB are left to come (2.00), its bytes
    # follow shard 1's last (2.08-3.08); shard 3's leaves at 3.00 and arrives 4.08: two round trips paid, not four,
    # one transfer on the wire at a time, each request decided 80 ms before the wire needs it
    f = _fetches(True)
    assert [round(e["start"], 6) for e in f] == [0.0, 1.04, 2.0, 3.0]
    assert [round(e["end"], 6) for e in f] == [1.04, 2.08, 3.08, 4.08]


def test_short_transfers_keep_several_requests_ahead():
    # 20 kB shards at 8 Mbit/s (20 ms each) behind a 40 ms round trip: one request ahead would leave the wire idle
    # 20 ms a shard; the window (80 kB) sends shards 2 and 3 with shard 1 (at 0.06, the probe's arrival), and the
    # transfers follow back to back
    lad = {"fp16": [[Level("q", 20_000, 20_000, 0.0, 1e-4)]] * 4}
    r = simulate(
        make_policy("fetch-fp16"),
        Trace.constant(8),
        CPU,
        lad,
        FLOORS,
        config=SimConfig(rtt_s=0.04, request_ahead=True),
    )
    ends = [round(e["end"], 6) for e in r.result.events if e["lane"] == "fetch"]
    assert ends == [0.06, 0.12, 0.14, 0.16]  # the probe, the one after it (its round trip), then back to back
    assert [round(e["start"], 6) for e in r.result.events if e["lane"] == "fetch"] == [0.0, 0.06, 0.06, 0.06]


def test_the_policy_is_charged_a_queued_round_trip_only_when_requests_go_one_at_a_time():
    for ahead, queued in ((False, 0.04), (True, 0.0)):
        sim = _Sim(
            make_policy("fetch-fp16"),
            Trace.constant(8),
            0.0,
            CPU,
            LADDERS["fp16"],
            0,
            SimConfig(rtt_s=0.04, request_ahead=ahead),
        )
        ctx = Context(sim)
        assert ctx.rtt_s == 0.04 and ctx.queued_rtt_s == queued
        assert ctx.first_byte_t() == pytest.approx(0.04)  # an idle link: a round trip either way
        sim._transfer(0, 0, MB, "base")  # on the wire until 1.04
        sim.now = 0.5
        busy = ctx.link_busy_until()  # its predicted end (the estimator's prior rate; never the true arrival)
        assert busy > 0.5 and ctx.first_byte_t() == pytest.approx(busy + queued)


def test_the_bench_flag_chooses_the_mode_and_the_command_records_it():
    import argparse

    from sakura_tools.bench import cli_e2e, cli_regime, e2e_args

    for mod in (cli_e2e, cli_regime):
        parser = argparse.ArgumentParser()
        mod.add_arguments(parser)
        base = ["--json", "out.json"]
        for flag, ahead in ((["--requests", "sequential"], False), ([], True), (["--requests", "ahead"], True)):
            args = parser.parse_args(base + flag)
            assert e2e_args.sim_config(args).request_ahead is ahead
            argv = mod._argv(args)
            assert argv[argv.index("--requests") + 1] == ("ahead" if ahead else "sequential")
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--requests", "parallel"])


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("kb", [20, 1000])
def test_the_oracles_exact_model_times_a_plan_as_the_simulator_runs_it(ahead, kb):
    # the oracle searches plans on Snapshot.finish with exact transfer times: it must charge the round trips the
    # lane pays (with requests ahead: the probe's and the one after it, none queued), or a plan it thinks lands a
    # shard before the link slows lands it after (a 4x-slower step in the middle of the edit)
    from sakura_core.policy.planner import Snapshot
    from sakura_core.runtime.oracle import fixed_split_policy

    lad = [[Level("q", kb * 1000, kb * 1000, 0.0, 1e-4)]] * 4
    trace = Trace("step", [1.0, 1.0, 1e6], [1e6, 0.25e6, 1e6])
    cfg = SimConfig(rtt_s=0.04, request_ahead=ahead)
    probe = _Sim(fixed_split_policy(0), trace, 0.0, CPU, lad, 0, cfg)
    snap = Snapshot(probe.ctx, None)
    for plan in ((0,), (1,), (2,), (3,)):
        ran = simulate(fixed_split_policy(list(plan)), trace, CPU, {"sakura": lad}, {"sakura": 0}, config=cfg)
        assert snap.finish(plan) == pytest.approx(ran.result.latency_s, abs=1e-6), plan


@pytest.mark.parametrize("ahead", [False, True])
def test_an_upgrade_on_its_way_is_not_asked_for_again(ahead):
    # the policy's fetched levels count what is requested, decoded or not: the same upgrade asked again while its
    # bytes (or its decode) are on their way was fetched twice, and with requests ahead asked for ever at one instant
    import json
    from pathlib import Path

    from sakura_tools.bench.e2e_ladders import ShardLadders

    path = Path(__file__).parents[3] / "docs" / "results" / "ladders" / "phone-dit-512.per-step.json"
    lad, fl = ShardLadders.from_dict(json.loads(path.read_text())).for_simulator()
    prof = get_profile("snapdragon-8-elite-cpu", "phone-dit-512")  # a fast link: the idle link upgrades
    r = simulate(make_policy("sakura"), Trace.constant(2000), prof, lad, fl, config=SimConfig(request_ahead=ahead))
    ups = [(d["layer"], d["level"]) for d in r.result.decisions if d["reason"] == "upgrade"]
    assert ups and len(ups) == len(set(ups))

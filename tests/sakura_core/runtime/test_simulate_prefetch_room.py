"""The simulator's prefetch room (``SimConfig.prefetch_kv_bytes``, the live lane's ``RuntimeConfig`` twin): a later
step's shard is fetched only while the KV decoded for later steps leaves room for it; the running step's never wait."""

import json
from pathlib import Path

import pytest

from sakura_core.cli import main
from sakura_core.fetch.traces import Trace
from sakura_core.policy.policies import make_policy
from sakura_core.runtime.oracle import fixed_split_policy
from sakura_core.runtime.profiles import get_profile
from sakura_core.runtime.sim_ladders import ShardLadders
from sakura_core.runtime.simulate import SimConfig, simulate
from sakura_tools.bench.e2e import sim_ladders

LADDERS = Path(__file__).resolve().parents[3] / "docs" / "results" / "ladders"


@pytest.fixture(scope="module")
def phone_dit():
    """The phone-class DiT on the phone CPU, per-step KV (4 steps x 24 layers), sakura's cross-step ladders."""
    lad = ShardLadders.from_dict(json.loads((LADDERS / "phone-dit-512.per-step.json").read_text()))
    prof = get_profile("snapdragon-8-elite-cpu", "phone-dit-512")
    return prof, *sim_ladders(lad, "per-step", prof.model)


def _step_starts(r, L: int, steps: int) -> list[float]:
    """When the compute lane entered each step (its first compute or stall on a shard of that step; step 0 at 0)."""
    lane = [e for e in r.result.events if e["lane"] in ("compute", "stall")]
    return [0.0] + [min(e["start"] for e in lane if s * L <= e["layer"] < (s + 1) * L) for s in range(1, steps)]


def _later_held_peak(r, L: int) -> int:
    """The most shards of later steps than the running one held decoded at once (a shard from its decode's end)."""
    starts = _step_starts(r, L, len(r.splits))
    decoded = {}
    for e in r.result.events:
        if e["lane"] == "decode":
            decoded.setdefault(e["layer"], e["end"])
    peak = 0
    for t in sorted({*decoded.values(), *starts}):
        running = max(s for s, t0 in enumerate(starts) if t0 <= t)
        peak = max(peak, sum(1 for g, t1 in decoded.items() if t1 <= t and g // L > running))
    return peak


def test_no_room_means_no_shard_before_its_step_and_ample_room_changes_nothing(phone_dit):
    prof, lad, fl = phone_dit
    L, steps = prof.model.layers, prof.model.steps
    fast = Trace.constant(200.0)  # fetching everything early would pay: without a limit later steps are prefetched
    free = simulate(fixed_split_policy(0), fast, prof, lad, fl, 0.0, SimConfig())
    assert _later_held_peak(free, L) > 10
    roomy = simulate(fixed_split_policy(0), fast, prof, lad, fl, 0.0, SimConfig(prefetch_kv_bytes=10**15))
    assert (
        roomy.result.latency_s == free.result.latency_s and roomy.result.events == free.result.events
    )  # room never short: the same run
    none = simulate(fixed_split_policy(0), fast, prof, lad, fl, 0.0, SimConfig(prefetch_kv_bytes=0))
    starts = _step_starts(none, L, steps)
    for e in none.result.events:
        if e["lane"] == "fetch":
            assert e["start"] >= starts[e["layer"] // L] - 1e-9, e  # requested once its step runs, not before
    assert _later_held_peak(none, L) == 0 and none.result.latency_s >= free.result.latency_s - 1e-9
    assert none.result.peak_kv_bytes < free.result.peak_kv_bytes


@pytest.mark.parametrize("shards", [1, 3])
def test_a_room_of_k_shards_holds_at_most_k_of_later_steps(phone_dit, shards):
    prof, lad, fl = phone_dit
    room = shards * prof.model.shard_bytes_fp16
    for policy in ("sakura", "cachegen"):
        r = simulate(make_policy(policy), Trace.constant(200.0), prof, lad, fl, 0.0, SimConfig(prefetch_kv_bytes=room))
        assert _later_held_peak(r, prof.model.layers) <= shards, policy


def test_a_negative_room_is_refused_by_the_config_and_the_cli(tmp_path):
    with pytest.raises(ValueError, match="prefetch_kv_bytes must be >= 0"):
        SimConfig(prefetch_kv_bytes=-1)
    with pytest.raises(SystemExit, match="--prefetch-gib must be >= 0 GiB, got -1.0"):
        main(
            [
                "bench",
                "e2e",
                "--mode",
                "sim",
                "--prefetch-gib",
                "-1",
                "--no-calibrate",
                "--kv-mode",
                "per-step",
                "--ladders",
                str(LADDERS),
                "--json",
                str(tmp_path / "x.json"),
            ]
        )

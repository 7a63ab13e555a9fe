"""CacheGen held to sakura's quality floor in both KV modes (issue 50, item 3): a level under the floor is never
chosen; when none of its levels reaches it, its ladder's floor is the exact fp16, which its rule fetches when it fits
the per-chunk budget and recomputes otherwise; the old rule stays beside it once as ``cachegen-no-floor``."""

import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.policy.plan import policy_levels, runnable_policies
from sakura_core.policy.policies import LEVEL_COMPUTE, make_policy
from sakura_core.runtime.profiles import PHONE_DIT, PROFILES
from sakura_core.runtime.sim_ladders import CACHEGEN_NO_FLOOR, FamilyLadders, ShardLadders, held_to_floor
from sakura_core.runtime.simulate import simulate
from sakura_tools.bench.e2e_report import select_policies

FP = PHONE_DIT.shard_bytes_fp16
CPU = PROFILES["snapdragon-8-elite-cpu"]
L = PHONE_DIT.layers
MBIT = 1e6 / 8


def _family(names, ratios, mse_total, floor, shards=L):
    """Every shard alike: level j is ``FP / ratios[j]`` bytes, the edit's MSE with every shard at it ``mse_total[j]``."""
    n = len(names)
    return FamilyLadders(
        tuple(names),
        (False,) * n,
        floor,
        bytes=tuple(tuple(int(FP / r) for r in ratios) for _ in range(shards)),
        increment_bytes=tuple(tuple(int(FP / r) for r in ratios) for _ in range(shards)),
        decode_s=tuple((1e-3,) * n for _ in range(shards)),
        mse=tuple(tuple(m / shards for m in mse_total) for _ in range(shards)),
    )


def _lad(cachegen_mse):
    # PSNR = 10 log10(4 / mse): 1e-2 -> 26 dB, 4e-3 -> 30 dB, 4e-4 -> 40 dB; fp16 4e-8 -> 80 dB
    fams = {
        "cachegen": _family(["c0", "c1"], [8.0, 5.0], cachegen_mse, floor=1),
        "fp16": _family(["fp16"], [1.0], [4e-8], floor=0),
        "sakura": _family(["s0", "fp16"], [10.0, 1.0], [4e-4, 4e-8], floor=0),
    }
    return ShardLadders("phone-dit-512", "single", L, PHONE_DIT.steps, fams)


def test_a_family_under_the_floor_gets_the_exact_level_as_its_floor():
    low = _lad([1e-2, 4e-3])  # best level 30 dB < 35
    held = held_to_floor(low.families["cachegen"], low.families["fp16"], 35.0)
    assert held.levels == ("c0", "c1", "fp16") and held.floor == 2  # old: floor c1 at 30 dB
    assert held.psnr_db()[held.floor] >= 35.0
    assert held.bytes[0][2] == FP and held.progressive[2] is False
    ok = _lad([1e-2, 4e-4])  # c1 reaches 40 dB: unchanged
    assert held_to_floor(ok.families["cachegen"], ok.families["fp16"], 35.0) is ok.families["cachegen"]
    with pytest.raises(ValueError, match="already in the family"):
        held_to_floor(low.families["sakura"], low.families["fp16"], 90.0)


def test_the_simulator_gets_the_held_cachegen_and_the_old_rule_beside_it():
    ladders, floors = _lad([1e-2, 4e-3]).for_simulator()
    assert [lv.name for lv in ladders["cachegen"][0]] == ["c0", "c1", "fp16"] and floors["cachegen"] == 2
    assert [lv.name for lv in ladders[CACHEGEN_NO_FLOOR][0]] == ["c0", "c1"] and floors[CACHEGEN_NO_FLOOR] == 1


def _levels(result, ladder) -> set[str]:
    """The level names (or "compute") a run's decisions chose."""
    out = set()
    for d in result.result.decisions:
        if d["level"] == LEVEL_COMPUTE:
            out.add("compute")
        elif isinstance(d["level"], int):
            out.add(ladder[d["level"]].name)
    return out


def test_held_cachegen_fetches_fp16_or_recomputes_never_a_level_under_the_floor():
    ladders, floors = _lad([1e-2, 4e-3]).for_simulator()
    budget = CPU.template_pass_s / L  # the per-chunk budget of its rule (no latency target)
    # c1 (FP / 5) fits the budget, fp16 does not: the old rule fetches c1 (30 dB), the held one recomputes
    mid = Trace.constant(FP / 5 / (0.5 * budget) / MBIT)
    assert FP / (FP / 5 / (0.5 * budget)) > budget
    old = simulate(make_policy(CACHEGEN_NO_FLOOR), mid, CPU, ladders, floors)
    held = simulate(make_policy("cachegen"), mid, CPU, ladders, floors)
    assert _levels(old, ladders[CACHEGEN_NO_FLOOR][0]) == {"c1"} and old.psnr_db < 35.0
    assert _levels(held, ladders["cachegen"][0]) == {"compute"} and held.result.bytes_fetched == 0
    # fp16 fits the budget: the held rule fetches it, at the exact level's PSNR
    fast = Trace.constant(FP / (0.5 * budget) / MBIT)
    held = simulate(make_policy("cachegen"), fast, CPU, ladders, floors)
    assert _levels(held, ladders["cachegen"][0]) == {"fp16"} and held.psnr_db >= 35.0


def test_live_cachegen_sees_fp16_only_when_none_of_its_levels_reaches_the_floor():
    names = ["cachegen-l0", "cachegen-l1", "fp16"]
    assert policy_levels(names, "cachegen", {"cachegen-l0": 20.0, "cachegen-l1": 29.2, "fp16": 80.0}) == [0, 1, 2]
    assert policy_levels(names, "cachegen", {"cachegen-l0": 20.0, "cachegen-l1": 36.1, "fp16": 80.0}) == [0, 1]
    assert policy_levels(names, "cachegen") == [0, 1]  # no PSNR measured: nothing to hold it to


def test_the_old_rule_is_simulation_only():
    assert CACHEGEN_NO_FLOOR not in runnable_policies()
    assert CACHEGEN_NO_FLOOR in select_policies("all", "sim")
    assert CACHEGEN_NO_FLOOR not in select_policies("all", "live")

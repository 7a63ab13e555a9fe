"""The quality floor and a policy's ladders for one manifest (policy/plan.py), on a tiny hand-written manifest."""

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.policy.plan import FLOOR_PSNR_DB, floor_index, plan_fetch, policy_levels, runnable_policies

NAMES = ["s1", "s2", "fp16"]
PSNR_DB = {"s1": 30.0, "s2": 40.0, "fp16": None}


def manifest() -> dict:
    """Two one-layer shards with s1 (10 B, 30 dB), s2 (s1 + 5 B, 40 dB) and fp16 (64 B, no PSNR measured)."""
    shards = []
    for i in range(2):
        reps = [
            {"name": "s1", "level": 0, "bytes": 10, "digest": f"a{i}", "distortion": 0.03, "psnr_db": 30.0},
            {
                "name": "s2",
                "level": 1,
                "bytes": 5,
                "digest": f"b{i}",
                "requires": [f"a{i}"],
                "distortion": 0.01,
                "psnr_db": 40.0,
            },
            {"name": "fp16", "level": 2, "bytes": 64, "digest": f"f{i}", "distortion": 0.0},
        ]
        shards.append({"layers": [i, i], "representations": reps})
    return {"num_layers": 2, "token_grid": [2, 2], "heads": 1, "head_dim": 4, "shards": shards}


@pytest.mark.parametrize(
    ("floor_db", "index"),
    [
        (FLOOR_PSNR_DB, 1),  # 35 dB: s1 (30 dB) is below, s2 (40 dB) the cheapest above
        (25.0, 0),  # s1 qualifies
        (40.0, 1),  # reaching the floor exactly qualifies
        (45.0, 2),  # none qualifies: the last (exact) level, fp16, even without a PSNR
    ],
)
def test_floor_is_the_cheapest_level_reaching_the_psnr(floor_db, index):
    assert floor_index(NAMES, PSNR_DB, floor_db) == index


def test_levels_without_a_measured_psnr_are_skipped():
    assert floor_index(NAMES, {"s1": None, "s2": 36.0}) == 1
    assert floor_index(NAMES, {}) == 2


def test_policy_levels_per_family():
    assert policy_levels(NAMES, "fp16") == [2]  # only the exact representation
    assert policy_levels(NAMES, "cachegen") == [0, 1]  # its own levels, not the fp16 reference
    assert policy_levels(NAMES, "sakura") == [0, 1, 2]
    # a serving-profile store keeps no fp16: the nearest rung it holds, its top (by track PSNR where given)
    assert policy_levels(["s1", "s2"], "fp16") == [1]
    assert policy_levels(["s1", "s2", "s3"], "fp16", {"s1": 30.0, "s2": 48.0, "s3": 40.0}) == [1]


@pytest.mark.parametrize(
    ("policy", "names", "floor_name"),
    [
        ("sakura", ["s1", "s2", "fp16"], "s2"),  # 35 dB floor: s2 (40 dB)
        ("cachegen", ["s1", "s2"], "s2"),
        ("fetch-fp16", ["fp16"], "fp16"),  # one level, no PSNR: the floor is that level
    ],
)
def test_plan_fetch_keeps_the_policys_levels_and_its_floor(policy, names, floor_name):
    plan = plan_fetch(unchecked_manifest(manifest()), policy)
    assert plan.policy.name == policy
    assert [[lv.name for lv in lad] for lad in plan.ladders] == [names, names]
    assert [[r.rep.name for r in lad] for lad in plan.rungs] == [names, names]
    assert plan.floor_name == floor_name and plan.ladders[0][plan.floor].name == floor_name
    assert plan.ladders[0][0].decode_s == pytest.approx(64 / 6e8)  # 64 B decoded at the default 6e8 B/s


def test_plan_fetch_names_an_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy 'fast'; choose from on-device"):
        plan_fetch(unchecked_manifest(manifest()), "fast")


def test_runnable_policies_leave_out_the_preloaded_bound():
    assert runnable_policies() == [
        "on-device",
        "on-device-cached",
        "fetch-fp16",
        "cachegen",
        "throughput",
        "sakura",
        "oracle",
    ]

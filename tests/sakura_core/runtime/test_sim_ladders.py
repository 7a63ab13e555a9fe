"""The simulator's ladder input (ShardLadders): units, validation, JSON round trip, and what the simulator gets."""

import json

import pytest

from sakura_core.runtime.sim_ladders import FamilyLadders, ShardLadders


def _family(shards=4, floor=1):
    return FamilyLadders(
        levels=("a", "b", "fp16"),
        progressive=(True, True, False),
        floor=floor,
        bytes=tuple((100 + g, 300 + g, 1000) for g in range(shards)),
        increment_bytes=tuple((100 + g, 200, 1000) for g in range(shards)),
        decode_s=tuple((0.01, 0.02, 0.005) for _ in range(shards)),
        mse=tuple((1e-3, 1e-4, 0.0) for _ in range(shards)),
        reference=tuple((None, None, None) for _ in range(shards)),
    )


def test_round_trip_and_the_simulators_view():
    lad = ShardLadders("g", "per-step", layers=2, steps=2, families={"sakura": _family()}, source={"how": "hand"})
    back = ShardLadders.from_dict(json.loads(json.dumps(lad.as_dict())))
    assert back == lad
    ladders, floors = back.for_simulator()
    assert floors == {"sakura": 1}
    assert ladders["sakura"][3][1].nbytes == 303 and ladders["sakura"][3][1].increment_bytes == 200
    assert ladders["sakura"][0][2].progressive is False and ladders["sakura"][2][0].decode_s == 0.01
    # the PSNR of every shard at a level: the summed MSE shares (4 x 1e-3 -> 10 log10(4 / 4e-3) = 30 dB)
    assert back.families["sakura"].psnr_db()[0] == pytest.approx(30.0)


def test_bad_ladders_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="has 4 shards, the geometry needs 6"):
        ShardLadders("g", "per-step", layers=3, steps=2, families={"sakura": _family()})
    with pytest.raises(ValueError, match="floor in 0..2"):
        _family(floor=3)
    with pytest.raises(ValueError, match="bytes must have one row of 3 values"):
        FamilyLadders(("a", "b", "c"), (False,) * 3, 0, ((1, 2),), ((1, 2, 3),), ((0, 0, 0),), ((0, 0, 0),))
    with pytest.raises(ValueError, match="not a sakura-sim-ladders file"):
        ShardLadders.from_dict({"format": "other"})
    with pytest.raises(ValueError, match="version 9 is not supported"):
        ShardLadders.from_dict({"format": "sakura-sim-ladders", "version": 9})

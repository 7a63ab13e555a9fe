"""DecodeLane: an upgrade of a shard the compute lane served while its blobs came is dropped (nothing to decode onto,
of no use); an upgrade whose decoder is missing for any other reason is an error, as before."""

import types

import pytest
from typed_manifests import unchecked_manifest

from sakura_core.runtime.decode_lane import DecodeLane
from sakura_core.runtime.shard_index import ShardGrid

GRID = ShardGrid(2, 2, True)


def _lane() -> DecodeLane:
    st = types.SimpleNamespace(now=0.0)  # the lane reads only the clock before it decodes
    manifest = unchecked_manifest({"kv_mode": "per-step", "schedule": {"steps": 2}})
    return DecodeLane(manifest, [[]] * len(GRID), st, log=None, threads=1)


def test_an_upgrade_of_a_served_shard_decodes_nothing():
    lane = _lane()
    lane.release([GRID[1]])
    assert lane.decode_now(GRID[1], 1, ["a", "b"], [b"blob"], start=1) is None


def test_a_late_upgrade_not_kept_is_dropped_too():
    lane = _lane()
    lane.forget(GRID[2])
    assert lane.decode_now(GRID[2], 1, ["a", "b"], [b"blob"], start=1) is None


def test_an_upgrade_without_its_decoder_of_a_shard_not_served_is_an_error():
    lane = _lane()
    lane.release([GRID[0]])  # another shard
    with pytest.raises(RuntimeError, match="no longer holds the chain prefix"):
        lane.decode_now(GRID[1], 1, ["a", "b"], [b"blob"], start=1)


def test_reset_forgets_the_served_shards():
    lane = _lane()
    lane.release([GRID[1]])
    lane.reset()
    with pytest.raises(RuntimeError, match="no longer holds the chain prefix"):
        lane.decode_now(GRID[1], 1, ["a", "b"], [b"blob"], start=1)

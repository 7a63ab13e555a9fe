"""ShardId / ShardGrid: the runtime's typed shard index, (step, layer) with the flat g of the policy protocol."""

import pytest

from sakura_core.runtime.shard_index import ShardGrid, ShardId


def test_per_step_shards_are_steps_times_layers_in_execution_order():
    grid = ShardGrid.for_edit(layers=3, steps=2, per_step=True)
    assert len(grid) == 6
    assert [(s.step, s.layer) for s in grid] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert grid[4] == ShardId(g=4, step=1, layer=1) and str(grid[4]) == "shard 4"
    assert grid.at(1, 2).g == 5 and grid.at(-1, 1).g == 1  # before the first layer: step 0
    assert [grid.step_end(s) for s in (-1, 0, 1)] == [3, 3, 6]


def test_single_mode_has_one_shard_per_layer_for_every_step():
    grid = ShardGrid.for_edit(layers=3, steps=4, per_step=False)
    assert len(grid) == 3 and grid.kv_steps == 1
    assert grid.at(3, 2) == grid[2] == ShardId(2, 0, 2)  # step 3 uses the layer's one KV
    assert grid.step_end(3) == 3


def test_shards_order_and_hash_by_index():
    grid = ShardGrid.for_edit(layers=2, steps=2, per_step=True)
    assert sorted([grid[3], grid[0], grid[2]]) == [grid[0], grid[2], grid[3]]
    assert {grid[1]: "x"}[ShardId(1, 0, 1)] == "x"


def test_bad_grids_and_indices_are_refused():
    with pytest.raises(IndexError, match="shard index 6 out of range: the edit has 6 shards"):
        ShardGrid.for_edit(3, 2, True)[6]
    with pytest.raises(ValueError, match="1 in single mode"):
        ShardGrid(layers=3, kv_steps=2, per_step=False)
    with pytest.raises(ValueError, match="0 layers"):
        ShardGrid(layers=0, kv_steps=1, per_step=False)

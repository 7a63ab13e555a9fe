"""HeldKV's cross-step references: a passed shard stays held only while a shard with a residual level against it may
still be fetched; the device's own template KV serves as a reference; a residual without one is refused."""

import pytest
import torch

from sakura_core.kv.chain import MissingReferenceError
from sakura_core.kv.manifest import CrossStepRef, Representation
from sakura_core.policy.ladder import CrossStepLinks, Level
from sakura_core.runtime.held_kv import HeldKV
from sakura_core.runtime.shard_index import ShardGrid

L, STEPS = 3, 3
GRID = ShardGrid(L, STEPS, True)


def _ladders(residual: bool) -> list[list[Level]]:
    """Step s >= 1 has a residual level against step s-1 (when ``residual``) below its exact level."""
    out = []
    for shard in GRID:
        exact = Level("fp16", 100, 100, 0.0, 0.0)
        if residual and shard.step >= 1:
            out.append([Level("sakura-l0", 10, 10, 0.0, 1e-3, links=CrossStepLinks(ref_step=shard.step - 1)), exact])
        else:
            out.append([exact])
    return out


def _kv(x: float):
    return torch.full((4, 2, 2), x, dtype=torch.float16), torch.full((4, 2, 2), -x, dtype=torch.float16)


def _residual_rep(step: int) -> Representation:
    return Representation(0, "sakura-l0", 10, "e" * 64, ref=CrossStepRef("residual", step, "d" * 64))


def _publish(held: HeldKV, g: int, x: float) -> None:
    held.publish(GRID[g], *_kv(x), level=1)
    held.set_ready(GRID[g])


def test_a_passed_shard_is_kept_while_the_next_steps_residual_may_need_it():
    held = HeldKV(GRID, _ladders(residual=True))
    _publish(held, 0, 1.0)  # step 0 layer 0
    held.release_before(L)  # the compute lane enters step 1: (1, 0) is not decoded yet
    assert held.is_held(GRID[0]) and held.kv_bytes == held.held_bytes() > 0
    ref = held.reference_for(GRID[L], _residual_rep(0))
    assert ref.step == 0 and ref.k.shape == (1, 4, 2, 2) and float(ref.k.max()) == 1.0 and float(ref.v.min()) == -1.0
    _publish(held, L, 2.0)  # the residual is decoded: the reference is freed at the next release
    held.release_before(L + 1)
    assert not held.is_held(GRID[0]) and held.kv_bytes == held.held_bytes()


def test_a_reference_is_freed_once_its_dependent_is_passed_or_given_up():
    held = HeldKV(GRID, _ladders(residual=True))
    _publish(held, 1, 1.0)  # step 0 layer 1
    held.release_before(L)
    assert held.is_held(GRID[1])
    held.give_up(GRID[L + 1])  # the device computes (1, 1): its reference is not needed any more
    held.release_before(L + 1)
    assert not held.is_held(GRID[1])
    _publish(held, 2, 1.0)  # step 0 layer 2; its dependent (1, 2) is never decoded but passed
    held.release_before(L + 3)
    assert not held.is_held(GRID[2]) and held.kv_bytes == 0


def test_without_residual_levels_nothing_is_kept():
    held = HeldKV(GRID, _ladders(residual=False))
    _publish(held, 0, 1.0)
    held.release_before(L)
    assert not held.is_held(GRID[0]) and held.kv_bytes == 0


def test_the_devices_own_kv_serves_only_where_a_residual_needs_it():
    held = HeldKV(GRID, _ladders(residual=True))
    _publish(held, L + 1, 5.0)  # (1, 1) came already (prefetched while step 0 ran): (0, 1) is nobody's reference
    held.release_before(L)  # step 0 ran on the device; its KV arrives at the step's end
    held.keep_references({GRID[0]: _kv(3.0), GRID[1]: _kv(4.0)})
    assert held.device(GRID[0]) is not None and held.device(GRID[1]) is None
    assert float(held.reference_for(GRID[L], _residual_rep(0)).k.max()) == 3.0
    assert held.kv_bytes == held.held_bytes()
    held.release_before(L + 1)  # the compute lane passed (1, 0) (the device computed it): (0, 0) is freed
    assert held.device(GRID[0]) is None and held.kv_bytes == held.held_bytes()


def test_a_residual_without_its_reference_is_refused_and_a_self_contained_level_needs_none():
    held = HeldKV(GRID, _ladders(residual=True))
    with pytest.raises(MissingReferenceError, match="coded against step 1 layer 2, which the device does not hold"):
        held.reference_for(GRID[2 * L + 2], _residual_rep(1))
    assert held.reference_for(GRID[2 * L + 2], Representation(1, "fp16", 10, "f" * 64)) is None

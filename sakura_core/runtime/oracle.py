"""The oracle's search and the fixed-split policy it (and the regime map) runs: the best per-step split vector under
exact transfer times, played through the simulator (:mod:`.simulate`)."""

from __future__ import annotations

from ..policy.planner import Snapshot, best_plan
from ..policy.policies import LEVEL_COMPUTE, Decision, Policy
from .simulate import SimConfig, SimResult, _Sim, simulate

__all__ = ["fixed_split_policy", "simulate_oracle"]


class _FixedSplit(Policy):
    """Compute layers < split on the device, fetch the rest at the floor level (at every step in per-step mode; a
    list gives one split per step). Used by the oracle search and the regime map."""

    family = "sakura"

    def __init__(self, split: int | list[int] | tuple[int, ...]):
        self.split = split
        self.name = f"split-{split}"

    def _k(self, ctx, shard: int) -> int:
        if isinstance(self.split, int):
            return self.split
        return self.split[min(ctx.step_of(shard), len(self.split) - 1)]

    def choose(self, ctx, layer):
        if ctx.layer_of(layer) < self._k(ctx, layer):
            return Decision(LEVEL_COMPUTE, "fixed split")
        return Decision(ctx.floor, "fixed split: floor level")

    def keep_template(self, ctx, layer):
        return ctx.layer_of(layer) < self._k(ctx, layer)


def fixed_split_policy(split: int | list[int]) -> Policy:
    """A policy that computes layers < ``split`` on the device and fetches the rest at the floor level (``split``:
    one split for every step, or one per step)."""
    return _FixedSplit(split)


def simulate_oracle(policy: Policy, trace, profile, ladders, floors, start_s=0.0, config=None) -> SimResult:
    """The oracle: knows the trace. The best per-step split vector under exact transfer times (coordinate descent
    over each step's split, :func:`~sakura_core.policy.planner.best_plan`), run through the simulator (upgrades in
    the slack included), against the same policy's adaptive run with exact rates in single mode; the fastest wins."""
    fam = ladders[policy.family]
    probe = _Sim(fixed_split_policy(0), trace, start_s, profile, fam, floors.get(policy.family, 0),
                 config or SimConfig())  # fmt: skip
    plan = best_plan(Snapshot(probe.ctx, None))
    best = simulate(fixed_split_policy(list(plan.splits)), trace, profile, ladders, floors, start_s, config)
    if not probe.per_step:
        r = simulate(policy, trace, profile, ladders, floors, start_s, config)
        if r.latency_s < best.latency_s - 1e-9:
            best = r
    best.policy = policy.name
    return best

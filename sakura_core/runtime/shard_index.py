"""Shard indices inside the live runtime: a :class:`ShardId` names one shard by (step, layer) and carries its flat
index ``g`` — the index of the policy protocol (:mod:`sakura_core.policy.context`), of the ladders and of the report
— so no lane re-derives one from the other; a :class:`ShardGrid` makes them for one edit.

In ``single`` KV mode one KV per layer serves every step: the shards are (0, layer) and ``g`` is the layer. In
``per-step`` mode shard (step, layer) holds the KV of that step and ``g = step * L + layer`` (execution order).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ShardGrid", "ShardId"]


@dataclass(frozen=True, order=True)
class ShardId:
    """One shard of an edit (made by :class:`ShardGrid`; ordered by ``g``, which is execution order).

    Attributes:
        g: flat index in execution order, ``step * L + layer``: what policies, ladders and reports index by.
        step: the step whose KV it holds (0 in single mode).
        layer: the model layer.
    """

    g: int
    step: int
    layer: int

    def __str__(self) -> str:
        return f"shard {self.g}"


@dataclass(frozen=True)
class ShardGrid:
    """The shards of one edit.

    Attributes:
        layers: model layers L.
        kv_steps: steps with a KV of their own: the edit's steps in per-step mode, 1 in single mode.
        per_step: the KV mode is ``per-step`` (a per-step template of one step still has per-step semantics: its
            KV is modulated at that step's own time).
    """

    layers: int
    kv_steps: int
    per_step: bool

    def __post_init__(self) -> None:
        if self.layers < 1 or self.kv_steps < 1 or (not self.per_step and self.kv_steps != 1):
            raise ValueError(
                f"a shard grid needs layers >= 1 and kv_steps >= 1 (1 in single mode), got "
                f"{self.layers} layers, {self.kv_steps} KV steps, per_step={self.per_step}"
            )

    @classmethod
    def for_edit(cls, layers: int, steps: int, per_step: bool) -> ShardGrid:
        """The grid of an edit of ``steps`` steps over ``layers`` layers in the given KV mode."""
        return cls(layers, steps if per_step else 1, per_step)

    def __len__(self) -> int:
        return self.layers * self.kv_steps

    def __iter__(self) -> Iterator[ShardId]:
        return (self[g] for g in range(len(self)))

    def __getitem__(self, g: int) -> ShardId:
        """The shard with flat index ``g`` (what a policy names)."""
        if not 0 <= g < len(self):
            raise IndexError(f"shard index {g} out of range: the edit has {len(self)} shards")
        return ShardId(g, g // self.layers, g % self.layers)

    def at(self, step: int, layer: int) -> ShardId:
        """The shard the compute lane uses at (``step``, ``layer``): that step's own in per-step mode, the layer's
        in single mode. ``step`` -1 (before the first layer) counts as step 0."""
        return self[max(step, 0) * self.layers + layer if self.per_step else layer]

    def step_end(self, step: int) -> int:
        """Flat index one past the last shard of ``step`` (past every shard in single mode)."""
        return (max(step, 0) + 1) * self.layers if self.per_step else len(self)

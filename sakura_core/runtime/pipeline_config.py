"""The pipelined run's settings (:class:`RuntimeConfig`), its report (:class:`RunReport`) and the error a cancelled
edit raises (:class:`Cancelled`); :mod:`sakura_core.runtime.pipeline` runs the edit and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from ..policy.estimator import EstimatorConfig
from .lane_types import LaneConfig, LaneResult

__all__ = ["CancelFlag", "Cancelled", "LiveSettings", "RunReport", "RuntimeConfig"]


class Cancelled(RuntimeError):
    """The edit was cancelled (between layers or steps)."""


class CancelFlag(Protocol):
    """What the lanes read of a cancel flag: a ``threading.Event``, or the pipeline's either-of-two."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class LiveSettings:
    """The live run's own settings (what the simulator has no use for). Attributes:
    steps: denoising steps.
    seed: noise seed.
    decode_threads: decoder pool size.
    shard_wait_s: longest wait for one shard before the device computes the template KV itself.
    estimator: the throughput estimator's settings (None = its defaults); EMULATED phone timing scales its prior
        and smallest sample to the model's shard bytes (``runtime.emulated_device``).
    pre_lanes: the transfers the edit made on its link before the lanes start, ``(bytes, seconds)`` each, request to
        last byte (``sakura_core.edit``: the template image): they seed the estimator at the edit's start
        (``ThroughputEstimator.seed``, a round trip ``rtt_s`` off each), so the first plan is made on the link, not
        on the prior. Empty: none (the estimator starts on its prior).
    """

    steps: int = 8
    seed: int = 0
    decode_threads: int = 1
    shard_wait_s: float = 120.0
    estimator: EstimatorConfig | None = None
    pre_lanes: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        bad = [t for t in self.pre_lanes if len(t) != 2 or not (t[0] >= 0 and t[1] >= 0)]
        if bad:
            raise ValueError(f"pre_lanes must be (bytes >= 0, seconds >= 0) pairs, got {bad[0]!r}")
        if self.steps < 1 or self.decode_threads < 1 or self.shard_wait_s <= 0:
            raise ValueError(
                f"steps and decode_threads must be >= 1 and shard_wait_s > 0, got {self.steps}, "
                f"{self.decode_threads}, {self.shard_wait_s}"
            )


@dataclass(frozen=True)
class RuntimeConfig(LaneConfig):
    """The lanes' settings (:class:`~sakura_core.runtime.lane_types.LaneConfig`, as the simulator's) and the live
    run's own (``live``: :class:`LiveSettings`, e.g. ``RuntimeConfig(live=LiveSettings(steps=4), upgrades=False)``)."""

    live: LiveSettings = field(default_factory=LiveSettings)


@dataclass
class RunReport:
    """One pipelined run: ``result``, what a simulated one reports too
    (:class:`~sakura_core.runtime.lane_types.LaneResult`; its ``split_layers`` is empty when the template ran
    everywhere), and the live run's own: the edited ``image`` and its ``tokens``, the ``fallbacks`` logged, the
    levels each shard ran with, the KV mode and the bytes used. ``levels_used`` maps a shard
    (the layer in single mode; ``g = step * L + layer`` in per-step mode) to the levels the compute lane used
    ("device" = computed here after a failed shard, "template" = the template tokens ran on the device at that
    (step, layer)); ``bytes_used`` is the part of ``bytes_fetched`` whose KV the compute lane injected: the bytes of
    every blob a KV it injected was decoded from (each once) — not a shard fetched and then computed here, nor an
    upgrade that came after the shard's last use, nor a failed try."""

    result: LaneResult
    image: np.ndarray
    tokens: torch.Tensor
    fallbacks: list[str] = field(default_factory=list)
    levels_used: dict[int, list[str]] = field(default_factory=dict)
    kv_mode: str = "single"
    layers_per_step: int = 0
    bytes_used: int = 0

    def levels_by_step(self) -> dict[str, list[str]]:
        """Per-step mode: ``{"step s": [what layer 0, 1, ... used]}`` ("-" = nothing recorded)."""
        L = self.layers_per_step
        steps = 1 + max((g // L for g in self.levels_used), default=-1) if L else 0
        return {
            f"step {s}": ["/".join(self.levels_used.get(s * L + i, ["-"])) for i in range(L)] for s in range(steps)
        }

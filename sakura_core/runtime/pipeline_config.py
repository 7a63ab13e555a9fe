"""The pipelined run's settings (:class:`RuntimeConfig`), its report (:class:`RunReport`) and the error a cancelled
edit raises (:class:`Cancelled`); :mod:`sakura_core.runtime.pipeline` runs the edit and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from ..policy.estimator import EstimatorConfig

__all__ = ["CancelFlag", "Cancelled", "RunReport", "RuntimeConfig"]


class Cancelled(RuntimeError):
    """The edit was cancelled (between layers or steps)."""


class CancelFlag(Protocol):
    """What the lanes read of a cancel flag: a ``threading.Event``, or the pipeline's either-of-two."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class RuntimeConfig:
    """Attributes:
    steps: denoising steps.
    seed: noise seed.
    decode_threads: decoder pool size.
    upgrades: fetch progressive enhancements during later steps (policies that ask for them).
    shard_wait_s: longest wait for one shard before the device computes the template KV itself.
    rtt_s: round trip charged per request in the policies' predictions.
    latency_target_s: the user's latency target for the edit (seconds) or None; policies trade the slack under it
        for quality (sakura) or use it as their SLO (cachegen).
    prefetch_kv_bytes: per-step mode: the most decoded KV of later steps the device may hold (or receive) ahead
        of the step it runs; the fetch lane waits for room before it fetches further ahead (the running step's own
        shards are always fetched). None = no limit (what ``bench e2e --mode sim`` models); 0 = no prefetch.
        The device then holds at most one step's KV plus this.
    request_ahead: the fetch lane sends requests ahead of the wire, once the bytes on their way are within two
        round trips of the link (``deferral.ahead_window_bytes``): their round trips hidden, the transfers still one
        at a time on the wire, first in first out, decodes overlapping the transfers after them; with a fetcher that
        reports its chunks and awaits what ``on_chunk`` returns (the default). False: one request at a time, each
        once the transfer before has ended (its decode overlapping the next transfer). ``bench e2e`` models the same
        (``SimConfig.request_ahead``, ``--requests``).
    estimator: the throughput estimator's settings (None = its defaults); EMULATED phone timing scales its prior
        and smallest sample to the model's shard bytes (``runtime.emulated_device``).
    """

    steps: int = 8
    seed: int = 0
    decode_threads: int = 1
    upgrades: bool = True
    shard_wait_s: float = 120.0
    rtt_s: float = 0.04
    latency_target_s: float | None = None
    prefetch_kv_bytes: int | None = None
    request_ahead: bool = True
    estimator: EstimatorConfig | None = None

    def __post_init__(self) -> None:
        if self.prefetch_kv_bytes is not None and self.prefetch_kv_bytes < 0:
            raise ValueError(f"prefetch_kv_bytes must be >= 0 bytes or None (no limit), got {self.prefetch_kv_bytes}")
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError(f"latency_target_s must be > 0 seconds or None, got {self.latency_target_s}")
        if self.steps < 1 or self.decode_threads < 1 or self.shard_wait_s <= 0:
            raise ValueError(
                f"steps and decode_threads must be >= 1 and shard_wait_s > 0, got {self.steps}, "
                f"{self.decode_threads}, {self.shard_wait_s}"
            )


@dataclass
class RunReport:
    """One pipelined run. ``levels_used`` maps a shard (the layer in single mode; ``g = step * L + layer`` in
    per-step mode) to the levels the compute lane used ("device" = computed here after a failed shard, "template" =
    the template tokens ran on the device at that (step, layer)); ``split_layers`` is the split ``k_s`` of every
    step in per-step mode (``[split_layer]`` in single mode, empty when the template ran everywhere);
    ``bytes_used`` is the part of ``bytes_fetched`` whose KV the compute lane injected: the bytes of every blob a
    KV it injected was decoded from (each once) — not a shard fetched and then computed here, nor an upgrade that
    came after the shard's last use, nor a failed try."""

    policy: str
    latency_s: float
    bytes_fetched: int
    split_layer: int
    image: np.ndarray
    tokens: torch.Tensor
    events: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    levels_used: dict[int, list[str]] = field(default_factory=dict)
    kv_mode: str = "single"
    layers_per_step: int = 0
    split_layers: list[int] = field(default_factory=list)
    peak_kv_bytes: int = 0
    bytes_used: int = 0

    def levels_by_step(self) -> dict[str, list[str]]:
        """Per-step mode: ``{"step s": [what layer 0, 1, ... used]}`` ("-" = nothing recorded)."""
        L = self.layers_per_step
        steps = 1 + max((g // L for g in self.levels_used), default=-1) if L else 0
        return {
            f"step {s}": ["/".join(self.levels_used.get(s * L + i, ["-"])) for i in range(L)] for s in range(steps)
        }

    def busy_s(self, lane: str) -> float:
        """Total time the lane was busy (overlaps merged)."""
        spans = sorted((e["start"], e["end"]) for e in self.events if e["lane"] == lane)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        return total + ((cur_e - cur_s) if cur_e is not None else 0.0)

"""The named parts a pipelined edit is built from, so that each lane's constructor takes a handful of them rather
than a long list: :class:`EditInputs` (what the compute lane edits), :class:`RunControls` (how the caller drives the
run) and :class:`LaneParts` (what the lanes of one run share: the shards, the fetch plan, the live state and the
policy's view of it, the KV held, the log, the settings and the cancel flag)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..models.edit_model import EditModel
from ..policy.context import Context
from ..policy.plan import FetchPlan
from .backend import ComputeBackend
from .clock import Clock
from .held_kv import HeldKV
from .live_state import LiveState
from .pipeline_config import CancelFlag, RuntimeConfig
from .run_log import RunLog
from .shard_index import ShardGrid

__all__ = ["EditInputs", "LaneParts", "RunControls"]


@dataclass(frozen=True)
class EditInputs:
    """The edit the compute lane runs: the model, the private user image (uint8 (S, S, 3)) and prompt, the public
    template image (for the layers the device computes: (S, S, 3) uint8, or a list of them for a template with
    several references) and what runs the model's blocks (:mod:`sakura_core.runtime.backend`; None = the torch
    adapter)."""

    model: EditModel
    user_image: np.ndarray
    prompt: str
    template_image: Any  # np.ndarray | list[np.ndarray]: the lanes pass it to the model as is
    backend: ComputeBackend | None = None


@dataclass(frozen=True)
class RunControls:
    """How the caller drives a run. ``cancel``: set it to stop between layers (the run raises ``Cancelled``);
    ``on_layer``: ``(step, layer)`` before each layer (progress reporting); ``clock``: what the run reads and waits
    on (:mod:`sakura_core.runtime.clock`); None = a fresh event, no hook, the wall clock."""

    cancel: threading.Event | None = None
    on_layer: Callable[[int, int], None] | None = None
    clock: Clock | None = None


@dataclass(frozen=True)
class LaneParts:
    """What the lanes of one run share (built once by the run, read by every lane).

    Attributes:
        grid: the run's shards (:class:`~sakura_core.runtime.shard_index.ShardGrid`).
        plan: the policy, its ladders (per shard, cheapest first), their manifest entries and the floor level.
        st, ctx: the live state (with the clock) and the policy's view of it.
        held: the shards' state and their KV.
        log, config, cancel: the run's timeline, settings and cancel flag.
    """

    grid: ShardGrid
    plan: FetchPlan
    st: LiveState
    ctx: Context
    held: HeldKV
    log: RunLog
    config: RuntimeConfig
    cancel: CancelFlag

"""The named parts a pipelined edit is built from, so that each lane's constructor takes a handful of them rather
than a long list: :class:`EditInputs` (what the compute lane edits), :class:`RunControls` (how the caller drives the
run) and :class:`LaneParts` (what the lanes of one run share: the shards, the fetch plan, the live state and the
policy's view of it, the KV held, the log, the settings and the cancel flag). A lane holds the parts and reads them
through :class:`PartsView`'s names, so each lives once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..models.edit_model import EditModel
from ..policy.context import Context
from ..policy.ladder import Level, Rung
from ..policy.plan import FetchPlan
from ..policy.policies import Policy
from .backend import ComputeBackend
from .clock import Clock
from .held_kv import HeldKV
from .live_state import LiveState
from .pipeline_config import CancelFlag, RuntimeConfig
from .run_log import RunLog
from .shard_index import ShardGrid

__all__ = ["EditInputs", "LaneParts", "PartsView", "RunControls"]


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
        plan: the policy, its rungs (per shard, cheapest first: each a level and its manifest entry) and the floor.
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


class PartsView:
    """The names a lane reads the run's shared :class:`LaneParts` by (``self.parts``, set by the lane's constructor):
    properties, not copies, so every field lives once in the parts."""

    parts: LaneParts

    @property
    def grid(self) -> ShardGrid:
        return self.parts.grid

    @property
    def plan(self) -> FetchPlan:
        return self.parts.plan

    @property
    def policy(self) -> Policy:
        return self.parts.plan.policy

    @property
    def rungs(self) -> list[list[Rung]]:
        """Per shard its ladder of rungs (each a level and the manifest entry fetched for it)."""
        return self.parts.plan.rungs

    @property
    def ladders(self) -> list[list[Level]]:
        """Per shard its levels (the policies' view of :attr:`rungs`)."""
        return self.parts.plan.ladders

    @property
    def floor(self) -> int:
        return self.parts.plan.floor

    @property
    def st(self) -> LiveState:
        return self.parts.st

    @property
    def ctx(self) -> Context:
        return self.parts.ctx

    @property
    def held(self) -> HeldKV:
        return self.parts.held

    @property
    def log(self) -> RunLog:
        return self.parts.log

    @property
    def cfg(self) -> RuntimeConfig:
        return self.parts.config

    @property
    def cancel(self) -> CancelFlag:
        return self.parts.cancel

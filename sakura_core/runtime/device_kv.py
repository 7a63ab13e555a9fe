""":class:`DeviceKV`: the template KV the device computes itself when a shard fails or is late — one template-only
pass per step (at that step's own time in per-step mode), resumed where the step dropped the template tokens: the
compute lane hands their hidden state over when it drops them (:meth:`DeviceKV.on_drop`), so the layers the device
already ran are not run again. The template layers the device runs at a step serve a cross-step template's next
step as the reference of its residual levels (:meth:`DeviceKV.on_extracted`)."""

from __future__ import annotations

import numpy as np
import torch

from ..models.edit_model import EditModel
from .backend import ComputeBackend
from .deferral import pass_stopped_reason
from .held_kv import KV, HeldKV
from .lane_rules import pass_makes, pass_stops_after
from .live_state import LiveState
from .run_log import RunLog
from .shard_index import ShardGrid, ShardId

__all__ = ["DeviceKV"]


class DeviceKV:
    """The device's fallback template passes of one edit; it owns the template state kept at each step's drop.

    Args:
        model, backend, template_image: what the pass runs, and on which template.
        times: the edit's schedule (per-step mode: step s's pass runs at ``times[s]``).
        grid, held, st, log: the shards, where the computed KV goes, the live state (clock), the timeline.
    """

    def __init__(
        self,
        model: EditModel,
        backend: ComputeBackend,
        template_image: np.ndarray,
        times,
        grid: ShardGrid,
        held: HeldKV,
        st: LiveState,
        log: RunLog,
    ) -> None:
        self.model, self.backend, self.template_image, self.times = model, backend, template_image, times
        self.grid, self.held, self.st, self.log = grid, held, st, log
        self.reset()

    def reset(self) -> None:
        self.dropped: dict[int, tuple[int, torch.Tensor]] = {}  # step -> (drop layer, template hidden state there)

    def on_drop(self, step: int, layer: int, hidden: torch.Tensor) -> None:
        """The compute lane dropped the template tokens before ``layer``: keep their state for a fallback pass."""
        self.dropped[max(step, 0) if self.grid.per_step else 0] = (layer, hidden)

    def on_extracted(self, step: int, extracted: list[KV]) -> None:
        """Per-step mode: the template KV the device computed at ``step`` (its layers below the split): held where it
        is the reference of a later shard's residual level (:meth:`HeldKV.keep_references`)."""
        if self.grid.per_step:
            self.held.keep_references({self.grid.at(step, layer): kv for layer, kv in enumerate(extracted)})

    def release_before(self, step: int) -> None:
        """Per-step mode: the compute lane is in ``step``; the template state of earlier steps is never used again."""
        for s in [s for s in self.dropped if s < step]:
            del self.dropped[s]

    def kv(self, shard: ShardId) -> KV | None:
        """``shard``'s template KV computed here: one pass serves the layers of its step from ``shard`` on, resumed at
        the step's drop, layer by layer, each layer's KV kept in :class:`HeldKV` as it is made (the fetch lane then
        skips that shard). It stops once every shard of the step from ``shard`` on is made or decoded
        (:func:`~sakura_core.runtime.lane_rules.pass_stops_after`); the compute lane then goes on with the fetched KV.
        None when it stopped before it made ``shard`` itself: that shard's transfer delivered first (its fetched KV
        serves). When the step kept no template state there, a whole pass from layer 0 (not stopped early)."""
        own = self.held.device(shard)
        if own is not None:
            return own
        grid, step, held = self.grid, shard.step, self.held
        t0, end = self.st.now, grid.step_end(step)
        ref_t = float(self.times[step]) if grid.per_step else None
        token_grid = self.model.template_grid(self.template_image)
        start, hidden = self.dropped.get(step, (0, None))
        stopped = []

        def made(g: int) -> bool:
            return held.device(grid[g]) is not None

        def ready(g: int) -> bool:
            return held.arrived(grid[g])

        def stop(layer: int, kv: KV) -> bool:
            if pass_makes(layer, shard.layer):
                held.hold_device({grid.at(step, layer): kv})
            done = pass_stops_after(layer, grid.layers, shard.g, end, made, ready)
            if done:
                stopped.append(layer)
            return done

        if hidden is not None and start <= shard.layer:
            self.backend.resume_template_kv(hidden, token_grid, start, ref_t, stop)
        else:
            start = 0
            tokens = self.model.template_tokens(self.template_image)
            tkv = self.backend.extract_template_kv(tokens, token_grid, ref_t)
            held.hold_device({grid.at(step, i): tkv.layer(i) for i in range(shard.layer, grid.layers)})
        what = f"fallback template pass from layer {start}" + (f" (step {step})" if grid.per_step else "")
        self.log.event("compute", t0, self.st.now, -1, what)
        if stopped:
            self.log.decision(self.st.now, shard.g, "fetched", pass_stopped_reason(stopped[0], grid.layers))
        return held.device(shard)

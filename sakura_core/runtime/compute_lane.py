"""The compute lane of a pipelined edit (:class:`~sakura_core.runtime.pipeline.PipelinedEdit`): the edit itself
(:func:`~sakura_core.runtime.denoise.run_edit`), run in one worker thread, and the hooks its forward calls.

Before each layer (:meth:`ComputeLane.on_layer`) the lane checks for a cancel, records the compute span of the
previous layer and tells the live state where it is (per-step: a new step restarts the template pass and frees the
shards passed). While the template tokens run, the policy says per layer whether the device keeps them
(:meth:`ComputeLane.keep_template`: the split). A cached layer takes its KV from :meth:`ComputeLane.kv_source`:
the fetched shard (waiting for it if late: :class:`~sakura_core.runtime.late_shards.LateShards`) or the device's
own (:class:`~sakura_core.runtime.device_kv.DeviceKV`). The lane owns the split it took, the levels each (step,
layer) used (and the blobs behind the fetched KV it injected) and its open span.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .decode_lane import DecodeLane
from .denoise import EditResult, run_edit
from .device_kv import DeviceKV
from .lane_parts import EditInputs, LaneParts, PartsView
from .lane_rules import ask_keep_template
from .late_shards import LateShards
from .pipeline_config import Cancelled

__all__ = ["ComputeLane"]


class ComputeLane(PartsView):
    """The edit and its per-layer hooks (see the module docstring); :meth:`reset` before each run.

    Args:
        edit, kv_mode: the edit (its ``backend`` resolved: not None) and the template's KV mode.
        parts: what the run's lanes share: the shards, the plan (the policy, its levels), the live state and the
            policy's view of it, the KV held, the timeline, the settings and the cancel flag.
        decoder, device, late: the decode lane (its decoders are freed with the shards), the device's fallback
            passes, the late-shard waits.
        user_hook: ``(step, layer)`` before each layer (the caller's progress hook), or None.
    """

    def __init__(
        self,
        edit: EditInputs,
        kv_mode: str,
        parts: LaneParts,
        *,
        decoder: DecodeLane,
        device: DeviceKV,
        late: LateShards,
        user_hook: Callable[[int, int], None] | None = None,
    ) -> None:
        self.model, self.backend, self.user_image, self.prompt = edit.model, edit.backend, edit.user_image, edit.prompt
        self.template_image, self.kv_mode = edit.template_image, kv_mode
        self.parts, self.decoder, self.device, self.late = parts, decoder, device, late
        self.user_hook = user_hook
        self.reset()

    def reset(self) -> None:
        L = self.grid.layers
        self.step = -1  # the step the lane is in
        self.split_layer = L  # step 0's split
        self.split_layers = [L] * self.grid.kv_steps  # k_s per step (per-step mode)
        self.levels_used: dict[int, list[str]] = {}  # shard g -> what each use of it took
        self.used_blobs: dict[str, int] = {}  # digest -> bytes on the wire, of every blob behind KV injected
        self.span_t = 0.0  # the compute span open since the last layer hook: its start, (step, layer, kind)
        self.span_key: tuple[int, int, str] | None = None

    def run(self) -> EditResult:
        """The edit itself (in the lane's worker thread)."""
        cfg, L = self.cfg, self.grid.layers
        edit = functools.partial(
            run_edit,
            self.model,
            self.user_image,
            self.prompt,
            steps=cfg.live.steps,
            seed=cfg.live.seed,
            template_image=self.template_image,
            on_layer=self.on_layer,
            kv_mode=self.kv_mode,
            backend=self.backend,
        )
        if self.policy.kv_preloaded:
            raise ValueError("free-kv is a simulation-only bound")
        if self.policy.template_every_step:
            self.st.template_alive = True
            return edit(split_layer=L, template_every_step=True)
        return edit(
            split_layer=self.keep_template,
            kv_source=self.kv_source,
            on_drop=self.device.on_drop,
            on_extracted=self.device.on_extracted,
        )

    # ---- the forward's hooks

    def on_layer(self, step: int, layer: int) -> None:
        """Before each layer: cancellation, the caller's hook, and the compute span of the previous layer."""
        if self.cancel.is_set():
            raise Cancelled(f"edit cancelled at step {step}, layer {layer}")
        if self.user_hook is not None:
            self.user_hook(step, layer)
        st = self.st
        now = st.now
        self.close_span(now)
        with st.lock:
            if self.grid.per_step and step != self.step:  # the template pass restarts at every step
                st.template_alive, st.dropped_at = True, self.grid.layers
            self.step = step
            shard = self.grid.at(step, layer)
            st.compute_layer, st.compute_t = shard.g, now
            if self.grid.per_step:
                self._release_before(shard.g)
        self.span_t = now
        live = st.template_alive and (step == 0 or self.grid.per_step or self.policy.template_every_step)
        self.span_key = (step, layer, "template" if live else "cached")

    def keep_template(self, layer: int) -> bool:
        """The split (step 0's; every step's in per-step mode): ask the policy whether the device keeps computing
        the template tokens at ``layer``."""
        st, shard = self.st, self.grid.at(self.step, layer)
        with st.lock:
            st.compute_layer, st.compute_t = shard.g, st.now
            keep = ask_keep_template(self.policy, self.ctx, shard.g, st.computed)
            if not keep:
                st.template_alive = False
                st.dropped_at = layer
                self.split_layers[shard.step] = layer
                if self.step <= 0:
                    self.split_layer = layer
        if keep and self.grid.per_step:
            self.levels_used[shard.g] = ["template"]
        if not keep:
            if self.span_key is not None and self.span_key[1] == layer:  # the span opened for this layer: no template
                self.span_key = (*self.span_key[:2], "cached")
            where = f"step {self.step} layer {layer}" if self.grid.per_step else f"layer {layer}"
            self.log.decision(st.now, shard.g, "drop", f"template dropped at {where}")
        return keep

    def kv_source(self, layer: int, step: int):
        """The KV for ``layer`` at ``step``: the fetched shard (of that step, in per-step mode), or the device's."""
        shard = self.grid.at(step, layer)
        held = self.held
        device_made = held.device(shard) is not None  # a fallback pass made it (it stopped after it, or not yet)
        if not device_made and not held.is_failed(shard) and not held.is_ready(shard):
            self.late.wait_for(shard, step)
        if device_made or held.is_failed(shard):
            kv = self.device.kv(shard)  # None: the pass stopped before it, once the link had delivered it after all
            if kv is not None:
                self.levels_used.setdefault(shard.g, []).append("device")
                return kv
        k, v, level, blobs = held.fetched_blobs(shard)
        self.levels_used.setdefault(shard.g, []).append(held.source_name(shard) or self.ladders[shard.g][level].name)
        self.used_blobs.update(blobs)
        return k.unsqueeze(0), v.unsqueeze(0)

    def close_span(self, end: float) -> None:
        """Record the compute span open since the last layer hook (if any) as ending at ``end``."""
        if self.span_key is not None:
            _, layer, level = self.span_key
            self.log.event("compute", self.span_t, end, layer, level)

    def _release_before(self, g: int) -> None:
        """Per-step mode: every shard before flat index ``g`` served its (step, layer): free its KV and decoder, and
        the template state kept at the drops of the steps before ``g``'s (the caller holds ``st.lock``)."""
        released = self.held.release_before(g)
        if released:
            self.decoder.release(self.grid[x] for x in released)
            self.device.release_before(self.grid[g].step)

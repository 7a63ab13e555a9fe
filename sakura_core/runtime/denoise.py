"""One edit on the device: the private user image and prompt never leave this function's caller.

Step 0 is a hybrid forward: layers ``< split_layer`` run the template tokens here (their KV is kept), layers
``>= split_layer`` take KV from ``kv_source`` (fetched shards). Steps 1.. reuse the KV of every layer — or, with
``template_every_step``, recompute the template tokens at every step (the plain on-device baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models.edit_model import EditModel
from ..models.kv_types import KV_MODES, KVMismatchError, PerStepTemplateKV, TemplateKV
from .backend import ComputeBackend, backend_of
from .schedule import edit_times, euler_sample

__all__ = ["EditResult", "KVSource", "run_edit"]

# KV for one layer at one step: (layer, step) -> (k, v), each (1, ref_tokens, heads, head_dim).
KVSource = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class EditResult:
    """Result of :func:`run_edit`.

    Attributes:
        tokens: (1, tokens, channels) edited image tokens (pixel patches in [-1, 1], or packed latents).
        image: (S, S, 3) uint8 edited image.
        device_kv: KV this device computed at step 0, per layer ``< split_layer``.
        layer_calls: how many transformer layers ran (all steps).
    """

    tokens: torch.Tensor
    image: np.ndarray
    device_kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    layer_calls: int = 0


def run_edit(
    model: EditModel,
    user_image,
    prompt: str,
    *,
    steps: int = 8,
    seed: int = 0,
    split_layer: int | Callable[[int], bool] = 0,
    kv_source: KVSource | TemplateKV | PerStepTemplateKV | None = None,
    template_image=None,
    template_every_step: bool = False,
    on_layer: Callable[[int, int], None] | None = None,
    shift: float = 1.0,
    kv_mode: str = "single",
    backend: ComputeBackend | None = None,
    on_drop: Callable[[int, int, torch.Tensor], None] | None = None,
    on_extracted: Callable[[int, list], None] | None = None,
) -> EditResult:
    """Edit ``user_image`` (uint8 (S, S, 3)) against a template with the demo model or a latent klein model.

    Args:
        split_layer: layers below it run the template on the device at step 0 (needs ``template_image``); or a
            function ``layer -> bool`` deciding at run time whether to keep running the template (adaptive split).
        kv_source: template KV for layers ``>= split_layer``; a TemplateKV or a ``(layer, step) -> (k, v)`` function
            (the runtime passes one that waits for shards and serves upgraded levels at later steps).
        template_every_step: recompute the template tokens at every step (needs ``split_layer == num_layers``).
        on_layer: ``(step, layer)`` before each layer — progress and cancellation (raise to stop).
        kv_mode: ``"single"`` (template at the fixed reference time, its KV reused by every step) or ``"per-step"``
            (template modulated at each step's own time: every step is a hybrid forward with ``split_layer`` and
            ``kv_source(layer, step)`` — a PerStepTemplateKV computed for this ``steps``/``shift`` schedule).
        backend: what runs the blocks (:mod:`sakura_core.runtime.backend`); None = the torch adapter.
        on_drop: ``(step, layer, hidden)`` when a step's template tokens are dropped before ``layer``: their hidden
            state there (1, template tokens, dim), from which ``backend.resume_template_kv`` continues the template
            pass (the runtime's fallback when shards are late).
        on_extracted: ``(step, [(k, v), ...])`` after each step, with the template KV the device computed at that
            step (layers below its split): a cross-step template's next-step residuals are decoded against it.
    """
    L = model.adapter.num_layers
    # the template's own token grid: larger than the edit's when the template image is (its KV says which)
    ref_grid = _template_grid(model, kv_source, template_image)
    dynamic = callable(split_layer)
    if template_every_step and (dynamic or split_layer != L):
        raise ValueError(f"template_every_step recomputes every layer: split_layer must be {L}, got {split_layer}")
    if kv_mode not in KV_MODES:
        raise ValueError(f"kv_mode must be one of {KV_MODES}, got {kv_mode!r}")
    per_step = kv_mode == "per-step"
    times = edit_times(model, steps, shift)
    kv_source = _kv_lookup(model.adapter, kv_source, ref_grid, times, per_step)
    on_device = callable(split_layer) or split_layer > 0  # template layers run on the device at step 0
    if on_device and template_image is None:
        raise ValueError("running template layers on the device needs template_image")
    ref = model.template_tokens(template_image) if on_device else None
    user = model.pack_image(user_image)
    velocity = _Velocity(
        model,
        backend_of(model, backend),
        _Tokens(user, model.encode_prompt(prompt), ref, ref_grid),
        split_layer,
        kv_source,
        template_every_step=template_every_step,
        per_step=per_step,
        hooks=_Hooks(on_layer, on_drop, on_extracted),
    )
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(user.shape, generator=gen)
    # latent models: the user image is the flow's start; the demo model concatenates it and flows from pure noise
    start = model.edit_start(user, noise, steps)[0] if hasattr(model, "edit_start") else noise
    out = euler_sample(velocity, start, times)
    return EditResult(
        tokens=out, image=model.unpack_tokens(out), device_kv=velocity.device_kv, layer_calls=velocity.calls
    )


@dataclass(frozen=True)
class _Tokens:
    """What a forward runs besides the latent: the user's image tokens, the prompt's, the template's (None when no
    template layer runs here) and the template's token grid."""

    user: torch.Tensor
    txt: torch.Tensor
    ref: torch.Tensor | None
    ref_grid: Any  # the template's (rows, cols), or one per reference (see _template_grid)


@dataclass(frozen=True)
class _Hooks:
    """:func:`run_edit`'s ``on_layer``, ``on_drop`` and ``on_extracted`` (each may be None)."""

    on_layer: Callable[[int, int], None] | None = None
    on_drop: Callable[[int, int, torch.Tensor], None] | None = None
    on_extracted: Callable[[int, list], None] | None = None


class _Velocity:
    """The velocity :func:`run_edit` integrates: at each step one hybrid forward (template layers computed here,
    the rest from ``kv_source`` — or, after step 0 in single mode, from the KV step 0 computed here), counting the
    layers run (``calls``) and keeping step 0's device KV (``device_kv``, single mode)."""

    def __init__(
        self,
        model: EditModel,
        compute: ComputeBackend,
        tokens: _Tokens,
        split_layer,
        kv_source,
        *,
        template_every_step: bool,
        per_step: bool,
        hooks: _Hooks,
    ) -> None:
        self.model, self.compute, self.user, self.txt = model, compute, tokens.user, tokens.txt
        self.ref, self.ref_grid = tokens.ref, tokens.ref_grid
        self.split_layer, self.kv_source = split_layer, kv_source
        self.template_every_step, self.per_step = template_every_step, per_step
        self.on_layer, self.on_drop, self.on_extracted = hooks.on_layer, hooks.on_drop, hooks.on_extracted
        # layers past the split take injected KV (a dynamic split may drop the template anywhere)
        self.injects = callable(split_layer) or split_layer < model.adapter.num_layers
        self.device_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.calls = 0

    def __call__(self, x: torch.Tensor, t: torch.Tensor, step: int) -> torch.Tensor:
        def hook(layer: int) -> None:
            self.calls += 1
            if self.on_layer is not None:
                self.on_layer(step, layer)

        def cached(layer: int):
            if layer < len(self.device_kv):
                return self.device_kv[layer]
            return self.kv_source(layer, step)

        on_drop = self.on_drop
        run_template = step == 0 or self.template_every_step or self.per_step
        result = self.compute.forward(
            self.model.request_tokens(x, self.user),
            self.txt,
            t,
            img_grid=self.model.spec.grid,
            ref_tokens=self.ref if run_template else None,
            ref_grid=self.ref_grid,
            split_layer=self.split_layer if run_template else 0,
            cached=cached if (self.injects or not run_template) else None,
            on_layer=hook,
            ref_timestep=float(t[0]) if self.per_step else None,
            on_drop=None if on_drop is None else (lambda layer, hidden: on_drop(step, layer, hidden)),
        )
        if step == 0 and not self.template_every_step and not self.per_step:
            self.device_kv.extend(result.extracted)
        if self.on_extracted is not None and result.extracted:
            self.on_extracted(step, result.extracted)
        return result.sample


def _kv_lookup(adapter, kv_source, ref_grid, times: torch.Tensor, per_step: bool) -> KVSource | None:
    """``kv_source`` as a ``(layer, step) -> (k, v)`` function (None stays None), after checking stored KV against
    the edit: its KV mode, token grid, reference time and (per-step) schedule."""
    if per_step and isinstance(kv_source, TemplateKV):
        raise KVMismatchError("per-step edit given single-mode template KV: pass a PerStepTemplateKV (or a function)")
    if isinstance(kv_source, PerStepTemplateKV):
        return _per_step_source(adapter, kv_source, ref_grid, times, per_step)
    if isinstance(kv_source, TemplateKV):
        adapter.check(kv_source, ref_grid)
        adapter.check_ref_time(kv_source, None)
        kv = kv_source

        def source(layer: int, step: int):
            return kv.layer(layer)

        return source
    return kv_source


def _per_step_source(adapter, kv: PerStepTemplateKV, grid, times: torch.Tensor, per_step: bool) -> KVSource:
    """``(layer, step) -> (k, v)`` over per-step KV, after checking it was computed for this run's schedule."""
    if not per_step:
        raise KVMismatchError("PerStepTemplateKV passed to a single-mode edit: use kv_mode='per-step'")
    want = [float(t) for t in times[:-1]]
    if len(want) != kv.num_steps or any(abs(a - b) > 1e-6 for a, b in zip(want, kv.timesteps, strict=True)):
        raise KVMismatchError(
            f"per-step template KV was computed for {kv.num_steps} steps at t={[round(t, 4) for t in kv.timesteps]} "
            f"but this edit runs {len(want)} steps at t={[round(t, 4) for t in want]}; run with the template's "
            "steps and shift, or precompute the template for this schedule"
        )
    adapter.check(kv.at_step(0), grid)

    def source(layer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return kv.kv[step, layer, 0].unsqueeze(0), kv.kv[step, layer, 1].unsqueeze(0)

    return source


def _template_grid(model: EditModel, kv_source, template_image):
    """The template's token grid (its references' grids when it has several): from its image(s), else from its
    KV, else the edit's own grid."""
    if template_image is not None:
        return model.template_grid(template_image)
    if isinstance(kv_source, (TemplateKV, PerStepTemplateKV)):
        grids = kv_source.ref_grids
        return grids[0] if len(grids) == 1 else grids
    return model.spec.grid

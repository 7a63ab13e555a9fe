"""One edit on the device: the private user image and prompt never leave this function's caller.

Step 0 is a hybrid forward: layers ``< split_layer`` run the template tokens here (their KV is kept), layers
``>= split_layer`` take KV from ``kv_source`` (fetched shards). Steps 1.. reuse the KV of every layer — or, with
``template_every_step``, recompute the template tokens at every step (the plain on-device baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..models.edit_model import EditModel
from ..models.kv_types import TemplateKV
from .sampler import euler_sample, flow_timesteps

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
    image: object
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
    kv_source: KVSource | TemplateKV | None = None,
    template_image=None,
    template_every_step: bool = False,
    on_layer: Callable[[int, int], None] | None = None,
    shift: float = 1.0,
) -> EditResult:
    """Edit ``user_image`` (uint8 (S, S, 3)) against a template with the demo model or a latent klein model.

    Args:
        split_layer: layers below it run the template on the device at step 0 (needs ``template_image``); or a
            function ``layer -> bool`` deciding at run time whether to keep running the template (adaptive split).
        kv_source: template KV for layers ``>= split_layer``; a TemplateKV or a ``(layer, step) -> (k, v)`` function
            (the runtime passes one that waits for shards and serves upgraded levels at later steps).
        template_every_step: recompute the template tokens at every step (needs ``split_layer == num_layers``).
        on_layer: ``(step, layer)`` before each layer — progress and cancellation (raise to stop).
    """
    adapter = model.adapter
    L = adapter.num_layers
    grid = model.spec.grid
    dynamic = callable(split_layer)
    if template_every_step and (dynamic or split_layer != L):
        raise ValueError(f"template_every_step recomputes every layer: split_layer must be {L}, got {split_layer}")
    if isinstance(kv_source, TemplateKV):
        adapter.check(kv_source, grid)
        kv_obj = kv_source

        def kv_source(layer: int, step: int, _kv=kv_obj):
            return _kv.layer(layer)

    if (dynamic or split_layer > 0) and template_image is None:
        raise ValueError("running template layers on the device needs template_image")
    ref = model.template_tokens(template_image) if (dynamic or split_layer > 0) else None
    user = model.pack_image(user_image)
    txt = model.encode_prompt(prompt)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(user.shape, generator=gen)
    device_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    calls = [0]

    def velocity(x: torch.Tensor, t: torch.Tensor, step: int) -> torch.Tensor:
        def hook(layer: int) -> None:
            calls[0] += 1
            if on_layer is not None:
                on_layer(step, layer)

        def cached(layer: int):
            if layer < len(device_kv):
                return device_kv[layer]
            return kv_source(layer, step)

        run_template = step == 0 or template_every_step
        result = adapter.forward(
            model.request_tokens(x, user),
            txt,
            t,
            img_grid=grid,
            ref_tokens=ref if run_template else None,
            ref_grid=grid,
            split_layer=split_layer if run_template else 0,
            cached=cached if (dynamic or split_layer < L or not run_template) else None,
            on_layer=hook,
        )
        if step == 0 and not template_every_step:
            device_kv.extend(result.extracted)
        return result.sample

    if hasattr(model, "edit_start"):  # latent models: the user image is the flow's start, their own schedule
        start, times = model.edit_start(user, noise, steps)
    else:  # the demo model: the user image is channel-concatenated; flow from pure noise
        start, times = noise, flow_timesteps(steps, shift)
    out = euler_sample(velocity, start, times)
    return EditResult(tokens=out, image=model.unpack_tokens(out), device_kv=device_kv, layer_calls=calls[0])

"""What the live policies predict with: :class:`LiveProfile`, the model's measured per-layer compute times on this
device, and :func:`measure_profile`, which measures them once per model instance."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LiveProfile", "measure_profile"]


@dataclass(frozen=True)
class LiveProfile:
    """Measured compute costs of the model on this device, which the policies predict with.

    Attributes:
        layer_full_s: one layer that also runs the template tokens, seconds.
        layer_cached_s: one layer with the template KV injected, seconds.
        layers: transformer layers.
        steps: denoising steps.
        fixed_s: per-edit work outside the transformer, seconds.
        dit_cpu_cores: threads the model computes with when it runs on this host's CPU (0 = on an accelerator): a
            decode thread then takes one of them while it works, which the planner and the simulator charge (as
            :attr:`sakura_core.runtime.profiles.DeviceProfile.dit_cpu_cores`); a measured figure may be fractional
            (the phone page's: ``sakura bench e2e --mode page``).
        cpu_slowdown: seconds a decode takes here for a second of the ladders' ``decode_s`` (as
            :attr:`sakura_core.runtime.profiles.DeviceProfile.cpu_slowdown`; 1.0: the ladders' own host).
    """

    layer_full_s: float
    layer_cached_s: float
    layers: int
    steps: int
    fixed_s: float = 0.0
    dit_cpu_cores: float = 0
    cpu_slowdown: float = 1.0

    @property
    def template_pass_s(self) -> float:
        """Extra cost of running the template tokens through every layer."""
        return (self.layer_full_s - self.layer_cached_s) * self.layers

    @property
    def model(self) -> LiveProfile:  # the simulation's profiles expose model.steps / model.layers
        return self


def measure_profile(model, steps: int, fixed_s: float = 0.0) -> LiveProfile:
    """``model``'s per-layer compute times here (measured on its first call, then reused; see
    :meth:`sakura_core.models.edit_model.EditModel.layer_times_s`) as a profile for a ``steps``-step edit. A model on
    the CPU shares it with the decode threads: the profile says with how many threads it computes."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    full_s, cached_s = model.layer_times_s()
    return LiveProfile(full_s, cached_s, model.adapter.num_layers, steps, fixed_s, _cpu_threads(model))


def _cpu_threads(model) -> int:
    """Threads torch computes ``model`` with when they fill this host's cores (then a decode thread takes one of
    them); 0 when its weights live on an accelerator or a core is left free for the decodes (the live bench gives
    the DiT half the cores)."""
    import torch

    if model.adapter.device.type != "cpu":
        return 0
    threads = max(1, torch.get_num_threads())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return threads if threads >= cores else 0

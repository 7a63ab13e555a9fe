"""The denoising schedule and the flow-matching Euler sampler over it (rectified flow: x_t = (1 - t) x_0 + t noise,
velocity = noise - x_0)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["edit_times", "euler_sample", "flow_timesteps"]


def flow_timesteps(steps: int, shift: float = 1.0) -> torch.Tensor:
    """``steps + 1`` times from 1 (pure noise) to 0 (data); ``shift > 1`` spends more steps at high noise."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    t = torch.linspace(1.0, 0.0, steps + 1)
    return shift * t / (1 + (shift - 1) * t)


def edit_times(model, steps: int, shift: float = 1.0) -> torch.Tensor:
    """The ``steps + 1`` flow times an edit with ``model`` runs (and per-step KV is computed for): a latent model's
    own schedule (``model.schedule``: the diffusers pipeline's shifted sigmas), else ``flow_timesteps(steps, shift)``."""
    return model.schedule(steps) if hasattr(model, "schedule") else flow_timesteps(steps, shift)


def euler_sample(
    velocity: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    on_step: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Integrate dx/dt = velocity(x, t, step) from ``timesteps[0]`` to ``timesteps[-1]`` with Euler steps.

    ``velocity`` gets the batch-shaped time (batch,) and the step index; ``on_step(step)`` runs after each step.
    """
    x = noise
    for step in range(len(timesteps) - 1):
        t, t_next = timesteps[step], timesteps[step + 1]
        v = velocity(x, t.expand(x.shape[0]), step)
        x = x + (t_next - t) * v
        if on_step is not None:
            on_step(step)
    return x

"""Probe requests for importance estimation and distortion measurement: noisy latents at several timesteps,
generic prompts, random user images — a pure function of (config, stream)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.edit_model import DEMO_TEMPLATES, EditModel, load_image

__all__ = ["GENERIC_PROMPTS", "ProbeConfig", "Probes", "make_probes", "sample_crop"]

#: Prompts the server can probe with (no user text ever reaches it).
GENERIC_PROMPTS = (
    "place it in the marked region",
    "add a hat",
    "replace the background",
    "make it look like a painting",
    "brighter and warmer",
    "put the object on the left",
    "a photo",
    "",
)


@dataclass(frozen=True)
class ProbeConfig:
    """Probe requests for importance estimation and distortion measurement.

    Attributes:
        num_probes: probe requests per estimate (one batched forward).
        timesteps: flow times (0 = clean, 1 = noise) the probes' latents are noised to, used in turn.
        prompts: prompts drawn from at random.
        seed: base seed; ``stream`` in :func:`make_probes` separates fitting probes from held-out ones.
        gain_steps: ``None`` (default): layer gains are not measured. Otherwise the denoising steps of the probe
            edits the gains are measured through (0: one forward at the probes' timesteps); see
            :func:`layer_gains`. Off by default because scaling the weights by measured gains (8-step or one-forward)
            lowered the output PSNR on the trained demo model: the default allocation compares layers in
            attention-output units.
    """

    num_probes: int = 8
    timesteps: tuple[float, ...] = (0.9, 0.7, 0.5, 0.3, 0.1)
    prompts: tuple[str, ...] = GENERIC_PROMPTS
    seed: int = 0
    gain_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_probes < 1:
            raise ValueError(f"num_probes must be >= 1, got {self.num_probes}")
        if not self.timesteps or any(not 0.0 <= t <= 1.0 for t in self.timesteps):
            raise ValueError(f"timesteps must be a non-empty tuple of values in [0, 1], got {self.timesteps}")
        if not self.prompts:
            raise ValueError("prompts must not be empty")
        if self.gain_steps is not None and self.gain_steps < 0:
            raise ValueError(f"gain_steps must be None or >= 0, got {self.gain_steps}")


@dataclass(frozen=True)
class Probes:
    """A batch of probe requests: x (B, tokens, in_channels) request tokens at times t (B,), txt (B, text_tokens,
    dim) prompts, and user (B, tokens, 3*p*p) the packed user images (to sample whole edits from)."""

    x: torch.Tensor
    txt: torch.Tensor
    t: torch.Tensor
    user: torch.Tensor


def _smooth_image(rng: np.random.Generator, size: int) -> np.ndarray:
    from PIL import Image

    cells = int(rng.integers(2, 9))
    low = rng.integers(0, 256, size=(cells, cells, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(low).resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    img += rng.normal(0.0, 6.0, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def sample_crop(rng: np.random.Generator, size: int) -> np.ndarray:
    name = sorted(DEMO_TEMPLATES)[int(rng.integers(0, len(DEMO_TEMPLATES)))]
    big = load_image(name, 2 * size)
    y, x = (int(v) for v in rng.integers(0, size + 1, size=2))
    crop = big[y : y + size, x : x + size]
    return np.ascontiguousarray(crop[:, ::-1] if rng.random() < 0.5 else crop)


def make_probes(model: EditModel, template: torch.Tensor | None, config: ProbeConfig, stream: int = 0) -> Probes:
    """``config.num_probes`` probe requests, a pure function of (config, stream).

    Args:
        template: (1, tokens, 3*p*p) packed template pixels, used as the clean latent of half the probes (an edit's
            output usually resembles its template); ``None`` uses the user images only.
        stream: 0 for the probes importance is fitted on, 1 for held-out probes, ... (disjoint random streams).
    """
    rng = np.random.default_rng([config.seed, stream, 0x5A4B])
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
    size = model.spec.image_size
    xs, txts, ts, users = [], [], [], []
    for i in range(config.num_probes):
        user_img = _smooth_image(rng, size) if rng.random() < 0.5 else sample_crop(rng, size)
        user = model.pack_image(user_img)  # (1, tokens, 3*p*p)
        x0 = template if (template is not None and i % 2 == 0) else user
        t = float(config.timesteps[i % len(config.timesteps)])
        noise = torch.randn(user.shape, generator=gen)
        xs.append(model.request_tokens((1.0 - t) * x0 + t * noise, user))
        users.append(user)
        txts.append(model.encode_prompt(config.prompts[int(rng.integers(0, len(config.prompts)))]))
        ts.append(t)
    return Probes(torch.cat(xs), torch.cat(txts), torch.tensor(ts, dtype=torch.float32), torch.cat(users))


# ---- capture --------------------------------------------------------------------------------------------------------

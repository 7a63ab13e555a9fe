"""The embedded demo model: a small FLUX.2-KV-architecture transformer that edits 64x64 images on a CPU.

Latent path: VAE-free. An RGB image in [-1, 1] is cut into ``patch_size`` x ``patch_size`` patches, one token per
patch (``3 * patch_size**2`` channels), row-major. A request token is the noisy target patch concatenated with the
user image's patch at the same place (channel concatenation); a template token is the template patch followed by
zeros. Text: a fixed, seeded byte-level embedding (no text encoder ships in any package), ``text_tokens`` tokens.

Weights: ``weights/demo_model.safetensors`` next to the config when present (trained, see ``sakura_tools.train.train``), else a
seeded random init — edits are then noise, but KV exactness and every systems path still hold.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

from .flux2_kv import Flux2KVAdapter
from .ref_layout import TokenLayout, as_references, layout_of

__all__ = ["EditModel", "ModelSpec", "load_demo_model", "load_image", "DEMO_TEMPLATES"]

logger = logging.getLogger(__name__)

_CONFIG = "demo_model.json"

# Demo templates: sample images that ship with scikit-image (name -> skimage.data function).
DEMO_TEMPLATES = {"astronaut": "astronaut", "coffee": "coffee", "chelsea": "chelsea", "rocket": "rocket"}


@dataclass(frozen=True)
class ModelSpec:
    """Geometry and transformer config of the demo model.

    Attributes:
        image_size: edit and template side in pixels (square).
        patch_size: pixels per token side; ``image_size`` must be a multiple.
        text_tokens: prompt length in tokens (fixed, so shapes are static for NPU export).
        ref_fixed_timestep: timestep (0..1) template tokens are modulated with.
        init_seed: seed of the random init used when no weights are found.
        weights: weights file relative to the config's folder.
        transformer: kwargs of ``Flux2Transformer2DModel``.
    """

    image_size: int = 64
    patch_size: int = 4
    text_tokens: int = 16
    ref_fixed_timestep: float = 0.0
    init_seed: int = 0
    weights: str = "weights/demo_model.safetensors"
    transformer: dict = field(default_factory=dict)
    name: str = "sakura-demo-edit"

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")
        if self.transformer and self.transformer.get("in_channels") != 2 * self.patch_dim:
            raise ValueError(
                f"transformer in_channels must be 2 * 3 * patch_size**2 = {2 * self.patch_dim} "
                f"(noisy + user patch), got {self.transformer.get('in_channels')}"
            )

    @property
    def grid(self) -> tuple[int, int]:
        side = self.image_size // self.patch_size
        return (side, side)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def patch_dim(self) -> int:
        return 3 * self.patch_size**2

    @classmethod
    def load(cls, path: str | Path | None = None) -> ModelSpec:
        text = Path(path).read_text() if path else resources.files(__package__).joinpath(_CONFIG).read_text()
        return cls(**json.loads(text))


def load_image(source, size: int) -> np.ndarray:
    """An image as (size, size, 3) uint8: a path, a (H, W[, 3|4]) array, or a scikit-image sample name.

    Non-square inputs are centre-cropped to a square first, then resized (bicubic).
    """
    from PIL import Image

    from ..images import open_image_file, to_uint8

    if isinstance(source, str) and source in DEMO_TEMPLATES:
        import skimage.data

        arr = getattr(skimage.data, DEMO_TEMPLATES[source])()
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"image {path} not found (or use a sample name: {', '.join(DEMO_TEMPLATES)})")
        arr = open_image_file(path)  # the pixel limit, 16-bit and palette images converted by their mode
    else:
        arr = np.asarray(source)
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"image must be (H, W, 3) or (H, W, 4), got shape {arr.shape}")
    arr = to_uint8(arr)  # uint16 scaled (not clipped), floats in [0, 1] times 255
    arr = arr[..., :3]
    h, w = arr.shape[:2]
    s = min(h, w)
    arr = arr[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
    return np.asarray(Image.fromarray(arr).resize((size, size), Image.Resampling.BICUBIC))


class EditModel:
    """The demo transformer with its token packing; ``adapter`` runs it in KV mode."""

    def __init__(self, spec: ModelSpec, transformer: Flux2Transformer2DModel, weights_source: str):
        self.spec = spec
        self.weights_source = weights_source
        self.adapter = Flux2KVAdapter(transformer, ref_fixed_timestep=spec.ref_fixed_timestep)
        gen = torch.Generator().manual_seed(1234)
        jdim = spec.transformer["joint_attention_dim"]
        self._byte_table = torch.randn(256, jdim, generator=gen) / jdim**0.5  # (256 byte values, joint_dim)
        self._timing_lock = threading.Lock()
        self._layer_times_s: tuple[float, float] | None = None

    @property
    def model_id(self) -> str:
        return self.adapter.model_id

    def layer_times_s(self) -> tuple[float, float]:
        """Seconds per layer on this machine: (with the template tokens, with the template's KV injected).

        Measured once (best of two full and two cached forwards at this model's own geometry, content-free inputs)
        and kept with this instance: timing does not depend on the image content.
        """
        with self._timing_lock:
            if self._layer_times_s is None:
                self._layer_times_s = self._measure_layer_times()
            return self._layer_times_s

    @torch.no_grad()
    def _measure_layer_times(self) -> tuple[float, float]:
        a, spec = self.adapter, self.spec
        template = torch.zeros(1, spec.num_tokens, spec.patch_dim)  # (1, tokens, 3*p*p)
        ref = torch.cat([template, torch.zeros_like(template)], dim=-1)  # (1, tokens, in_channels)
        kv = a.extract_template_kv(ref, spec.grid)
        x = self.request_tokens(torch.zeros_like(template), template)
        txt, t = self.encode_prompt("place it"), torch.tensor([0.5])
        best_full = best_cached = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            a.forward(x, txt, t, img_grid=spec.grid, ref_tokens=ref, ref_grid=spec.grid, split_layer=a.num_layers)
            t1 = time.perf_counter()
            a.forward(x, txt, t, img_grid=spec.grid, ref_grid=spec.grid, cached=kv)
            t2 = time.perf_counter()
            best_full, best_cached = min(best_full, t1 - t0), min(best_cached, t2 - t1)
        return best_full / a.num_layers, best_cached / a.num_layers

    # ---- images <-> tokens ---------------------------------------------------------------------------------
    def pack_image(self, image: np.ndarray, side: int | None = None) -> torch.Tensor:
        """(S, S, 3) uint8 -> (1, tokens, 3*p*p) float in [-1, 1], row-major patches.

        ``side``: the expected image side in pixels (default: the model's edit size; templates may be larger).
        """
        s, p = side or self.spec.image_size, self.spec.patch_size
        if image.shape != (s, s, 3):
            raise ValueError(f"image must be ({s}, {s}, 3) uint8 for this model, got {image.shape}; use load_image()")
        x = torch.from_numpy(image.astype(np.float32) / 127.5 - 1.0)  # (S, S, 3)
        g = s // p
        x = x.reshape(g, p, g, p, 3).permute(0, 2, 1, 3, 4)  # (g, g, p, p, 3)
        return x.reshape(1, g * g, p * p * 3)

    def unpack_tokens(self, tokens: torch.Tensor) -> np.ndarray:
        """(1, tokens, 3*p*p) in [-1, 1] -> (S, S, 3) uint8."""
        s, p = self.spec.image_size, self.spec.patch_size
        g = s // p
        x = tokens.detach().float().reshape(g, g, p, p, 3).permute(0, 2, 1, 3, 4)  # (g, p, g, p, 3)
        x = x.reshape(s, s, 3)
        return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()

    def template_tokens(self, template: np.ndarray) -> torch.Tensor:
        """Template image -> (1, tokens, in_channels): patch then zeros (no user image on the template side).

        The template may be larger than the edit (any square side that is a multiple of ``patch_size``, see
        :meth:`template_grid`): its tokens get their own position ids (the template's grid at the reference time).
        """
        refs = as_references(template)
        if refs is not None:  # several references: their tokens in order (their positions: ref_layout)
            return torch.cat([self.template_tokens(r) for r in refs], dim=1)
        t = self.pack_image(template, self._image_grid(template)[0] * self.spec.patch_size)
        return torch.cat([t, torch.zeros_like(t)], dim=-1)

    def template_grid(self, template: np.ndarray) -> TokenLayout:
        """Token grid of a square template image of side ``S >= image_size``, a multiple of ``patch_size``; of a list
        of reference images (one size), their grids (:mod:`.ref_layout`)."""
        refs = as_references(template)
        if refs is not None:
            return layout_of([self._image_grid(r) for r in refs])
        return self._image_grid(template)

    def _image_grid(self, template: np.ndarray) -> tuple[int, int]:
        """The token grid of one template image (:meth:`template_grid`)."""
        shape, p = np.shape(template), self.spec.patch_size
        if len(shape) != 3 or shape[0] != shape[1] or shape[2] != 3 or shape[0] % p or shape[0] < self.spec.image_size:
            raise ValueError(
                f"template must be (S, S, 3) uint8 with S a multiple of {p} and >= {self.spec.image_size}, got "
                f"{shape}; use load_image(source, size)"
            )
        return (shape[0] // p, shape[0] // p)

    def request_tokens(self, noisy: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
        """Noisy target tokens and packed user image -> (1, tokens, in_channels)."""
        return torch.cat([noisy, user], dim=-1)

    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """Prompt -> (1, text_tokens, joint_dim): byte embeddings plus a position ramp; padding is zero."""
        raw = prompt.lower().encode("utf-8")[: self.spec.text_tokens]
        emb = torch.zeros(1, self.spec.text_tokens, self._byte_table.shape[1])
        if raw:
            idx = torch.tensor(list(raw), dtype=torch.long)
            emb[0, : len(raw)] = self._byte_table[idx]
        return emb


def load_demo_model(
    spec: ModelSpec | None = None, weights: str | Path | None = "auto", dtype: torch.dtype = torch.float32
) -> EditModel:
    """Build the demo transformer; load trained weights when present (``weights="auto"``), a path, or ``None``.

    ``weights=None`` forces the seeded random init.
    """
    spec = spec or ModelSpec.load()
    torch.manual_seed(spec.init_seed)
    transformer = Flux2Transformer2DModel(**spec.transformer).eval()
    source = f"random-init(seed={spec.init_seed})"
    path: Path | None = None
    if weights == "auto":
        candidate = Path(str(resources.files(__package__).joinpath(spec.weights)))
        path = candidate if candidate.is_file() else None
    elif weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"demo model weights {path} not found; pass weights=None for the random init")
    if path is not None:
        from safetensors.torch import load_file

        state = load_file(str(path))
        missing, unexpected = transformer.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"weights {path} do not fit the demo config: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}; retrain or restore the matching demo_model.json"
            )
        source = f"trained:{path.name}"
    else:
        logger.info("demo model: no trained weights found, using %s", source)
    if dtype != torch.float32:
        transformer = transformer.to(dtype)
    return EditModel(spec, transformer, source)

"""The pieces of one FLUX.2 KV-mode forward that are not the adapter itself: RoPE ids and layout, the model's content
id, the forward's result and running state, per-token modulation (see :mod:`.flux2_kv`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "REF_TIME_OFFSET",
    "ROPE_LAYOUT",
    "DropHook",
    "ForwardResult",
    "LayerHook",
    "image_ids",
    "content_id",
    "model_content_id",
    "ref_position_ids",
    "text_ids",
]

from .ref_layout import REF_TIME_OFFSET, ROPE_LAYOUT, ref_grids


def model_content_id(model: torch.nn.Module, config: dict | None = None) -> str:
    """sha256 over the canonical JSON of the config and every parameter/buffer (name, dtype, shape, bytes).

    Two models with the same id compute the same KV; any changed weight, dtype or config value changes it. A
    config's ``out_channels: None`` counts as its ``in_channels`` (what diffusers builds), so a transformer read
    from a single file (whose config is read off its tensors) has the id of the same weights in a folder.
    """
    return content_id(dict(config if config is not None else getattr(model, "config", {})), model.state_dict())


def content_id(config: dict, tensors: dict[str, torch.Tensor]) -> str:
    """:func:`model_content_id` of a config and named tensors (a state dict) without building the model."""
    h = hashlib.sha256()
    cfg = dict(config)
    if "out_channels" in cfg and cfg["out_channels"] is None and "in_channels" in cfg:
        cfg["out_channels"] = cfg["in_channels"]
    h.update(json.dumps(_jsonable(cfg), sort_keys=True).encode())
    for name, tensor in sorted(tensors.items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def text_ids(num_tokens: int, device: torch.device | None = None) -> torch.Tensor:
    """RoPE ids of text tokens: (t, h, w, l) = (0, 0, 0, index). Shape (num_tokens, 4)."""
    ids = torch.zeros(num_tokens, 4, dtype=torch.long, device=device)
    ids[:, 3] = torch.arange(num_tokens, device=device)
    return ids


def image_ids(rows: int, cols: int, t: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """RoPE ids of an image token grid at time coordinate ``t``: (t, h, w, 0), row-major. Shape (rows*cols, 4)."""
    hh, ww = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
    ids = torch.zeros(rows * cols, 4, dtype=torch.long, device=device)
    ids[:, 0] = t
    ids[:, 1] = hh.reshape(-1)
    ids[:, 2] = ww.reshape(-1)
    return ids


def ref_position_ids(grid, device: torch.device | None = None) -> torch.Tensor:
    """RoPE ids of a template's references (a layout, :mod:`.ref_layout`): reference ``i`` at time
    ``REF_TIME_OFFSET * (i + 1)``, in order. Shape (template tokens, 4)."""
    grids = ref_grids(grid)
    return torch.cat([image_ids(r, c, t=REF_TIME_OFFSET * (i + 1), device=device) for i, (r, c) in enumerate(grids)])


@dataclass
class ForwardResult:
    """Output of one transformer forward.

    Attributes:
        sample: predicted velocity for the request image tokens, (batch, image_tokens, out_channels).
        extracted: K/V computed on the device for layers ``< split_layer`` (each (1, ref_tokens, heads, head_dim)),
            in layer order; empty when no template tokens were run.
    """

    sample: torch.Tensor
    extracted: list[tuple[torch.Tensor, torch.Tensor]]


LayerHook = Callable[[int], None]
DropHook = Callable[[int, torch.Tensor], None]  # (layer, template hidden state entering it)


@dataclass
class _Stream:
    """One forward's running state: the token sequence, the text stream and what every block reads.

    ``hidden`` is (batch, [ref +] img, dim) before the single-stream blocks and (batch, txt + [ref +] img, dim) in
    them; ``enc`` is (batch, txt, dim); the modulations are raw (batch, k * dim) vectors; the RoPE pairs cover
    (txt, img) or (txt, ref, img). The ``ref_*`` fields are None when no template tokens are run.
    """

    n_txt: int
    n_ref: int
    temb: torch.Tensor
    mod_img: torch.Tensor
    mod_txt: torch.Tensor
    mod_single: torch.Tensor
    hidden: torch.Tensor
    enc: torch.Tensor
    rope_plain: tuple[torch.Tensor, torch.Tensor] | None = None
    rope_with_ref: tuple[torch.Tensor, torch.Tensor] | None = None
    ref_mod_img: torch.Tensor | None = None
    ref_mod_single: torch.Tensor | None = None


def _blend_rows(mod: torch.Tensor, ref_mod: torch.Tensor, n_ref: int, seq_len: int, offset: int) -> torch.Tensor:
    """Per-token modulation: rows ``[offset, offset + n_ref)`` take ``ref_mod``, the others ``mod``.

    ``mod``/``ref_mod`` are raw modulation vectors (batch, k * dim) as ``Flux2Modulation`` returns them; the result is
    (batch, seq_len, k * dim), which ``Flux2Modulation.split`` chunks along the last dim exactly like the unblended one.
    """
    batch = mod.shape[0]
    out = mod.unsqueeze(1).expand(batch, seq_len, -1).clone()  # (batch, seq, k*dim)
    out[:, offset : offset + n_ref] = ref_mod.unsqueeze(1).expand(batch, n_ref, -1)
    return out


def _ref_time(ref_timestep: float | torch.Tensor | None, fixed: float, t: torch.Tensor) -> torch.Tensor:
    """The template tokens' modulation time, scaled like ``t`` (x1000): ``fixed`` when ``ref_timestep`` is None."""
    if ref_timestep is None:
        return torch.full_like(t, fixed * 1000)
    if isinstance(ref_timestep, torch.Tensor) and ref_timestep.numel() > 1:
        if ref_timestep.shape != t.shape:
            raise ValueError(
                f"ref_timestep must be a float or shaped like timestep {tuple(t.shape)}, "
                f"got {tuple(ref_timestep.shape)}"
            )
        return ref_timestep.to(t.dtype) * 1000
    value = float(ref_timestep)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"ref_timestep must be in [0, 1], got {value}")
    return torch.full_like(t, value * 1000)

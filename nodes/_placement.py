"""Where the Model Loader puts a model inside ComfyUI: device and dtype per part from ``comfy.model_management``.

ComfyUI decides, not the node: the transformer goes to ``get_torch_device()`` in ``unet_dtype(...)`` (bfloat16, or
float16 on a GPU without bfloat16; float32 on the CPU), the VAE to ``vae_device()`` in ``vae_dtype(...)`` and the
text encoder to ``text_encoder_device()`` in ``text_encoder_dtype(...)``, honouring ComfyUI's own flags
(``--cpu``, ``--bf16-unet``, ``--fp32-vae``, ``--cpu-vae`` ...). On the CPU every part computes in float32, as
ComfyUI's own CPU path does (it casts its float16 weights up). Float8 choices are not exact-KV weights: they fall back
to bfloat16, with a log line. Before a model goes to a GPU, ``free_memory`` asks ComfyUI to unload its own models
to make room.

The embedded demo model always loads in float32 (the example templates ``sakura examples`` publishes are float32,
and the dtype is part of the model id); it goes to ComfyUI's device like the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["Placement", "comfy_placement", "make_room"]

logger = logging.getLogger(__name__)

_EXACT = ("float32", "bfloat16", "float16")
_DEVICES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class Placement:
    """Device and dtype names (as ``--device`` / ``--dtype`` take them) of each part of a model.

    Attributes:
        device, dtype: the transformer's (its dtype is part of the model id).
        vae, text_encoder: ``(device, dtype)`` of a klein pipeline's VAE and text encoder.
    """

    device: str
    dtype: str
    vae: tuple[str, str]
    text_encoder: tuple[str, str]

    @property
    def parts(self) -> dict[str, tuple[str, str]]:
        return {"vae": self.vae, "text_encoder": self.text_encoder}

    def describe(self) -> str:
        return (
            f"transformer {self.dtype} on {self.device}, VAE {self.vae[1]} on {self.vae[0]}, text encoder "
            f"{self.text_encoder[1]} on {self.text_encoder[0]}"
        )


def _device_name(device) -> str:
    name = str(device)
    if name.split(":")[0] not in _DEVICES:
        logger.warning("sakura: ComfyUI's device %s is not one SAKURA runs on (cpu, cuda, mps); using the CPU", name)
        return "cpu"
    return name


def _dtype_name(dtype, device: str, part: str) -> str:
    if device == "cpu":
        return "float32"
    name = str(dtype).removeprefix("torch.")
    if name not in _EXACT:
        logger.warning(
            "sakura: ComfyUI chose %s for the %s; exact template KV needs bf16/fp16/fp32 weights: using bfloat16",
            name,
            part,
        )
        return "bfloat16"
    return name


def comfy_placement(mm) -> Placement:
    """The placement ComfyUI's model management (the module ``comfy.model_management``) picks for a klein model."""
    import torch

    device = _device_name(mm.get_torch_device())
    unet = mm.unet_dtype(device=torch.device(device), supported_dtypes=[torch.bfloat16, torch.float16, torch.float32])
    vae_device = _device_name(mm.vae_device())
    vae = mm.vae_dtype(device=torch.device(vae_device), allowed_dtypes=[torch.bfloat16, torch.float32])
    te_device = _device_name(mm.text_encoder_device())
    te = mm.text_encoder_dtype(torch.device(te_device))
    return Placement(
        device=device,
        dtype=_dtype_name(unet, device, "transformer"),
        vae=(vae_device, _dtype_name(vae, vae_device, "VAE")),
        text_encoder=(te_device, _dtype_name(te, te_device, "text encoder")),
    )


def make_room(mm, placement: Placement, weight_bytes: int) -> None:
    """Ask ComfyUI to unload its models until ``weight_bytes`` fit on each non-CPU device the model goes to."""
    import torch

    for device in sorted({placement.device, placement.vae[0], placement.text_encoder[0]} - {"cpu"}):
        mm.free_memory(weight_bytes, torch.device(device))

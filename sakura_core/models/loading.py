"""Which model a name or a path means (the embedded demo model, or a diffusers FLUX.2 [klein] pipeline folder), on
which device and in which precision.

Cheap to import (no torch until a model is loaded), so configs can validate ``--model``, ``--device`` and
``--dtype`` values.

The dtype is part of the model: weights cast to bfloat16 are other weights, so the model id (a content hash of the
config and the weights as loaded) changes with it, and KV precomputed in bfloat16 is for clients that run the model
in bfloat16 too. The device is not: the same weights on a GPU have the same id and compute the same KV up to the
device's arithmetic.
"""

from __future__ import annotations

import re

from .folders import KLEIN_PIPELINES, is_klein_folder

__all__ = [
    "DEMO_MODEL",
    "DTYPES",
    "KLEIN_PIPELINES",
    "check_device_dtype",
    "check_model_source",
    "is_klein_folder",
    "load_edit_model",
    "torch_device",
]

DEMO_MODEL = "demo"
#: dtype names accepted by ``--dtype`` (and their short forms) -> torch attribute names.
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
_DEVICE_RE = re.compile(r"cpu|cuda(:[0-9]{1,2})?|mps")


def check_model_source(source: str) -> None:
    """Raise ValueError naming the fix unless ``source`` is ``demo`` or a klein pipeline folder."""
    if source == DEMO_MODEL or is_klein_folder(source):
        return
    raise ValueError(
        f"unknown model {source!r}: use {DEMO_MODEL!r} or the path of a diffusers FLUX.2 [klein] pipeline folder "
        f"(its model_index.json names one of {', '.join(KLEIN_PIPELINES)})"
    )


def check_device_dtype(device: str, dtype: str | None) -> None:
    """Raise ValueError naming the accepted values unless ``device`` and ``dtype`` are well-formed (availability
    is checked when the model loads: :func:`torch_device`)."""
    if not isinstance(device, str) or _DEVICE_RE.fullmatch(device) is None:
        raise ValueError(f"unknown device {str(device)[:40]!r}: use cpu, cuda, cuda:N or mps")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {str(dtype)[:40]!r}: use one of {', '.join(DTYPES)} (or leave it unset)")


def torch_device(device: str):
    """``device`` as a ``torch.device``, after checking this machine has it (the error says what to use)."""
    import torch

    check_device_dtype(device, None)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r}: CUDA is not available here (torch {torch.__version__}, "
                f"{'a CPU build' if torch.version.cuda is None else 'no visible GPU'}); use --device cpu"
            )
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps': Metal is not available here; use --device cpu")
    return torch.device(device)


def load_edit_model(source: str, *, weights: str | None = "auto", device: str = "cpu", dtype: str | None = None):
    """The model ``source`` names: ``demo`` (``weights`` as ``load_demo_model``'s) or a klein pipeline folder, with
    its parameters in ``dtype`` (``None``: float32 for the demo model, float32 for a folder, as before) on
    ``device``. The model id is computed from the weights in ``dtype`` (see the module docstring)."""
    check_model_source(source)
    check_device_dtype(device, dtype)
    import torch

    target = torch_device(device)
    torch_dtype = getattr(torch, DTYPES[dtype]) if dtype is not None else torch.float32
    if source == DEMO_MODEL:
        from .edit_model import load_demo_model

        model = load_demo_model(weights=weights, dtype=torch_dtype)
        if target.type != "cpu":
            model.adapter.model.to(target)
        return model
    from .latent_model import load_klein_folder

    model = load_klein_folder(source, dtype=torch_dtype)
    if target.type != "cpu":
        model.pipe.to(target)
    return model

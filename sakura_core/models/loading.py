"""Which model a name or a path means (the embedded demo model, a diffusers FLUX.2 [klein] pipeline folder, or a
user's klein single files as ComfyUI keeps them: ``klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR``),
on which device and in which precision.

Cheap to import (no torch until a model is loaded), so configs can validate ``--model``, ``--device`` and
``--dtype`` values.

The dtype is part of the model: weights cast to bfloat16 are other weights, so the model id (a content hash of the
config and the weights as loaded) changes with it, and KV precomputed in bfloat16 is for clients that run the model
in bfloat16 too. The device is not: the same weights on a GPU have the same id and compute the same KV up to the
device's arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .folders import KLEIN_FILES_PREFIX, KLEIN_PIPELINES, KleinFiles, is_klein_folder

__all__ = [
    "DEMO_MODEL",
    "DTYPES",
    "add_device_arguments",
    "KLEIN_FILES_PREFIX",
    "KLEIN_PIPELINES",
    "KleinFiles",
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


def add_device_arguments(parser, *, what: str = "precompute") -> None:
    """``--device`` and ``--dtype`` of the model that runs ``what`` (every CLI that loads a model)."""
    parser.add_argument(
        "--device",
        default="cpu",
        help=f"device {what} runs the model on: cpu, cuda, cuda:N, mps (default: %(default)s)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=sorted(DTYPES),
        help=f"parameter dtype for {what} (default: float32); part of the model id, so a client and the server that "
        "precomputed its templates must run the model in the same dtype",
    )


def check_model_source(source: str | KleinFiles) -> None:
    """Raise ValueError naming the fix unless ``source`` is ``demo``, a klein pipeline folder or a klein files spec
    (whose files are checked: safetensors paths, a tokenizer folder)."""
    if isinstance(source, KleinFiles) or source == DEMO_MODEL or is_klein_folder(source):
        return
    if KleinFiles.is_spec(source):
        KleinFiles.parse(source)
        return
    raise ValueError(
        f"unknown model {source!r}: use {DEMO_MODEL!r}, the path of a diffusers FLUX.2 [klein] pipeline folder "
        f"(its model_index.json names one of {', '.join(KLEIN_PIPELINES)}), or ComfyUI-style single files as "
        f"{KLEIN_FILES_PREFIX}diffusion_model=A.safetensors,text_encoder=B.safetensors,vae=C.safetensors,tokenizer=DIR"
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


def load_edit_model(
    source: str | KleinFiles,
    *,
    weights: str | None = "auto",
    device: str = "cpu",
    dtype: str | None = None,
    parts: Mapping[str, tuple[str, str | None]] | None = None,
):
    """The model ``source`` names: ``demo`` (``weights`` as ``load_demo_model``'s), a klein pipeline folder or klein
    single files, with its parameters in ``dtype`` (``None``: float32) on ``device``. The model id is computed from
    the weights in ``dtype`` (see the module docstring); a folder and single files of the same weights share it.

    ``parts`` places a klein pipeline's ``"vae"`` and ``"text_encoder"`` apart from the transformer, as
    ``(device, dtype)`` each (ComfyUI picks a device and dtype per part); they do not change the model id.
    """
    check_model_source(source)
    check_device_dtype(device, dtype)
    unknown = sorted(set(parts or {}) - {"vae", "text_encoder"})
    if unknown:
        raise ValueError(f"parts {unknown}: only 'vae' and 'text_encoder' can be placed apart from the transformer")
    for part_device, part_dtype in (parts or {}).values():
        check_device_dtype(part_device, part_dtype)
    import torch

    def as_dtype(name: str | None):
        return getattr(torch, DTYPES[name]) if name is not None else torch.float32

    target = torch_device(device)
    if source == DEMO_MODEL:
        from .edit_model import load_demo_model

        demo = load_demo_model(weights=weights, dtype=as_dtype(dtype))
        if target.type != "cpu":
            demo.adapter.model.to(target)
        return demo
    placed = {"transformer": (target, as_dtype(dtype))}
    for part in ("vae", "text_encoder"):
        part_device, part_dtype = (parts or {}).get(part, (device, dtype))
        placed[part] = (torch_device(part_device), as_dtype(part_dtype))
    dtypes = {part: dt for part, (_, dt) in placed.items()}
    if isinstance(source, KleinFiles) or KleinFiles.is_spec(source):
        from .single_files import load_klein_files

        files = source if isinstance(source, KleinFiles) else KleinFiles.parse(source)
        model = load_klein_files(files, dtypes=dtypes)
    else:
        from .latent_model import load_klein_folder

        model = load_klein_folder(source, dtype={**dtypes, "default": dtypes["transformer"]})
    for part, (part_device, _) in placed.items():
        if part_device.type != "cpu":
            getattr(model.pipe, part).to(part_device)
    return model

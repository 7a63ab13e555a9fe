"""Sakura Model Loader: the embedded demo model, a user's FLUX.2 [klein] single files as ComfyUI keeps them, a
diffusers FLUX.2 [klein] pipeline folder, or a FLUX.2 KV transformer folder.

Single files (``model_name`` = ``KLEIN_FILES``) are picked as ComfyUI's own klein templates place them: the
transformer from ``models/diffusion_models``, the Qwen3 text encoder from ``models/text_encoders``, the VAE from
``models/vae`` (``sakura_core.models.single_files`` says what each holds), and a tokenizer: ComfyUI's bundled Qwen
tokenizer (with klein's prompt template) or the ``tokenizer/`` of a klein folder under ``models/diffusers``. The
same weights as a folder have the same model id, so templates precomputed with the folder serve them.

Device and dtype come from ComfyUI's model management (``nodes/_placement.py``): bfloat16 / float16 on a GPU,
float32 on the CPU; the demo model stays float32.

Folders are listed the way ComfyUI lists diffusers models: every folder under ``models/diffusers`` (any of
``folder_paths.get_folder_paths("diffusers")``) whose

* ``model_index.json`` names a FLUX.2 [klein] pipeline (``Flux2KleinKVPipeline``; what ``save_pretrained`` or a
  hub download of ``FLUX.2-klein-*-kv`` gives): loaded as is, latent space, VAE and Qwen3 text encoder included
  (``sakura_core.models.latent_model``; an optional ``sakura_spec.json`` there may set ``image_size``,
  ``text_tokens``, ``strength``); its ``transformer/`` subfolder is not listed separately; or whose
* ``config.json`` names ``Flux2Transformer2DModel`` — a pixel-patch transformer saved with ``save_pretrained``.
  That one also needs ``sakura_spec.json`` with the image geometry (``image_size``, ``patch_size``,
  ``text_tokens``, optionally ``ref_fixed_timestep``, ``name``), the fields of ``sakura_core/models/demo_model.json``
  without ``transformer``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from comfy_api.latest import io

from ._common import CATEGORY, SakuraModel, SakuraNodeError
from ._placement import Placement, comfy_placement, make_room

__all__ = [
    "COMFY_TOKENIZER",
    "DEMO",
    "KLEIN_FILES",
    "NONE",
    "SPEC_FILE",
    "SakuraModelLoader",
    "klein_files",
    "list_single_files",
    "list_transformer_folders",
    "load_model_folder",
]

logger = logging.getLogger(__name__)

DEMO = "demo (embedded)"
KLEIN_FILES = "klein single files (below)"
NONE = "none"
COMFY_TOKENIZER = "ComfyUI's Qwen tokenizer"
_FILE_KINDS = {"diffusion_model": "diffusion_models", "text_encoder": "text_encoders", "vae": "vae"}
SPEC_FILE = "sakura_spec.json"
_CLASS = "Flux2Transformer2DModel"
_MAX_DEPTH = 4  # folder levels searched below each models/diffusers root


def _roots() -> list[str]:
    import folder_paths

    return folder_paths.get_folder_paths("diffusers")


def list_transformer_folders() -> dict[str, Path]:
    """``{name shown in the combo: folder}`` of every klein pipeline and FLUX.2 transformer folder under the
    diffusers roots."""
    from sakura_core.models.loading import is_klein_folder

    found: dict[str, Path] = {}
    for root in _roots():
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            rel = os.path.relpath(dirpath, root)
            if rel.count(os.sep) + 1 >= _MAX_DEPTH:
                dirnames.clear()
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if "model_index.json" in filenames and is_klein_folder(dirpath):
                found.setdefault(Path(rel).as_posix(), Path(dirpath))
                dirnames.clear()  # its transformer/ is part of it
                continue
            if "config.json" not in filenames:
                continue
            try:
                config = json.loads(Path(dirpath, "config.json").read_text())
            except (OSError, ValueError) as e:
                logger.info("sakura: skipping %s: unreadable config.json (%s)", dirpath, e)
                continue
            if isinstance(config, dict) and config.get("_class_name") == _CLASS:
                found.setdefault(Path(rel).as_posix(), Path(dirpath))
    return found


def list_single_files(kind: str) -> list[str]:
    """The ``.safetensors`` files ComfyUI lists in its ``diffusion_models``, ``text_encoders`` or ``vae`` folders."""
    import folder_paths

    return [n for n in folder_paths.get_filename_list(_FILE_KINDS[kind]) if n.endswith(".safetensors")]


def _bundled_tokenizer() -> Path | None:
    """ComfyUI's own Qwen tokenizer folder (what its klein text encoder uses), when this ComfyUI ships one."""
    import importlib.util

    spec = importlib.util.find_spec("comfy.text_encoders")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "qwen25_tokenizer"
    return folder if folder.is_dir() else None


def klein_files(diffusion_model: str, text_encoder: str, vae: str, tokenizer: str):
    """The ``KleinFiles`` the widgets name (paths through ``folder_paths``); errors say which widget to set."""
    import folder_paths

    from sakura_core.models.loading import KleinFiles

    paths = {}
    for kind, name in (("diffusion_model", diffusion_model), ("text_encoder", text_encoder), ("vae", vae)):
        path = folder_paths.get_full_path(_FILE_KINDS[kind], name) if name != NONE else None
        if path is None:
            roots = ", ".join(folder_paths.get_folder_paths(_FILE_KINDS[kind])) or "(none configured)"
            raise SakuraNodeError(
                f"{kind}: pick the klein {kind.replace('_', ' ')} file (a .safetensors in models/"
                f"{_FILE_KINDS[kind]}: {roots}); got {name!r}. Found: {', '.join(list_single_files(kind)) or 'none'}"
            )
        paths[kind] = path
    if tokenizer == COMFY_TOKENIZER:
        folder = _bundled_tokenizer()
        if folder is None:
            raise SakuraNodeError(
                "tokenizer: this ComfyUI ships no comfy/text_encoders/qwen25_tokenizer; pick the tokenizer of a "
                "FLUX.2 [klein] pipeline folder under models/diffusers instead"
            )
        return KleinFiles(**paths, tokenizer=str(folder), klein_template=True)
    folders = list_transformer_folders()
    if tokenizer not in folders or not (folders[tokenizer] / "tokenizer").is_dir():
        raise SakuraNodeError(
            f"tokenizer: {tokenizer!r} is not a klein folder with a tokenizer/ under models/diffusers; "
            f"use {COMFY_TOKENIZER!r} or one of {', '.join(_tokenizer_folders()) or 'none'}"
        )
    return KleinFiles(**paths, tokenizer=str(folders[tokenizer] / "tokenizer"))


def _tokenizer_folders() -> list[str]:
    return [name for name, path in list_transformer_folders().items() if (path / "tokenizer").is_dir()]


def _weight_bytes(paths: list[Path]) -> int:
    """Bytes the weights take when loaded (their files' size: bf16 on disk, as a rough upper bound for bf16/fp16)."""
    files = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*.safetensors"))]
    return sum(p.stat().st_size for p in files)


def load_model_folder(folder: Path, name: str, placement: Placement | None = None):
    """The model in ``folder``: a klein pipeline (``LatentEditModel``, placed as ``placement`` says; default: CPU,
    float32) or a pixel-patch FLUX.2 transformer with its ``sakura_spec.json`` (``EditModel``, float32 on
    ``placement.device``); see the module doc."""
    from sakura_core.models.edit_model import EditModel, ModelSpec
    from sakura_core.models.loading import is_klein_folder

    if is_klein_folder(folder):
        return _load_klein(str(folder), name, placement)

    config = json.loads((folder / "config.json").read_text())
    spec_path = folder / SPEC_FILE
    if not spec_path.is_file():
        raise SakuraNodeError(
            f"model folder {name!r} holds a {_CLASS} (in_channels={config.get('in_channels')}) but no {SPEC_FILE}. "
            f"SAKURA runs FLUX.2 KV transformers in pixel-patch token space and needs the image geometry: add "
            f"{SPEC_FILE} with image_size, patch_size and text_tokens (as in sakura_core/models/demo_model.json). "
            "A latent-space FLUX.2 [klein] KV checkpoint (in_channels 128): put the whole diffusers pipeline folder "
            "(model_index.json, transformer/, vae/, text_encoder/, tokenizer/, scheduler/) under models/diffusers "
            "and pick that folder instead."
        )
    try:
        fields = json.loads(spec_path.read_text())
        if not isinstance(fields, dict) or "transformer" in fields:
            raise ValueError("expected a JSON object of ModelSpec fields without 'transformer'")
        transformer_cfg = {k: v for k, v in config.items() if not k.startswith("_")}
        spec = ModelSpec(**{"name": name, **fields, "transformer": transformer_cfg, "weights": ""})
    except (ValueError, TypeError) as e:
        raise SakuraNodeError(f"model folder {name!r}: {SPEC_FILE} does not fit the transformer: {e}") from e
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    try:
        transformer = Flux2Transformer2DModel.from_pretrained(str(folder)).eval()
    except Exception as e:  # diffusers/safetensors raise many types; all mean the same to the user, chained
        raise SakuraNodeError(f"model folder {name!r}: the transformer weights cannot be loaded: {e}") from e
    if placement is not None and placement.device != "cpu":
        transformer.to(placement.device)
    return EditModel(spec, transformer, f"folder:{name}")


def _load_klein(source, name: str, placement: Placement | None):
    from sakura_core.models.loading import load_edit_model

    where = placement or Placement("cpu", "float32", ("cpu", "float32"), ("cpu", "float32"))
    try:
        model = load_edit_model(source, device=where.device, dtype=where.dtype, parts=where.parts)
    except (OSError, ValueError, ImportError) as e:
        raise SakuraNodeError(
            f"{name!r} names a FLUX.2 [klein] model but cannot be loaded: {e}. A folder needs transformer/, vae/, "
            "text_encoder/, tokenizer/ and scheduler/ as Flux2KleinKVPipeline.save_pretrained writes them; single "
            "files need the bf16/fp16/fp32 safetensors ComfyUI's klein templates use; both need the transformers "
            "package (pip install transformers)"
        ) from e
    logger.info("sakura: loaded %s (%s; model id %s)", name, where.describe(), model.model_id[:16])
    return model


def _file_input(kind: str, label: str) -> io.Combo.Input:
    return io.Combo.Input(
        kind,
        options=[NONE, *list_single_files(kind)],
        default=NONE,
        optional=True,
        tooltip=f"With model_name {KLEIN_FILES!r}: the klein {label} (a .safetensors in models/{_FILE_KINDS[kind]}, as "
        "ComfyUI's klein templates place it). Unquantized files only (bf16/fp16/fp32).",
    )


class SakuraModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraModelLoader",
            display_name="Sakura Model Loader",
            category=CATEGORY,
            description="Loads the DiT that edits on this machine: the embedded demo model (64 px), FLUX.2 [klein] "
            "single files (models/diffusion_models + text_encoders + vae, as ComfyUI's klein templates use), or a "
            "FLUX.2 [klein] KV pipeline folder / FLUX.2 KV transformer folder from models/diffusers. ComfyUI picks "
            "the device and dtype (bf16/fp16 on a GPU, fp32 on the CPU; the demo model stays fp32).",
            inputs=[
                io.Combo.Input(
                    "model_name",
                    options=[DEMO, KLEIN_FILES, *list_transformer_folders()],
                    default=DEMO,
                    tooltip=f"'demo (embedded)', {KLEIN_FILES!r} (the three files below), a diffusers FLUX.2 [klein] "
                    "pipeline folder (model_index.json) or a FLUX.2 transformer folder (with "
                    f"{SPEC_FILE} beside its config.json) under models/diffusers.",
                ),
                _file_input("diffusion_model", "transformer"),
                _file_input("text_encoder", "Qwen3 text encoder (qwen_3_4b / qwen_3_8b)"),
                _file_input("vae", "VAE (flux2-vae)"),
                io.Combo.Input(
                    "tokenizer",
                    options=[COMFY_TOKENIZER, *_tokenizer_folders()],
                    default=COMFY_TOKENIZER,
                    optional=True,
                    tooltip=f"With {KLEIN_FILES!r}: the Qwen tokenizer ComfyUI ships (klein's prompt template), or "
                    "the tokenizer/ of a klein pipeline folder under models/diffusers (exactly the model's own).",
                ),
            ],
            outputs=[
                SakuraModel.Output(
                    "model",
                    display_name="SAKURA_MODEL",
                    tooltip="The editing DiT; into the Template KV Loader (to check the template) and the sampler.",
                )
            ],
        )

    @classmethod
    def execute(
        cls,
        model_name: str,
        diffusion_model: str | None = None,
        text_encoder: str | None = None,
        vae: str | None = None,
        tokenizer: str | None = None,
    ) -> io.NodeOutput:
        import comfy.model_management as mm

        placement = comfy_placement(mm)
        if model_name == DEMO:
            from sakura_core.models.loading import load_edit_model

            return io.NodeOutput(load_edit_model("demo", device=placement.device))  # float32: see _placement
        if model_name == KLEIN_FILES:
            files = klein_files(
                diffusion_model or NONE, text_encoder or NONE, vae or NONE, tokenizer or COMFY_TOKENIZER
            )
            make_room(
                mm, placement, _weight_bytes([Path(files.diffusion_model), Path(files.text_encoder), Path(files.vae)])
            )
            return io.NodeOutput(_load_klein(files, files.name, placement))
        folders = list_transformer_folders()
        if model_name not in folders:
            roots = ", ".join(_roots()) or "(none configured)"
            raise SakuraNodeError(
                f"model folder {model_name!r} is not among the FLUX.2 klein / transformer folders under {roots}; "
                f"found: {', '.join(folders) or 'none'}"
            )
        make_room(mm, placement, _weight_bytes([folders[model_name]]))
        return io.NodeOutput(load_model_folder(folders[model_name], model_name, placement))

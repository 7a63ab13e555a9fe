"""Sakura Model Loader: the embedded demo model, a diffusers FLUX.2 [klein] pipeline folder, or a FLUX.2 KV
transformer folder.

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

__all__ = ["DEMO", "SPEC_FILE", "SakuraModelLoader", "list_transformer_folders", "load_model_folder"]

logger = logging.getLogger(__name__)

DEMO = "demo (embedded)"
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


def load_model_folder(folder: Path, name: str):
    """The model in ``folder``: a klein pipeline (``LatentEditModel``) or a pixel-patch FLUX.2 transformer with its
    ``sakura_spec.json`` (``EditModel``); see the module doc."""
    from sakura_core.models.edit_model import EditModel, ModelSpec
    from sakura_core.models.loading import is_klein_folder

    if is_klein_folder(folder):
        return _load_klein(folder, name)

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
    return EditModel(spec, transformer, f"folder:{name}")


def _load_klein(folder: Path, name: str):
    from sakura_core.models.latent_model import load_klein_folder

    try:
        return load_klein_folder(folder)
    except (OSError, ValueError, ImportError) as e:
        raise SakuraNodeError(
            f"model folder {name!r} names a FLUX.2 [klein] pipeline but cannot be loaded: {e}. It needs "
            "transformer/, vae/, text_encoder/, tokenizer/ and scheduler/ as Flux2KleinKVPipeline.save_pretrained "
            "writes them, and the transformers package (pip install transformers)"
        ) from e


class SakuraModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraModelLoader",
            display_name="Sakura Model Loader",
            category=CATEGORY,
            description="Loads the DiT that edits on this machine: the embedded demo model (64 px, CPU), or a "
            "FLUX.2 [klein] KV pipeline folder (VAE + text encoder, latent space) or FLUX.2 KV transformer folder "
            "from models/diffusers.",
            inputs=[
                io.Combo.Input(
                    "model_name",
                    options=[DEMO, *list_transformer_folders()],
                    default=DEMO,
                    tooltip="'demo (embedded)', a diffusers FLUX.2 [klein] pipeline folder (model_index.json) or a "
                    f"FLUX.2 transformer folder (with {SPEC_FILE} beside its config.json) under models/diffusers.",
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
    def execute(cls, model_name: str) -> io.NodeOutput:
        model = model_name
        if model == DEMO:
            from sakura_core.models.edit_model import load_demo_model

            return io.NodeOutput(load_demo_model())
        folders = list_transformer_folders()
        if model not in folders:
            roots = ", ".join(_roots()) or "(none configured)"
            raise SakuraNodeError(
                f"model folder {model!r} is not among the FLUX.2 klein / transformer folders under {roots}; "
                f"found: {', '.join(folders) or 'none'}"
            )
        return io.NodeOutput(load_model_folder(folders[model], model))

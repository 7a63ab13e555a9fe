"""The Model Loader inside ComfyUI (stand-in API): a user's FLUX.2 [klein] single files picked from
models/diffusion_models, text_encoders and vae (the tiny klein folder written in ComfyUI's layout) load with the
folder's model id, and device and dtype come from ``comfy.model_management``."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ci_deps import import_or_skip

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")


@pytest.fixture(scope="module")
def comfy_models(comfy, tmp_path_factory, klein_folder, klein_single_files):
    """ComfyUI's model folders: the three klein files where ComfyUI's klein templates put them, and the klein
    folder under models/diffusers (for its tokenizer)."""
    root = tmp_path_factory.mktemp("comfyui") / "models"
    shutil.copytree(klein_folder, root / "diffusers" / "tiny-klein")
    kinds = {
        "diffusion_models": klein_single_files.diffusion_model,
        "text_encoders": klein_single_files.text_encoder,
        "vae": klein_single_files.vae,
    }
    saved = dict(comfy.folder_paths.folder_names_and_paths)
    for kind, path in kinds.items():
        shutil.copytree(Path(path).parent, root / kind)
        comfy.folder_paths.folder_names_and_paths[kind] = ([str(root / kind)], {".safetensors"})
    comfy.folder_paths.folder_names_and_paths["diffusers"] = ([str(root / "diffusers")], {"folder"})
    try:
        yield {kind: Path(path).name for kind, path in kinds.items()}
    finally:
        comfy.folder_paths.folder_names_and_paths.update(saved)


def _inputs(names, **overrides):
    values = dict(
        model_name="klein single files (below)",
        diffusion_model=names["diffusion_models"],
        text_encoder=names["text_encoders"],
        vae=names["vae"],
        tokenizer="tiny-klein",
    )
    return {**values, **overrides}


def test_the_loader_lists_comfyuis_klein_files(node_classes, comfy_models):
    inputs = {i.id: i for i in node_classes["SakuraModelLoader"].GET_SCHEMA().inputs}
    assert inputs["model_name"].options == ["demo (embedded)", "klein single files (below)", "tiny-klein"]
    assert inputs["diffusion_model"].options == ["none", comfy_models["diffusion_models"]]  # not the .sakura_spec.json
    assert inputs["text_encoder"].options == ["none", comfy_models["text_encoders"]]
    assert inputs["vae"].options == ["none", comfy_models["vae"]]
    assert inputs["tokenizer"].options == ["ComfyUI's Qwen tokenizer", "tiny-klein"]
    assert all(inputs[k].optional for k in ("diffusion_model", "text_encoder", "vae", "tokenizer"))


def test_single_files_load_with_the_folders_model_id(node_classes, run_node, comfy_models, klein_model):
    (model,) = run_node(node_classes["SakuraModelLoader"], **_inputs(comfy_models))
    assert model.model_id == klein_model.model_id  # the folder's templates serve these files
    assert model.spec.grid == klein_model.spec.grid and model.weights_source.startswith("files:")
    assert model.adapter.dtype == torch.float32  # ComfyUI on the CPU: float32 for every part
    assert model.text_encoder.dtype == torch.float32 and model.vae.dtype == torch.float32


def test_missing_files_and_tokenizers_name_the_widget(comfy, node_classes, run_node, comfy_models):
    SakuraNodeError = comfy.nodes._common.SakuraNodeError
    loader = node_classes["SakuraModelLoader"]
    with pytest.raises(SakuraNodeError, match=r"vae: pick the klein vae file .*Found: tiny-klein-vae.safetensors"):
        run_node(loader, **_inputs(comfy_models, vae="none"))
    with pytest.raises(SakuraNodeError, match="tokenizer: this ComfyUI ships no comfy/text_encoders/qwen25_tokenizer"):
        run_node(loader, **_inputs(comfy_models, tokenizer="ComfyUI's Qwen tokenizer"))
    with pytest.raises(SakuraNodeError, match="not a klein folder with a tokenizer/"):
        run_node(loader, **_inputs(comfy_models, tokenizer="elsewhere"))
    with pytest.raises(SakuraNodeError, match="cannot be loaded: .*not a FLUX.2 transformer"):
        run_node(loader, **_inputs(comfy_models, diffusion_model="../vae/" + comfy_models["vae"]))


def test_comfyuis_device_reaches_the_loader(comfy, node_classes, run_node, comfy_models):
    """A GPU ComfyUI (stand-in): the model goes to ComfyUI's device after ComfyUI freed room there; without a GPU
    here, loading says so (it was asked for CUDA)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the stand-in's 'cuda' would load")
    comfy.mm.emulate_gpu, comfy.mm.freed[:] = True, []
    try:
        with pytest.raises(Exception, match="CUDA is not available here"):
            run_node(node_classes["SakuraModelLoader"], **_inputs(comfy_models))
    finally:
        comfy.mm.emulate_gpu = False
    assert comfy.mm.freed and all(device == "cuda" and n > 100_000 for n, device in comfy.mm.freed)


def _mm(device: str, unet, vae, te, vae_device=None, te_device=None):
    return SimpleNamespace(
        get_torch_device=lambda: torch.device(device),
        unet_dtype=lambda device=None, supported_dtypes=(), **_: unet or supported_dtypes[0],
        vae_device=lambda: torch.device(vae_device or device),
        vae_dtype=lambda device=None, allowed_dtypes=(): vae or allowed_dtypes[0],
        text_encoder_device=lambda: torch.device(te_device or device),
        text_encoder_dtype=lambda device=None: te,
    )


def test_placement_follows_comfyuis_model_management(comfy, caplog):
    comfy_placement = comfy.nodes._placement.comfy_placement
    gpu = comfy_placement(_mm("cuda:0", None, None, torch.float16))
    assert (gpu.device, gpu.dtype, gpu.vae, gpu.text_encoder) == (
        "cuda:0",
        "bfloat16",
        ("cuda:0", "bfloat16"),
        ("cuda:0", "float16"),
    )
    old_gpu = comfy_placement(_mm("cuda", torch.float16, torch.float32, torch.float16, te_device="cpu"))
    assert (old_gpu.dtype, old_gpu.vae[1], old_gpu.text_encoder) == ("float16", "float32", ("cpu", "float32"))
    cpu = comfy_placement(_mm("cpu", torch.bfloat16, torch.bfloat16, torch.float16))
    assert {cpu.dtype, cpu.vae[1], cpu.text_encoder[1]} == {"float32"}  # ComfyUI's CPU path computes in fp32
    with caplog.at_level(logging.WARNING):
        odd = comfy_placement(_mm("xpu", None, None, torch.float8_e4m3fn, te_device="cuda"))
    assert odd.device == "cpu" and odd.text_encoder == ("cuda", "bfloat16")
    assert "xpu is not one SAKURA runs on" in caplog.text and "float8_e4m3fn for the text encoder" in caplog.text

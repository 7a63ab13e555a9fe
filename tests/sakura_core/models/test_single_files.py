"""A user's FLUX.2 [klein] single files as ComfyUI keeps them (``single_files``): the tiny klein folder written in
ComfyUI's layout (``single_file_export``) loads back bit-exact (every tensor, dtype and model id, float32 and
bfloat16), edits bit-exactly as the folder does, and bad or quantized files are refused with the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ci_deps import import_or_skip

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")

# What ComfyUI reads to tell the three files apart (comfy/model_detection.py detect_unet_config, comfy/sd.py
# detect_te_model and its VAE branch): present in every file we write, as in Comfy-Org's klein files.
COMFY_DETECTS = {
    "diffusion_model": (
        "double_stream_modulation_img.lin.weight",
        "double_blocks.0.img_attn.norm.key_norm.scale",
        "img_in.weight",
        "txt_in.weight",
        "single_blocks.0.linear1.weight",
    ),
    "text_encoder": (
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.embed_tokens.weight",
    ),
    "vae": (
        "decoder.conv_in.weight",
        "bn.running_mean",
        "bn.running_var",
        "decoder.post_quant_conv.weight",
        "encoder.quant_conv.weight",
        "encoder.down.0.block.0.conv1.weight",
        "decoder.mid.attn_1.q.weight",
    ),
}


@pytest.fixture(scope="module")
def models(klein_folder, klein_single_files, klein_model):
    from sakura_core.models.loading import load_edit_model

    torch.set_num_threads(1)
    return klein_model, load_edit_model(klein_single_files)


def _keys(path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def test_the_files_are_in_comfyuis_layout(klein_single_files):
    for part, keys in COMFY_DETECTS.items():
        held = _keys(getattr(klein_single_files, part))
        assert set(keys) <= held, (part, sorted(set(keys) - held))
    transformer = _keys(klein_single_files.diffusion_model)
    assert not any(k.startswith(("transformer_blocks.", "x_embedder")) or k.endswith(".bias") for k in transformer)
    assert not any("down_blocks" in k or "to_q" in k for k in _keys(klein_single_files.vae))
    # tied, as Qwen3-4B's (qwen_3_4b.safetensors)
    assert "lm_head.weight" not in _keys(klein_single_files.text_encoder)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_files_load_bit_exact_with_the_folders_model_id(klein_folder, klein_single_files, dtype):
    from sakura_core.models.loading import load_edit_model

    folder = load_edit_model(str(klein_folder), dtype=dtype)
    files = load_edit_model(klein_single_files, dtype=dtype)
    assert files.model_id == folder.model_id  # templates precomputed with the folder serve the files
    for part in ("transformer", "vae", "text_encoder"):
        a, b = getattr(folder.pipe, part).state_dict(), getattr(files.pipe, part).state_dict()
        assert set(a) == set(b), part
        bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
        assert not bad, (part, bad[:3])
    assert files.spec.grid == folder.spec.grid and files.spec.text_tokens == folder.spec.text_tokens  # the sidecar


def test_single_files_edit_exactly_as_the_folder(models):
    from sakura_core.runtime.denoise import run_edit

    folder, files = models
    rng = np.random.default_rng(3)
    template = (rng.random((64, 64, 3)) * 255).astype(np.uint8)
    user = (rng.random((64, 64, 3)) * 255).astype(np.uint8)
    outs = []
    for model in (folder, files):
        kv = model.adapter.extract_template_kv(model.template_tokens(template), model.template_grid(template))
        run = run_edit(
            model, user, "swap the face", steps=2, seed=1, kv_source=kv, split_layer=1, template_image=template
        )
        outs.append((kv.kv, model.unpack_tokens(run.tokens)))
    diff_kv = float((outs[0][0] - outs[1][0]).abs().max())
    diff_image = int(np.abs(outs[0][1].astype(int) - outs[1][1].astype(int)).max())
    print(f"single files vs folder: max |KV diff| {diff_kv}, max |image diff| {diff_image}")  # noqa: T201 (-s figure)
    assert diff_kv == 0.0 and diff_image == 0
    assert outs[0][1].std() > 1  # a real image


def test_prefixed_transformer_and_spec_string(klein_single_files, klein_model, tmp_path):
    from safetensors.torch import load_file, save_file

    from sakura_core.models.loading import KleinFiles, check_model_source
    from sakura_core.models.single_files import load_transformer_file

    state = load_file(klein_single_files.diffusion_model)
    save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(tmp_path / "prefixed.safetensors"))
    transformer = load_transformer_file(tmp_path / "prefixed.safetensors")
    assert torch.equal(transformer.x_embedder.weight, klein_model.adapter.model.x_embedder.weight)
    f = klein_single_files
    spec = f"klein-files:diffusion_model={f.diffusion_model},text_encoder={f.text_encoder},vae={f.vae},tokenizer={f.tokenizer}"
    assert KleinFiles.parse(spec) == f
    check_model_source(spec)
    with pytest.raises(ValueError, match="names no tokenizer"):
        KleinFiles.parse(spec.rsplit(",", 1)[0])
    with pytest.raises(ValueError, match="key=path"):
        KleinFiles.parse(spec + ",lora=x")


def test_bad_files_are_refused_with_the_fix(klein_single_files, tmp_path):
    from safetensors.torch import load_file, save_file

    from sakura_core.models.loading import KleinFiles
    from sakura_core.models.single_files import load_text_encoder_file, load_transformer_file, load_vae_file

    f = klein_single_files
    with pytest.raises(ValueError, match="not a FLUX.2 transformer"):
        load_transformer_file(f.vae)
    with pytest.raises(ValueError, match="no 'model.layers.0.self_attn.q_norm.weight'"):
        load_text_encoder_file(f.diffusion_model)
    with pytest.raises(ValueError, match=r"not a FLUX.2 \[klein\] VAE file"):
        load_vae_file(f.text_encoder)
    state = load_file(f.diffusion_model)
    quant = {**state, "img_in.weight": state["img_in.weight"].to(torch.float8_e4m3fn)}
    save_file(quant, str(tmp_path / "klein-fp8mixed.safetensors"))
    with pytest.raises(ValueError, match="quantized .*use the unquantized file"):
        load_transformer_file(tmp_path / "klein-fp8mixed.safetensors")
    del state["single_blocks.1.linear2.weight"]
    save_file(state, str(tmp_path / "truncated.safetensors"))
    with pytest.raises(ValueError, match="missing .*single_transformer_blocks.1.attn.to_out.weight"):
        load_transformer_file(tmp_path / "truncated.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_vae_file(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="only .safetensors"):
        KleinFiles(str(tmp_path / "klein.ckpt"), f.text_encoder, f.vae, f.tokenizer)
    with pytest.raises(ValueError, match="tokenizer .* is not a folder"):
        KleinFiles(f.diffusion_model, f.text_encoder, f.vae, str(tmp_path / "nope"))


def test_model_id_counts_out_channels_none_as_in_channels(klein_model):
    from sakura_core.models.flux2_parts import model_content_id

    model = klein_model.adapter.model
    cfg = dict(model.config)
    assert cfg["out_channels"] is None
    explicit = model_content_id(model, {**cfg, "out_channels": cfg["in_channels"]})
    assert explicit == model_content_id(model) == klein_model.model_id
    assert model_content_id(model, {**cfg, "out_channels": cfg["in_channels"] + 1}) != explicit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_id_from_a_loaded_state_dict_is_the_files_model_id(klein_single_files, dtype):
    """What the ComfyUI MODEL patch computes from ComfyUI's loaded tensors (BFL keys, optional prefix, ComfyUI's
    dtype) is the id `sakura precompute --model klein-files:...` gives for that file in that dtype."""
    from sakura_core.models.loading import load_edit_model
    from sakura_core.models.single_files import read_checkpoint, transformer_state_model_id

    state = {
        f"diffusion_model.{k}": v.to(dtype)
        for k, v in read_checkpoint(klein_single_files.diffusion_model, "diffusion model").items()
    }
    name = "bfloat16" if dtype == torch.bfloat16 else None
    assert transformer_state_model_id(state) == load_edit_model(klein_single_files, dtype=name).model_id
    changed = dict(state)
    key = next(k for k in changed if k.endswith("img_in.weight"))
    changed[key] = changed[key] + 1e-2
    assert transformer_state_model_id(changed) != transformer_state_model_id(state)

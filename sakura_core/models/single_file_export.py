"""A diffusers FLUX.2 [klein] pipeline as ComfyUI's three single files (the inverse of :mod:`.single_files`).

Writes ``diffusion_models/<name>.safetensors`` (Black Forest Labs' transformer keys), ``text_encoders/<name>-qwen3
.safetensors`` (Qwen3 under ``model.``, no ``lm_head`` when tied) and ``vae/<name>-vae.safetensors`` (LDM layout,
``encoder.quant_conv`` / ``decoder.post_quant_conv``, ``bn.*``) into ``OUT`` (and the folder's ``sakura_spec.json``
as ``diffusion_models/<name>.sakura_spec.json``) — ComfyUI's folder names, so ``OUT`` can
be a ComfyUI ``models/`` folder. The tests build their single-file checkpoints offline this way from the tiny klein
folder; a user can put a diffusers klein into ComfyUI with it::

    python -m sakura_core.models.single_file_export KLEIN_FOLDER OUT [--name flux-2-klein-4b]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from .folders import KleinFiles
from .single_files import spec_sidecar

__all__ = ["save_single_files", "text_encoder_tensors", "transformer_tensors", "vae_tensors"]

_TOP = {
    "x_embedder.": "img_in.",
    "context_embedder.": "txt_in.",
    "time_guidance_embed.timestep_embedder.linear_1.": "time_in.in_layer.",
    "time_guidance_embed.timestep_embedder.linear_2.": "time_in.out_layer.",
    "time_guidance_embed.guidance_embedder.linear_1.": "guidance_in.in_layer.",
    "time_guidance_embed.guidance_embedder.linear_2.": "guidance_in.out_layer.",
    "double_stream_modulation_img.linear.": "double_stream_modulation_img.lin.",
    "double_stream_modulation_txt.linear.": "double_stream_modulation_txt.lin.",
    "single_stream_modulation.linear.": "single_stream_modulation.lin.",
    "proj_out.": "final_layer.linear.",
}
_DOUBLE = {
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale",
    "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
    "attn.to_out.0.weight": "img_attn.proj.weight",
    "attn.to_add_out.weight": "txt_attn.proj.weight",
    "ff.linear_in.weight": "img_mlp.0.weight",
    "ff.linear_out.weight": "img_mlp.2.weight",
    "ff_context.linear_in.weight": "txt_mlp.0.weight",
    "ff_context.linear_out.weight": "txt_mlp.2.weight",
}
_SINGLE = {
    "attn.to_qkv_mlp_proj.weight": "linear1.weight",
    "attn.to_out.weight": "linear2.weight",
    "attn.norm_q.weight": "norm.query_norm.scale",
    "attn.norm_k.weight": "norm.key_norm.scale",
}
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")


def transformer_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers ``Flux2Transformer2DModel`` state dict in Black Forest Labs' key layout (fused q/k/v, the final
    modulation as (shift, scale))."""
    out: dict[str, torch.Tensor] = {}
    left = dict(state)
    doubles = sorted({int(m.group(2)) for k in state if (m := _BLOCK.match(k)) and m.group(1) == "transformer_blocks"})
    for kind, names in (("img", ("to_q", "to_k", "to_v")), ("txt", ("add_q_proj", "add_k_proj", "add_v_proj"))):
        for n in doubles:
            parts = [left.pop(f"transformer_blocks.{n}.attn.{p}.weight") for p in names]
            out[f"double_blocks.{n}.{kind}_attn.qkv.weight"] = torch.cat(parts, dim=0)
    norm = left.pop("norm_out.linear.weight")
    scale, shift = norm.chunk(2, dim=0)  # diffusers keeps (scale, shift); BFL's adaLN_modulation is (shift, scale)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale], dim=0)
    for key, value in left.items():
        out[_transformer_key(key)] = value
    return out


def _transformer_key(key: str) -> str:
    m = _BLOCK.match(key)
    if m:
        table, prefix = (
            (_DOUBLE, "double_blocks") if m.group(1) == "transformer_blocks" else (_SINGLE, "single_blocks")
        )
        if m.group(3) not in table:
            raise ValueError(f"transformer tensor {key!r} has no place in the FLUX.2 single-file layout")
        return f"{prefix}.{m.group(2)}.{table[m.group(3)]}"
    for old, new in _TOP.items():
        if key.startswith(old):
            return new + key[len(old) :]
    raise ValueError(f"transformer tensor {key!r} has no place in the FLUX.2 single-file layout")


def _resnet(key: str) -> str:
    return key.replace("conv_shortcut", "nin_shortcut")


def _vae_key(key: str, levels: int) -> str:
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    rules = [
        (
            r"^(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.+)$",
            lambda m: f"{m[1]}.mid.block_{int(m[2]) + 1}.{_resnet(m[3])}",
        ),
        (
            r"^(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(.+)$",
            lambda m: f"{m[1]}.mid.attn_1.{attn[m[2]]}.{m[3]}",
        ),
        (
            r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$",
            lambda m: f"encoder.down.{m[1]}.block.{m[2]}.{_resnet(m[3])}",
        ),
        (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.+)$", lambda m: f"encoder.down.{m[1]}.downsample.{m[2]}"),
        (
            r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$",
            lambda m: f"decoder.up.{levels - 1 - int(m[1])}.block.{m[2]}.{_resnet(m[3])}",
        ),
        (
            r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)$",
            lambda m: f"decoder.up.{levels - 1 - int(m[1])}.upsample.{m[2]}",
        ),
        (r"^(encoder|decoder)\.conv_norm_out\.(.+)$", lambda m: f"{m[1]}.norm_out.{m[2]}"),
        (r"^quant_conv\.(.+)$", lambda m: f"encoder.quant_conv.{m[1]}"),
        (r"^post_quant_conv\.(.+)$", lambda m: f"decoder.post_quant_conv.{m[1]}"),
        (r"^((encoder|decoder)\.(conv_in|conv_out)|bn)\.(.+)$", lambda m: key),
    ]
    for pattern, name in rules:
        m = re.match(pattern, key)
        if m:
            return name(m)
    raise ValueError(f"VAE tensor {key!r} has no place in the FLUX.2 VAE single-file layout")


def vae_tensors(state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """A diffusers ``AutoencoderKLFlux2`` state dict in the LDM layout ComfyUI's ``flux2-vae.safetensors`` uses
    (attention projections as 1x1 convolutions)."""
    out = {}
    for key, value in state.items():
        new = _vae_key(key, levels)
        if ".mid.attn_1." in new and new.endswith(".weight") and value.ndim == 2:
            value = value.reshape(*value.shape, 1, 1)  # (out, in) -> (out, in, 1, 1)
        out[new] = value
    return out


def text_encoder_tensors(model) -> dict[str, torch.Tensor]:
    """A ``Qwen3ForCausalLM``'s tensors as ComfyUI's Qwen3 files hold them (``lm_head`` dropped when tied)."""
    state = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_single_files(folder: str | Path, out: str | Path, name: str | None = None) -> KleinFiles:
    """Write the klein pipeline ``folder`` as ComfyUI's three files under ``out`` (see the module doc); returns them
    with the folder's ``tokenizer/`` as the tokenizer."""
    from diffusers import Flux2KleinKVPipeline
    from safetensors.torch import save_file

    folder, out = Path(folder), Path(out)
    name = name or folder.name
    pipe = Flux2KleinKVPipeline.from_pretrained(str(folder))
    paths = {
        "diffusion_model": out / "diffusion_models" / f"{name}.safetensors",
        "text_encoder": out / "text_encoders" / f"{name}-qwen3.safetensors",
        "vae": out / "vae" / f"{name}-vae.safetensors",
    }
    levels = len(pipe.vae.config.block_out_channels)
    tensors = {
        "diffusion_model": transformer_tensors(pipe.transformer.state_dict()),
        "text_encoder": text_encoder_tensors(pipe.text_encoder),
        "vae": vae_tensors(pipe.vae.state_dict(), levels),
    }
    for part, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors[part].items()}, str(path))
    if (folder / "sakura_spec.json").is_file():  # the folder's image size / prompt length go with the files
        spec_sidecar(paths["diffusion_model"]).write_text((folder / "sakura_spec.json").read_text())
    return KleinFiles(
        diffusion_model=str(paths["diffusion_model"]),
        text_encoder=str(paths["text_encoder"]),
        vae=str(paths["vae"]),
        tokenizer=str(folder / "tokenizer"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a diffusers FLUX.2 [klein] folder as ComfyUI's single files.")
    parser.add_argument("folder", help="the klein pipeline folder (model_index.json)")
    parser.add_argument("out", help="where to write diffusion_models/, text_encoders/, vae/ (e.g. ComfyUI/models)")
    parser.add_argument("--name", default=None, help="file name stem (default: the folder's name)")
    args = parser.parse_args(argv)
    files = save_single_files(args.folder, args.out, args.name)
    for part in ("diffusion_model", "text_encoder", "vae"):
        print(getattr(files, part))  # noqa: T201 (CLI)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

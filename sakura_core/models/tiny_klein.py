"""A tiny random FLUX.2 [klein] KV pipeline folder, built offline: the same classes as the real one, seconds on a CPU.

``Flux2KleinKVPipeline`` with a 3-layer ``Flux2Transformer2DModel`` (in_channels 16), a 4-level
``AutoencoderKLFlux2`` (scale factor 8, 4 latent channels, 32-64 channels in 32-group norms as the real VAE's), a
28-layer width-16 ``Qwen3ForCausalLM`` (so the pipeline's default hidden-state layers 9, 18, 27 exist; Qwen3's
rope_theta 1e6) and a byte-level ``Qwen2TokenizerFast`` with the Qwen chat markers, saved with ``save_pretrained``.
Whatever the real klein files fix by convention rather than store (group count, RoPE constants) is the real value
here, so ``single_file_export.save_single_files`` of this folder loads back through ``single_files`` unchanged. No hub download. The edits are noise; every path (precompute,
serving, fetching, the ComfyUI nodes, the phone agent, exactness against diffusers) runs on it as on a real folder.

    python -m sakura_core.models.tiny_klein OUT_FOLDER
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

__all__ = ["COMFYUI_GEOMETRY", "TINY_IMAGE_SIZE", "TINY_TEXT_TOKENS", "build_tiny_klein"]

TINY_IMAGE_SIZE = 64  # the pipeline's minimum side
TINY_TEXT_TOKENS = 32  # written to sakura_spec.json; the pipeline default (512) works too, only slower
#: A tiny klein ComfyUI 0.29 can load: its model detection fixes head_dim 128 (RoPE axes 4 x 32), 128 latent
#: channels in and out (a 32-channel VAE latent, 2x2 packed) and 256 timestep channels; width and depth are free.
#: Other widths and depths than the default tiny klein's (a held-out model for the ComfyUI tests).
COMFYUI_GEOMETRY = {"heads": 2, "head_dim": 128, "double": 2, "single": 3, "latent_channels": 32, "time_channels": 256}
_DEFAULT_GEOMETRY = {"heads": 2, "head_dim": 8, "double": 1, "single": 2, "latent_channels": 4, "time_channels": 32}

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}  # 256 byte symbols, no merges
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    out = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.chat_template = _CHAT_TEMPLATE
    return out


def build_tiny_klein(
    out: str | Path, seed: int = 0, text_tokens: int = TINY_TEXT_TOKENS, geometry: dict | None = None
) -> Path:
    """Save a tiny random klein KV pipeline (and a ``sakura_spec.json``: 64 px, ``text_tokens``) to ``out``;
    ``geometry`` (keys of :data:`COMFYUI_GEOMETRY`) changes the transformer's and the VAE latent's sizes."""
    g = {**_DEFAULT_GEOMETRY, **(geometry or {})}
    # the defining modules, not the package's lazy exports (a type checker reads those as diffusers' dummy classes)
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.models.autoencoders.autoencoder_kl_flux2 import AutoencoderKLFlux2
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import Flux2KleinKVPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    te_cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=28,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
    )
    text_encoder = Qwen3ForCausalLM(te_cfg).eval()
    vae = AutoencoderKLFlux2(
        block_out_channels=(32, 32, 64, 64),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1,
        latent_channels=g["latent_channels"],
        norm_num_groups=32,
    ).eval()
    with torch.no_grad():  # a non-trivial batch-norm so (de)normalisation is exercised
        vae.bn.running_mean.copy_(torch.linspace(-0.2, 0.2, vae.bn.running_mean.numel()))
        vae.bn.running_var.copy_(torch.linspace(0.5, 1.5, vae.bn.running_var.numel()))
    transformer = Flux2Transformer2DModel(
        in_channels=4 * g["latent_channels"],
        num_layers=g["double"],
        num_single_layers=g["single"],
        attention_head_dim=g["head_dim"],
        num_attention_heads=g["heads"],
        joint_attention_dim=3 * te_cfg.hidden_size,
        timestep_guidance_channels=g["time_channels"],
        axes_dims_rope=(g["head_dim"] // 4,) * 4,
        guidance_embeds=False,
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift=3.0, time_shift_type="exponential")
    pipe = Flux2KleinKVPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    pipe.save_pretrained(str(out))
    spec = {"image_size": TINY_IMAGE_SIZE, "text_tokens": text_tokens, "name": "tiny-klein-kv"}
    (out / "sakura_spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save a tiny random FLUX.2 [klein] KV pipeline folder (offline).")
    parser.add_argument("out", help="folder to write (model_index.json, transformer/, vae/, text_encoder/, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--comfyui", action="store_true", help="ComfyUI-loadable sizes (head_dim 128, 32-ch latent)")
    args = parser.parse_args(argv)
    print(build_tiny_klein(args.out, seed=args.seed, geometry=COMFYUI_GEOMETRY if args.comfyui else None))  # noqa: T201 (CLI)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

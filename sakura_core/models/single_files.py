"""FLUX.2 [klein] as ComfyUI keeps it: three single-file checkpoints, loaded into the diffusers modules SAKURA runs.

ComfyUI's layout (what Comfy-Org/Flux-2-Klein-4B ``split_files`` and ComfyUI's own klein templates ship):

* ``models/diffusion_models/flux-2-klein-4b.safetensors`` — the transformer in Black Forest Labs' key layout
  (``img_in``, ``txt_in``, ``time_in.{in,out}_layer``, ``double_stream_modulation_{img,txt}.lin``,
  ``single_stream_modulation.lin``, ``double_blocks.N.{img,txt}_attn.{qkv,proj,norm.{query,key}_norm.scale}``,
  ``double_blocks.N.{img,txt}_mlp.{0,2}``, ``single_blocks.N.{linear1,linear2,norm.*.scale}``,
  ``final_layer.{linear,adaLN_modulation.1}``; no biases), optionally under ``model.diffusion_model.``. No config:
  ComfyUI tells FLUX.2 by ``double_stream_modulation_img.lin.weight`` (``comfy/model_detection.py``) and reads the
  sizes off the tensors, as :func:`transformer_config` does.
* ``models/text_encoders/qwen_3_4b.safetensors`` (klein 9B: ``qwen_3_8b``) — Qwen3 in Hugging Face's key layout
  (``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``, ``...q_norm``, ``model.norm``), no
  ``lm_head``, no config and no tokenizer: ComfyUI tells Qwen3 by ``model.layers.0.self_attn.q_norm.weight`` and the
  width (2560: 4B, 4096: 8B) and ships the tokenizer itself (``comfy/text_encoders/qwen25_tokenizer``).
* ``models/vae/flux2-vae.safetensors`` — the FLUX.2 autoencoder in the LDM layout (``encoder.down.N.block.M``,
  ``encoder.quant_conv``, ``decoder.post_quant_conv``, ``mid.attn_1`` as 1x1 convolutions) plus the latent batch
  norm's ``bn.running_mean`` / ``bn.running_var``.

Sizes not stored in the tensors are the architecture's constants, as ComfyUI assumes them too: 32 groups in every
VAE group norm, RoPE axes of ``head_dim / 4`` each (theta 2000), Qwen3's ``rope_theta`` 1e6 and RMS eps 1e-6.
Files already in diffusers' key layout are taken as they are. Only safetensors files are read (no pickle).
Quantized files (ComfyUI's fp8 / nvfp4 ``*mixed`` variants) are refused with the file to use instead.

The transformer's model id is computed from its weights and config as for a pipeline folder, so the same weights
give the same id either way: a server that precomputed with the diffusers folder serves a ComfyUI user's files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .folders import KleinFiles

if TYPE_CHECKING:
    from .latent_model import LatentEditModel

__all__ = [
    "KLEIN_CHAT_TEMPLATE",
    "load_klein_files",
    "load_text_encoder_file",
    "load_transformer_file",
    "load_vae_file",
    "spec_sidecar",
    "read_checkpoint",
    "text_encoder_config",
    "transformer_config",
    "transformer_state_model_id",
    "vae_config",
]

# The prompt klein's Qwen3 reads (the Qwen3 chat template with thinking off; ComfyUI's KleinTokenizer writes the same).
KLEIN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)
_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
_QUANT_KEY = re.compile(r"(\.scale_weight|\.weight_scale|\.comfy_quant|\.scale_input|\.input_scale)$")
_VAE_GROUPS = 32
_QWEN3_CONSTANTS = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}


def read_checkpoint(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (CPU), prefix ``model.diffusion_model.`` dropped; quantized files refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} checkpoint {path} not found")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{what} checkpoint {path.name} is not a readable safetensors file: {e}") from e
    for prefix in _PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    quantized = [k for k, v in state.items() if _QUANT_KEY.search(k) or v.dtype in _QUANT_DTYPES]
    if quantized:
        raise ValueError(
            f"{what} checkpoint {path.name} is quantized ({quantized[0]}, "
            f"{state[quantized[0]].dtype}); SAKURA computes exact KV from bf16/fp16/fp32 weights: use "
            "the unquantized file (e.g. flux-2-klein-4b.safetensors, qwen_3_4b.safetensors)"
        )
    return state


_QUANT_DTYPES = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint8", "int8") if hasattr(torch, n)}


def _count(state: dict, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({int(m.group(1)) for k in state if (m := pattern.match(k))})


def _need(state: dict, key: str, what: str) -> torch.Tensor:
    if key not in state:
        raise ValueError(
            f"{what} checkpoint has no {key!r}: not a FLUX.2 [klein] {what} file in ComfyUI's (or diffusers') layout"
        )
    return state[key]


# ---- transformer ------------------------------------------------------------------------------------------------
def _transformer_to_diffusers(state: dict) -> dict:
    if "x_embedder.weight" in state:
        return state
    if "double_stream_modulation_img.lin.weight" not in state:
        raise ValueError(
            "diffusion model checkpoint has no double_stream_modulation_img.lin.weight: not a FLUX.2 "
            "transformer (FLUX.1 / other models are not KV-mode klein)"
        )
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    return convert_flux2_transformer_checkpoint_to_diffusers(dict(state))


def transformer_config(state: dict) -> dict:
    """``Flux2Transformer2DModel`` keyword arguments read off a diffusers-layout state dict (see the module doc)."""
    what = "diffusion model"
    x_in = _need(state, "x_embedder.weight", what)  # (inner, in_channels)
    head_dim = int(_need(state, "single_transformer_blocks.0.attn.norm_q.weight", what).shape[0])
    inner = int(x_in.shape[0])
    if inner % head_dim or head_dim % 4:
        raise ValueError(f"{what}: width {inner} / head_dim {head_dim} do not make whole heads and 4 RoPE axes")
    linear_in = (
        _need(state, "transformer_blocks.0.ff.linear_in.weight", what)
        if "transformer_blocks.0.ff.linear_in.weight" in state
        else None
    )
    mlp_hidden = (int(linear_in.shape[0]) // 2) if linear_in is not None else _single_mlp_hidden(state, inner)
    out = int(_need(state, "proj_out.weight", what).shape[0])
    return {
        "patch_size": 1,
        "in_channels": int(x_in.shape[1]),
        "out_channels": None if out == int(x_in.shape[1]) else out,
        "num_layers": _count(state, "transformer_blocks."),
        "num_single_layers": _count(state, "single_transformer_blocks."),
        "attention_head_dim": head_dim,
        "num_attention_heads": inner // head_dim,
        "joint_attention_dim": int(_need(state, "context_embedder.weight", what).shape[1]),
        "timestep_guidance_channels": int(
            _need(state, "time_guidance_embed.timestep_embedder.linear_1.weight", what).shape[1]
        ),
        "mlp_ratio": mlp_hidden / inner,
        "axes_dims_rope": (head_dim // 4,) * 4,
        "guidance_embeds": any(k.startswith("time_guidance_embed.guidance_embedder.") for k in state),
    }


def _single_mlp_hidden(state: dict, inner: int) -> int:
    fused = _need(state, "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", "diffusion model")
    return (int(fused.shape[0]) - 3 * inner) // 2  # (3 * inner + 2 * mlp_hidden, inner)


def load_transformer_file(path: str | Path, dtype: torch.dtype = torch.float32):
    """The klein transformer in ``path`` as a diffusers ``Flux2Transformer2DModel`` (eval mode, ``dtype``)."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    state = _transformer_to_diffusers(read_checkpoint(path, "diffusion model"))
    config = transformer_config(state)
    with torch.device("meta"):
        model = Flux2Transformer2DModel(**config)
    _load_exact(model, state, f"diffusion model {Path(path).name}", dtype)
    return model.eval()


def transformer_state_model_id(state: dict[str, torch.Tensor]) -> str:
    """The model id (``flux2_parts.model_content_id``) of the klein transformer whose tensors are ``state`` (BFL's
    layout as ComfyUI loads it, or diffusers'), in the dtype they have — what ``sakura precompute --model
    klein-files:...`` gives for the same file loaded in that dtype. Builds nothing but a meta-device model."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Transformer2DModel

    from .flux2_parts import content_id

    state = _transformer_to_diffusers({_strip_prefix(k): v for k, v in state.items()})
    config = transformer_config(state)
    with torch.device("meta"):
        meta = Flux2Transformer2DModel(**config)
    names = list(meta.state_dict())
    missing = sorted(set(names) - set(state))
    if missing:
        raise ValueError(f"diffusion model state has no {missing[:4]}: not a complete FLUX.2 [klein] transformer")
    return content_id(dict(meta.config), {n: state[n] for n in names})


def _strip_prefix(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in storage of its own: a q/k/v slice of a fused checkpoint tensor is a view at an offset, and a
    misaligned weight takes other CPU matmul kernels (results differ in the last bits from a folder's weights)."""
    if tensor.storage_offset() or not tensor.is_contiguous():
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _load_exact(
    module: torch.nn.Module, state: dict, what: str, dtype: torch.dtype, optional: tuple[str, ...] = ()
) -> None:
    """Load ``state`` (floating tensors cast to ``dtype``) into ``module`` (built on the meta device) with every
    parameter and buffer given, shapes checked."""
    state = {k: _own(v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    try:
        missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # size mismatches: the first few lines say which tensors
        lines = str(e).splitlines()
        raise ValueError(
            f"{what} does not fit the architecture its tensors describe: {' '.join(x.strip() for x in lines[1:3])} ..."
        ) from e
    missing = [k for k in missing if not k.endswith(optional)]
    if missing or unexpected:
        raise ValueError(
            f"{what} does not fit the architecture its tensors describe: missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]}"
        )


# ---- VAE --------------------------------------------------------------------------------------------------------
def vae_config(state: dict) -> dict:
    """``AutoencoderKLFlux2`` keyword arguments read off an LDM-layout VAE state dict (see the module doc)."""
    what = "VAE"
    levels = _count(state, "encoder.down.")
    if levels < 1:
        raise ValueError(
            "VAE checkpoint has no encoder.down.0: not a FLUX.2 [klein] VAE file in ComfyUI's (LDM) layout"
        )
    channels = tuple(int(_need(state, f"encoder.down.{i}.block.0.conv1.weight", what).shape[0]) for i in range(levels))
    decoder = tuple(int(_need(state, f"decoder.up.{i}.block.0.conv1.weight", what).shape[0]) for i in range(levels))
    return {
        "in_channels": int(_need(state, "encoder.conv_in.weight", what).shape[1]),
        "out_channels": int(_need(state, "decoder.conv_out.weight", what).shape[0]),
        "down_block_types": ("DownEncoderBlock2D",) * levels,
        "up_block_types": ("UpDecoderBlock2D",) * levels,
        "block_out_channels": channels,
        "decoder_block_out_channels": None if decoder == channels else decoder,
        "layers_per_block": _count(state, "encoder.down.0.block."),
        "latent_channels": int(_need(state, "decoder.conv_in.weight", what).shape[1]),
        "norm_num_groups": _VAE_GROUPS,
        "use_quant_conv": "quant_conv.weight" in state,
        "use_post_quant_conv": "post_quant_conv.weight" in state,
        "mid_block_add_attention": "encoder.mid.attn_1.q.weight" in state,
    }


def _vae_to_diffusers(state: dict) -> tuple[dict, dict]:
    """(diffusers state dict, config) of a VAE file in ComfyUI's layout (or diffusers' own)."""
    if "encoder.down_blocks.0.resnets.0.conv1.weight" in state:
        raise ValueError(
            "VAE checkpoint is in diffusers' key layout: put its folder (config.json + weights) in a "
            "klein pipeline folder under models/diffusers instead"
        )
    renames = {"encoder.quant_conv.": "quant_conv.", "decoder.post_quant_conv.": "post_quant_conv."}
    state = {
        next((new + k[len(old) :] for old, new in renames.items() if k.startswith(old)), k): v
        for k, v in state.items()
    }
    for key in ("bn.running_mean", "bn.running_var"):
        _need(state, key, "VAE")
    config = vae_config(state)
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    converted = convert_ldm_vae_checkpoint(state, config)
    for key in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        if key in state:
            converted[key] = state[key]
    return converted, config


def load_vae_file(path: str | Path, dtype: torch.dtype = torch.float32):
    """The FLUX.2 VAE in ``path`` as a diffusers ``AutoencoderKLFlux2`` (eval mode, ``dtype``)."""
    from diffusers.models.autoencoders.autoencoder_kl_flux2 import AutoencoderKLFlux2

    state, config = _vae_to_diffusers(read_checkpoint(path, "VAE"))
    with torch.device("meta"):
        vae = AutoencoderKLFlux2(**config)
    _load_exact(vae, state, f"VAE {Path(path).name}", dtype, optional=("num_batches_tracked",))
    if vae.bn.num_batches_tracked.is_meta:  # not every file keeps the counter; eval mode never reads it
        vae.bn.num_batches_tracked = torch.zeros((), dtype=torch.long)
    return vae.eval()


# ---- text encoder -----------------------------------------------------------------------------------------------
def text_encoder_config(state: dict) -> dict:
    """``Qwen3Config`` keyword arguments read off a Qwen3 state dict in Hugging Face's layout."""
    what = "text encoder"
    _need(state, "model.layers.0.self_attn.q_norm.weight", what)  # what tells Qwen3 from Llama / Mistral
    embed = _need(state, "model.embed_tokens.weight", what)  # (vocab, hidden)
    head_dim = int(state["model.layers.0.self_attn.q_norm.weight"].shape[0])
    return {
        "vocab_size": int(embed.shape[0]),
        "hidden_size": int(embed.shape[1]),
        "intermediate_size": int(_need(state, "model.layers.0.mlp.gate_proj.weight", what).shape[0]),
        "num_hidden_layers": _count(state, "model.layers."),
        "head_dim": head_dim,
        "num_attention_heads": int(_need(state, "model.layers.0.self_attn.q_proj.weight", what).shape[0]) // head_dim,
        "num_key_value_heads": int(_need(state, "model.layers.0.self_attn.k_proj.weight", what).shape[0]) // head_dim,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in state,
        "tie_word_embeddings": "lm_head.weight" not in state,
        "rms_norm_eps": _QWEN3_CONSTANTS["rms_norm_eps"],
        "max_position_embeddings": _QWEN3_CONSTANTS["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": _QWEN3_CONSTANTS["rope_theta"]},
    }


def load_text_encoder_file(path: str | Path, dtype: torch.dtype = torch.float32):
    """The Qwen3 text encoder in ``path`` as a transformers ``Qwen3ForCausalLM`` (eval mode, ``dtype``), loaded the
    way ``from_pretrained`` loads a folder (its non-persistent rotary buffers stay float32)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    state = read_checkpoint(path, "text encoder")
    config = Qwen3Config(**text_encoder_config(state))
    with torch.device("meta"):
        expected = set(Qwen3ForCausalLM(config).state_dict())
    missing = sorted(expected - set(state) - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"text encoder {Path(path).name} does not fit the Qwen3 its tensors describe: missing "
            f"{missing[:4]}, unexpected {unexpected[:4]}"
        )
    model = Qwen3ForCausalLM.from_pretrained(None, config=config, state_dict=state, dtype=dtype)
    return model.eval()


def _tokenizer(files: KleinFiles):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(files.tokenizer)
    if files.klein_template:
        tok.chat_template = KLEIN_CHAT_TEMPLATE
    return tok


# ---- the pipeline -----------------------------------------------------------------------------------------------
def load_klein_files(
    files: KleinFiles,
    *,
    image_size: int | None = None,
    text_tokens: int | None = None,
    strength: float | None = None,
    dtype: torch.dtype = torch.float32,
    dtypes: dict[str, torch.dtype] | None = None,
) -> LatentEditModel:
    """The klein pipeline of ``files`` as a :class:`~sakura_core.models.latent_model.LatentEditModel`. Image size
    and prompt length: the keywords, else a ``<diffusion model stem>.sakura_spec.json`` beside the transformer file
    (a folder's ``sakura_spec.json`` keys), else 512 px and the pipeline's 512 tokens. ``dtypes`` may set
    ``transformer``, ``vae`` and ``text_encoder`` apart (ComfyUI picks one per part); the rest get ``dtype``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinKVPipeline

    from .latent_model import build_latent_model, read_spec_fields

    per = {"transformer": dtype, "vae": dtype, "text_encoder": dtype, **(dtypes or {})}
    transformer = load_transformer_file(files.diffusion_model, per["transformer"])
    vae = load_vae_file(files.vae, per["vae"])
    text_encoder = load_text_encoder_file(files.text_encoder, per["text_encoder"])
    # klein's scheduler (its mu comes from the pipeline's empirical rule, so base/max shift do not matter)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift=3.0, time_shift_type="exponential")
    pipe = Flux2KleinKVPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=_tokenizer(files), transformer=transformer
    )
    fields = read_spec_fields(spec_sidecar(files.diffusion_model))
    given = {"image_size": image_size, "text_tokens": text_tokens, "strength": strength}
    fields.update({k: v for k, v in given.items() if v is not None})
    return build_latent_model(pipe, files.name, fields, f"files:{Path(files.diffusion_model).name}")


def spec_sidecar(diffusion_model: str | Path) -> Path:
    """Where the optional spec of a transformer file lies: ``NAME.safetensors`` -> ``NAME.sakura_spec.json``."""
    path = Path(diffusion_model)
    return path.with_name(path.name.removesuffix(".safetensors") + ".sakura_spec.json")

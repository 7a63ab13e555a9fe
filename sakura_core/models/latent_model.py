"""FLUX.2 [klein] KV in latent space: a diffusers pipeline folder (VAE, Qwen3 text encoder, transformer, scheduler).

The same interface as the pixel-patch demo model (:class:`~sakura_core.models.edit_model.EditModel`), so the edit
runtime, the pipelined executor, the policies, the fallbacks and the server's precompute drive it unchanged:

* ``pack_image`` / ``template_tokens``: VAE-encode (distribution mode), 2x2 patchify, batch-norm normalise and pack
  to (1, tokens, 4 * latent_channels) exactly as ``Flux2KleinKVPipeline._encode_vae_image`` / ``_pack_latents``;
  the template is encoded on the server at precompute, the user image on the device.
* ``encode_prompt``: the pipeline's own Qwen3 prompt embedding (chat template, ``max_length`` padding, hidden
  states of layers ``text_encoder_layers`` stacked), on the device.
* ``edit_start``: the user image enters as the start of the flow (img2img): the pipeline's sigmas
  ``linspace(1, 1/steps, steps) * strength``, time-shifted by the scheduler with the pipeline's empirical ``mu``;
  the start latent is ``sigma_0 * noise + (1 - sigma_0) * user``. ``strength == 1`` is plain generation with the
  template as the KV reference (the user image is then ignored).
* ``unpack_tokens``: un-normalise, unpatchify, VAE-decode, to uint8.

Position ids: request latents at t = 0, template latents at t = 10 (``REF_TIME_OFFSET``), text (0, 0, 0, index):
the pipeline's ``_prepare_latent_ids`` / ``_prepare_image_ids`` / ``_prepare_text_ids``. The template gets the
reference's fixed timestep (0) as in diffusers' extract mode. The transformer's in_channels stay the pipeline's
(128 for klein): nothing is channel-concatenated.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..limits import MAX_EDIT_TOKENS, LimitError
from .flux2_kv import Flux2KVAdapter
from .folders import KLEIN_PIPELINES, is_klein_folder
from .ref_layout import TokenLayout, as_references, layout_of

__all__ = [
    "LatentEditModel",
    "LatentSpec",
    "build_latent_model",
    "check_pipeline_geometry",
    "load_klein_folder",
    "read_spec_fields",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LatentSpec:
    """Geometry and sampling settings of a latent-space klein edit.

    Attributes:
        image_size: edit and template side in pixels (square); a multiple of ``2 * vae_scale_factor``.
        vae_scale_factor: pixels per latent pixel (2 ** (VAE levels - 1); 8 for klein).
        text_tokens: prompt length in tokens (``max_sequence_length``; 512 as in the diffusers pipeline).
        text_encoder_layers: Qwen3 hidden-state layers stacked into the prompt embedding ((9, 18, 27) for klein).
        strength: fraction of the noise schedule the edit runs (0 < strength <= 1); the user image is the start.
        ref_fixed_timestep: timestep (0..1) the template tokens are modulated with (0 in diffusers' KV mode).
        name: shown in reports and the phone agent's info.
        transformer: the transformer's config (for reports and budgets).
    """

    image_size: int = 512
    vae_scale_factor: int = 8
    text_tokens: int = 512
    text_encoder_layers: tuple[int, ...] = (9, 18, 27)
    strength: float = 0.8
    ref_fixed_timestep: float = 0.0
    name: str = "flux2-klein-kv"
    transformer: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        multiple = 2 * self.vae_scale_factor
        if self.image_size < 64 or self.image_size % multiple:
            raise ValueError(
                f"image_size {self.image_size} must be >= 64 (the pipeline's minimum) and a multiple of {multiple} "
                "(2 x the VAE scale factor)"
            )
        if not 0.0 < self.strength <= 1.0:
            raise ValueError(f"strength must be in (0, 1], got {self.strength}")
        if self.text_tokens < 1:
            raise ValueError(f"text_tokens must be >= 1, got {self.text_tokens}")

    @property
    def grid(self) -> tuple[int, int]:
        side = self.image_size // (2 * self.vae_scale_factor)
        return (side, side)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]


class LatentEditModel:
    """A klein KV pipeline's components behind the demo model's interface (see the module docstring)."""

    def __init__(self, spec: LatentSpec, pipe, weights_source: str):
        self.spec = spec
        self.weights_source = weights_source
        self.pipe = pipe
        self.vae, self.text_encoder, self.tokenizer = pipe.vae, pipe.text_encoder, pipe.tokenizer
        self.scheduler = pipe.scheduler
        self.adapter = Flux2KVAdapter(pipe.transformer, ref_fixed_timestep=spec.ref_fixed_timestep)
        self._lock = threading.Lock()  # the scheduler holds state; one set_timesteps at a time
        self._layer_times_s: tuple[float, float] | None = None

    @property
    def model_id(self) -> str:
        return self.adapter.model_id

    @property
    def component_params(self) -> int:
        """Parameters besides the transformer's: the VAE and the text encoder (both run on the device)."""
        return sum(p.numel() for m in (self.vae, self.text_encoder) for p in m.parameters())

    # ---- images <-> latent tokens -------------------------------------------------------------------------
    @torch.no_grad()
    def pack_image(self, image: np.ndarray, side: int | None = None) -> torch.Tensor:
        """(S, S, 3) uint8 -> (1, tokens, 4 * latent_channels) normalised packed latents (the pipeline's encode).

        ``side``: the expected image side in pixels (default: the model's edit size; templates may be larger).
        """
        from PIL import Image

        s = side or self.spec.image_size
        if np.shape(image) != (s, s, 3) or np.asarray(image).dtype != np.uint8:
            raise ValueError(
                f"image must be ({s}, {s}, 3) uint8 for {self.spec.name}, got {np.shape(image)}; use load_image()"
            )
        pixels = self.pipe.image_processor.preprocess(Image.fromarray(image), height=s, width=s, resize_mode="crop")
        pixels = pixels.to(self.vae.device, self.vae.dtype)
        latents = self.pipe._encode_vae_image(pixels, generator=None)  # (1, 4C, h, w)
        return self.pipe._pack_latents(latents).float().cpu()  # (1, h*w, 4C)

    def template_grid(self, template: np.ndarray) -> TokenLayout:
        """Token grid of a square template of side ``S >= image_size``, a multiple of 2 x the VAE scale factor; of a
        list of reference images (one size), their grids (:mod:`.ref_layout`)."""
        refs = as_references(template)
        if refs is not None:
            return layout_of([self._image_grid(r) for r in refs])
        return self._image_grid(template)

    def _image_grid(self, template: np.ndarray) -> tuple[int, int]:
        """The token grid of one template image (:meth:`template_grid`)."""
        shape, m = np.shape(template), 2 * self.spec.vae_scale_factor
        if len(shape) != 3 or shape[0] != shape[1] or shape[2] != 3 or shape[0] % m or shape[0] < self.spec.image_size:
            raise ValueError(
                f"template must be (S, S, 3) uint8 with S a multiple of {m} and >= {self.spec.image_size}, got "
                f"{shape}; use load_image(source, size)"
            )
        return (shape[0] // m, shape[0] // m)

    def template_tokens(self, template: np.ndarray) -> torch.Tensor:
        """Template image -> (1, tokens, in_channels): its packed latents (the pipeline's reference tokens), at
        its own size (a larger template gets its own grid of position ids at t = 10, as diffusers gives one). A list
        of reference images: their tokens in order, each VAE-encoded on its own as the pipeline encodes them."""
        refs = as_references(template)
        if refs is not None:
            return torch.cat([self.template_tokens(r) for r in refs], dim=1)
        return self.pack_image(template, self._image_grid(template)[0] * 2 * self.spec.vae_scale_factor)

    def request_tokens(self, noisy: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
        """The request tokens are the noisy latents alone: the user image entered at the start (``edit_start``)."""
        return noisy

    def unpack_latents(self, tokens: torch.Tensor) -> torch.Tensor:
        """(1, tokens, 4C) packed normalised latents -> (1, C, H/8, W/8) VAE latents (the pipeline's decode prep)."""
        rows, cols = self.spec.grid
        x = (
            tokens.detach().to(self.vae.device, self.vae.dtype).permute(0, 2, 1).reshape(1, -1, rows, cols)
        )  # (1, 4C, rows, cols)
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(x.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(x.dtype)
        return self.pipe._unpatchify_latents(x * std + mean)

    @torch.no_grad()
    def decode_float(self, tokens: torch.Tensor) -> np.ndarray:
        """(1, tokens, 4C) -> (S, S, 3) float in [0, 1], as the pipeline's ``output_type="np"``."""
        image = self.vae.decode(self.unpack_latents(tokens), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type="np")[0]

    def unpack_tokens(self, tokens: torch.Tensor) -> np.ndarray:
        """(1, tokens, 4C) latents -> (S, S, 3) uint8 (VAE decode; rounding as the pipeline's PIL output)."""
        return (self.decode_float(tokens) * 255).round().astype(np.uint8)

    # ---- prompt and schedule ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """Prompt -> (1, text_tokens, joint_attention_dim) with the pipeline's own Qwen3 embedding."""
        emb = self.pipe._get_qwen3_prompt_embeds(
            text_encoder=self.text_encoder,
            tokenizer=self.tokenizer,
            prompt=prompt,
            max_sequence_length=self.spec.text_tokens,
            hidden_states_layers=self.spec.text_encoder_layers,
        )
        return emb.float().cpu()

    def sigmas_in(self, steps: int) -> list[float]:
        """The ``sigmas`` argument the pipeline is called with for this edit (before the scheduler's shift)."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return [float(s) for s in np.linspace(1.0, 1 / steps, steps) * self.spec.strength]

    def schedule(self, steps: int) -> torch.Tensor:
        """``steps + 1`` sigmas (ending at 0) as the pipeline's scheduler sets them (empirical ``mu`` shift)."""
        from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import compute_empirical_mu

        mu = compute_empirical_mu(image_seq_len=self.spec.num_tokens, num_steps=steps)
        with self._lock:
            self.scheduler.set_timesteps(steps, sigmas=self.sigmas_in(steps), mu=mu)
            return self.scheduler.sigmas.detach().float().clone()

    def edit_start(self, user: torch.Tensor, noise: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(start latents, sigmas): the user latents noised to the schedule's first sigma, and the schedule."""
        sigmas = self.schedule(steps)
        s0 = sigmas[0]
        return s0 * noise + (1.0 - s0) * user, sigmas

    # ---- timing -------------------------------------------------------------------------------------------
    def layer_times_s(self) -> tuple[float, float]:
        """Seconds per layer here: (with the template tokens, with its KV injected); measured once, content-free."""
        with self._lock:
            if self._layer_times_s is None:
                self._layer_times_s = self._measure_layer_times()
            return self._layer_times_s

    @torch.no_grad()
    def _measure_layer_times(self) -> tuple[float, float]:
        a, grid = self.adapter, self.spec.grid
        cfg = a.model.config
        ref = torch.zeros(1, self.spec.num_tokens, cfg["in_channels"])  # (1, tokens, in_channels)
        kv = a.extract_template_kv(ref, grid)
        txt = torch.zeros(1, self.spec.text_tokens, cfg["joint_attention_dim"])
        t = torch.tensor([0.5])
        best_full = best_cached = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            a.forward(ref, txt, t, img_grid=grid, ref_tokens=ref, ref_grid=grid, split_layer=a.num_layers)
            t1 = time.perf_counter()
            a.forward(ref, txt, t, img_grid=grid, ref_grid=grid, cached=kv)
            t2 = time.perf_counter()
            best_full, best_cached = min(best_full, t1 - t0), min(best_cached, t2 - t1)
        return best_full / a.num_layers, best_cached / a.num_layers


def load_klein_folder(
    folder: str | Path,
    *,
    image_size: int | None = None,
    text_tokens: int | None = None,
    strength: float | None = None,
    dtype: torch.dtype | dict[str, torch.dtype] = torch.float32,
) -> LatentEditModel:
    """Load a diffusers FLUX.2 [klein] pipeline folder (``model_index.json``) as a :class:`LatentEditModel`.

    The optional ``sakura_spec.json`` in the folder may set ``image_size``, ``text_tokens``, ``strength``,
    ``text_encoder_layers`` and ``name``; keyword arguments override it. Default image size: 512. ``dtype`` may be
    one per component (``{"transformer": ..., "vae": ..., "text_encoder": ..., "default": ...}``, as diffusers takes).
    """
    folder = Path(folder)
    if not is_klein_folder(folder):
        raise ValueError(
            f"{folder} is not a FLUX.2 [klein] pipeline folder: its model_index.json must name one of "
            f"{', '.join(KLEIN_PIPELINES)} (save one with Flux2KleinKVPipeline.save_pretrained)"
        )
    from diffusers import Flux2KleinKVPipeline

    fields = read_spec_fields(folder / "sakura_spec.json")
    for key, value in (("image_size", image_size), ("text_tokens", text_tokens), ("strength", strength)):
        if value is not None:
            fields[key] = value
    vae_cfg, te_cfg = (_config_json(folder / part / "config.json") for part in ("vae", "text_encoder"))
    if "block_out_channels" in vae_cfg and "num_hidden_layers" in te_cfg:  # checked before any weight is loaded
        check_pipeline_geometry(folder.name, fields, len(vae_cfg["block_out_channels"]), te_cfg["num_hidden_layers"])
    pipe = Flux2KleinKVPipeline.from_pretrained(str(folder), dtype=dtype)
    return build_latent_model(pipe, folder.name, fields, f"folder:{folder.name}")


def build_latent_model(pipe, name: str, fields: dict, weights_source: str) -> LatentEditModel:
    """A :class:`LatentEditModel` over a loaded ``Flux2KleinKVPipeline`` (from a folder or from single files):
    ``fields`` are :class:`LatentSpec` fields (image size, prompt length, ...), the geometry is the pipeline's."""
    for module in (pipe.vae, pipe.text_encoder, pipe.transformer):
        module.eval()
        _own_storage(module)
    cfg = {k: v for k, v in pipe.transformer.config.items() if not k.startswith("_")}
    levels = len(pipe.vae.config.block_out_channels)
    check_pipeline_geometry(name, fields, levels, pipe.text_encoder.config.num_hidden_layers)
    scale = 2 ** (levels - 1)
    spec = LatentSpec(**{"name": name, **fields, "vae_scale_factor": scale, "transformer": _jsonable(cfg)})
    if pipe.transformer.config.in_channels != 4 * pipe.vae.config.latent_channels:
        raise ValueError(
            f"{name}: transformer in_channels {pipe.transformer.config.in_channels} != 4 x VAE latent_channels "
            f"{pipe.vae.config.latent_channels}; the transformer and VAE are not one klein pipeline"
        )
    return LatentEditModel(spec, pipe, weights_source)


def check_pipeline_geometry(name: str, fields: dict, vae_levels: int, text_encoder_depth: int) -> None:
    """Refuse, naming the setting, the folder's value and the fix, a pipeline whose text encoder is shallower than
    the hidden-state layers ``text_encoder_layers`` stacks (an IndexError deep in the prompt encoding otherwise), or
    whose VAE (``vae_levels`` entries of ``block_out_channels``: it downsamples 2 ** (levels - 1) x) makes an edit
    at ``image_size`` more than ``MAX_EDIT_TOKENS`` tokens (tens of GB allocated otherwise). ``fields``: the
    :class:`LatentSpec` fields of ``sakura_spec.json``; called before weights are loaded where configs allow."""
    layers = tuple(fields.get("text_encoder_layers", LatentSpec.text_encoder_layers))
    if not layers or not all(isinstance(k, int) and 0 <= k <= text_encoder_depth for k in layers):
        raise ValueError(
            f"{name}: text_encoder_layers {list(layers)} (sakura_spec.json; klein's default {list(LatentSpec.text_encoder_layers)}) "
            f"must name hidden states 0..{text_encoder_depth}: this folder's text encoder has {text_encoder_depth} "
            f'layers (text_encoder/config.json num_hidden_layers); set "text_encoder_layers" in its sakura_spec.json '
            f"to layers within 0..{text_encoder_depth}, or use klein's own text encoder"
        )
    scale = 2 ** (vae_levels - 1)
    size = int(fields.get("image_size", LatentSpec.image_size))
    side = size // (2 * scale)
    if side * side > MAX_EDIT_TOKENS:
        largest = int(MAX_EDIT_TOKENS**0.5) * 2 * scale
        raise LimitError(
            f"{name}: an edit at image_size {size} is {side}x{side} = {side * side} tokens with this folder's VAE (it "
            f"downsamples {scale}x: {vae_levels} levels in vae/config.json block_out_channels; klein's VAE: 8x), over "
            f'the limit of {MAX_EDIT_TOKENS}; set "image_size" <= {largest} in its sakura_spec.json, or use klein\'s VAE'
        )


def _config_json(path: Path) -> dict:
    """A component's ``config.json`` as a dict ({} when absent or not a JSON object: from_pretrained then says why)."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


_ALIGN_BYTES = 64


@torch.no_grad()
def _own_storage(module: torch.nn.Module) -> None:
    """Give every parameter and buffer not at a 64-byte boundary storage of its own (a fresh, aligned copy).

    Where a loader leaves weights (inside a memory-mapped file, or views into a fused checkpoint tensor) decides
    which CPU matmul kernels run, and so the last bits of every result: aligned weights make the same weights compute
    the same bits however they were loaded (a folder and ComfyUI's single files edit bit-identically)."""
    for sub in module.modules():
        for name, tensor in [*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)]:
            if tensor is None or tensor.device.type != "cpu" or tensor.data_ptr() % _ALIGN_BYTES == 0:
                continue
            if isinstance(tensor, torch.nn.Parameter):
                tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)
            else:
                setattr(sub, name, tensor.clone(memory_format=torch.contiguous_format))  # stays a buffer


def read_spec_fields(path: Path) -> dict:
    """The :class:`LatentSpec` fields a ``sakura_spec.json`` sets (``{}`` when there is none); a bad file raises
    ``ValueError`` naming the allowed keys."""
    if not path.is_file():
        return {}
    fields = json.loads(path.read_text())
    allowed = {"image_size", "text_tokens", "strength", "text_encoder_layers", "name", "ref_fixed_timestep"}
    if not isinstance(fields, dict) or set(fields) - allowed:
        raise ValueError(f"{path}: expected a JSON object with keys among {sorted(allowed)}, got {fields!r}")
    if "text_encoder_layers" in fields:
        fields["text_encoder_layers"] = tuple(fields["text_encoder_layers"])
    return fields


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value

"""Sakura Template KV: a MODEL patch that makes ComfyUI's native FLUX.2 [klein] forward attend to a SAKURA template's
reference K/V instead of computing reference tokens — through ComfyUI's public patch points, as its ``FluxKVCache``
does (``set_model_attn1_patch`` + ``set_model_post_input_patch`` on a clone), so any sampler runs the edit.

KV-mode semantics (diffusers' ``Flux2KleinKVPipeline``, BFL's klein KV): reference tokens attend only to themselves
and are modulated at timestep 0, so their per-layer K/V do not depend on the request. ComfyUI's own forward lets them
attend to everything (``FluxKVCache`` caches K/V computed that way at the first step). Two modes:

* ``fetched template``: reference tokens (a ``ReferenceLatent``, if any) are dropped after the input projection
  and every attention gets the template's K/V (already RoPE'd at t = 10 (i + 1), as klein's ``index`` method places
  references) appended to its keys and values; a layer not decoded yet waits (``sakura_core.template_feed``).
* ``compute here (KV mode)``: ComfyUI computes the reference tokens itself with the KV-mode semantics (an attention
  mask keeping reference queries on reference keys; method ``index_timestep_zero`` for a single-mode template, the
  step's own time for a per-step one) — the on-device edit the fetched one must equal.

A per-step template's step is the one whose time equals the sampler's sigma (``extra_options["sigmas"]``).

Per-run state is a :class:`_RunState` made per node output and reset in ``finally`` by an ``OUTER_SAMPLE`` wrapper.
"""

from __future__ import annotations

import logging

import torch
from comfy_api.latest import io

from ._common import CATEGORY, SakuraNodeError, SakuraTemplate

__all__ = ["COMPUTE", "FETCHED", "SakuraTemplateKV", "comfy_model_key"]

logger = logging.getLogger(__name__)

FETCHED = "fetched template"
COMPUTE = "compute here (KV mode)"
_KEY = "sakura_template_kv"


def comfy_model_key(model):
    """``sakura_core.template_check.ModelKey`` of a ComfyUI MODEL (a ModelPatcher of FLUX.2): the model id computed
    from its loaded diffusion-model tensors (``sakura precompute --model klein-files:...`` gives the same for those
    weights in that dtype), its KV geometry; no edit grid (any latent size uses the same reference K/V)."""
    from sakura_core.models.single_files import transformer_state_model_id
    from sakura_core.template_check import ModelKey

    dm = model.model.diffusion_model
    if not hasattr(dm, "double_blocks") or not hasattr(dm, "single_blocks") or not hasattr(dm, "params"):
        raise SakuraNodeError(f"Sakura Template KV needs a FLUX.2 [klein] MODEL (UNETLoader of a klein file); got "
                              f"{type(dm).__name__}")  # fmt: skip
    try:
        model_id = transformer_state_model_id(dm.state_dict())
    except ValueError as e:
        raise SakuraNodeError(f"Sakura Template KV: this MODEL is not a FLUX.2 [klein] transformer: {e}") from e
    geometry = (len(dm.double_blocks) + len(dm.single_blocks), int(dm.num_heads), int(dm.hidden_size // dm.num_heads))
    return ModelKey(model_id, (1, 1), geometry)


def _check_template(handle, model) -> None:
    """The template against ComfyUI's model (``sakura_core.template_check.check_template``: ids, geometry) and its
    reference placement against ComfyUI's (``ref_index_scale``); errors name both sides and the fix."""
    from sakura_core.models.ref_layout import REF_TIME_OFFSET
    from sakura_core.template_check import check_template

    key = comfy_model_key(model)
    dtype = next(model.model.diffusion_model.parameters()).dtype
    try:
        check_template(handle.manifest, handle.template_id, key)
    except ValueError as e:
        raise SakuraNodeError(
            f"template {handle.template_id!r} does not fit this MODEL ({str(dtype).removeprefix('torch.')} weights, "
            f"id {key.model_id[:12]}…): {e}. Precompute it for these files with `sakura precompute --model "
            "klein-files:diffusion_model=...` (same dtype), or load the model it was made for"
        ) from e
    scale = float(getattr(model.model.diffusion_model.params, "ref_index_scale", 1.0))
    if scale != REF_TIME_OFFSET:
        raise SakuraNodeError(f"template {handle.template_id!r} places references at RoPE time {REF_TIME_OFFSET} (i + 1)"
                              f", this MODEL at {scale:g} (i + 1): not a FLUX.2 [klein] model")  # fmt: skip


class _RunState:
    """One sampling run's fetch: made per node output, started and reset by the OUTER_SAMPLE wrapper."""

    def __init__(self, handle, representation: str):
        self.handle = handle
        self.representation = representation
        self.feed = None
        self.on_device: dict = {}  # single mode: (layer, device, dtype) -> (K, V) (B=1, H, T, D), moved once a run

    def device_kv(self, step: int, layer: int, like: torch.Tensor, check) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's template K/V as (1, heads, tokens, head_dim) on ``like``'s device and in its dtype."""
        key = (layer, like.device, like.dtype)
        if self.feed.steps == 1 and key in self.on_device:
            return self.on_device[key]
        k, v = self.feed.kv(step, layer, check=check)  # (tokens, heads, head_dim) fp16
        kv = tuple(t.to(like.device, like.dtype).permute(1, 0, 2).unsqueeze(0) for t in (k, v))
        if self.feed.steps == 1:
            self.on_device[key] = kv
        return kv

    def start(self) -> None:
        from sakura_core.template_feed import TemplateKVFeed

        self.reset()
        self.feed = TemplateKVFeed(self.handle.template_source(), self.handle.manifest, self.representation)
        self.feed.start()

    def reset(self) -> None:
        if self.feed is not None:
            logger.info("Sakura Template KV %s: %s", self.handle.template_id, self.feed.stats.summary())
            self.feed.reset()
        self.feed = None
        self.on_device = {}


def _sample_wrapper(state: _RunState):
    def wrapper(executor, *args, **kwargs):
        state.start()
        try:
            return executor(*args, **kwargs)
        finally:
            state.reset()

    return wrapper


def _ref_tokens(options: dict) -> int:
    return int(sum(options.get("reference_image_num_tokens", []) or []))


class _DropReferences:
    """post_input patch (fetched mode): drop ComfyUI's reference tokens (the template holds their K/V) after checking
    that they are as many as the template's."""

    def __init__(self, template_tokens: int, template_id: str):
        self.template_tokens = template_tokens
        self.template_id = template_id

    def __call__(self, inputs: dict) -> dict:
        n = _ref_tokens(inputs["transformer_options"])
        if n == 0:
            return inputs
        if n != self.template_tokens:
            raise SakuraNodeError(f"the conditioning's reference latents make {n} tokens, template "
                                  f"{self.template_id!r} holds {self.template_tokens}: use the reference image the "
                                  "template was made from at its size, or drop the ReferenceLatent node (the template "
                                  "is the reference)")  # fmt: skip
        inputs["img"] = inputs["img"][:, :-n]
        inputs["img_ids"] = inputs["img_ids"][:, :-n]
        return inputs


class _TemplateAttention:
    """attn1 patch (fetched mode): append the template's K/V of this layer (and step) to every attention."""

    def __init__(self, state: _RunState, num_double: int):
        self.state = state
        self.num_double = num_double

    def __call__(self, q, k, v, pe=None, attn_mask=None, extra_options=None, **kwargs):
        import comfy.model_management
        from comfy.ldm.flux.math import apply_rope

        from sakura_core.template_feed import layer_index, step_of_sigma

        feed = self.state.feed
        if feed is None:
            raise SakuraNodeError("Sakura Template KV: the model ran outside a sampler run (no fetch started)")
        layer = layer_index(extra_options["block_type"], extra_options["block_index"], self.num_double)
        step = 0
        if feed.steps > 1:
            sigma = float(extra_options["sigmas"].flatten()[0])
            try:
                step = step_of_sigma(sigma, self.state.handle.manifest.schedule.timesteps)
            except ValueError as e:
                raise SakuraNodeError(f"template {self.state.handle.template_id!r}: {e}") from e
        check = comfy.model_management.throw_exception_if_processing_interrupted
        kt, vt = self.state.device_kv(step, layer, k, check)
        batch = q.shape[0]
        kt, vt = kt.expand(batch, -1, -1, -1), vt.expand(batch, -1, -1, -1)  # (B, H, T, D)
        if pe is not None:  # the template's keys are stored after RoPE: rotate the request's here, none later
            q, k = apply_rope(q, k, pe)
        if attn_mask is not None:
            pad = torch.zeros(*attn_mask.shape[:-1], kt.shape[2], dtype=attn_mask.dtype, device=attn_mask.device)
            attn_mask = torch.cat([attn_mask, pad if attn_mask.dtype != torch.bool else ~pad], dim=-1)
        return {"q": q, "k": torch.cat([k, kt], dim=2), "v": torch.cat([v, vt], dim=2), "pe": None,
                "attn_mask": attn_mask}  # fmt: skip


class _SelfOnlyReferences:
    """attn1 patch (compute mode): reference queries see only reference keys (the KV-mode definition)."""

    def __call__(self, q, k, v, pe=None, attn_mask=None, extra_options=None, **kwargs):
        n = _ref_tokens(extra_options)
        if n == 0:
            return {}
        length = q.shape[2]
        mask = torch.zeros(1, 1, length, length, dtype=q.dtype, device=q.device)  # (B, H, L_q, L_k) additive
        mask[..., length - n :, : length - n] = float("-inf")
        if attn_mask is not None:
            mask = mask + (attn_mask if attn_mask.dtype != torch.bool else torch.where(attn_mask, 0.0, float("-inf")))
        return {"attn_mask": mask}


class SakuraTemplateKV(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraTemplateKV",
            display_name="Sakura Template KV (MODEL patch)",
            category=CATEGORY,
            description="Patches ComfyUI's own FLUX.2 [klein] MODEL so that its reference tokens come from a SAKURA "
            "template's precomputed attention K/V, fetched while sampling, instead of being computed here. Any "
            "sampler (KSampler, SamplerCustomAdvanced) then runs the edit.",
            inputs=[
                io.Model.Input("model", tooltip="A FLUX.2 [klein] model (UNETLoader)."),
                SakuraTemplate.Input(
                    "template",
                    tooltip="From a Sakura Template KV Loader (its model input may stay "
                    "empty: the template is checked against this MODEL here).",
                ),
                io.Combo.Input(
                    "kv_source",
                    options=[FETCHED, COMPUTE],
                    default=FETCHED,
                    tooltip="fetched template = the template's K/V replace the reference tokens (a "
                    "ReferenceLatent, if any, is dropped); compute here = ComfyUI computes the reference "
                    "tokens with the same KV-mode semantics (needs ReferenceLatent).",
                ),
                io.String.Input(
                    "representation",
                    default="fp16",
                    tooltip="The representation fetched for every shard: fp16 = exact; a level name of "
                    "the template's ladder (e.g. sakura-l3) for fewer bytes.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The patched model (a clone; the input model is unchanged).")],
        )

    @classmethod
    def execute(cls, model, template, kv_source: str, representation: str) -> io.NodeOutput:
        if template.manifest is None:
            raise SakuraNodeError("the template handle holds no manifest: connect a Sakura Template KV Loader")
        import comfy.patcher_extension

        _check_template(template, model)
        m = model.clone()
        if kv_source == COMPUTE:
            m.set_model_attn1_patch(_SelfOnlyReferences())
            if template.kv_mode == "single":  # single mode: references at t = 0; per-step: at the step's own t
                m.add_object_patch("diffusion_model.params.default_ref_method", "index_timestep_zero")
            mode = f"reference tokens computed here ({template.kv_mode} KV-mode semantics)"
        elif kv_source == FETCHED:
            state = _RunState(template, representation.strip() or "fp16")
            tokens = sum(r.tokens for r in template.manifest.references)
            m.set_model_attn1_patch(_TemplateAttention(state, len(model.model.diffusion_model.double_blocks)))
            m.set_model_post_input_patch(_DropReferences(tokens, template.template_id))
            m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, _KEY, _sample_wrapper(state))
            mode = f"reference K/V fetched ({state.representation}) from {template.source}"
        else:
            raise SakuraNodeError(f"kv_source must be {FETCHED!r} or {COMPUTE!r}, got {kv_source!r}")
        return io.NodeOutput(m, ui={"text": [f"{template.template_id}: {mode}"]})

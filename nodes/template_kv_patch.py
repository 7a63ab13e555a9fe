"""Sakura Template KV: a MODEL patch that makes ComfyUI's native FLUX.2 [klein] forward attend to a SAKURA template's
reference K/V instead of computing reference tokens — through ComfyUI's public patch points, as its ``FluxKVCache``
does (``set_model_attn1_patch`` + ``set_model_post_input_patch`` on a clone), so any sampler runs the edit.

KV-mode semantics (diffusers' ``Flux2KleinKVPipeline``, BFL's klein KV): reference tokens attend only to themselves
and are modulated at timestep 0, so their per-layer K/V do not depend on the request. ComfyUI's own forward lets them
attend to everything (``FluxKVCache`` caches K/V computed that way at the first step). Two modes:

* ``fetched template``: reference tokens (a ``ReferenceLatent``, if any) are dropped after the input projection
  and every attention gets the template's K/V (already RoPE'd at t = 10 (i + 1), as klein's ``index`` method places
  references) appended to its keys and values. Without a ``kv_stream`` one representation is fetched for every shard
  and a layer not decoded yet waits (``sakura_core.template_feed``). With one (a Sakura Bandwidth-Adaptive Fetch:
  its policy and link), the runtime's fetch lanes serve the run (``sakura_core.runtime.host_lanes``): the policy picks
  each shard's level from the measured link and, while a ``ReferenceLatent``'s tokens are in step 0's sequence, where
  ComfyUI stops computing them (the hybrid split); ComfyUI's progress bar shows the fetch while the forward waits.
  The run's report: the Sakura Template KV Report node.
* ``compute here (KV mode)``: ComfyUI computes the reference tokens itself with the KV-mode semantics (an attention
  mask keeping reference queries on reference keys; method ``index_timestep_zero`` for a single-mode template, the
  step's own time for a per-step one) — the on-device edit the fetched one must equal.

A per-step template's step is the one whose time equals the sampler's sigma (``extra_options["sigmas"]``).

Per-run state is a ``RunState`` (``nodes/_kv_patches.py``, with the patch callables) made per node output and reset in
``finally`` by an ``OUTER_SAMPLE`` wrapper.
"""

from __future__ import annotations

import logging

from comfy_api.latest import io

from sakura_core.models.model_id_cache import ModuleIdCache

from ._common import CATEGORY, SakuraKVStream, SakuraNodeError, SakuraTemplate
from ._kv_patches import DropReferences, RunState, SampleWrapper, SelfOnlyReferences, SplitBlock, TemplateAttention

__all__ = [
    "COMPUTE",
    "FETCHED",
    "MODEL_IDS",
    "SakuraTemplateKV",
    "SakuraTemplateKVReport",
    "comfy_model_key",
    "run_report",
]

logger = logging.getLogger(__name__)

FETCHED = "fetched template"
COMPUTE = "compute here (KV mode)"
_KEY = "sakura_template_kv"


def _hash_transformer(state: dict) -> str:
    from sakura_core.models.single_files import transformer_state_model_id

    return transformer_state_model_id(state)


# the id of each loaded diffusion model, hashed once per weights state (weakly held: it goes with the model, and a
# weight replaced or written in place is hashed again; sakura_core.models.model_id_cache says how)
MODEL_IDS = ModuleIdCache(_hash_transformer)


def comfy_model_key(model):
    """``sakura_core.template_check.ModelKey`` of a ComfyUI MODEL (a ModelPatcher of FLUX.2): the model id computed
    from its loaded diffusion-model tensors (``sakura precompute --model klein-files:...`` gives the same for those
    weights in that dtype; cached per loaded model: :data:`MODEL_IDS`), its KV geometry; no edit grid (any latent
    size uses the same reference K/V)."""
    from sakura_core.template_check import ModelKey

    dm = model.model.diffusion_model
    if not hasattr(dm, "double_blocks") or not hasattr(dm, "single_blocks") or not hasattr(dm, "params"):
        raise SakuraNodeError(
            f"Sakura Template KV needs a FLUX.2 [klein] MODEL (UNETLoader of a klein file); got {type(dm).__name__}"
        )
    try:
        model_id = MODEL_IDS.model_id(dm)
    except ValueError as e:
        raise SakuraNodeError(f"Sakura Template KV: this MODEL is not a FLUX.2 [klein] transformer: {e}") from e
    geometry = (len(dm.double_blocks) + len(dm.single_blocks), int(dm.num_heads), int(dm.hidden_size // dm.num_heads))
    return ModelKey(model_id, (1, 1), geometry)


def _check_template(handle, model) -> None:
    """The template against ComfyUI's model (``sakura_core.template_check.check_template``: ids, geometry) and its
    reference placement against ComfyUI's (``ref_index_scale``); errors name both sides and the fix."""
    from sakura_core.models.ref_layout import REF_TIME_OFFSET
    from sakura_core.template_check import check_template

    patched = sorted(getattr(model, "patches", None) or {})
    if patched:
        raise SakuraNodeError(
            f"this MODEL carries weight patches (a LoRA or similar) on {len(patched)} weights, e.g. "
            f"{patched[0]!r}: template {handle.template_id!r} holds reference K/V of the plain "
            "weights. Remove the LoRA, or set kv_source = compute here (ComfyUI then computes the "
            "reference tokens with these weights)"
        )
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
        raise SakuraNodeError(
            f"template {handle.template_id!r} places references at RoPE time {REF_TIME_OFFSET} (i + 1)"
            f", this MODEL at {scale:g} (i + 1): not a FLUX.2 [klein] model"
        )


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
                    tooltip="Without a kv_stream: the representation fetched for every shard: fp16 = exact; a level "
                    "name of the template's ladder (e.g. sakura-l3) for fewer bytes.",
                ),
                SakuraKVStream.Input(
                    "kv_stream",
                    optional=True,
                    tooltip="From a Sakura Bandwidth-Adaptive Fetch (its policy and link): the policy picks each "
                    "shard's level from the measured link and, with a ReferenceLatent, where ComfyUI computes the "
                    "reference tokens instead of waiting (the hybrid split). Overrides representation.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The patched model (a clone; the input model is unchanged).")],
        )

    @classmethod
    def execute(cls, model, template, kv_source: str, representation: str, kv_stream=None) -> io.NodeOutput:
        if template.manifest is None:
            raise SakuraNodeError("the template handle holds no manifest: connect a Sakura Template KV Loader")
        import comfy.patcher_extension

        _check_template(template, model)
        dm = model.model.diffusion_model
        m = model.clone()
        if kv_source == COMPUTE:
            m.set_model_attn1_patch(SelfOnlyReferences())
            if template.kv_mode == "single":  # single mode: references at t = 0; per-step: at the step's own t
                m.add_object_patch("diffusion_model.params.default_ref_method", "index_timestep_zero")
            mode = f"reference tokens computed here ({template.kv_mode} KV-mode semantics)"
        elif kv_source == FETCHED:
            settings = None
            if kv_stream is not None:
                if kv_stream.template.template_id != template.template_id:
                    raise SakuraNodeError(
                        f"kv_stream fetches template {kv_stream.template.template_id!r}, the "
                        f"template input is {template.template_id!r}: connect the same Template KV "
                        "Loader to both"
                    )
                settings = kv_stream.settings
            state = RunState(
                template,
                representation.strip() or "fp16",
                settings,
                len(dm.double_blocks),
                len(dm.double_blocks) + len(dm.single_blocks),
            )
            tokens = sum(r.tokens for r in template.manifest.references)
            m.set_model_attn1_patch(TemplateAttention(state))
            m.set_model_post_input_patch(DropReferences(state, tokens))
            m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, _KEY, SampleWrapper(state))
            if settings is not None:
                for block_type, blocks in (("double", dm.double_blocks), ("single", dm.single_blocks)):
                    for i in range(len(blocks)):
                        m.set_model_patch_replace(SplitBlock(state, block_type, i), "dit", f"{block_type}_block", i)
                if template.kv_mode == "single":  # references riding in step 0 (the split) are at t = 0
                    m.add_object_patch("diffusion_model.params.default_ref_method", "index_timestep_zero")
                mode = f"reference K/V fetched as policy {settings.policy} decides over {settings.link.to_wire()}"
            else:
                mode = f"reference K/V fetched ({state.representation})"
            mode += f" from {template.source}"
        else:
            raise SakuraNodeError(f"kv_source must be {FETCHED!r} or {COMPUTE!r}, got {kv_source!r}")
        return io.NodeOutput(m, ui={"text": [f"{template.template_id}: {mode}"]})


def run_report(model) -> dict | None:
    """The last sampling run's report of a MODEL patched by Sakura Template KV (fetched mode), or None."""
    import comfy.patcher_extension

    for wrapper in model.get_wrappers(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, _KEY):
        if isinstance(wrapper, SampleWrapper):
            return wrapper.state.last_report
    return None


class SakuraTemplateKVReport(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraTemplateKVReport",
            display_name="Sakura Template KV Report",
            category=CATEGORY,
            description="What the last sampling run of a Sakura Template KV MODEL fetched: policy, levels per "
            "shard, the split, bytes, waits, the policy's decisions. Connect the sampler's output so it runs after.",
            inputs=[
                io.Model.Input("model", tooltip="The MODEL output of Sakura Template KV (fetched template)."),
                io.Latent.Input("samples", tooltip="The sampler's output: this node then runs after the sampler."),
            ],
            outputs=[io.String.Output("report", tooltip="The report as JSON.")],
            not_idempotent=True,
        )

    @classmethod
    def execute(cls, model, samples) -> io.NodeOutput:
        import json

        report = run_report(model)
        if report is None:
            raise SakuraNodeError(
                "this MODEL has run no Sakura Template KV fetch: connect the MODEL output of a "
                "Sakura Template KV node (kv_source = fetched template) that the sampler used"
            )
        line = ", ".join(
            f"{k} {report[k]}"
            for k in ("policy", "bytes_fetched", "bytes_used", "split_layer", "wait_s", "waits")
            if k in report
        )
        return io.NodeOutput(json.dumps(report, indent=1), ui={"text": [f"{report['template_id']}: {line}"]})

"""Server side: a template image -> exact KV -> importance -> every representation of every shard + the manifest.

:func:`precompute_template` is what the cloud server's write path calls. Whole-template encode/decode helpers live in
:mod:`sakura_core.kv.template_codec`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..kv.chain import decode_chain
from ..kv.codec_registry import Codec, get_codec
from ..kv.container import shard_digest
from ..kv.manifest import MANIFEST_VERSION, validate_manifest
from ..kv.template_codec import shard_inputs
from ..models.edit_model import EditModel, load_image
from ..models.kv_types import KV_MODES, PerStepTemplateKV, TemplateKV
from ..models.ref_layout import REF_TIME_OFFSET, as_references
from .attention_capture import capture_attention
from .cross_step import StepBase, encode_residual_step, reuse_representation
from .importance import attention_error, importance_from_captures, layer_gains
from .output_psnr import PSNR_METRIC, add_output_psnr
from .probes import ProbeConfig, make_probes
from .store_profile import StoreProfile, apply_store_profile

__all__ = ["DISTORTION_METRIC", "PrecomputedTemplate", "precompute_template", "template_kvs"]

logger = logging.getLogger(__name__)

DISTORTION_METRIC = "attn_rel_err"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PrecomputedTemplate:
    """What the server stores: ``manifest`` (JSON-able dict, see :mod:`.manifest`) and ``blobs`` (digest -> bytes)."""

    manifest: dict
    blobs: dict[str, bytes]


def precompute_template(
    model: EditModel,
    template_image: np.ndarray,
    template_id: str,
    *,
    codec: str = "sakura",
    shard_layers: int = 1,
    seed: int = 0,
    progress: Progress | None = None,
    probes: ProbeConfig | None = None,
    held_out_probes: int = 4,
    psnr_steps: int = 4,
    kv_mode: str = "single",
    steps: int = 4,
    shift: float = 1.0,
    cross_step: bool = True,
    store_profile: StoreProfile | str = "full",
) -> PrecomputedTemplate:
    """Compute a template's exact KV, estimate token importance, encode every shard at every level of ``codec`` plus
    the fp16 reference, measure each representation's distortion on held-out probes, and build the manifest.

    Args:
        model: the demo model (anything with ``adapter``, ``spec``, ``template_tokens``, ``pack_image``).
        template_image: (S, S, 3) uint8 at the model's resolution, or larger (S a multiple of the patch size): a
            larger template's tokens keep their own grid of position ids, so it costs more KV than the edit. Or a
            list of up to 4 such reference images of one size (try-on: person, garment): one KV over all of them,
            the references attending to each other as in klein's KV mode; the manifest lists them (``references``).
        template_id: ``[a-z0-9-]{1,64}``.
        codec: ladder codec: ``"sakura"`` (progressive), ``"cachegen"``, ``"int8"``, ``"int4"`` or ``"fp16"``.
        shard_layers: consecutive layers per shard.
        seed: seed of the probe requests (importance and held-out distortion); the result is a pure function of
            (model, image, id, codec, shard_layers, seed[, steps, shift]).
        progress: ``progress(stage, done, total)`` with stages "kv", "importance", "encode", "psnr".
        probes: probe settings for importance (``seed`` is overridden by ``seed``).
        held_out_probes: number of held-out probe requests the distortion is measured on.
        psnr_steps: steps of the held-out edit each level's end-to-end PSNR (``psnr_db``) is measured with
            (every shard at that level, vs the exact-KV edit); 0 skips it. Clients pick their quality floor by it.
            In per-step mode the held-out edit runs the template's own schedule (``steps``, ``shift``) instead.
        kv_mode: ``"single"`` (one KV per layer) or ``"per-step"`` (one KV per (step, layer) for the schedule
            ``flow_timesteps(steps, shift)``, or a latent model's own schedule for ``steps``; importance probes run at
            each step's time; shards carry ``step``).
        steps, shift: the per-step schedule (ignored in single mode).
        cross_step: per-step mode: code steps >= 1 against step s - 1 (:mod:`.cross_step`), not on their own.
        store_profile: what the result keeps (:mod:`.store_profile`): ``"full"`` (every representation, the fp16
            included; the default here: benchmarks and tests measure every level) or ``"serving"`` (the rungs a
            client fetches, chosen by their ``psnr_db``; what ``sakura precompute`` publishes by default).
    """
    if kv_mode not in KV_MODES:
        raise ValueError(f"kv_mode must be one of {KV_MODES}, got {kv_mode!r}")
    profile = store_profile if isinstance(store_profile, StoreProfile) else StoreProfile(store_profile)
    ladder = get_codec(codec)
    report = progress or (lambda stage, done, total: None)
    images = _check_images(model, template_image)
    config = ProbeConfig(seed=seed) if probes is None else replace(probes, seed=seed)
    per_step, kvs = template_kvs(model, images[0] if len(images) == 1 else images, kv_mode, steps, shift, report)
    blobs: dict[str, bytes] = {}
    packed = _probe_latents(model, images[0])
    cross = per_step is not None and cross_step and ladder.name != "fp16"  # an fp16 ladder is its own exact rung
    enc = _StepEncoder(model, ladder, template_id, shard_layers, packed, held_out_probes, blobs, report)
    shards = enc.all_steps(kvs, config, per_step is not None, cross)
    if psnr_steps > 0:
        add_output_psnr(
            model, per_step or kvs[0], shards, blobs, seed, steps if per_step else psnr_steps, shift, report
        )

    probes_used = {"seed": seed, "num_probes": config.num_probes, "held_out": held_out_probes}
    coding = None if per_step is None else ("cross-step" if cross else "independent")
    refs = _references(images, kvs[0])
    manifest = _manifest(
        kvs[0], template_id, ladder.name, probes_used, psnr_steps > 0, per_step, shift, coding, shards, refs
    )
    return _stored(manifest, blobs, profile, ladder.progressive, kv_mode, len(shards))


def _stored(
    manifest: dict, blobs: dict[str, bytes], profile: StoreProfile, progressive: bool, kv_mode: str, shards: int
) -> PrecomputedTemplate:
    """What ``profile`` keeps of the manifest and blobs, the manifest validated; logs the template's size."""
    manifest, blobs = apply_store_profile(manifest, blobs, profile, progressive)
    validate_manifest(manifest)
    total = sum(len(b) for b in blobs.values())
    logger.info(
        "precomputed template %s (%s, store profile %s): %d shards, %d blobs, %d bytes",
        manifest["template_id"],
        kv_mode,
        manifest["store_profile"],
        shards,
        len(blobs),
        total,
    )
    return PrecomputedTemplate(manifest, blobs)


def _probe_latents(model: EditModel, image: np.ndarray) -> torch.Tensor:
    """The importance probes' clean latents, edit-sized: a larger template (or the first of several references) is
    scaled down to the edit's size for them."""
    size = model.spec.image_size
    return model.pack_image(image if image.shape[0] == size else load_image(image, size))


def _manifest(
    kv: TemplateKV, template_id, codec, probes, psnr: bool, per_step, shift, coding, shards, references: list[dict]
) -> dict:
    """The manifest (see :mod:`sakura_core.kv.manifest`) of the encoded ``shards``; ``kv``: the first step's KV;
    ``references``: the manifest's (:func:`_references`, without images: the publisher adds them)."""
    return {
        "version": MANIFEST_VERSION,
        "model_id": kv.model_id,
        "template_id": template_id,
        "token_grid": [int(kv.token_grid[0]), int(kv.token_grid[1])],
        "rope_layout": kv.rope_layout,
        "references": references,
        "num_layers": kv.num_layers,
        "heads": kv.num_heads,
        "head_dim": kv.head_dim,
        "codec": codec,
        "distortion_metric": DISTORTION_METRIC,
        "probes": probes,
        "psnr_metric": PSNR_METRIC if psnr else None,
        "kv_mode": "single" if per_step is None else "per-step",
        **({"schedule": _schedule(per_step, shift), "per_step_coding": coding} if per_step is not None else {}),
        "shards": shards,
    }


@dataclass
class _StepEncoder:
    """Encodes the steps of a template in order: each step on its own, or (cross-step) step s >= 1 against s - 1."""

    model: EditModel
    ladder: Codec
    template_id: str
    shard_layers: int
    packed: torch.Tensor
    held_out: int
    blobs: dict[str, bytes]
    report: Progress

    def all_steps(self, kvs: list[TemplateKV], config: ProbeConfig, per_step: bool, cross: bool) -> list[dict]:
        shards: list[dict] = []
        base: StepBase | None = None  # what the next step is coded against (cross-step coding)
        for s, kv in enumerate(kvs):
            step_cfg = replace(config, timesteps=(kv.ref_timestep,)) if per_step else config
            importance, held = _importance(self.model, kv, self.packed, step_cfg, self.held_out, self.report)
            if cross and s > 0:
                assert base is not None  # step 0 set it (cross-step coding)
                prev_exact = base.exact_digest
                step_shards, base = encode_residual_step(
                    self.ladder,
                    kv,
                    base,
                    s,
                    importance,
                    held,
                    self.template_id,
                    self.shard_layers,
                    self.blobs,
                    len(kvs),
                )
                for sh in step_shards:
                    reuse = reuse_representation(s, sh["layers"], prev_exact, held, kv, kvs[s - 1])
                    sh["representations"].insert(0, reuse)
            else:
                base = StepBase(kv) if cross else None
                step_shards = _encode_step(
                    self.ladder,
                    kv,
                    self.template_id,
                    importance,
                    held,
                    self.shard_layers,
                    self.blobs,
                    self.report,
                    s if per_step else None,
                    base,
                )
                if base is not None:
                    base.exact_digest = {sh["layers"][0]: _fp16_digest(sh) for sh in step_shards}
                    base.start_track(step_shards)
            shards += [{"step": s, **sh} for sh in step_shards] if per_step else step_shards
        return shards


def template_kvs(model, image, kv_mode: str, steps: int, shift: float, report):
    """(the per-step KV or None, the TemplateKV of each step — one in single mode) of the exact template KV
    (``image``: the template image, or the list of its reference images)."""
    from ..runtime.schedule import edit_times

    grid = model.template_grid(image)  # larger than the edit's grid for a larger template; one per reference
    report("kv", 0, 1)
    ref = model.template_tokens(image)
    if kv_mode == "per-step":
        per_step = model.adapter.extract_per_step_kv(ref, grid, edit_times(model, steps, shift)[:-1])
        kvs = [per_step.at_step(s) for s in range(steps)]
    else:
        per_step, kvs = None, [model.adapter.extract_template_kv(ref, grid)]
    report("kv", 1, 1)
    return per_step, kvs


def _schedule(per_step: PerStepTemplateKV, shift: float) -> dict:
    """The manifest's ``schedule``: what a request must run for this per-step KV to be exact."""
    return {
        "steps": per_step.num_steps,
        "timesteps": [float(t) for t in per_step.timesteps],
        "shift": float(shift),
        "guidance": None,
        "sampler": "flow-euler",
    }


def _fp16_digest(entry: dict) -> str:
    return next(r["digest"] for r in entry["representations"] if r["codec"] == "fp16")


def _encode_step(
    ladder, kv: TemplateKV, template_id, importance, held, shard_layers, blobs, report, step=None, base=None
) -> list[dict]:
    """Every representation of every shard (and its distortion on the held-out probes) for one TemplateKV; with a
    :class:`StepBase`, also what later steps are coded against (thresholds, decoded KV per level name)."""

    inputs = ladder.prepare_shards(shard_inputs(kv, template_id, importance, shard_layers, step=step))
    if base is not None:
        base.slopes = inputs[0].level_slopes if inputs else None
    shards = []
    for i, shard in enumerate(inputs):
        report("encode", i, len(inputs))
        shards.append(_encode_shard(ladder, shard, kv, held, blobs, None if base is None else base.decoded))
    report("encode", len(inputs), len(inputs))
    return shards


def _check_images(model: EditModel, template_image) -> list[np.ndarray]:
    """The template's reference images (one image, or a list of them of one size)."""
    refs = as_references(template_image)
    images = [np.asarray(x) for x in (refs if refs is not None else [template_image])]
    size = model.spec.image_size
    for image in images:
        if image.ndim != 3 or image.shape[0] < size or image.shape[0] != image.shape[1] or image.dtype != np.uint8:
            raise ValueError(
                f"template_image must be (S, S, 3) uint8 with S >= {size} for this model (or a list of such reference "
                f"images), got {image.shape} {image.dtype}; resize it with sakura_core.models.edit_model.load_image"
            )
    if len({x.shape for x in images}) > 1:
        raise ValueError(
            f"the references of one template must share one size, got {[x.shape[0] for x in images]}; "
            "resize them to one template size"
        )
    return images


def _references(images: list[np.ndarray], kv: TemplateKV) -> list[dict]:
    """The manifest's ``references`` (:func:`sakura_core.kv.manifest_schema.check_references`) as the codec knows
    them (no images yet: the publisher adds them)."""
    out, offset = [], 0
    for i, (image, (rows, cols)) in enumerate(zip(images, kv.ref_grids, strict=True)):
        out.append(
            {
                "size": [int(image.shape[0]), int(image.shape[1])],
                "token_grid": [rows, cols],
                "rope_t": REF_TIME_OFFSET * (i + 1),
                "token_offset": offset,
                "tokens": rows * cols,
            }
        )
        offset += rows * cols
    return out


def _importance(model: EditModel, kv: TemplateKV, packed, config: ProbeConfig, held_out: int, report):
    """Token importance (and per-layer gains) from fit probes, and the attention captured on held-out probes
    (``packed``: the template as edit-sized clean tokens, what the probes' user side is built from)."""
    seed = config.seed
    report("importance", 0, 2)
    fit_probes = make_probes(model, packed, config, stream=0)
    fit = capture_attention(model, kv, fit_probes)
    importance = importance_from_captures(fit, kv, seed=seed)
    if config.gain_steps is not None:
        gains = layer_gains(model, kv, fit_probes, fit, seed=seed, steps=config.gain_steps)
        importance = replace(importance, layer_gain=gains)
    del fit
    report("importance", 1, 2)
    held_cfg = replace(config, num_probes=held_out)
    held = capture_attention(model, kv, make_probes(model, packed, held_cfg, stream=1))
    report("importance", 2, 2)
    return importance, held


def _encode_shard(ladder, shard, kv: TemplateKV, held, blobs: dict[str, bytes], decoded=None) -> dict:
    """One shard's manifest entry: every level of ``ladder`` and the fp16 reference on top; blobs go to ``blobs``
    (and each level's decoded K, V to ``decoded[(first layer, level name)]`` when given)."""
    first, last = shard.meta.layer_first, shard.meta.layer_first + shard.k.shape[0] - 1
    reps = []
    if ladder.name != "fp16":
        encoded = ladder.encode(shard, ladder.levels)
        chain: list[bytes] = []
        for level, blob in zip(ladder.levels, encoded, strict=True):
            chain = chain + [blob] if ladder.progressive else [blob]
            reps.append(_representation(ladder, level, chain, kv, held, first, decoded))
            blobs[reps[-1]["digest"]] = blob
    top = (max(ladder.levels) + 1) if ladder.name != "fp16" else 0
    fp16 = get_codec("fp16")
    (fp16_blob,) = fp16.encode(shard, [0])
    rep = _representation(fp16, 0, [fp16_blob], kv, held, first)
    rep["level"] = top
    reps.append(rep)
    blobs[rep["digest"]] = fp16_blob
    return {"layers": [first, last], "representations": reps}


def _representation(codec, level: int, chain: list[bytes], kv: TemplateKV, held, first: int, decoded=None) -> dict:
    _, k, v = decode_chain(chain)
    if decoded is not None:
        decoded[(first, codec.level_name(level))] = (k, v)
    approx = {first + i: (torch.from_numpy(k[i]), torch.from_numpy(v[i])) for i in range(k.shape[0])}
    digest = shard_digest(chain[-1])
    return {
        "level": int(level),
        "name": codec.level_name(level),
        "codec": codec.name,
        "bytes": len(chain[-1]),
        "total_bytes": sum(len(b) for b in chain),
        "distortion": round(attention_error(held, kv, approx), 8),
        "digest": digest,
        "requires": [shard_digest(b) for b in chain[:-1]],
    }

"""Precompute glue: model + template image -> ``sakura_core.precompute.precompute_template`` -> store (shards, manifest last).

Shared by ``sakura precompute`` and ``POST /v1/templates``. The codec does the work (importance estimation, every
ladder level); this module checks what it returns, stores every shard, then the source image, then publishes the
manifest — so a crash at any point leaves the template unpublished rather than half there.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sakura_core.files import png_bytes
from sakura_core.images import ImageError
from sakura_core.images import decode_image as decode_core_image
from sakura_core.kv.manifest import ManifestError, blob_digests, parse_manifest
from sakura_core.kv.storage import DEFAULT_STORE_PROFILE
from sakura_core.models.loading import add_device_arguments

from .store import ManifestExistsError, Store, validate_template_id

__all__ = [
    "ImageError",
    "Progress",
    "PublishResult",
    "TemplateExistsError",
    "add_device_arguments",
    "compute_info",
    "decode_image",
    "load_model",
    "publish_template",
    "read_template_image",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
# (model, template_image (S, S, 3) uint8, template_id, *, codec, shard_layers, seed, progress) -> result with
# ``.manifest`` (dict) and ``.blobs`` (digest -> bytes): the signature of sakura_core.precompute.precompute_template.
PrecomputeFn = Callable[..., Any]

_FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}


class TemplateExistsError(ValueError):
    """A template with this id is already published."""


@dataclass(frozen=True)
class PublishResult:
    """What ``publish_template`` stored: the manifest as published, the number of KV blobs and their bytes (the
    template image blob not included)."""

    template_id: str
    manifest: dict
    shards: int
    shard_bytes: int


def load_model(name: str, *, device: str = "cpu", dtype: str | None = None):
    """The served model: ``demo`` (the embedded demo model, ``MODELS``) or a diffusers FLUX.2 [klein] pipeline
    folder's path (VAE-encoded templates, latent-space KV), on ``device`` in ``dtype`` (``load_edit_model``)."""
    from sakura_core.models.loading import load_edit_model

    return load_edit_model(name, device=device, dtype=dtype)


def compute_info(model) -> dict | None:
    """``{"device": ..., "dtype": ...}`` the model computes with (recorded in the manifest), when it says."""
    adapter = getattr(model, "adapter", None)
    if adapter is None or not hasattr(adapter, "dtype"):
        return None
    return {"device": str(adapter.device), "dtype": str(adapter.dtype).removeprefix("torch.")}


def decode_image(data: bytes, *, max_pixels: int, what: str = "the upload") -> tuple[np.ndarray, str]:
    """Decode an uploaded PNG/JPEG/WebP into (H, W, 3) uint8 (``sakura_core.images.decode_image``: the pixel count
    checked from the header before any pixel is decoded, 16-bit and palette images converted by their mode); returns
    it with the file extension to keep it under."""
    rgb, fmt = decode_core_image(data, what, max_pixels=max_pixels, formats=tuple(_FORMATS))
    h, w = rgb.shape[:2]
    if min(w, h) < 8:
        raise ImageError(f"image is {w}x{h}; templates need at least 8 pixels a side")
    return rgb, _FORMATS[fmt]


def read_template_image(source: str) -> tuple:
    """(image array, (file bytes, ext) or ``None``) from an image file, or a demo sample name (``astronaut``, ...)."""
    path = Path(source)
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ImageError(f"image file {source!r} cannot be read: {e.strerror}") from e
        image, ext = decode_image(data, max_pixels=100_000_000, what=f"image file {source!r}")
        return image, (data, ext)
    if path.suffix or "/" in source:
        raise ImageError(f"image file {source!r} not found")
    from sakura_core.models.edit_model import DEMO_TEMPLATES, load_image

    if source in DEMO_TEMPLATES:
        return load_image(source, 512), None
    raise ImageError(f"image {source!r} is neither a file nor a demo sample ({', '.join(DEMO_TEMPLATES)})")


def _publish_manifest(store: Store, template_id: str, manifest: dict, overwrite: bool) -> None:
    """Write the manifest; without ``overwrite``, only if no other writer published the id meanwhile."""
    try:
        (store.put_manifest if overwrite else store.put_new_manifest)(template_id, manifest)
    except ManifestExistsError as e:
        raise TemplateExistsError(
            f"template {template_id!r} was published by another writer while this one computed "
            "it; pick another id or overwrite"
        ) from e


def _default_precompute_fn() -> PrecomputeFn:
    from sakura_core.precompute import precompute_template

    return precompute_template


def _check_result(result: Any, model_id: str, template_id: str) -> tuple[dict, dict[str, bytes]]:
    manifest, blobs = getattr(result, "manifest", None), getattr(result, "blobs", None)
    if not isinstance(manifest, dict) or not isinstance(blobs, dict):
        raise ManifestError(f"precompute returned {type(result).__name__}, expected .manifest dict and .blobs dict")
    parse_manifest(manifest, template_id=template_id, model_id=model_id)
    for i, shard in enumerate(manifest["shards"]):
        for rep in shard["representations"]:
            if rep["digest"] is None:  # a zero-byte cross-step "reuse" rung: no blob
                continue
            blob = blobs.get(rep["digest"])
            if blob is None:
                raise ManifestError(f"manifest shards[{i}] names digest {rep['digest']} but no blob was produced")
            if len(blob) != rep["bytes"]:
                raise ManifestError(
                    f"shard {rep['digest']}: blob is {len(blob)} bytes, the manifest says {rep['bytes']}"
                )
    return manifest, blobs


def _publishable(
    manifest: dict, images: list[np.ndarray], names: list[str] | None, model, annotations: dict | None
) -> tuple[dict, list[bytes]]:
    """The manifest to publish (the codec's + each reference's ``image`` and ``name`` + ``template_image`` +
    ``precompute``) and the reference images' PNGs, in order.

    The device computes the template's first layers itself (hybrid split): it needs the exact images the KV was
    computed from. Lossless PNGs at the template's resolution, content-addressed like shards; ``template_image`` is
    the first (what a one-reference client reads).
    """
    pngs = [png_bytes(image) for image in images]
    refs = [{"digest": hashlib.sha256(png).hexdigest(), "bytes": len(png), "format": "png"} for png in pngs]
    entries = manifest.get("references") or [{}]
    if len(entries) != len(refs):
        raise ManifestError(f"precompute listed {len(entries)} reference(s) for {len(refs)} image(s)")
    named = [{**e, **({"name": names[i]} if names else {}), "image": refs[i]} for i, e in enumerate(entries)]
    manifest = {**manifest, "template_image": refs[0], **({"references": named} if manifest.get("references") else {})}
    made = {**(compute_info(model) or {}), **(annotations or {})}
    if made:
        manifest["precompute"] = made
    return manifest, pngs


def _reference_names(names, count: int) -> list[str] | None:
    if names is None:
        return None
    names = [str(n) for n in names]
    if len(names) != count or any(not 0 < len(n) <= 64 for n in names):
        raise ValueError(f"reference names {names!r}: give one name of 1-64 characters per image ({count})")
    return names


def _sized_images(model, images: list[np.ndarray], template_size: int | None) -> list[np.ndarray]:
    """``images`` resized to ``template_size`` (default the model's edit size) when the model has a ``spec``."""
    spec = getattr(model, "spec", None)
    if spec is None:
        return images
    from sakura_core.models.edit_model import load_image

    return [load_image(x, template_size or spec.image_size) for x in images]


def _mode_kwargs(kv_mode: str, steps: int, shift: float, cross_step: bool, store_profile: str) -> dict:
    """The codec's keyword arguments for ``kv_mode`` (the schedule only in per-step mode) and ``store_profile``."""
    mode_kwargs = {} if kv_mode == "single" else {"kv_mode": kv_mode, "steps": steps, "shift": shift}
    if kv_mode != "single" and not cross_step:  # the codec's default is cross-step coding
        mode_kwargs["cross_step"] = False
    mode_kwargs["store_profile"] = store_profile
    return mode_kwargs


def publish_template(
    store: Store,
    model,
    image: np.ndarray | list[np.ndarray],
    template_id: str,
    *,
    codec: str = "sakura",
    shard_layers: int = 1,
    seed: int = 0,
    source: tuple[bytes, str] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    precompute_fn: PrecomputeFn | None = None,
    kv_mode: str = "single",
    steps: int = 4,
    shift: float = 1.0,
    template_size: int | None = None,
    cross_step: bool = True,
    annotations: dict | None = None,
    reference_names: list[str] | None = None,
    store_profile: str = DEFAULT_STORE_PROFILE,
) -> PublishResult:
    """Precompute a template's KV ladder and publish it in ``store``; the manifest is written last.

    The published manifest is the codec's plus ``template_image``: ``{digest, bytes, format}`` of a lossless PNG of
    the template at the model's resolution, stored as a blob like the shards (the device needs it for the layers it
    computes itself).

    Args:
        store: where shards, source image and manifest go.
        model: the model (``.model_id``; ``.spec.image_size`` when the image must be resized to the model's size).
        image: (H, W, 3) uint8 template image; centre-cropped and resized to the model's size. Or a list of up to 4
            reference images (try-on: person, garment), each resized to that size: one template over all of them.
        template_id: ``[a-z0-9-]{1,64}``.
        codec, shard_layers, seed: passed to the codec.
        source: (bytes, ext) of the image file to keep next to the manifest; a PNG of ``image`` when omitted.
        overwrite: replace a published template with the same id (shards are content-addressed; old ones stay).
        progress: ``progress(stage, done, total)``; may raise to abort (nothing is published then).
        precompute_fn: the codec entry point (default ``sakura_core.precompute.precompute_template``).
        kv_mode, steps, shift: ``"single"`` (one KV per layer) or ``"per-step"`` (one per (step, layer) for the
            schedule ``steps``/``shift``; the manifest names it). Passed to the codec only in per-step mode, with
            ``cross_step`` (step s >= 1 coded against step s - 1; see ``sakura_core.precompute.cross_step``).
        template_size: side in pixels the template is resized to (default: the model's edit size); a larger
            template has more tokens than the edit (its own grid of position ids).
        annotations: JSON-able facts about how the template was made, merged into the manifest's ``precompute``
            object with the model's device and dtype (``sakura precompute-catalog`` keeps its entry key there).
        reference_names: one short name per reference image (``references[i].name``, shown by the nodes).
        store_profile: ``"serving"`` (default: the rungs a client fetches, no fp16) or ``"full"`` (every
            representation, the fp16 included: the fetch-fp16 baseline and exactness tests need it), passed to the
            codec (``sakura_core.precompute.store_profile``).
    """
    validate_template_id(template_id)
    if not overwrite and store.has_template(template_id):
        raise TemplateExistsError(f"template {template_id!r} is already published; pick another id or overwrite")
    fn = precompute_fn or _default_precompute_fn()
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    names = _reference_names(reference_names, len(images))
    if source is None:
        source = (png_bytes(images[0]), "png")
    images = _sized_images(model, images, template_size)
    mode_kwargs = _mode_kwargs(kv_mode, steps, shift, cross_step, store_profile)
    one = images if len(images) > 1 else images[0]
    result = fn(
        model, one, template_id, codec=codec, shard_layers=shard_layers, seed=seed, progress=progress, **mode_kwargs
    )
    manifest, blobs = _check_result(result, model.model_id, template_id)
    manifest, image_pngs = _publishable(manifest, images, names, model, annotations)
    count, total_bytes = _store_blobs(store, manifest, blobs, image_pngs, progress)
    store.put_source_image(template_id, *source)
    if progress is not None:
        progress("store", count, count)
    _publish_manifest(store, template_id, manifest, overwrite)  # last: publishes the template
    logger.info("template %s published: %d shard(s), %d bytes", template_id, count, total_bytes)
    return PublishResult(template_id, manifest, count, total_bytes)


def _store_blobs(store: Store, manifest: dict, blobs: dict[str, bytes], image_pngs: list[bytes], progress):
    """Store the shards the manifest names (each re-hashed against its name) and the reference images' PNGs;
    (shards stored, their bytes)."""
    digests = blob_digests(manifest)  # the reuse rung has no blob
    unused = set(blobs) - set(digests)
    if unused:
        logger.warning(
            "template %s: %d blob(s) not named by the manifest are not stored", manifest["template_id"], len(unused)
        )
    total_bytes = 0
    for i, digest in enumerate(digests):
        if progress is not None:
            progress("store", i, len(digests))
        blob = blobs[digest]
        if hashlib.sha256(blob).hexdigest() != digest:
            raise ManifestError(f"blob named {digest} hashes to {hashlib.sha256(blob).hexdigest()}")
        store.put_shard(digest, blob)
        total_bytes += len(blob)
    images = manifest.get("references") or [{"image": manifest["template_image"]}]
    for ref, png in zip(images, image_pngs, strict=True):
        store.put_shard(ref["image"]["digest"], png)
    return len(digests), total_bytes

"""Precompute glue: model + template image -> ``sakura_core.precompute.precompute_template`` -> store (shards, manifest last).

Shared by ``sakura precompute`` and ``POST /v1/templates``. The codec does the work (importance estimation, every
ladder level); this module checks what it returns, stores every shard, then the source image, then publishes the
manifest — so a crash at any point leaves the template unpublished rather than half there.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sakura_core.files import png_bytes
from sakura_core.kv.manifest import ManifestError, parse_manifest

from .store import Store, validate_template_id

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


class ImageError(ValueError):
    """An uploaded template image cannot be used (format, size, corrupt data)."""


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


def add_device_arguments(parser, *, what: str = "precompute") -> None:
    """``--device`` and ``--dtype`` of the model that runs ``what``."""
    from sakura_core.models.loading import DTYPES

    parser.add_argument("--device", default="cpu",
                        help=f"device {what} runs the model on: cpu, cuda, cuda:N (default: %(default)s)")  # fmt: skip
    parser.add_argument(
        "--dtype", default=None, choices=sorted(DTYPES),
        help=f"parameter dtype for {what} (default: the checkpoint's, float32 for the demo model); part of the model "
        "id, so clients must run the model in the same dtype",
    )  # fmt: skip


def compute_info(model) -> dict | None:
    """``{"device": ..., "dtype": ...}`` the model computes with (recorded in the manifest), when it says."""
    adapter = getattr(model, "adapter", None)
    if adapter is None or not hasattr(adapter, "dtype"):
        return None
    return {"device": str(adapter.device), "dtype": str(adapter.dtype).removeprefix("torch.")}


_OBJECT_REPR = re.compile(r"<[^<>]{1,80} object at 0x[0-9a-fA-F]+>")


def decode_image(data: bytes, *, max_pixels: int) -> tuple[np.ndarray, str]:
    """Decode an uploaded PNG/JPEG/WebP into (H, W, 3) uint8; returns it with the file extension to keep it under.

    The pixel count is checked from the header before any pixel is decoded (decompression bombs).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format
            if fmt not in _FORMATS:
                raise ImageError(f"image format {fmt} not accepted: upload PNG, JPEG or WebP")
            w, h = img.size
            if w * h > max_pixels:
                raise ImageError(f"image is {w}x{h} = {w * h} pixels, over the limit of {max_pixels}")
            if min(w, h) < 8:
                raise ImageError(f"image is {w}x{h}; templates need at least 8 pixels a side")
            rgb = np.asarray(img.convert("RGB"))
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as e:
        detail = _OBJECT_REPR.sub("the upload", str(e))  # PIL names its file object: <_io.BytesIO object at 0x...>
        raise ImageError(f"not a readable PNG/JPEG/WebP image: {detail}") from e
    return rgb, _FORMATS[fmt]


def read_template_image(source: str) -> tuple:
    """(image array, (file bytes, ext) or ``None``) from an image file, or a demo sample name (``astronaut``, ...)."""
    path = Path(source)
    if path.is_file():
        data = path.read_bytes()
        image, ext = decode_image(data, max_pixels=100_000_000)
        return image, (data, ext)
    if path.suffix or "/" in source:
        raise ImageError(f"image file {source!r} not found")
    from sakura_core.models.edit_model import DEMO_TEMPLATES, load_image

    if source in DEMO_TEMPLATES:
        return load_image(source, 512), None
    raise ImageError(f"image {source!r} is neither a file nor a demo sample ({', '.join(DEMO_TEMPLATES)})")


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
            blob = blobs.get(rep["digest"])
            if blob is None:
                raise ManifestError(f"manifest shards[{i}] names digest {rep['digest']} but no blob was produced")
            if len(blob) != rep["bytes"]:
                raise ManifestError(
                    f"shard {rep['digest']}: blob is {len(blob)} bytes, the manifest says {rep['bytes']}"
                )
    return manifest, blobs


def _publishable(manifest: dict, image: np.ndarray, model, annotations: dict | None) -> tuple[dict, bytes]:
    """The manifest to publish (the codec's + ``template_image`` + ``precompute``) and the template image's PNG.

    The device computes the template's first layers itself (hybrid split): it needs the exact image the KV was
    computed from. Lossless PNG at the model's resolution, content-addressed like a shard.
    """
    image_png = png_bytes(image)
    image_ref = {"digest": hashlib.sha256(image_png).hexdigest(), "bytes": len(image_png), "format": "png"}
    manifest = {**manifest, "template_image": image_ref}
    made = {**(compute_info(model) or {}), **(annotations or {})}
    if made:
        manifest["precompute"] = made
    return manifest, image_png


def publish_template(
    store: Store,
    model,
    image: np.ndarray,
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
    annotations: dict | None = None,
) -> PublishResult:
    """Precompute a template's KV ladder and publish it in ``store``; the manifest is written last.

    The published manifest is the codec's plus ``template_image``: ``{digest, bytes, format}`` of a lossless PNG of
    the template at the model's resolution, stored as a blob like the shards (the device needs it for the layers it
    computes itself).

    Args:
        store: where shards, source image and manifest go.
        model: the model (``.model_id``; ``.spec.image_size`` when the image must be resized to the model's size).
        image: (H, W, 3) uint8 template image; centre-cropped and resized to the model's size.
        template_id: ``[a-z0-9-]{1,64}``.
        codec, shard_layers, seed: passed to the codec.
        source: (bytes, ext) of the image file to keep next to the manifest; a PNG of ``image`` when omitted.
        overwrite: replace a published template with the same id (shards are content-addressed; old ones stay).
        progress: ``progress(stage, done, total)``; may raise to abort (nothing is published then).
        precompute_fn: the codec entry point (default ``sakura_core.precompute.precompute_template``).
        kv_mode, steps, shift: ``"single"`` (one KV per layer) or ``"per-step"`` (one per (step, layer) for the
            schedule ``steps``/``shift``; the manifest names it). Passed to the codec only in per-step mode.
        template_size: side in pixels the template is resized to (default: the model's edit size); a larger
            template has more tokens than the edit (its own grid of position ids).
        annotations: JSON-able facts about how the template was made, merged into the manifest's ``precompute``
            object with the model's device and dtype (``sakura precompute-catalog`` keeps its entry key there).
    """
    validate_template_id(template_id)
    if not overwrite and store.has_template(template_id):
        raise TemplateExistsError(f"template {template_id!r} is already published; pick another id or overwrite")
    fn = precompute_fn or _default_precompute_fn()
    if source is None:
        source = (png_bytes(image), "png")
    spec = getattr(model, "spec", None)
    if spec is not None:
        from sakura_core.models.edit_model import load_image

        image = load_image(image, template_size or spec.image_size)
    mode_kwargs = {} if kv_mode == "single" else {"kv_mode": kv_mode, "steps": steps, "shift": shift}
    result = fn(
        model, image, template_id, codec=codec, shard_layers=shard_layers, seed=seed, progress=progress, **mode_kwargs
    )
    manifest, blobs = _check_result(result, model.model_id, template_id)
    manifest, image_png = _publishable(manifest, image, model, annotations)
    image_ref = manifest["template_image"]
    digests = [rep["digest"] for shard in manifest["shards"] for rep in shard["representations"]]
    unused = set(blobs) - set(digests)
    if unused:
        logger.warning("template %s: %d blob(s) not named by the manifest are not stored", template_id, len(unused))
    total_bytes = 0
    for i, digest in enumerate(digests):
        if progress is not None:
            progress("store", i, len(digests))
        blob = blobs[digest]
        if hashlib.sha256(blob).hexdigest() != digest:
            raise ManifestError(f"blob named {digest} hashes to {hashlib.sha256(blob).hexdigest()}")
        store.put_shard(digest, blob)
        total_bytes += len(blob)
    store.put_shard(image_ref["digest"], image_png)
    store.put_source_image(template_id, *source)
    if progress is not None:
        progress("store", len(digests), len(digests))
    store.put_manifest(template_id, manifest)  # last: publishes the template
    logger.info("template %s published: %d shard(s), %d bytes", template_id, len(digests), total_bytes)
    return PublishResult(template_id, manifest, len(digests), total_bytes)

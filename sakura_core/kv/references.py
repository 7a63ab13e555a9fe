"""The manifest's ``references``: the template's reference images (one, or several: try-on = person + garment).

Each entry, in the model's order (:mod:`sakura_core.models.ref_layout`)::

    {"name": "person", "size": [S, S], "token_grid": [rows, cols], "rope_t": 10, "token_offset": 0,
     "tokens": rows * cols, "image": {"digest": <sha256 of its PNG>, "bytes": N, "format": "png"}}

``size`` is the image's side in pixels as the KV was computed from it, ``token_grid`` its token grid, ``rope_t`` its
RoPE time coordinate (10 (i + 1)), ``token_offset`` where its tokens start in the template's token sequence (and in
every shard's K/V). The publisher adds ``image`` (the exact PNG the device computes on-device layers from) and
``name``. The entries must agree with the manifest's ``token_grid`` (their grids stacked) and ``rope_layout`` (how
many). A manifest without ``references`` (published before them) has one reference, its ``template_image``.
"""

from __future__ import annotations

from typing import Any

from ..models.ref_layout import MAX_REFERENCES, REF_TIME_OFFSET, grids_of
from .manifest import ManifestError

__all__ = ["check_references", "reference_entries", "reference_images"]

_FIELDS = ("size", "token_grid", "rope_t", "token_offset", "tokens")


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(x, int) and x > 0 for x in value)


def _check_entry(i: int, ref: Any, grid: tuple[int, int], offset: int, need_image: bool) -> None:
    where = f"references[{i}]"
    if not isinstance(ref, dict) or any(k not in ref for k in _FIELDS):
        raise ManifestError(f"manifest field {where} must be an object with {', '.join(_FIELDS)}, got {ref!r}")
    if not _pair(ref["size"]) or not _pair(ref["token_grid"]) or tuple(ref["token_grid"]) != grid:
        raise ManifestError(f"manifest field {where}: size {ref['size']!r} / token_grid {ref['token_grid']!r} must be "
                            f"[S, S] / {list(grid)} (the manifest's token_grid and rope_layout stack that grid)")  # fmt: skip
    expect = {"rope_t": REF_TIME_OFFSET * (i + 1), "token_offset": offset, "tokens": grid[0] * grid[1]}
    for key, want in expect.items():
        if ref[key] != want:
            raise ManifestError(f"manifest field {where}.{key} must be {want}, got {ref[key]!r}")
    image = ref.get("image")
    if image is None and not need_image:
        return
    if not (isinstance(image, dict) and isinstance(image.get("digest"), str) and len(image["digest"]) == 64
            and isinstance(image.get("bytes"), int) and image["bytes"] > 0):  # fmt: skip
        raise ManifestError(
            f"manifest field {where}.image must be {{digest, bytes}} of the image's PNG, got {image!r}"
        )
    name = ref.get("name")
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= 64):
        raise ManifestError(f"manifest field {where}.name must be a string of 1-64 characters, got {name!r}")


def check_references(manifest: dict, *, published: bool = True) -> None:
    """Raise :class:`ManifestError` naming the field unless ``references`` (when present) lists the references the
    manifest's ``token_grid`` / ``rope_layout`` describe, in order, each with its image (``published``: the
    publisher's manifest; the codec's own has no images yet). Several references need ``references``."""
    refs = manifest.get("references")
    try:
        grids = grids_of(manifest["token_grid"], manifest["rope_layout"])
    except (KeyError, TypeError, ValueError) as e:
        raise ManifestError(f"manifest token_grid / rope_layout do not describe references: {e}") from e
    if refs is None:
        if len(grids) > 1:
            raise ManifestError(f"manifest of {len(grids)} references (rope_layout {manifest['rope_layout']!r}) has "
                                "no 'references' field; republish it")  # fmt: skip
        return
    if not isinstance(refs, list) or len(refs) != len(grids) or len(refs) > MAX_REFERENCES:
        raise ManifestError(f"manifest field 'references' must list the {len(grids)} reference(s) rope_layout "
                            f"{manifest['rope_layout']!r} names, got {refs!r:.200}")  # fmt: skip
    offset = 0
    for i, (ref, grid) in enumerate(zip(refs, grids, strict=True)):
        _check_entry(i, ref, grid, offset, published)
        offset += grid[0] * grid[1]


def reference_entries(manifest: dict) -> list[dict]:
    """The checked ``references`` of a published manifest; for one published before them, one entry made of its
    ``token_grid`` and ``template_image``."""
    check_references(manifest)
    refs = manifest.get("references")
    if refs is not None:
        if manifest.get("template_image") and refs[0].get("image") != manifest["template_image"]:
            raise ManifestError("manifest field 'template_image' must be references[0].image (the first reference)")
        return [dict(r) for r in refs]
    rows, cols = manifest["token_grid"]
    return [{"size": None, "token_grid": [rows, cols], "rope_t": REF_TIME_OFFSET, "token_offset": 0,
             "tokens": rows * cols, "image": manifest.get("template_image")}]  # fmt: skip


def reference_images(manifest: dict) -> list[dict]:
    """The blob references (``{digest, bytes, ...}``) of the reference images the device needs, in order (the first
    is the manifest's ``template_image``, which one-reference clients read)."""
    images = [r.get("image") for r in reference_entries(manifest)]
    if not manifest.get("template_image") or any(not image for image in images):
        raise ManifestError(f"template {manifest.get('template_id')!r}: its manifest names no template_image; "
                            "republish it")  # fmt: skip
    return images

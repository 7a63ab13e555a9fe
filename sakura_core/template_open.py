"""Opening a published template for an edit: its manifest checked against the model once
(:func:`sakura_core.template_check.check_template`) and its reference image(s) fetched, from wherever it is served
(a :class:`~sakura_core.fetch.sources.ServerSource` or a :class:`~sakura_core.fetch.sources.StoreSource`).

    opened = await open_template(ServerSource(url, token), "face-swap-astronaut", model)   # manifest + template image

:func:`fetch_template_manifest` fetches and checks the manifest only (the ComfyUI loader, the phone agent's admission);
:func:`open_checked_template` then fetches the image of a manifest already checked. ``sakura_core.edit`` runs the edit
on an :class:`OpenedTemplate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .fetch.errors import TemplateNotFoundError
from .fetch.sources import ServerSource, TemplateSource
from .kv.manifest import Manifest, ManifestError
from .models.edit_model import EditModel, load_image
from .template_check import ModelKey, check_template

__all__ = ["OpenedTemplate", "fetch_template_manifest", "open_checked_template", "open_template"]


def _source(source: TemplateSource | str, token: str | None = None) -> TemplateSource:
    return ServerSource(source, token) if isinstance(source, str) else source


async def _get_manifest(shards, label: str, template_id: str) -> Manifest:
    try:
        return await shards.get_manifest(template_id)
    except TemplateNotFoundError as e:
        catalog = await shards.get_catalog()
        ids = sorted(str(t.get("id")) for t in catalog.get("templates", []) if isinstance(t, dict))
        raise TemplateNotFoundError(
            f"template {template_id!r} is not in the catalog of {label}; published there: {', '.join(ids) or 'none'}"
        ) from e


async def fetch_template_manifest(
    source: TemplateSource | str, template_id: str, model: EditModel | ModelKey | None, *, token: str | None = None
) -> Manifest:
    """The template's manifest from ``source`` (parsed once, as it arrives), checked against ``model``
    (:func:`check_template`; ``None``: not checked here — the ComfyUI MODEL patch checks it against ComfyUI's
    model); an unknown id raises ``TemplateNotFoundError`` listing what is published there."""
    src = _source(source, token)
    async with src.open() as shards:
        manifest = await _get_manifest(shards, src.label, template_id)
    return manifest if model is None else check_template(manifest, template_id, ModelKey.of(model))


@dataclass(frozen=True)
class OpenedTemplate:
    """A template ready to edit against: where it is served, its checked manifest and its image file.

    Attributes:
        source: where the shards are fetched from during the edit.
        template_id: the template's id.
        model_id: content id of the model the manifest was checked against.
        manifest: the checked manifest (:func:`check_template`, typed to the leaves: what the edit reads).
        image_file: the template image as published (PNG bytes): the first reference's.
        image_fetch_s: (started, finished) of the image fetch(es), ``time.monotonic()`` seconds.
        reference_files: every reference image as published (PNG bytes), in order; ``(image_file,)`` for one.
    """

    source: TemplateSource
    template_id: str
    model_id: str
    manifest: Manifest = field(repr=False)
    image_file: bytes = field(repr=False)
    image_fetch_s: tuple[float, float] = (0.0, 0.0)
    reference_files: tuple[bytes, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.reference_files:
            object.__setattr__(self, "reference_files", (self.image_file,))

    @property
    def token_grid(self) -> tuple[int, ...]:
        return self.manifest.token_grid

    @property
    def ref_grids(self) -> tuple[tuple[int, int], ...]:
        """Each reference's token grid, in order (one entry for a one-reference template)."""
        return self.manifest.ref_grids

    @property
    def kv_mode(self) -> str:
        """``"single"`` (one KV per layer, any schedule) or ``"per-step"`` (one per (step, layer), one schedule)."""
        return self.manifest.kv_mode

    def template_image(self, size: int) -> np.ndarray | list[np.ndarray]:
        """The template image as (size, size, 3) uint8; a list of them, in order, for several references (each decoded
        with the pixel limits and mode-correct conversion of :func:`sakura_core.images.decode_image`)."""
        from .images import decode_image

        images = [
            load_image(decode_image(f, f"reference {i + 1} of template {self.template_id!r}")[0], size)
            for i, f in enumerate(self.reference_files)
        ]
        return images[0] if len(images) == 1 else images

    def pre_lanes(self) -> tuple[tuple[int, float], ...]:
        """The image fetch as the estimator's seed (``LiveSettings.pre_lanes``): its bytes and seconds, a transfer
        over the edit's link made just before the lanes (several references: their requests one after another, one
        sample, so only one of their round trips is taken off: the seed errs slow). Only for the live link: an
        emulated one paces the lanes' shards only, so the image never crossed it."""
        started, finished = self.image_fetch_s
        nbytes = sum(len(f) for f in self.reference_files)
        return ((nbytes, finished - started),) if nbytes > 0 and finished > started else ()

    def summary(self) -> dict:
        """What a report says about the template: ids, source, geometry, bytes per level and the image fetch."""
        levels: dict[str, int] = {}
        m = self.manifest
        for shard in m.shards:
            for rep in shard.representations:
                levels[rep.name] = levels.get(rep.name, 0) + rep.nbytes
        return {
            "template_id": self.template_id,
            "model_id": self.model_id,
            "source": self.source.label,
            "token_grid": list(self.token_grid),
            "references": [r.summary() for r in m.references],
            "num_layers": m.num_layers,
            "kv_mode": m.kv_mode,
            "schedule": m.schedule_label,
            "bytes_per_level": levels,
            "image_bytes": sum(len(f) for f in self.reference_files),
            "image_fetch_s": round(self.image_fetch_s[1] - self.image_fetch_s[0], 4),
        }


async def open_template(
    source: TemplateSource | str, template_id: str, model: EditModel | ModelKey, *, token: str | None = None
) -> OpenedTemplate:
    """Fetch the template's manifest, check it against ``model`` (:func:`check_template`) and fetch its image."""
    src, key = _source(source, token), ModelKey.of(model)
    async with src.open() as shards:
        manifest = check_template(await _get_manifest(shards, src.label, template_id), template_id, key)
        return await _with_image(src, shards, manifest)


async def open_checked_template(
    source: TemplateSource | str, manifest: Manifest, *, token: str | None = None
) -> OpenedTemplate:
    """A template whose manifest :func:`fetch_template_manifest` (or :func:`check_template`) already returned for
    the model that will edit: only its image is fetched (the manifest is neither fetched nor checked again)."""
    src = _source(source, token)
    async with src.open() as shards:
        return await _with_image(src, shards, manifest)


async def _with_image(source: TemplateSource, shards, manifest: Manifest) -> OpenedTemplate:
    """The opened template with its reference images fetched, in order (the first is ``template_image``)."""
    started = time.monotonic()
    fetched = []
    for i, r in enumerate(manifest.references):
        if r.image is None:
            raise ManifestError(
                f"template {manifest.template_id!r}: reference {i} has no image blob; the publisher adds it (sakura "
                "precompute ... --overwrite republishes the template)"
            )
        fetched.append(await shards.fetch_shard(r.image.digest, expected_bytes=r.image.nbytes))
    blobs = tuple(fetched)
    return OpenedTemplate(
        source, manifest.template_id, manifest.model_id, manifest, blobs[0], (started, time.monotonic()), blobs
    )

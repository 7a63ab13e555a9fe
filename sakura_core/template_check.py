"""The check of a published template against the model that edits with it: :func:`check_template` (ids, token grid,
template images). :mod:`sakura_core.edit` runs it (and re-exports it). A per-step template's schedule is checked
against the edit's (the model's own, ``runtime.schedule.edit_times``) once per run, by the pipeline that runs it."""

from __future__ import annotations

from dataclasses import dataclass

from .kv.manifest import Manifest, ManifestError, parse_manifest
from .models.edit_model import EditModel
from .models.ref_layout import ref_grids

__all__ = ["ModelKey", "check_template", "template_grid_fits"]


@dataclass(frozen=True)
class ModelKey:
    """What a template's KV must match: the model's content id, its token grid (rows, cols) and, when known, its KV
    geometry (layers, heads, head_dim; None: not checked)."""

    model_id: str
    token_grid: tuple[int, ...]
    geometry: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, model: EditModel | ModelKey) -> ModelKey:
        if isinstance(model, ModelKey):
            return model
        a = getattr(model, "adapter", None)
        geometry = None if a is None else (int(a.num_layers), int(a.num_heads), int(a.head_dim))
        return cls(model.model_id, tuple(model.spec.grid), geometry)


def template_grid_fits(template_grids, edit_grid) -> bool:
    """A template fits an edit when each of its references' token grids (``template_grids``: one (rows, cols), or
    the references' grids, ``Manifest.ref_grids``) is square and at least the edit's grid (a larger template gets its
    own position ids; see ``EditModel.template_grid``)."""
    return all(r == c and r >= int(edit_grid[0]) and c >= int(edit_grid[1]) for r, c in ref_grids(template_grids))


def check_template(manifest: Manifest | dict, template_id: str, model: EditModel | ModelKey) -> Manifest:
    """The one check of a template against the model that edits with it: the template and model ids (another model
    raises ``ModelMismatchError``), the token grid of each reference (the edit's, or a larger square one), and every
    reference image named (the device computes the template layers from them). ``manifest``: as a source returned it
    (parsed once, ``sakura_core.kv.parse_manifest``: the references agree with the token grid there), or its JSON
    (parsed here). Returns the typed manifest; ``ValueError`` subclasses say what to change."""
    key = ModelKey.of(model)
    if isinstance(manifest, Manifest):
        manifest.expect(template_id=template_id, model_id=key.model_id)
    else:
        manifest = parse_manifest(manifest, template_id=template_id, model_id=key.model_id)
    if not template_grid_fits(manifest.ref_grids, key.token_grid):
        grids = " + ".join(f"{r}x{c}" for r, c in manifest.ref_grids)
        raise ManifestError(
            f"template {template_id!r} has token grid(s) {grids}, the model edits "
            f"{list(key.token_grid)}; precompute it at the model's resolution or larger (a square "
            "--template-size)"
        )
    theirs = (manifest.num_layers, manifest.heads, manifest.head_dim)
    if key.geometry is not None and theirs != key.geometry:
        raise ManifestError(
            f"template {template_id!r} has KV of (layers, heads, head_dim) {theirs}, the model "
            f"{key.geometry}: the manifest does not describe this model's KV; republish it"
        )
    if manifest.template_image is None or any(r.image is None for r in manifest.references):
        raise ManifestError(f"template {template_id!r}: its manifest names no template_image; republish it")
    return manifest

"""The check of a published template against the model that edits with it: :func:`check_template` (ids, token grid,
template image). :mod:`sakura_core.edit` runs it (and re-exports it). A per-step template's schedule is checked
against the edit's (the model's own, ``runtime.schedule.edit_times``) once per run, by the pipeline that runs it."""

from __future__ import annotations

from dataclasses import dataclass

from .kv.manifest import Manifest, ManifestError, parse_manifest
from .models.edit_model import EditModel

__all__ = ["ModelKey", "check_template", "template_grid_fits"]


@dataclass(frozen=True)
class ModelKey:
    """What a template's KV must match: the model's content id and its token grid (rows, cols)."""

    model_id: str
    token_grid: tuple[int, ...]

    @classmethod
    def of(cls, model: EditModel | ModelKey) -> ModelKey:
        if isinstance(model, ModelKey):
            return model
        return cls(model.model_id, tuple(model.spec.grid))


def template_grid_fits(template_grid, edit_grid) -> bool:
    """A template's token grid fits an edit when it is square and at least the edit's grid (a larger template gets
    its own position ids; see ``EditModel.template_grid``)."""
    rows, cols = (int(x) for x in template_grid)
    return rows == cols and rows >= int(edit_grid[0]) and cols >= int(edit_grid[1])


def check_template(manifest: Manifest | dict, template_id: str, model: EditModel | ModelKey) -> Manifest:
    """The one check of a template against the model that edits with it: the template and model ids (another model
    raises ``ModelMismatchError``), the token grid (the edit's, or a larger square one), and a template image named
    (the device computes the template layers from it). ``manifest``: as a source returned it (parsed once,
    ``sakura_core.kv.parse_manifest``), or its JSON (parsed here). Returns the typed manifest; ``ValueError``
    subclasses say what to change."""
    key = ModelKey.of(model)
    if isinstance(manifest, Manifest):
        manifest.expect(template_id=template_id, model_id=key.model_id)
    else:
        manifest = parse_manifest(manifest, template_id=template_id, model_id=key.model_id)
    if not template_grid_fits(manifest.token_grid, key.token_grid):
        raise ManifestError(f"template {template_id!r} has token grid {list(manifest.token_grid)}, the model edits "
                            f"{list(key.token_grid)}; precompute it at the model's resolution or larger (a square "
                            "--template-size)")  # fmt: skip
    if manifest.template_image is None:
        raise ManifestError(f"template {template_id!r}: its manifest names no template_image; republish it")
    return manifest

"""The check of a published template against the model that edits with it: :func:`check_template` (ids, token grid,
template image). :mod:`sakura_core.edit` runs it (and re-exports it). A per-step template's schedule is checked
against the edit's (the model's own, ``runtime.schedule.edit_times``) once per run, by the pipeline that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fetch.errors import ManifestError
from .fetch.manifest_check import check_manifest
from .kv.manifest import manifest_kv_mode
from .models.edit_model import EditModel

__all__ = ["ModelKey", "check_template", "schedule_label", "template_grid_fits"]


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


def check_template(manifest: Any, template_id: str, model: EditModel | ModelKey) -> dict:
    """The one check of a template against the model that edits with it: the manifest's schema and ids (a model
    mismatch raises ``ModelMismatchError``), the token grid (the edit's, or a larger square one), and a template
    image named (the device computes the template layers from it). Returns the manifest; ``ValueError`` subclasses
    say what to change."""
    key = ModelKey.of(model)
    manifest = check_manifest(manifest, template_id=template_id, model_id=key.model_id)
    if not template_grid_fits(manifest["token_grid"], key.token_grid):
        raise ManifestError(f"template {template_id!r} has token grid {list(manifest['token_grid'])}, the model edits "
                            f"{list(key.token_grid)}; precompute it at the model's resolution or larger (a square "
                            "--template-size)")  # fmt: skip
    if not manifest.get("template_image"):
        raise ManifestError(f"template {template_id!r}: its manifest names no template_image; republish it")
    return manifest


def schedule_label(manifest: dict) -> str:
    """What a template's KV is valid for: ``"any schedule"`` (single mode) or ``"4 steps, shift 1"`` (per-step)."""
    if manifest_kv_mode(manifest) == "single":
        return "any schedule"
    sched = manifest["schedule"]
    return f"{sched['steps']} steps, shift {sched['shift']:g}"

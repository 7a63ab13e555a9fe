"""The checks of a published template against the model and the edit that use it: :func:`check_template` (ids,
token grid, template image) and, for per-step templates, :func:`check_request_schedule` (the edit's step count and
schedule). :mod:`sakura_core.edit` runs them (and re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fetch.errors import ManifestError
from .fetch.manifest_check import check_manifest
from .kv.manifest import ScheduleMismatchError, check_schedule, manifest_kv_mode
from .kv.references import check_references, reference_images
from .models.edit_model import EditModel
from .models.ref_layout import ROPE_LAYOUT, grids_of
from .runtime.schedule import flow_timesteps

__all__ = ["ModelKey", "check_request_schedule", "check_template", "schedule_label", "template_grid_fits"]


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


def template_grid_fits(template_grid, edit_grid, rope_layout: str | None = None) -> bool:
    """A template's token grid fits an edit when each of its references' grids (``rope_layout`` says how many are
    stacked in ``template_grid``; see :mod:`sakura_core.models.ref_layout`) is square and at least the edit's grid (a
    larger template gets its own position ids; see ``EditModel.template_grid``)."""
    try:
        grids = grids_of(template_grid, rope_layout or ROPE_LAYOUT)
    except ValueError:
        return False
    return all(r == c and r >= int(edit_grid[0]) and c >= int(edit_grid[1]) for r, c in grids)


def check_template(manifest: Any, template_id: str, model: EditModel | ModelKey) -> dict:
    """The one check of a template against the model that edits with it: the manifest's schema and ids (a model
    mismatch raises ``ModelMismatchError``), the references (each the edit's grid or a larger square one; their
    list agrees with the token grid), and a template image named (the device computes the template layers from it). Returns the manifest; ``ValueError`` subclasses
    say what to change."""
    key = ModelKey.of(model)
    manifest = check_manifest(manifest, template_id=template_id, model_id=key.model_id)
    check_references(manifest)
    if not template_grid_fits(manifest["token_grid"], key.token_grid, manifest["rope_layout"]):
        grids = " + ".join(f"{r}x{c}" for r, c in grids_of(manifest["token_grid"], manifest["rope_layout"]))
        raise ManifestError(f"template {template_id!r} has token grid(s) {grids}, the model edits "
                            f"{list(key.token_grid)}; precompute it at the model's resolution or larger (a square "
                            "--template-size)")  # fmt: skip
    reference_images(manifest)  # the device computes on-device layers from them: named, or refused
    return manifest


def schedule_label(manifest: dict) -> str:
    """What a template's KV is valid for: ``"any schedule"`` (single mode) or ``"4 steps, shift 1"`` (per-step)."""
    if manifest_kv_mode(manifest) == "single":
        return "any schedule"
    sched = manifest["schedule"]
    return f"{sched['steps']} steps, shift {sched['shift']:g}"


def check_request_schedule(manifest: dict, steps: int) -> None:
    """Refuse an edit of ``steps`` steps (shift 1) against a per-step template computed for another schedule: the
    ``ScheduleMismatchError`` names both and the fix (set steps to the template's, or precompute for the edit's)."""
    if manifest_kv_mode(manifest) == "single":
        return
    sched, tid = manifest["schedule"], manifest.get("template_id")
    if sched["steps"] != steps:
        raise ScheduleMismatchError(
            f"template {tid!r} was precomputed for {sched['steps']} steps (shift {sched['shift']:g}, per-step KV); "
            f"the edit asks {steps} — set steps to {sched['steps']} or precompute the template with "
            f"--kv-mode per-step --steps {steps}"
        )
    times = [float(t) for t in flow_timesteps(steps)[:-1]]
    check_schedule(manifest, steps, 1.0, timesteps=times)

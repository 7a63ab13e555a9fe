"""Template manifest (JSON, version 1): what a client needs to choose and fetch representations shard by shard.

Schema::

    {
      "version": 2,                                # 1: before shard format 2 (step + reference); refused
      "model_id": hex content id of the model,
      "template_id": "[a-z0-9-]{1,64}",
      "token_grid": [rows, cols],
      "rope_layout": str,
      "num_layers": int, "heads": int, "head_dim": int,
      "codec": the ladder's codec ("sakura", "cachegen", ...),
      "distortion_metric": "attn_rel_err" (relative error of the attention output on held-out probe requests),
      "kv_mode": "single" | "per-step"             # optional; absent = "single" (one KV per layer, every step)
      "schedule": {"steps": S, "timesteps": [t_0, .., t_{S-1}], "shift": float, "guidance": float | null,
                   "sampler": "flow-euler"}        # per-step only: the schedule the KV is valid for
      "shards": [                                  # in execution order, covering layers 0..num_layers-1
        {"layers": [first, last],                  # (per-step: step-major, each step covering every layer)
         "step": s,                                # per-step only: the sampler step (t = timesteps[s]); single: absent
         "representations": [                      # ascending level = ascending size and quality
           {"level": int, "name": str, "codec": str,
            "bytes": size of this blob alone,
            "total_bytes": bytes of this blob plus every blob it requires (what fetching it from nothing costs),
            "distortion": measured attention-output relative error of the decoded chain (0 = exact),
            "digest": sha256 hex of the blob (its name: GET /v1/shards/{digest}),
            "requires": [digests of the lower-level blobs this one refines, base first; [] for a base],
            "psnr_db": measured end-to-end PSNR of an edit with every shard at this level (optional),
            "ref": per-step only, optional: {"mode": "residual" | "reuse", "step": r, "digest": fp16 digest of
                   the shard (r, same layers)} — the shard that must be decoded first (see manifest_refs.py)}
         ]}
      ]
    }

A progressive representation at level j is decoded from ``requires + [digest]`` in that order. The fp16
representation (codec "fp16", the highest level, ``requires == []``) is always present, so a client can always get
the exact KV. A ``per-step`` manifest holds S x (layer ranges) shards, keyed by (step, layers); a request whose
step count or schedule differs from ``schedule`` is refused by :func:`check_schedule`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..models.kv_types import KV_MODES
from .manifest_refs import ManifestError, check_references, ref_mode

__all__ = [
    "KV_MODES",
    "MANIFEST_VERSION",
    "ManifestError",
    "ScheduleMismatchError",
    "check_schedule",
    "manifest_kv_mode",
    "shards_for_step",
    "validate_manifest",
    "version_problem",
]

MANIFEST_VERSION = 2
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MODEL_ID = re.compile(r"^[0-9a-f]{1,128}$")
_TEMPLATE_ID = re.compile(r"^[a-z0-9-]{1,64}$")


class ScheduleMismatchError(ValueError):
    """A per-step template's KV was computed for another sampler schedule than the request's (see check_schedule)."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _pos_int(m: dict, key: str) -> int:
    value = m.get(key)
    if not _is_int(value) or value < 1:
        raise ManifestError(f"manifest field {key!r} must be a positive int, got {value!r}")
    return value


def validate_manifest(manifest: dict) -> None:
    """Raise :class:`ManifestError` naming the first bad field; return ``None`` for a valid manifest."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest must be a JSON object, got {type(manifest).__name__}")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestError(version_problem(manifest.get("version")))
    model_id = manifest.get("model_id")
    if not isinstance(model_id, str) or not _MODEL_ID.match(model_id):
        raise ManifestError(f"manifest field 'model_id' must be lowercase hex, got {model_id!r}")
    template_id = manifest.get("template_id")
    if not isinstance(template_id, str) or not _TEMPLATE_ID.match(template_id):
        raise ManifestError(f"manifest field 'template_id' must match [a-z0-9-]{{1,64}}, got {template_id!r}")
    grid = manifest.get("token_grid")
    if not (isinstance(grid, list) and len(grid) == 2 and all(_is_int(g) and g > 0 for g in grid)):
        raise ManifestError(f"manifest field 'token_grid' must be [rows, cols] of positive ints, got {grid!r}")
    if not isinstance(manifest.get("rope_layout"), str) or not manifest["rope_layout"]:
        raise ManifestError(
            f"manifest field 'rope_layout' must be a non-empty string, got {manifest.get('rope_layout')!r}"
        )
    num_layers = _pos_int(manifest, "num_layers")
    _pos_int(manifest, "heads")
    _pos_int(manifest, "head_dim")
    if not isinstance(manifest.get("codec"), str) or not manifest["codec"]:
        raise ManifestError(f"manifest field 'codec' must be a non-empty string, got {manifest.get('codec')!r}")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise ManifestError("manifest field 'shards' must be a non-empty list")
    kv_mode = manifest_kv_mode(manifest)
    steps = _validate_schedule(manifest.get("schedule")) if kv_mode == "per-step" else None
    if steps is None and manifest.get("schedule") is not None:
        raise ManifestError("manifest field 'schedule' is only for kv_mode 'per-step' (single-mode KV fits any)")
    seen_digests: set[str] = set()
    if steps is None:
        _validate_layer_cover(list(enumerate(shards)), num_layers, seen_digests, None)
        for i, shard in enumerate(shards):
            if shard.get("step") is not None:
                raise ManifestError(f"manifest field 'shards[{i}].step' is set but kv_mode is 'single'")
        return
    keys = [_shard_step(sh, i) for i, sh in enumerate(shards)]
    if keys != sorted(keys) or keys[-1] >= steps:
        raise ManifestError(
            f"manifest field 'shards' must be step-major with steps 0..{steps - 1} (all shards of step 0, then "
            f"step 1, ...), got steps {sorted(set(keys))} in the order {keys}"
        )
    for step in range(steps):
        group = [(i, sh) for i, sh in enumerate(shards) if keys[i] == step]
        _validate_layer_cover(group, num_layers, seen_digests, step)
    check_references(shards)


def version_problem(version: Any) -> str:
    """What is wrong with a manifest's ``version`` and how to fix it."""
    if version == 1:
        return (
            "manifest field 'version' is 1: the template was published before shard format 2 (shards carrying their "
            "step and cross-step reference), which this client reads; republish it (sakura precompute ... "
            "--overwrite, or sakura examples --store DIR)"
        )
    return f"manifest field 'version' must be {MANIFEST_VERSION}, got {version!r}"


def _validate_layer_cover(group: list[tuple[int, Any]], num_layers: int, seen_digests: set[str], step) -> None:
    """The shards of one step (or of a single-mode template) cover layers 0..num_layers-1 in order."""
    what = "shards" if step is None else f"shards of step {step}"
    if not group:
        raise ManifestError(f"manifest field 'shards' has no shard for step {step}")
    next_layer = 0
    for i, shard in group:
        where = f"shards[{i}]"
        if not isinstance(shard, dict):
            raise ManifestError(f"manifest field {where!r} must be an object")
        layers = shard.get("layers")
        if not (isinstance(layers, list) and len(layers) == 2 and all(_is_int(x) for x in layers)):
            raise ManifestError(f"manifest field '{where}.layers' must be [first, last] ints, got {layers!r}")
        if layers[0] != next_layer or layers[1] < layers[0] or layers[1] >= num_layers:
            raise ManifestError(
                f"manifest field '{where}.layers' is {layers}: {what} must cover layers 0..{num_layers - 1} in order "
                f"without gaps (expected first = {next_layer})"
            )
        next_layer = layers[1] + 1
        _validate_representations(shard.get("representations"), where, seen_digests, step)
    if next_layer != num_layers:
        raise ManifestError(
            f"manifest field {what!r} covers layers 0..{next_layer - 1}, but num_layers = {num_layers}"
        )


def manifest_kv_mode(manifest: dict) -> str:
    """``"single"`` or ``"per-step"``; a manifest without ``kv_mode`` (every manifest before per-step) is single."""
    mode = manifest.get("kv_mode", "single")
    if mode not in KV_MODES:
        raise ManifestError(f"manifest field 'kv_mode' must be one of {list(KV_MODES)}, got {mode!r}")
    return mode


def _shard_step(shard: Any, i: int) -> int:
    step = shard.get("step") if isinstance(shard, dict) else None
    if not _is_int(step) or step < 0:
        raise ManifestError(
            f"manifest field 'shards[{i}].step' must be an int >= 0 in a per-step manifest, got {step!r}"
        )
    return step


def _validate_schedule(schedule: Any) -> int:
    """Check a per-step ``schedule``; return its step count."""
    if not isinstance(schedule, dict):
        raise ManifestError(f"manifest field 'schedule' must be an object in a per-step manifest, got {schedule!r}")
    steps = schedule.get("steps")
    if not _is_int(steps) or steps < 1:
        raise ManifestError(f"manifest field 'schedule.steps' must be a positive int, got {steps!r}")
    times = schedule.get("timesteps")
    if not (
        isinstance(times, list)
        and len(times) == steps
        and all(_is_number(t) and 0.0 <= t <= 1.0 for t in times)
        and all(a >= b for a, b in zip(times, times[1:], strict=False))
    ):
        raise ManifestError(
            f"manifest field 'schedule.timesteps' must be {steps} non-increasing times in [0, 1], got {times!r}"
        )
    shift = schedule.get("shift")
    if not _is_number(shift) or shift <= 0:
        raise ManifestError(f"manifest field 'schedule.shift' must be a number > 0, got {shift!r}")
    guidance = schedule.get("guidance")
    if guidance is not None and not _is_number(guidance):
        raise ManifestError(f"manifest field 'schedule.guidance' must be a number or null, got {guidance!r}")
    return steps


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def shards_for_step(manifest: dict, step: int) -> list[dict]:
    """The shards the request's step ``step`` injects, in layer order: every shard for a single-mode template (its KV
    serves all steps), the shards keyed ``step`` for a per-step one."""
    if manifest_kv_mode(manifest) == "single":
        return list(manifest["shards"])
    steps = manifest["schedule"]["steps"]
    if not 0 <= step < steps:
        raise IndexError(
            f"step {step} out of range: template {manifest.get('template_id')!r} has steps 0..{steps - 1}"
        )
    return [sh for sh in manifest["shards"] if sh["step"] == step]


def check_schedule(
    manifest: dict,
    steps: int,
    shift: float,
    timesteps: list[float] | None = None,
    guidance: float | None = None,
    tol: float = 1e-6,
) -> None:
    """Refuse a request whose sampler schedule differs from the one a per-step template's KV was computed for.

    Single-mode KV is valid for any schedule (nothing is checked). The error names both schedules and the fixes:
    run with the template's steps/shift, precompute the template for the request's schedule, or compute the
    template on the device.
    """
    if manifest_kv_mode(manifest) == "single":
        return
    sched = manifest["schedule"]
    theirs = f"{sched['steps']} steps, shift {sched['shift']:g}, guidance {sched.get('guidance')}"
    ours = f"{steps} steps, shift {shift:g}, guidance {guidance}"
    bad = sched["steps"] != steps or abs(sched["shift"] - shift) > tol or sched.get("guidance") != guidance
    if not bad and timesteps is not None:
        bad = len(timesteps) != steps or any(
            abs(a - b) > tol for a, b in zip(timesteps, sched["timesteps"], strict=False)
        )
        if bad:
            ours += f", t={[round(float(t), 4) for t in timesteps]} vs the template's {sched['timesteps']}"
    if bad:
        raise ScheduleMismatchError(
            f"template {manifest.get('template_id')!r} holds per-step KV for {theirs}, but this request runs {ours}; "
            f"run with --steps {sched['steps']} --shift {sched['shift']:g}, precompute the template for this schedule "
            f"(sakura precompute --kv-mode per-step --steps {steps} --shift {shift:g}), or compute the template on the "
            "device"
        )


def _validate_representations(reps: Any, where: str, seen_digests: set[str], step: int | None = None) -> None:
    if not isinstance(reps, list) or not reps:
        raise ManifestError(f"manifest field '{where}.representations' must be a non-empty list")
    by_digest: dict[str, dict] = {}
    levels: list[int] = []
    for j, rep in enumerate(reps):
        w = f"{where}.representations[{j}]"
        if not isinstance(rep, dict):
            raise ManifestError(f"manifest field {w!r} must be an object")
        level = rep.get("level")
        if not _is_int(level) or level < 0:
            raise ManifestError(f"manifest field '{w}.level' must be an int >= 0, got {level!r}")
        if not isinstance(rep.get("name"), str) or not rep["name"]:
            raise ManifestError(f"manifest field '{w}.name' must be a non-empty string, got {rep.get('name')!r}")
        if ref_mode(rep, w, step) == "reuse":  # zero bytes, no blob: nothing more to check here
            levels.append(level)
            continue
        size = rep.get("bytes")
        if not _is_int(size) or size < 1:
            raise ManifestError(f"manifest field '{w}.bytes' must be a positive int, got {size!r}")
        dist = rep.get("distortion")
        if not isinstance(dist, (int, float)) or isinstance(dist, bool) or not math.isfinite(dist) or dist < 0:
            raise ManifestError(f"manifest field '{w}.distortion' must be a finite number >= 0, got {dist!r}")
        digest = rep.get("digest")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise ManifestError(f"manifest field '{w}.digest' must be 64 lowercase hex characters, got {digest!r}")
        if digest in by_digest or digest in seen_digests:
            raise ManifestError(f"manifest field '{w}.digest' {digest[:12]}… appears twice")
        requires = rep.get("requires")
        if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
            raise ManifestError(f"manifest field '{w}.requires' must be a list of digests, got {requires!r}")
        if "total_bytes" in rep and (not _is_int(rep["total_bytes"]) or rep["total_bytes"] < size):
            raise ManifestError(
                f"manifest field '{w}.total_bytes' must be an int >= bytes, got {rep['total_bytes']!r}"
            )
        by_digest[digest] = rep
        levels.append(level)
    if len(set(levels)) != len(levels):
        raise ManifestError(f"manifest field '{where}.representations' has repeated levels {sorted(levels)}")
    if levels != sorted(levels):
        raise ManifestError(f"manifest field '{where}.representations' must be in ascending level order, got {levels}")
    for j, rep in enumerate(reps):
        w = f"{where}.representations[{j}].requires"
        requires = rep["requires"]
        if rep["digest"] is None:  # a reuse representation
            continue
        for r in requires:
            if r not in by_digest:
                raise ManifestError(
                    f"manifest field {w!r} names {r[:12]}…, which is not a representation of this shard"
                )
        if requires:
            parent = by_digest[requires[-1]]
            if parent["requires"] + [requires[-1]] != requires:
                raise ManifestError(f"manifest field {w!r} is not its parent's requires plus the parent")
            if parent["level"] >= rep["level"]:
                raise ManifestError(f"manifest field {w!r}: a representation must refine a lower level")
            total = sum(by_digest[r]["bytes"] for r in requires) + rep["bytes"]
        else:
            total = rep["bytes"]
        if "total_bytes" in rep and rep["total_bytes"] != total:
            raise ManifestError(
                f"manifest field '{where}.representations[{j}].total_bytes' is {rep['total_bytes']}, the chain is {total}"
            )
    seen_digests.update(by_digest)

"""The manifest's schema, field by field: the one place its structure, types and ranges are checked (the layout is
in :mod:`sakura_core.kv.manifest`, which builds the typed :class:`~sakura_core.kv.manifest.Manifest` from what these
functions return; every reader of a manifest gets each check). Each check raises :class:`ManifestError` naming the
offending field (``shards[2].layers``) and what it must be; the size bounds are in :mod:`.manifest_limits`.
Version 2 (shard container format 2): a per-step representation may carry a cross-step ``ref``, checked
in :mod:`.manifest_refs`. A version-1 manifest is refused naming the fix (:func:`version_problem`).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from ..models.kv_types import KV_MODES
from ..models.ref_layout import MAX_REFERENCES, REF_TIME_OFFSET, grids_of
from .manifest_errors import ManifestError, ModelMismatchError
from .manifest_refs import CLOSED_REF_MODE, DECODED_REF_MODES, REF_MODES, check_cross_step_refs, ref_mode
from .names import MODEL_ID_RE, TEMPLATE_ID_FORM, is_digest, is_template_id

__all__ = [
    "MANIFEST_VERSION",
    "CLOSED_REF_MODE",
    "DECODED_REF_MODES",
    "REF_MODES",
    "ManifestError",
    "ModelMismatchError",
    "check_blob_ref",
    "check_header",
    "check_references",
    "check_schedule_field",
    "check_shards",
    "manifest_kv_mode",
    "version_problem",
]

MANIFEST_VERSION = 2


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pos_int(m: dict, key: str) -> int:
    value = m.get(key)
    if not _is_int(value) or value < 1:
        raise ManifestError(f"manifest field {key!r} must be a positive int, got {value!r}")
    return value


def _name(m: dict, key: str) -> str:
    value = m.get(key)
    if not isinstance(value, str) or not value:
        raise ManifestError(f"manifest field {key!r} must be a non-empty string, got {value!r}")
    return value


def manifest_kv_mode(manifest: dict) -> str:
    """``"single"`` or ``"per-step"``; a manifest without ``kv_mode`` is single."""
    mode = manifest.get("kv_mode", "single")
    if mode not in KV_MODES:
        raise ManifestError(f"manifest field 'kv_mode' must be one of {list(KV_MODES)}, got {mode!r}")
    return mode


def version_problem(version: Any) -> str:
    """What is wrong with a manifest's ``version`` and how to fix it."""
    if version == 1:
        return (
            "manifest field 'version' is 1: the template was published before shard format 2 (shards carrying their "
            "step and cross-step reference), which this client reads; republish it (sakura precompute ... "
            "--overwrite, or sakura examples --store DIR)"
        )
    return f"manifest field 'version' must be {MANIFEST_VERSION}, got {version!r}"


def check_header(manifest: Any) -> dict:
    """The top-level fields but ``shards``, ``schedule`` and ``template_image``, typed: version, ids, token grid,
    RoPE layout, layers, heads, head dim, codec, KV mode."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest must be a JSON object, got {type(manifest).__name__}")
    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestError(version_problem(manifest.get("version")))
    model_id = manifest.get("model_id")
    if not isinstance(model_id, str) or not MODEL_ID_RE.fullmatch(model_id):
        raise ManifestError(f"manifest field 'model_id' must be lowercase hex, got {model_id!r}")
    template_id = manifest.get("template_id")
    if not is_template_id(template_id):
        raise ManifestError(f"manifest field 'template_id' must match {TEMPLATE_ID_FORM}, got {template_id!r}")
    grid = manifest.get("token_grid")
    if not (isinstance(grid, list) and len(grid) == 2 and all(_is_int(g) and g > 0 for g in grid)):
        raise ManifestError(f"manifest field 'token_grid' must be [rows, cols] of positive ints, got {grid!r}")
    return {
        "model_id": model_id,
        "template_id": template_id,
        "token_grid": (grid[0], grid[1]),
        "rope_layout": _name(manifest, "rope_layout"),
        "num_layers": _pos_int(manifest, "num_layers"),
        "heads": _pos_int(manifest, "heads"),
        "head_dim": _pos_int(manifest, "head_dim"),
        "codec": _name(manifest, "codec"),
        "kv_mode": manifest_kv_mode(manifest),
    }


def check_schedule_field(schedule: Any) -> dict:
    """A per-step manifest's ``schedule``, typed: steps, timesteps (one per step, non-increasing, in [0, 1]), shift,
    guidance, sampler."""
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
    sampler = schedule.get("sampler")
    return {
        "steps": steps,
        "timesteps": tuple(float(t) for t in times),
        "shift": float(shift),
        "guidance": None if guidance is None else float(guidance),
        "sampler": sampler if isinstance(sampler, str) else None,
    }


def check_blob_ref(image: Any, where: str = "template_image") -> tuple[str, int] | None:
    """An optional blob reference the publisher adds (``template_image``, ``references[i].image``): (digest, bytes),
    or None when absent."""
    if image is None:
        return None
    if not (
        isinstance(image, dict)
        and is_digest(image.get("digest"))
        and _is_int(image.get("bytes"))
        and image["bytes"] > 0
    ):
        raise ManifestError(f"manifest field {where!r} must be {{digest, bytes}} of a blob, got {image!r}")
    return image["digest"], image["bytes"]


_REFERENCE_FIELDS = ("size", "token_grid", "rope_t", "token_offset", "tokens")


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_is_int(x) and x > 0 for x in value)


def check_references(manifest: dict, token_grid: tuple[int, int], rope_layout: str) -> list[dict]:
    """The template's reference images, typed, in the model's order (:mod:`sakura_core.models.ref_layout`): the
    ``references`` list agrees with ``token_grid`` (their grids stacked) and ``rope_layout`` (how many), each entry
    ``{name?, size, token_grid, rope_t = 10 (i + 1), token_offset, tokens, image?}``; the first one's image is
    ``template_image``. A manifest without ``references`` has one reference: its token grid
    and ``template_image``; several references need the list. Each returned entry: ``name`` (or None), ``size``
    (or None), ``token_grid``, ``rope_t``, ``token_offset``, ``tokens``, ``image`` ((digest, bytes) or None: the
    codec's manifest has no images yet)."""
    try:
        grids = grids_of(token_grid, rope_layout)
    except ValueError as e:
        raise ManifestError(f"manifest fields 'token_grid' / 'rope_layout': {e}") from e
    template_image = check_blob_ref(manifest.get("template_image"))
    refs = manifest.get("references")
    if refs is None:
        if len(grids) > 1:
            raise ManifestError(
                f"manifest of {len(grids)} references (rope_layout {rope_layout!r}) has no "
                "'references' field; republish it"
            )
        ((rows, cols),) = grids
        return [
            {
                "name": None,
                "size": None,
                "token_grid": (rows, cols),
                "rope_t": REF_TIME_OFFSET,
                "token_offset": 0,
                "tokens": rows * cols,
                "image": template_image,
            }
        ]
    if not isinstance(refs, list) or len(refs) != len(grids) or len(refs) > MAX_REFERENCES:
        raise ManifestError(
            f"manifest field 'references' must list the {len(grids)} reference(s) rope_layout "
            f"{rope_layout!r} names, got {refs!r:.200}"
        )
    out, offset = [], 0
    for i, (ref, grid) in enumerate(zip(refs, grids, strict=True)):
        out.append(_check_reference(i, ref, grid, offset))
        offset += grid[0] * grid[1]
    if template_image is not None and out[0]["image"] != template_image:
        raise ManifestError("manifest field 'template_image' must be references[0].image (the first reference)")
    return out


def _check_reference(i: int, ref: Any, grid: tuple[int, int], offset: int) -> dict:
    where = f"references[{i}]"
    if not isinstance(ref, dict) or any(k not in ref for k in _REFERENCE_FIELDS):
        raise ManifestError(
            f"manifest field {where!r} must be an object with {', '.join(_REFERENCE_FIELDS)}, got {ref!r:.200}"
        )
    size, ref_grid = ref["size"], ref["token_grid"]
    if not _pair(size) or not _pair(ref_grid) or tuple(ref_grid) != grid:
        raise ManifestError(
            f"manifest field {where!r}: size {size!r} / token_grid {ref_grid!r} must be [S, S] / "
            f"{list(grid)} (the manifest's token_grid and rope_layout stack that grid)"
        )
    expect = {"rope_t": REF_TIME_OFFSET * (i + 1), "token_offset": offset, "tokens": grid[0] * grid[1]}
    for key, want in expect.items():
        if ref[key] != want or not _is_int(ref[key]):
            raise ManifestError(f"manifest field '{where}.{key}' must be {want}, got {ref[key]!r}")
    name = ref.get("name")
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= 64):
        raise ManifestError(f"manifest field '{where}.name' must be a string of 1-64 characters, got {name!r}")
    image = check_blob_ref(ref.get("image"), f"{where}.image")
    return {"name": name, "size": (size[0], size[1]), "token_grid": grid, "image": image, **expect}


def check_shards(shards: Any, num_layers: int, steps: int | None) -> None:
    """``shards`` cover layers 0..num_layers-1 in order (per-step, ``steps`` given: step-major, each step covering
    every layer); each shard's representations are a ladder of distinct digests with consistent chains."""
    if not isinstance(shards, list) or not shards:
        raise ManifestError("manifest field 'shards' must be a non-empty list")
    seen_digests: set[str] = set()
    if steps is None:
        _check_layer_cover(list(enumerate(shards)), num_layers, seen_digests, None)
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
        _check_layer_cover(group, num_layers, seen_digests, step)
    check_cross_step_refs(shards)


def _shard_step(shard: Any, i: int) -> int:
    step = shard.get("step") if isinstance(shard, dict) else None
    if not _is_int(step) or step < 0:
        raise ManifestError(
            f"manifest field 'shards[{i}].step' must be an int >= 0 in a per-step manifest, got {step!r}"
        )
    return step


def _check_layer_cover(group: list[tuple[int, Any]], num_layers: int, seen_digests: set[str], step) -> None:
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
        exact = shard.get("exact_digest")
        if exact is not None and (step is None or not is_digest(exact)):
            raise ManifestError(
                f"manifest field '{where}.exact_digest' must be 64 lowercase hex characters in a "
                f"per-step manifest, got {exact!r}"
            )
        _check_representations(shard.get("representations"), where, seen_digests, step)
    if next_layer != num_layers:
        raise ManifestError(
            f"manifest field {what!r} covers layers 0..{next_layer - 1}, but num_layers = {num_layers}"
        )


def _check_representation(rep: Any, w: str) -> None:
    """One representation's own fields (``w``: where it is, for the message)."""
    if not isinstance(rep, dict):
        raise ManifestError(f"manifest field {w!r} must be an object")
    level = rep.get("level")
    if not _is_int(level) or level < 0:
        raise ManifestError(f"manifest field '{w}.level' must be an int >= 0, got {level!r}")
    if not isinstance(rep.get("name"), str) or not rep["name"]:
        raise ManifestError(f"manifest field '{w}.name' must be a non-empty string, got {rep.get('name')!r}")
    size = rep.get("bytes")
    if not _is_int(size) or size < 1:
        raise ManifestError(f"manifest field '{w}.bytes' must be a positive int, got {size!r}")
    dist = rep.get("distortion")
    if not _is_number(dist) or dist < 0:
        raise ManifestError(f"manifest field '{w}.distortion' must be a finite number >= 0, got {dist!r}")
    if not is_digest(rep.get("digest")):
        raise ManifestError(
            f"manifest field '{w}.digest' must be 64 lowercase hex characters, got {rep.get('digest')!r}"
        )
    requires = rep.get("requires")
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ManifestError(f"manifest field '{w}.requires' must be a list of digests, got {requires!r}")
    if "total_bytes" in rep and (not _is_int(rep["total_bytes"]) or rep["total_bytes"] < size):
        raise ManifestError(f"manifest field '{w}.total_bytes' must be an int >= bytes, got {rep['total_bytes']!r}")


def _check_representations(reps: Any, where: str, seen_digests: set[str], step: int | None) -> None:
    if not isinstance(reps, list) or not reps:
        raise ManifestError(f"manifest field '{where}.representations' must be a non-empty list")
    by_digest: dict[str, dict] = {}
    levels: list[int] = []
    for j, rep in enumerate(reps):
        w = f"{where}.representations[{j}]"
        if ref_mode(rep, w, step) == "reuse":  # zero bytes, no blob, no chain: its ref is all there is to check
            levels.append(rep["level"])
            continue
        _check_representation(rep, w)
        digest = rep["digest"]
        if digest in by_digest or digest in seen_digests:
            raise ManifestError(f"manifest field '{w}.digest' {digest[:12]}… appears twice")
        by_digest[digest] = rep
        levels.append(rep["level"])
    if len(set(levels)) != len(levels):
        raise ManifestError(f"manifest field '{where}.representations' has repeated levels {sorted(levels)}")
    if levels != sorted(levels):
        raise ManifestError(f"manifest field '{where}.representations' must be in ascending level order, got {levels}")
    for j, rep in enumerate(reps):
        if rep.get("digest") is not None:  # (a reuse representation has no chain; its digest may be left out)
            _check_chain(rep, by_digest, f"{where}.representations[{j}]")
    seen_digests.update(by_digest)


def _check_chain(rep: dict, by_digest: dict[str, dict], w: str) -> None:
    """``rep.requires`` is its parent's chain plus the parent, within the shard; ``total_bytes`` is the chain's."""
    requires = rep["requires"]
    for r in requires:
        if r not in by_digest:
            raise ManifestError(
                f"manifest field '{w}.requires' names {r[:12]}…, which is not a representation of this shard"
            )
    if requires:
        parent = by_digest[requires[-1]]
        if parent["requires"] + [requires[-1]] != requires:
            raise ManifestError(f"manifest field '{w}.requires' is not its parent's requires plus the parent")
        if parent["level"] >= rep["level"]:
            raise ManifestError(f"manifest field '{w}.requires': a representation must refine a lower level")
        total = sum(by_digest[r]["bytes"] for r in requires) + rep["bytes"]
    else:
        total = rep["bytes"]
    if "total_bytes" in rep and rep["total_bytes"] != total:
        raise ManifestError(f"manifest field '{w}.total_bytes' is {rep['total_bytes']}, the chain is {total}")

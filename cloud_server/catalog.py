"""A template catalog (``CATALOG.json``): templates x models x KV modes x schedules, each entry one published template.

Format (version 1; relative paths are relative to the catalog file)::

    {
      "version": 1,
      "templates": [{"name": "face", "image": "astronaut"}, {"name": "cup", "image": "cup.png", "template_size": 128}],
      "models": {"demo": "demo"},                      # alias -> "demo" or a FLUX.2 [klein] pipeline folder
      "kv_modes": ["single", "per-step"],
      "schedules": [{"steps": 4, "shift": 1.0}],       # per-step entries, one per schedule (single mode needs none)
      "codec": "sakura", "shard_layers": 1, "seed": 0, # optional
      "store_profile": "serving"                       # optional: serving (default) or full (the fp16 kept)
    }

Entry ids: ``<template>-<model>-single`` or ``<template>-<model>-ps<steps>`` (``-x<shift>`` when shift != 1, ``.``
written ``p``). Each entry has a **key**: the sha256 of everything its KV depends on (the image bytes, the model
source and, for a folder, its files' names/sizes/mtimes, the dtype, codec, shard layers, seed, KV mode, schedule,
template size, store profile). The published manifest keeps it under ``precompute.catalog_entry``, so a re-run skips entries whose
key is published and republishes an entry whose inputs changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE, STORE_PROFILES

from .store import NotFoundError, Store, validate_template_id

__all__ = ["CatalogEntry", "CatalogError", "load_catalog", "published_key"]

_MODES = ("single", "per-step")


class CatalogError(ValueError):
    """A catalog file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class CatalogEntry:
    """One template to publish. ``image`` is a path or a demo sample name; ``model`` a model source."""

    template_id: str
    image: str
    model: str
    kv_mode: str
    steps: int
    shift: float
    codec: str
    shard_layers: int
    seed: int
    template_size: int | None
    store_profile: str = DEFAULT_STORE_PROFILE
    key: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _field(obj: dict, name: str, kind, where: str, default=None):
    value = obj.get(name, default)
    if value is None or (kind is float and isinstance(value, int)) or isinstance(value, kind):
        return value
    raise CatalogError(f"{where}: field {name!r} must be {kind.__name__}, got {value!r}")


def _image_digest(image: str) -> str:
    path = Path(image)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    from sakura_core.models.edit_model import DEMO_TEMPLATES

    if image in DEMO_TEMPLATES:
        return f"sample:{image}"
    raise CatalogError(f"template image {image!r} is neither a file nor a demo sample ({', '.join(DEMO_TEMPLATES)})")


def _model_digest(source: str) -> str:
    """``demo``, or a folder's files (relative name, size, mtime) hashed: a changed weight file changes it."""
    if source == "demo":
        return "demo"
    h = hashlib.sha256(str(Path(source).resolve()).encode())
    for path in sorted(Path(source).rglob("*")):
        if path.is_file():
            st = path.stat()
            h.update(f"{path.relative_to(source)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _entry_key(entry: CatalogEntry, dtype: str | None) -> str:
    facts = {**entry.to_json(), "key": None, "image": _image_digest(entry.image), "model": _model_digest(entry.model)}
    facts["dtype"] = dtype or "float32"
    if entry.kv_mode == "single":
        facts["steps"] = facts["shift"] = None
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _shift_tag(shift: float) -> str:
    return "" if shift == 1.0 else "-x" + f"{shift:g}".replace(".", "p").replace("-", "m")


def _resolve(base: Path, value: str) -> str:
    """A path relative to the catalog's folder (a demo sample name or an absolute path stays as it is)."""
    candidate = base / value
    return str(candidate) if not os.path.isabs(value) and candidate.exists() else value


def load_catalog(
    path: str | os.PathLike, *, dtype: str | None = None, store_profile: str | None = None
) -> list[CatalogEntry]:
    """Parse ``path`` into its entries (keys computed for ``dtype``); ``CatalogError`` for a bad file.
    ``store_profile``: overrides the file's ``store_profile`` (default ``serving``)."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CatalogError(f"cannot read catalog {path}: {e}") from e
    if not isinstance(spec, dict) or spec.get("version") != 1:
        raise CatalogError(f'catalog {path}: expected a JSON object with "version": 1')
    templates, models = spec.get("templates"), spec.get("models")
    if not isinstance(templates, list) or not templates:
        raise CatalogError(f"catalog {path}: 'templates' must be a non-empty list of {{name, image}}")
    if not isinstance(models, dict) or not models:
        raise CatalogError(f"catalog {path}: 'models' must map an alias to 'demo' or a klein folder")
    modes = spec.get("kv_modes", ["single"])
    if not isinstance(modes, list) or not modes or any(m not in _MODES for m in modes):
        raise CatalogError(f"catalog {path}: 'kv_modes' must list some of {_MODES}, got {modes!r}")
    schedules = spec.get("schedules", [{"steps": 4, "shift": 1.0}])
    if "per-step" in modes and (not isinstance(schedules, list) or not schedules):
        raise CatalogError(f"catalog {path}: 'schedules' must be a non-empty list of {{steps, shift}}")
    common = dict(
        codec=_field(spec, "codec", str, str(path), "sakura"),
        shard_layers=_field(spec, "shard_layers", int, str(path), 1),
        seed=_field(spec, "seed", int, str(path), 0),
        store_profile=store_profile or _field(spec, "store_profile", str, str(path), DEFAULT_STORE_PROFILE),
    )
    if common["store_profile"] not in STORE_PROFILES:
        raise CatalogError(
            f"catalog {path}: 'store_profile' must be one of {', '.join(STORE_PROFILES)}, got "
            f"{common['store_profile']!r}"
        )
    entries = []
    for i, t in enumerate(templates):
        where = f"catalog {path}: templates[{i}]"
        if not isinstance(t, dict):
            raise CatalogError(f"{where} must be an object with 'name' and 'image'")
        name, image = _field(t, "name", str, where), _field(t, "image", str, where)
        if not name or not image:
            raise CatalogError(f"{where} needs 'name' and 'image'")
        size = _field(t, "template_size", int, where)
        for alias, source in models.items():
            if not isinstance(source, str):
                raise CatalogError(f"catalog {path}: models[{alias!r}] must be 'demo' or a folder path")
            from sakura_core.models.loading import check_model_source

            source = source if source == "demo" else _resolve(path.parent, source)
            try:
                check_model_source(source)
            except ValueError as e:
                raise CatalogError(f"catalog {path}: models[{alias!r}]: {e}") from e
            for mode in modes:
                for sched in schedules if mode == "per-step" else [{"steps": 4, "shift": 1.0}]:
                    steps = _field(sched, "steps", int, f"catalog {path}: schedules", 4)
                    shift = float(_field(sched, "shift", float, f"catalog {path}: schedules", 1.0))
                    if steps < 1 or shift <= 0:
                        raise CatalogError(f"catalog {path}: schedule steps must be >= 1 and shift > 0")
                    tag = "single" if mode == "single" else f"ps{steps}{_shift_tag(shift)}"
                    tid = f"{name}-{alias}-{tag}"
                    try:
                        validate_template_id(tid)
                    except ValueError as e:
                        raise CatalogError(
                            f"{where}: entry id {tid!r}: {e}; shorten the template or model name"
                        ) from e
                    entry = CatalogEntry(
                        tid, _resolve(path.parent, image), source, mode, steps, shift, template_size=size, **common
                    )
                    entries.append(CatalogEntry(**{**entry.to_json(), "key": _entry_key(entry, dtype)}))
    ids = [e.template_id for e in entries]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise CatalogError(f"catalog {path}: entry ids repeat ({', '.join(dup)}): template names must be unique")
    return entries


def published_key(store: Store, template_id: str) -> str | None:
    """The catalog key of the published template ``template_id`` (``None``: not published, unreadable, or not from
    a catalog); errors reaching the store propagate (``StoreError``)."""
    try:
        manifest = json.loads(store.get_manifest_bytes(template_id))
    except NotFoundError:
        return None
    except ValueError:
        return None  # a broken manifest: republishing replaces it
    made = manifest.get("precompute") if isinstance(manifest, dict) else None
    return made.get("catalog_entry") if isinstance(made, dict) else None

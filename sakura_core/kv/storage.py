"""What a published template occupies in a store, read from its manifest alone: the store profile it was published
with, the bytes of its blobs (each once), its uncompressed fp16 KV in its KV mode, their ratio, and the PSNR of its
floor and top rungs. ``sakura precompute`` prints it per template; ``sakura store usage`` totals a store with it.

Store profiles (the manifest's ``store_profile``; see :mod:`sakura_core.precompute.store_profile`): ``full`` keeps
every representation precompute made, the exact fp16 included; ``serving`` keeps the rungs a client fetches (the
floor, the upgrades above it up to a near-lossless top rung; per-step: the closed-loop twins' track and the open-loop
floor). A manifest without the field is ``full`` (published before profiles existed).
"""

from __future__ import annotations

from typing import Any

from .manifest_errors import ManifestError

__all__ = [
    "DEFAULT_STORE_PROFILE",
    "STORE_PROFILES",
    "fp16_kv_bytes",
    "manifest_store_profile",
    "template_storage",
]

#: The store profiles a template can be published with (``serving`` is what precompute publishes by default).
STORE_PROFILES = ("serving", "full")
DEFAULT_STORE_PROFILE = "serving"
#: The profile of a manifest without ``store_profile``: every representation kept.
LEGACY_STORE_PROFILE = "full"


def manifest_store_profile(manifest: dict) -> str:
    """The manifest's ``store_profile``: ``serving`` or ``full`` (absent: ``full``)."""
    profile = manifest.get("store_profile", LEGACY_STORE_PROFILE)
    if profile not in STORE_PROFILES:
        raise ManifestError(f"manifest field 'store_profile' must be one of {list(STORE_PROFILES)}, got {profile!r}")
    return profile


def fp16_kv_bytes(manifest: dict) -> int:
    """The template's uncompressed KV in its KV mode, from the geometry: K and V in fp16 for every layer
    (``single``), or every (step, layer) (``per-step``) — the container headers not counted."""
    rows, cols = manifest["token_grid"]
    steps = manifest["schedule"]["steps"] if manifest.get("kv_mode", "single") == "per-step" else 1
    return steps * manifest["num_layers"] * 2 * rows * cols * manifest["heads"] * manifest["head_dim"] * 2


def _psnr(rep: dict) -> float | None:
    value = rep.get("psnr_db")
    return None if value is None else float(value)


def template_storage(manifest: dict[str, Any], floor_psnr_db: float = 35.0) -> dict:
    """One template's storage figures: ``profile``, ``kv_mode``, ``steps``, ``stored_bytes`` (every blob the manifest
    names, once: a progressive chain shares the blobs below it; the reference images not counted), ``fp16_kv_bytes``
    (:func:`fp16_kv_bytes`), ``x_fp16`` (their ratio), ``fp16_stored`` (whether the exact fp16 is in the store),
    ``floor`` / ``floor_psnr_db`` (the cheapest level — on the closed-loop twins' track where the template has them —
    whose ``psnr_db`` reaches ``floor_psnr_db``) and ``top`` / ``top_psnr_db`` (the best rung stored: fp16 when it is
    there, else the highest PSNR of a level or twin)."""
    blobs: dict[str, int] = {}
    psnr: dict[str, float | None] = {}
    order: list[str] = []
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            if rep.get("digest") is not None:
                blobs[rep["digest"]] = rep["bytes"]
            if rep["name"] not in psnr:
                order.append(rep["name"])
            psnr[rep["name"]] = _psnr(rep)
    stored, raw = sum(blobs.values()), fp16_kv_bytes(manifest)
    floor = _floor(order, psnr, floor_psnr_db)
    rated = [(p, n) for n, p in psnr.items() if p is not None and n != "reuse"]
    top = "fp16" if "fp16" in psnr else (max(rated)[1] if rated else None)
    return {
        "template_id": manifest["template_id"],
        "profile": manifest_store_profile(manifest),
        "kv_mode": manifest.get("kv_mode", "single"),
        "steps": manifest["schedule"]["steps"] if manifest.get("schedule") else 1,
        "stored_bytes": stored,
        "fp16_kv_bytes": raw,
        "x_fp16": round(stored / raw, 4),
        "fp16_stored": "fp16" in psnr,
        "floor": floor,
        "floor_psnr_db": None if floor is None else _track_psnr(floor, psnr),
        "top": top,
        "top_psnr_db": None if top is None else psnr.get(top),
    }


def _track_psnr(name: str, psnr: dict[str, float | None]) -> float | None:
    """A level's PSNR on its closed-loop twins' track where it has a twin, else its own."""
    twin = psnr.get(name + "+cl")
    return twin if twin is not None else psnr.get(name)


def _floor(order: list[str], psnr: dict[str, float | None], floor_psnr_db: float) -> str | None:
    """The cheapest level (ladder order; twins and ``reuse`` are no rungs) whose track PSNR reaches the target."""
    levels = [n for n in order if not n.endswith("+cl") and n != "reuse"]
    levels.sort(key=lambda n: n == "fp16")
    for name in levels:
        p = _track_psnr(name, psnr)
        if p is not None and p >= floor_psnr_db:
            return name
    return None

"""The bounds a manifest's values must keep (:mod:`sakura_core.limits`), checked by
:func:`~sakura_core.kv.manifest.parse_manifest` beside the schema: the geometry (token grid, layers, heads, head
dim, steps) before anything is sized from it, each shard's size, its ladder, finite PSNRs, the template image's size.
A value past a bound raises :class:`ManifestLimitError` (a ``ManifestError`` and a ``LimitError``) naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from ..limits import (
    MAX_GRID_SIDE,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_IMAGE_BYTES,
    MAX_LAYERS,
    MAX_REPRESENTATIONS,
    MAX_SHARD_ELEMENTS,
    MAX_STEPS,
    MAX_TEMPLATE_TOKENS,
    LimitError,
)
from .container import MAX_BLOB_BYTES
from .manifest_schema import ManifestError
from .storage import manifest_store_profile

__all__ = ["ManifestLimitError", "check_geometry_limits", "check_steps_limit", "check_value_limits"]


class ManifestLimitError(ManifestError, LimitError):
    """A manifest field is past one of :mod:`sakura_core.limits`' bounds."""


def _at_most(field: str, value: int, bound: int) -> None:
    if value > bound:
        raise ManifestLimitError(f"manifest field {field!r} is {value}, over the limit of {bound}")


def check_geometry_limits(header: dict) -> None:
    """The typed header's geometry (``check_header``'s result) within the bounds: token grid sides and tokens,
    layers, heads, head dim."""
    rows, cols = header["token_grid"]
    _at_most("token_grid[0]", rows, MAX_GRID_SIDE)
    _at_most("token_grid[1]", cols, MAX_GRID_SIDE)
    _at_most("token_grid (rows x cols tokens)", rows * cols, MAX_TEMPLATE_TOKENS)
    _at_most("num_layers", header["num_layers"], MAX_LAYERS)
    _at_most("heads", header["heads"], MAX_HEADS)
    _at_most("head_dim", header["head_dim"], MAX_HEAD_DIM)


def check_steps_limit(steps: int) -> None:
    """A per-step schedule's steps within :data:`MAX_STEPS`."""
    _at_most("schedule.steps", steps, MAX_STEPS)


def check_value_limits(manifest: dict, header: dict) -> None:
    """Once the schema holds: each shard's K/V within the shard container's element limit, at most
    :data:`MAX_REPRESENTATIONS` representations of at most ``MAX_BLOB_BYTES`` each, the same ladder (level names)
    in every shard (the blob-less reuse rung and the closed-loop twins of cross-step steps aside; a ``serving`` store
    profile keeps a subset per shard), ``psnr_db``
    (optional) a finite number, the template image at most :data:`MAX_IMAGE_BYTES`."""
    rows, cols = header["token_grid"]
    per_layer = rows * cols * header["heads"] * header["head_dim"]
    ladder = None
    serving = manifest_store_profile(manifest) == "serving"
    for i, shard in enumerate(manifest["shards"]):
        first, last = shard["layers"]
        _at_most(f"shards[{i}].layers (K elements)", (last - first + 1) * per_layer, MAX_SHARD_ELEMENTS)
        reps = shard["representations"]
        _at_most(f"shards[{i}].representations (count)", len(reps), MAX_REPRESENTATIONS)
        for j, rep in enumerate(reps):
            w = f"shards[{i}].representations[{j}]"
            _at_most(f"{w}.bytes", rep["bytes"], MAX_BLOB_BYTES)
            _check_psnr(rep.get("psnr_db"), f"{w}.psnr_db")
        # the ladder the runtime indexes; a cross-step "reuse the previous step" rung (no blob) and the closed-loop
        # twins (substituted for a level, no rung of their own) exist from step 1 on
        names = [rep["name"] for rep in reps if (rep.get("ref") or {}).get("mode") not in ("reuse", "closed")]
        if ladder is None:
            ladder = names
        elif names != ladder and not serving:  # a serving store keeps a subset per shard (its ladder view fills in)
            raise ManifestError(
                f"manifest field 'shards[{i}].representations' has the levels {names}, shard 0 has {ladder}: every "
                "shard must offer the same ladder"
            )
    image = manifest.get("template_image")
    if image is not None:
        _at_most("template_image.bytes", image["bytes"], MAX_IMAGE_BYTES)


def _check_psnr(psnr: Any, field: str) -> None:
    if psnr is None:
        return
    if not isinstance(psnr, (int, float)) or isinstance(psnr, bool) or not math.isfinite(psnr):
        raise ManifestError(f"manifest field {field!r} must be a finite number (dB) or absent, got {psnr!r}")

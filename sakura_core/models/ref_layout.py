"""The token layout of a template's reference images (one, or several: try-on = person + garment; klein takes 4).

A template's tokens are its references' tokens in the model's own order, concatenated: reference ``i`` (from 0) is a
(rows, cols) grid of tokens at RoPE time ``REF_TIME_OFFSET * (i + 1)`` (10, 20, 30, 40 — diffusers'
``Flux2KleinKVPipeline._prepare_image_ids``), row-major. In FLUX.2 [klein] KV mode every reference token attends to
every reference token (all references, not only its own image) and to nothing else; the request attends to all of
them (diffusers' ``_flux2_kv_causal_attention``), so the references' KV is one block, exact for every request.

On the wire (shard headers, manifests) a layout is two fields that already exist: ``token_grid``, the references'
grids stacked (sum of rows, cols — the references of one template share one size), and ``rope_layout``, which says
how many references the stack holds: ``flux2-ref-t10`` (one) or ``flux2-ref-t10-xN`` (N of them). A
layout as a value is a tuple of (rows, cols) grids; a single (rows, cols) means one reference.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_REFERENCES",
    "as_references",
    "layout_of",
    "REF_TIME_OFFSET",
    "ROPE_LAYOUT",
    "TokenLayout",
    "grids_of",
    "num_tokens",
    "ref_grids",
    "rope_layout_of",
    "stacked_grid",
]

# Reference images sit at t = 10 (i + 1) on the first RoPE axis, as in diffusers' Flux2 pipelines (scale + scale * i).
REF_TIME_OFFSET = 10
ROPE_LAYOUT = "flux2-ref-t10"  # one reference
MAX_REFERENCES = 4  # FLUX.2 [klein]'s documented limit of reference images
#: A template's token layout: (rows, cols) of one reference, or the grids of several (one grid each, in order).
TokenLayout = tuple[int, int] | tuple[tuple[int, int], ...]
_MULTI = re.compile(r"^flux2-ref-t10-x([2-9])$")


def ref_grids(grid) -> tuple[tuple[int, int], ...]:
    """A layout from ``(rows, cols)`` (one reference) or a sequence of such grids (several)."""
    if len(grid) == 2 and all(isinstance(x, int) or hasattr(x, "__index__") for x in grid):
        grids: tuple[tuple[int, int], ...] = ((int(grid[0]), int(grid[1])),)
    else:
        grids = tuple((int(g[0]), int(g[1])) for g in grid)
    if not 1 <= len(grids) <= MAX_REFERENCES or any(r < 1 or c < 1 for r, c in grids):
        raise ValueError(f"a template holds 1..{MAX_REFERENCES} references of positive (rows, cols) grids, got {grid}")
    return grids


def num_tokens(grid) -> int:
    return sum(r * c for r, c in ref_grids(grid))


def rope_layout_of(grid) -> str:
    """The ``rope_layout`` name of a layout: ``flux2-ref-t10`` (one reference) or ``flux2-ref-t10-xN``."""
    n = len(ref_grids(grid))
    return ROPE_LAYOUT if n == 1 else f"{ROPE_LAYOUT}-x{n}"


def stacked_grid(grid) -> tuple[int, int]:
    """The ``token_grid`` a layout travels as: its grids stacked (sum of rows, the shared cols)."""
    grids = ref_grids(grid)
    if len({g for g in grids}) != 1:
        raise ValueError(
            f"the references of one template must share one token grid (one image size), got {grids}; "
            "resize them to one template size"
        )
    rows, cols = grids[0]
    return (rows * len(grids), cols)


def grids_of(token_grid, rope_layout: str) -> tuple[tuple[int, int], ...]:
    """The layout a (``token_grid``, ``rope_layout``) pair names (the inverse of :func:`stacked_grid` /
    :func:`rope_layout_of`); a layout name this build does not know is returned as one reference."""
    rows, cols = int(token_grid[0]), int(token_grid[1])
    m = _MULTI.match(rope_layout or "")
    if m is None:
        return ((rows, cols),)
    n = int(m.group(1))
    if n > MAX_REFERENCES or rows % n:
        raise ValueError(
            f"rope_layout {rope_layout!r} with token grid {[rows, cols]}: {rows} rows do not stack "
            f"{n} equal references (at most {MAX_REFERENCES})"
        )
    return ((rows // n, cols),) * n


def as_references(template) -> list | None:
    """The template's reference images when ``template`` is a list or tuple of them, else None (one image)."""
    if isinstance(template, (list, tuple)):
        if not 1 <= len(template) <= MAX_REFERENCES:
            raise ValueError(f"a template holds 1..{MAX_REFERENCES} reference images, got {len(template)}")
        return list(template)
    return None


def layout_of(grids) -> TokenLayout:
    """The layout of references with these grids: a plain (rows, cols) for one, the grids for several (which must
    share one grid, :func:`stacked_grid`)."""
    grids = tuple((int(r), int(c)) for r, c in grids)
    stacked_grid(grids)
    return grids[0] if len(grids) == 1 else grids

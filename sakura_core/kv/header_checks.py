"""Field checks of a shard header (:class:`sakura_core.kv.container.ShardHeader`): each field's form and range, the
step / reference / predictor fields' consistency. A message names the bad field and value; empty when valid."""

from __future__ import annotations

import re

from .names import MODEL_ID_RE, TEMPLATE_ID_FORM, is_digest, is_template_id
from .predictor import scale_codes_size

__all__ = ["DTYPE_CODES", "MAX_STEP", "header_problems"]

DTYPE_CODES = {"float16": 1, "float32": 2}
MAX_STEP = 0xFFFE
_MAX_LAYER = 4095
_MAX_GRID_SIDE = 4096
_MAX_HEADS = 1024
_MAX_HEAD_DIM = 1024

_CODEC_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_ROPE_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def header_problems(h) -> str:
    """Empty string when the header is valid, else a message naming the bad field and value."""
    if not isinstance(h.codec, str) or not _CODEC_RE.match(h.codec):
        return f"codec {h.codec!r} must match [a-z0-9][a-z0-9_-]{{0,31}}"
    if not isinstance(h.model_id, str) or not MODEL_ID_RE.fullmatch(h.model_id):
        return f"model_id {h.model_id!r} must be 1-128 lowercase hex characters"
    if not is_template_id(h.template_id):
        return f"template_id {h.template_id!r} must match {TEMPLATE_ID_FORM}"
    if not isinstance(h.rope_layout, str) or not _ROPE_RE.match(h.rope_layout):
        return f"rope_layout {h.rope_layout!r} must be 1-64 characters of [A-Za-z0-9._-]"
    if not 0 <= h.level <= 0xFFFF:
        return f"level {h.level} must be in [0, 65535]"
    if not 0 <= h.layer_first <= h.layer_last <= _MAX_LAYER:
        return f"layer range [{h.layer_first}, {h.layer_last}] must satisfy 0 <= first <= last <= {_MAX_LAYER}"
    rows, cols = h.token_grid
    if not (1 <= rows <= _MAX_GRID_SIDE and 1 <= cols <= _MAX_GRID_SIDE):
        return f"token_grid {tuple(h.token_grid)} sides must be in [1, {_MAX_GRID_SIDE}]"
    if not 1 <= h.heads <= _MAX_HEADS:
        return f"heads {h.heads} must be in [1, {_MAX_HEADS}]"
    if not 1 <= h.head_dim <= _MAX_HEAD_DIM:
        return f"head_dim {h.head_dim} must be in [1, {_MAX_HEAD_DIM}]"
    if h.dtype not in DTYPE_CODES:
        return f"dtype {h.dtype!r} must be one of {sorted(DTYPE_CODES)}"
    if h.parent is not None and not is_digest(h.parent):
        return f"parent {h.parent!r} must be a 64-character hex sha256 digest or None"
    return _step_problems(h)


def _step_problems(h) -> str:
    """The step, reference and predictor fields: a reference needs a step after it and a digest; a predictor scale
    needs a reference and one code per (K or V, layer, head, channel)."""
    if h.ref_scale is not None:
        size = scale_codes_size(h.layer_last - h.layer_first + 1, h.heads, h.head_dim)
        if h.ref_step is None:
            return "ref_scale (a cross-step predictor) needs a reference (ref_step, ref_digest)"
        if not isinstance(h.ref_scale, bytes) or len(h.ref_scale) != size:
            n = len(h.ref_scale) if isinstance(h.ref_scale, bytes) else type(h.ref_scale).__name__
            return f"ref_scale has {n} bytes; the shard's geometry needs {size} (2 x layers x heads x head_dim)"
    if h.step is not None and not (isinstance(h.step, int) and 0 <= h.step <= MAX_STEP):
        return f"step {h.step!r} must be None or an int in [0, {MAX_STEP}]"
    if (h.ref_step is None) != (h.ref_digest is None):
        return f"ref_step {h.ref_step!r} and ref_digest {h.ref_digest!r} must both be set or both None"
    if h.ref_step is None:
        return ""
    if h.step is None or not (isinstance(h.ref_step, int) and 0 <= h.ref_step < h.step):
        return f"ref_step {h.ref_step!r} must be an earlier step than the shard's step {h.step!r}"
    if not is_digest(h.ref_digest):
        return f"ref_digest {h.ref_digest!r} must be a 64-character hex sha256 digest"
    return ""

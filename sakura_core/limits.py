"""The bounds on every size that comes from outside (a manifest, a shard header, a job body, an image, a JSON body):
one home for the numbers, and :func:`bounded_json`, the one JSON loader for bytes from the network or a store.

A value past a bound is refused with a :class:`LimitError` (a ``ValueError``) naming the value and the bound, before
anything of that size is allocated. The bounds are far above every real template (FLUX.2 [klein] 9B at 2048² is
32 layers x 32 heads x 128 channels x 128² tokens) and far below what would exhaust a machine.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

__all__ = [
    "MAX_EDIT_TOKENS",
    "MAX_GRID_SIDE",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_LAYERS",
    "MAX_PROMPT_CHARS",
    "MAX_REPRESENTATIONS",
    "MAX_SHARD_ELEMENTS",
    "MAX_STEPS",
    "MAX_TEMPLATE_TOKENS",
    "LimitError",
    "bounded_json",
    "check_at_most",
    "check_prompt",
    "json_depth",
]

#: Token-grid side of a template (tokens); 256 is 4096 px at 16 px per token.
MAX_GRID_SIDE = 256
#: Template tokens (rows x cols).
MAX_TEMPLATE_TOKENS = 65_536
#: Image tokens of one edit at a model's own size (a folder's image_size over its VAE's and patch's downsampling):
#: klein at 1024² (64²). Past it the VAE's attention over its latent pixels alone needs GBs (a folder whose VAE
#: downsamples less than klein's 8x would allocate tens of GB at the default 512 px).
MAX_EDIT_TOKENS = 4096
#: Transformer layers of a template's KV.
MAX_LAYERS = 512
#: Attention heads.
MAX_HEADS = 256
#: Channels per head.
MAX_HEAD_DIM = 1024
#: Sampler steps of a per-step template.
MAX_STEPS = 1000
#: Representations (ladder levels) of one shard.
MAX_REPRESENTATIONS = 64
#: Elements of one shard's K (or V): layers x tokens x heads x head_dim (the shard container's own limit).
MAX_SHARD_ELEMENTS = 1 << 28
#: Bytes of a template image blob.
MAX_IMAGE_BYTES = 64 << 20
#: Pixels of a decoded image (width x height): 8192².
MAX_IMAGE_PIXELS = 8192 * 8192
#: Bytes of a JSON document (a manifest, a catalog, a job header).
MAX_JSON_BYTES = 64 << 20
#: Nesting depth of a JSON document (a manifest nests 5 deep).
MAX_JSON_DEPTH = 64
#: Characters of an edit prompt.
MAX_PROMPT_CHARS = 4096


class LimitError(ValueError):
    """A size from outside is over its bound (the message names the value, the bound and what it was)."""


def check_at_most(what: str, value: int, bound: int) -> int:
    """``value`` when it is at most ``bound``, else :class:`LimitError` naming both."""
    if value > bound:
        raise LimitError(f"{what} is {value}, over the limit of {bound}")
    return value


def check_prompt(prompt: object) -> str:
    """``prompt`` when it is text a tokenizer can take: a ``str`` of at most :data:`MAX_PROMPT_CHARS` characters that
    encodes as UTF-8. A lone surrogate (bytes that were not UTF-8 on a command line, half of an emoji cut off by a
    client) is refused here, where the prompt enters, with a :class:`LimitError` naming its position and the fix."""
    if not isinstance(prompt, str):
        raise LimitError(f"the prompt must be text (a string), got {type(prompt).__name__}")
    check_at_most("the prompt's length in characters", len(prompt), MAX_PROMPT_CHARS)
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LimitError(
            f"the prompt is not valid Unicode text: character {e.start} is U+{ord(prompt[e.start]):04X}, a lone "
            "surrogate (bytes that were not UTF-8, or half of a character pair cut off); type that part again, "
            "or pass the prompt as UTF-8"
        ) from None
    return prompt


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (strings skipped), in one vectorised pass
    (no recursion, whatever the depth)."""
    brackets = np.frombuffer(_STRING.sub(b"", data), np.uint8)
    if brackets.size == 0:
        return 0
    return int(max(np.cumsum(_OPEN[brackets], dtype=np.int64).max(), 0))


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def bounded_json(
    data: bytes | bytearray | str, what: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """``json.loads`` of ``data`` once it is at most ``max_bytes`` long and ``max_depth`` deep; NaN and Infinity are
    refused. Every failure is a ``ValueError``: :class:`LimitError` (too big, too deep) or ``ValueError`` naming
    ``what`` (not JSON, not UTF-8) — never a RecursionError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    check_at_most(f"{what}: JSON of {len(raw)} bytes: its size", len(raw), max_bytes)
    depth = json_depth(raw)
    if depth > max_depth:
        raise LimitError(f"{what}: JSON nested {depth} deep, over the limit of {max_depth}")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{what}: invalid JSON: {e}") from e

"""The names the wire format uses, written once: template ids, shard digests and model ids (the manifest, the shard
container, the shard client, the store layout and the phone's job header all check them with these)."""

from __future__ import annotations

import re
from typing import TypeGuard

__all__ = [
    "CLOSED_SUFFIX",
    "DIGEST_RE",
    "MODEL_ID_RE",
    "TEMPLATE_ID_FORM",
    "TEMPLATE_ID_RE",
    "base_level_name",
    "closed_name",
    "is_digest",
    "is_template_id",
]

#: What a template id looks like, as the messages say it.
TEMPLATE_ID_FORM = "[a-z0-9-]{1,64}"
#: A template id (use ``fullmatch``): also a folder name in a store and a URL path segment, so nothing else.
TEMPLATE_ID_RE = re.compile(TEMPLATE_ID_FORM)
#: A shard's digest: the sha256 of its bytes, 64 lowercase hex characters (its name in a store and in URLs).
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
#: A model's content id: 1-128 lowercase hex characters.
MODEL_ID_RE = re.compile(r"[0-9a-f]{1,128}")


def is_template_id(value: object) -> TypeGuard[str]:
    """True when ``value`` is a string matching ``[a-z0-9-]{1,64}``."""
    return isinstance(value, str) and TEMPLATE_ID_RE.fullmatch(value) is not None


def is_digest(value: object) -> TypeGuard[str]:
    """True when ``value`` is 64 lowercase hex characters."""
    return isinstance(value, str) and DIGEST_RE.fullmatch(value) is not None


#: A closed-loop twin's name is its level's name plus this (``sakura-l2+cl``; see
#: :mod:`sakura_core.precompute.cross_step`).
CLOSED_SUFFIX = "+cl"


def closed_name(name: str) -> str:
    """The closed-loop twin's name of level ``name``."""
    return name + CLOSED_SUFFIX


def base_level_name(name: str) -> str:
    """The level a twin's name belongs to (``sakura-l2+cl`` -> ``sakura-l2``); any other name unchanged."""
    return name[: -len(CLOSED_SUFFIX)] if name.endswith(CLOSED_SUFFIX) else name

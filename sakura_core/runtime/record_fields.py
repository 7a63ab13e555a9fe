"""A published record's flat fields over its named parts: the records whose constructor takes a few parts
(:class:`~sakura_core.runtime.geometry.DitGeometry`, :class:`~sakura_core.runtime.profiles.DeviceProfile`) keep one
flat set of field names in their JSON and in their ``with_fields``; this splits such a set by part."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

__all__ = ["split_fields"]


def split_fields(record: str, flat: Mapping[str, Any], *parts: Any) -> list[dict[str, Any]]:
    """``flat`` (field name -> value) split by the field names of the dataclasses ``parts``: one dict per part, in
    their order. A name no part has is an error naming it and the names ``record`` (the record's id) has."""
    names = [{f.name for f in fields(part)} for part in parts]
    known = set().union(*names)
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"{record}: no field {', '.join(unknown)}; its fields are {', '.join(sorted(known))}")
    return [{k: v for k, v in flat.items() if k in part} for part in names]

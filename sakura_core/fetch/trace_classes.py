"""Trace classes (3G, 4G, broadband, 5G): results are reported per class, never as one median over all links.

A trace's class comes from a classes file in the trace folder (``trace_classes.json``: ``{"glob": "class"}``,
globs over the path relative to that folder, first match wins), else from the words in its file name and folder
names (file name first, then the folders from the deepest up, the trace folder itself last): ``5g``/``nr`` -> 5G, ``4g``/``lte`` -> 4G,
``3g``/``3gp``/``hsdpa``/``hspa``/``umts`` -> 3G, ``fcc``/``broadband``/``wifi``/``dsl``/``cable``/``fiber`` ->
broadband; a word like ``ucc5g`` counts as ``5g``. Anything else is ``other``.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

__all__ = ["CLASSES_FILE", "TRACE_CLASSES", "classify_path", "read_classes_file"]

CLASSES_FILE = "trace_classes.json"
TRACE_CLASSES = ("3G", "4G", "broadband", "5G", "other")  # report order

_WORDS = {
    "5G": {"5g", "nr"},
    "4G": {"4g", "lte"},
    "3G": {"3g", "3gp", "hsdpa", "hspa", "umts"},
    "broadband": {"fcc", "broadband", "wifi", "dsl", "cable", "fiber", "fibre"},
}
_GEN_SUFFIX = re.compile(r"^[a-z]*([345])g$")  # ucc5g, att4g


def _class_of_words(text: str) -> str | None:
    for word in re.split(r"[^a-z0-9]+", text.lower()):
        if not word:
            continue
        for cls, words in _WORDS.items():
            if word in words:
                return cls
        m = _GEN_SUFFIX.match(word)
        if m:
            return f"{m.group(1)}G"
    return None


def read_classes_file(path: str | Path) -> dict[str, str]:
    """``{"glob": "class"}`` from a JSON file; classes must be one of TRACE_CLASSES."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read trace classes file {path}: {e}; it must be a JSON object glob -> class") from e
    if not isinstance(data, dict):
        raise ValueError(
            f"trace classes file {path} must hold a JSON object {{glob: class}}, got {type(data).__name__}"
        )
    bad = {k: v for k, v in data.items() if v not in TRACE_CLASSES}
    if bad:
        raise ValueError(f"trace classes file {path}: unknown classes {bad}; use one of {', '.join(TRACE_CLASSES)}")
    return {str(k): str(v) for k, v in data.items()}


def classify_path(relative: str | Path, globs: dict[str, str] | None = None, root_name: str = "") -> str:
    """The class of a trace at ``relative`` (path relative to the trace folder, whose own name ``root_name`` is
    looked at last)."""
    rel = Path(relative)
    posix = rel.as_posix()
    for pattern, cls in (globs or {}).items():
        if fnmatch.fnmatch(posix, pattern) or fnmatch.fnmatch(rel.name, pattern):
            return cls
    for part in [rel.stem, *reversed(rel.parent.parts), root_name]:
        found = _class_of_words(part)
        if found:
            return found
    return "other"

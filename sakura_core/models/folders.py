"""What a model folder is, from its JSON alone (no torch): a diffusers FLUX.2 [klein] pipeline folder."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["KLEIN_PIPELINES", "is_klein_folder"]

# model_index.json ``_class_name`` values whose folders hold a FLUX.2 [klein] pipeline (same components).
KLEIN_PIPELINES = ("Flux2KleinKVPipeline", "Flux2KleinPipeline")


def is_klein_folder(folder: str | Path) -> bool:
    """True when ``folder/model_index.json`` names a FLUX.2 [klein] pipeline (see ``KLEIN_PIPELINES``)."""
    try:
        data = json.loads((Path(folder) / "model_index.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("_class_name") in KLEIN_PIPELINES

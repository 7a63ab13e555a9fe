"""Which model a name or a path means: the embedded demo model, or a diffusers FLUX.2 [klein] pipeline folder.

Cheap to import (no torch until a model is loaded), so configs can validate a ``--model`` value.
"""

from __future__ import annotations

from .folders import KLEIN_PIPELINES, is_klein_folder

__all__ = ["DEMO_MODEL", "KLEIN_PIPELINES", "is_klein_folder", "load_edit_model", "check_model_source"]

DEMO_MODEL = "demo"


def check_model_source(source: str) -> None:
    """Raise ValueError naming the fix unless ``source`` is ``demo`` or a klein pipeline folder."""
    if source == DEMO_MODEL or is_klein_folder(source):
        return
    raise ValueError(
        f"unknown model {source!r}: use {DEMO_MODEL!r} or the path of a diffusers FLUX.2 [klein] pipeline folder "
        f"(its model_index.json names one of {', '.join(KLEIN_PIPELINES)})"
    )


def load_edit_model(source: str, *, weights: str | None = "auto"):
    """The model ``source`` names: ``demo`` (``weights`` as ``load_demo_model``'s) or a klein pipeline folder."""
    check_model_source(source)
    if source == DEMO_MODEL:
        from .edit_model import load_demo_model

        return load_demo_model(weights=weights)
    from .latent_model import load_klein_folder

    return load_klein_folder(source)

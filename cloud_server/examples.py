"""The templates and user images the example workflows (``example_workflows/``) edit with, made from the samples
that ship with scikit-image, for the demo model. ``sakura examples`` (``cli_examples.py``) publishes the templates into
a store and writes the user images into ComfyUI's input folder::

    sakura examples --store ~/sakura-store --comfyui-input /path/to/ComfyUI/input
    sakura serve --store ~/sakura-store --port 8080

Every example template is one reference image: the demo model was trained with one, so its edits against several
blend them. Templates of several references (``sakura precompute --image A --image B``) are tested through the nodes
with a workflow the tests build (``tests/nodes/workflows.py``), not shipped as an example.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypedDict

import numpy as np

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE

__all__ = [
    "KV_SETTINGS",
    "TEMPLATES",
    "USER_IMAGES",
    "publish_examples",
    "template_image",
    "user_image",
    "write_user_images",
]

logger = logging.getLogger(__name__)

# template id -> (scikit-image sample, region marked for the edit (y0, x0, y1, x1) in pixels of the 64 px demo size)
TEMPLATES = {
    "face-swap-astronaut": ("astronaut", (12, 12, 40, 52)),  # the astronaut's face
    "in-context-coffee": ("coffee", (16, 12, 48, 52)),  # the cup
    "face-swap-astronaut-per-step": ("astronaut", (12, 12, 40, 52)),  # the face swap with per-step KV
}


# template id -> how its KV is precomputed, when not the default single mode (``publish_template`` keywords)
class _KVSettings(TypedDict, total=False):
    """An example's KV settings besides the defaults (``publish_template``'s keywords)."""

    kv_mode: str
    steps: int


KV_SETTINGS: dict[str, _KVSettings] = {
    # one KV per (step, layer) for a 4-step schedule: what a stock editing DiT reuses; edits must run 4 steps
    "face-swap-astronaut-per-step": {"kv_mode": "per-step", "steps": 4},
}

# ComfyUI input file -> how to make it (the private user images)
USER_IMAGES = {
    "sakura-face.png": "lfw",  # a face from scikit-image's LFW subset
    "sakura-object.png": "chelsea",  # the cat
}

USER_SIZE = 128  # pixels; the sampler fits any size to the model's


def template_image(template_id: str, spec) -> np.ndarray:
    """The marked template image (``spec.image_size`` square) for ``template_id``."""
    from sakura_core.demo.edit_task import demo_template, task_for

    sample, box = TEMPLATES[template_id]
    scale = spec.image_size / 64
    x0, y0, x1, y1 = (int(round(v * scale)) for v in box)
    return demo_template(sample, task_for(spec), box=(x0, y0, x1, y1))


def user_image(name: str) -> np.ndarray:
    """The example user image ``name`` (a key of ``USER_IMAGES``), ``USER_SIZE`` square, uint8."""
    import skimage.data

    from sakura_core.models.edit_model import load_image

    source = USER_IMAGES[name]
    if source == "lfw":
        face = skimage.data.lfw_subset()[0]  # (25, 25) float in [0, 1]
        return load_image((face * 255).astype(np.uint8), USER_SIZE)
    return load_image(getattr(skimage.data, source)(), USER_SIZE)


def publish_examples(store, model=None, template_ids=None, store_profile: str = DEFAULT_STORE_PROFILE) -> list[str]:
    """Publish the example templates into ``store`` (a :class:`~cloud_server.store.Store`, or a folder for a local
    one); those already there are kept; returns the ids published.

    ``template_ids`` picks some of :data:`TEMPLATES` (default: all); an unknown id raises ``ValueError``.
    ``store_profile``: ``serving`` (default) or ``full`` (the fp16 kept: the fetch-fp16 policy fetches it exactly)."""
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore, Store
    from sakura_core.models.edit_model import load_demo_model

    unknown = sorted(set(template_ids or ()) - set(TEMPLATES))
    if unknown:
        raise ValueError(f"unknown example template(s) {', '.join(unknown)}; the examples are {', '.join(TEMPLATES)}")
    store = store if isinstance(store, Store) else LocalStore(store)
    model = model or load_demo_model()
    done = []
    for template_id in template_ids or TEMPLATES:
        if store.has_template(template_id):
            continue
        kv = KV_SETTINGS.get(template_id, {})
        publish_template(
            store, model, template_image(template_id, model.spec), template_id, **kv, store_profile=store_profile
        )
        logger.info("published %s in %s", template_id, getattr(store, "root", store))
        done.append(template_id)
    return done


def write_user_images(folder: str | Path) -> list[Path]:
    """Write the example user images (``USER_IMAGES``) into ``folder`` (ComfyUI's ``input/``); returns their paths."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in USER_IMAGES:
        Image.fromarray(user_image(name)).save(folder / name)
        paths.append(folder / name)
    return paths

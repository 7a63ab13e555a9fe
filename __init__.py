"""SAKURA as a ComfyUI custom-node folder.

ComfyUI imports this module from ``custom_nodes/``. It registers the Sakura V3 nodes through
``comfy_entrypoint`` only when ComfyUI's API imports; anywhere else (tests, pip installs, plain Python)
it imports nothing heavy and registers nothing.
"""

import importlib.util as _ilu

__all__ = []
WEB_DIRECTORY = None  # the frontend extension (web/sakura.js), handed to ComfyUI with the nodes

if _ilu.find_spec("comfy_api") is not None:  # pragma: no cover - exercised inside ComfyUI
    try:
        from .nodes import comfy_entrypoint  # noqa: F401

        WEB_DIRECTORY = "./web"
        __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
    except ImportError as e:  # the nodes need comfy_api.latest; older ComfyUI lacks it
        import logging

        logging.getLogger(__name__).error("SAKURA nodes not registered: %s (needs ComfyUI with comfy_api.latest)", e)

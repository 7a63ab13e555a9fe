"""SAKURA's ComfyUI V3 nodes: thin wrappers over ``sakura_core`` (validate, call the core, wrap the result).

Imported by the root ``__init__`` only when ComfyUI's ``comfy_api`` is importable; ``comfy_entrypoint`` hands
ComfyUI the node list. Nothing here registers anything at import time.
"""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .adaptive_fetch import SakuraAdaptiveFetch
from .model_loader import SakuraModelLoader
from .page_routes import register_page_routes
from .phone_device import SakuraPhoneDevice
from .pipelined_sampler import SakuraPipelinedSampler
from .routes import register_routes
from .template_kv_patch import SakuraTemplateKV, SakuraTemplateKVReport
from .template_loader import SakuraTemplateLoader

__all__ = ["NODES", "SakuraExtension", "comfy_entrypoint"]

NODES: tuple[type[io.ComfyNode], ...] = (
    SakuraModelLoader,
    SakuraTemplateLoader,
    SakuraAdaptiveFetch,
    SakuraPipelinedSampler,
    SakuraPhoneDevice,
    SakuraTemplateKV,
    SakuraTemplateKVReport,
)


class SakuraExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> SakuraExtension:
    """Called by ComfyUI when it loads the pack: also adds the pack's routes (``routes.py``, ``page_routes.py``) to
    its server."""
    register_routes()
    register_page_routes()
    return SakuraExtension()

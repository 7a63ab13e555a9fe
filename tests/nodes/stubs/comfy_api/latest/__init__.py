"""Stand-in for ``comfy_api.latest``: ``io`` (node schema types) and ``ComfyExtension``."""

from abc import ABC, abstractmethod

from . import _io as io

__all__ = ["ComfyExtension", "io"]


class ComfyExtension(ABC):
    async def on_load(self) -> None:  # noqa: B027 - an optional hook, as in ComfyUI
        """Called once when the extension is loaded."""

    @abstractmethod
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        """The node classes this extension provides."""

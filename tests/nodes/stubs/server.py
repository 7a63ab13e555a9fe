"""Stand-in for ComfyUI's ``server`` module: ``PromptServer.instance.routes``, the route table custom nodes add to
(ComfyUI adds it to its aiohttp app after the custom nodes have loaded)."""

from aiohttp import web


class PromptServer:
    instance = None

    def __init__(self):
        self.routes = web.RouteTableDef()
        PromptServer.instance = self

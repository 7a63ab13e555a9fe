"""A local store folder as a template source: served read-only on a loopback port while a fetch needs it.

``StoreSource`` is what ``sakura_core.edit.open_template`` / ``run_template_edit`` take for a store on this machine
(the ComfyUI Template KV Loader's "local store" source): the edit fetches through the same HTTP client, link shaping
and digest checks as from a server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StoreSource"]


@dataclass(frozen=True)
class StoreSource:
    """A SAKURA store folder on this machine (``sakura precompute --store DIR``), served on 127.0.0.1 per use.

    Attributes:
        store_dir: the store folder (it holds ``templates/``).
    """

    store_dir: str
    token: None = None  # the loopback server has no read token

    def __post_init__(self) -> None:
        if not isinstance(self.store_dir, str) or not self.store_dir.strip():
            raise ValueError("a local store source needs the store folder; give store_dir")

    @property
    def label(self) -> str:
        return f"store:{self.store_dir}"

    def check(self) -> Path:
        """The store root; ``ValueError`` if the folder is not a SAKURA store (says how to make one)."""
        root = Path(self.store_dir).expanduser()
        if not (root / "templates").is_dir():
            raise ValueError(
                f"{root} is not a SAKURA store (no templates/ folder); create one with "
                f"`sakura precompute --store {root} --image IMAGE --id ID`"
            )
        return root

    @asynccontextmanager
    async def base_url(self) -> AsyncIterator[str]:
        """A read-only server over the store on a free loopback port, stopped when the context closes."""
        from aiohttp import web

        from sakura_core.http_serving import bound_port

        from .app import create_app
        from .config import ServerConfig

        config = ServerConfig(store_dir=str(self.check()), host="127.0.0.1", port=0, model=None)
        runner = web.AppRunner(create_app(config), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, config.host, 0).start()
            yield f"http://127.0.0.1:{bound_port(runner)}"
        finally:
            await runner.cleanup()

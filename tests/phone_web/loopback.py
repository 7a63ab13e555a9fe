"""A cloud server (``cloud_server.app.create_app``, what ``sakura serve`` runs) on 127.0.0.1 in a background thread,
for the page's tests that need a real HTTP peer (node's fetch, Chromium). The server's event loop lives in its
thread from set-up to clean-up, so the block may run while another loop runs here (playwright's sync API)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web

__all__ = ["loopback_server"]


@contextlib.contextmanager
def loopback_server(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) while the block runs; yields its base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

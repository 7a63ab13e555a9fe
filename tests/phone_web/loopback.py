"""A cloud server (``cloud_server.app.create_app``, what ``sakura serve`` runs) on 127.0.0.1 in a background thread,
for the page's tests that need a real HTTP peer (node's fetch, Chromium)."""

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
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()

"""``bound_port``: the port a runner started on port 0 really listens on; a runner without a TCP site is an error."""

import aiohttp
import pytest
from aiohttp import web

from sakura_core.http_serving import bound_port


async def _here(request: web.Request) -> web.Response:
    return web.Response(text="here")


async def test_bound_port_is_the_port_that_answers(tmp_path):
    app = web.Application()
    app.router.add_get("/", _here)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(tmp_path / "s.sock")).start()  # listed first: not a TCP address
        with pytest.raises(RuntimeError, match="no TCP address"):
            bound_port(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = bound_port(runner)
        assert port > 0
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as resp:
            assert await resp.text() == "here"
    finally:
        await runner.cleanup()

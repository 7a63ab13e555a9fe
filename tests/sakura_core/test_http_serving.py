"""The one loopback test and the one bearer-token check the cloud server and the phone agent share; ``bound_port``:
the port a runner started on port 0 really listens on (a runner without a TCP site is an error)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from sakura_core.http_serving import bearer_token, bound_port, is_loopback, token_matches


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.20", False),
        ("::", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_bearer_token_reads_only_the_bearer_scheme():
    assert bearer_token("Bearer abc") == "abc" and bearer_token("bearer  abc ") == "abc"
    for header in (None, "", "Bearer", "Bearer   ", "Basic abc", "abc", "Bearerabc"):
        assert bearer_token(header) is None, header


def test_token_matches_any_configured_token_and_never_raises_on_odd_bytes():
    assert token_matches("s3cret-token", None, "s3cret-token")
    assert not token_matches("s3cret-token", "other-token") and not token_matches(None, "s3cret-token")
    assert not token_matches("s3cret-token", None, None)  # no token configured: nothing matches
    assert not token_matches("s3cret-toke", "s3cret-token") and not token_matches("s3cret-token!", "s3cret-token")
    odd = b"s3cret-\xff".decode("utf-8", "surrogateescape")  # how aiohttp keeps header bytes that are not UTF-8
    assert not token_matches(odd, "s3cret-token")


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

"""The host's phone client never follows a redirect: its requests carry the pairing token and the user's image, so a
3xx from the agent's address is an error naming the Location, and the redirect's target receives nothing."""

from __future__ import annotations

import numpy as np
import pytest
from aiohttp import web
from redirecting import redirect_pair

from android_bridge.client import PhoneClient, PhoneError, PhoneJob


@pytest.mark.parametrize("status", [302, 307, 308])
async def test_info_is_not_followed_to_a_redirect(aiohttp_server, status):
    pair = await redirect_pair(aiohttp_server, status)
    client = PhoneClient.connect(pair.url, "pairing-token-0123456789", check=False)
    with pytest.raises(PhoneError, match=f"HTTP {status} redirecting to .*internal/admin.*not followed") as e:
        await client.ainfo()
    assert e.value.code == "redirect" and pair.hits == []


@pytest.mark.parametrize("status", [303, 307, 308])
async def test_a_job_with_the_user_image_is_not_resent_to_a_redirect(aiohttp_server, status):
    pair = await redirect_pair(aiohttp_server, status)

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"model": {"image_size": 16}})

    async def jobs(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, headers={"Location": pair.location})

    agent = web.Application()
    agent.router.add_get("/v1/info", info)
    agent.router.add_post("/v1/jobs", jobs)
    url = str((await aiohttp_server(agent)).make_url("")).rstrip("/")
    client = PhoneClient.connect(url, "pairing-token-0123456789", check=False)
    job = PhoneJob(cloud_url="http://127.0.0.1:9", template_id="t", prompt="p", steps=2)
    with pytest.raises(PhoneError, match="redirects are not followed"):
        await client.arun_job(np.zeros((16, 16, 3), np.uint8), job)
    assert pair.hits == []  # neither the image nor the token reached the redirect's target

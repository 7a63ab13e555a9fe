"""The phone agent's cloud: hosts it refuses before any connection (link-local, multicast, unspecified, numeric
forms that hide an address, and loopback/private unless allowed), redirects it never follows, and the queue place a
job takes before any network work. Every server here is on 127.0.0.1; a refused address is never connected to (the
shard client's sessions are watched and guarded, the resolver is a stand-in)."""
# ruff: noqa: F811 - make_agent is a fixture imported from test_agent_app

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from aiohttp import web
from redirecting import redirect_pair

from android_bridge.agent import AGENT_STATE_KEY, AgentConfig
from sakura_core.fetch import client as fetch_client

from .conftest import PHONE_TOKEN
from .test_agent_app import FakeEdit, _body, _submit, make_agent  # noqa: F401 - make_agent is a fixture
from .test_agent_limits import _manifest

SETTING = "--allow-private-cloud"


class _Resolver:
    """A stand-in for getaddrinfo: ``answers[host]``, and the hosts asked."""

    def __init__(self, **answers: list[str]):
        self.answers = {k.replace("_", "."): v for k, v in answers.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.answers[host]


@pytest.fixture(autouse=True)
def sessions(monkeypatch):
    """Every session the shard client opens, by base URL: none may be opened for a refused host. A guard as well:
    a session for anything but 127.0.0.1 (or a name pinned to it) is refused with ``ConnectionRefusedError`` before
    any lookup or connection, so even an agent without the host check (today's main) contacts nothing else."""
    opened: list[str] = []
    real = fetch_client.ShardClient._get_session

    def watch(self):
        opened.append(self.base_url)
        pinned = getattr(self, "_addresses", ())
        if not (self.base_url.startswith("http://127.0.0.1:") or pinned == ("127.0.0.1",)):
            raise ConnectionRefusedError(f"test guard: no connection to {self.base_url}")
        return real(self)

    monkeypatch.setattr(fetch_client.ShardClient, "_get_session", watch)
    return opened


@pytest.fixture
async def counting_cloud(aiohttp_server, demo_model):
    """A cloud serving a valid manifest of ``TEMPLATE_ID`` after ``delay_s``, counting manifest requests."""
    cloud = SimpleNamespace(url="", hits=[], delay_s=0.0)
    body = json.dumps(_manifest(demo_model, demo_model.spec.grid)).encode()

    async def manifest(request: web.Request) -> web.Response:
        cloud.hits.append(request.headers.get("Host"))
        await asyncio.sleep(cloud.delay_s)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/templates/{tid}/manifest", manifest)
    server = await aiohttp_server(app)
    cloud.url, cloud.port = str(server.make_url("")).rstrip("/"), server.port
    return cloud


def _at(url: str) -> SimpleNamespace:
    return SimpleNamespace(url=url)


# ---- hosts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, host, why",
    [
        ("http://169.254.169.254", "169.254.169.254", "link-local"),
        ("http://[fe80::1]:8080", "fe80::1", "link-local"),
        ("http://[::ffff:169.254.169.254]", "::ffff:169.254.169.254", "link-local"),
        ("http://224.0.0.251", "224.0.0.251", "multicast"),
        ("http://[ff02::1]", "ff02::1", "multicast"),
        ("http://0.0.0.0:8080", "0.0.0.0", "unspecified"),
        ("http://[::]:8080", "::", "unspecified"),
        ("http://255.255.255.255", "255.255.255.255", "broadcast"),
        ("http://0x7f000001", "0x7f000001", "ambiguous"),
        ("http://2130706433:8080", "2130706433", "ambiguous"),
        ("http://0177.0.0.1", "0177.0.0.1", "ambiguous"),
        ("http://127.1", "127.1", "ambiguous"),
        ("http://0xa9.0xfe.0xa9.0xfe", "0xa9.0xfe.0xa9.0xfe", "ambiguous"),
        ("http://127.0.0.1.:8080", "127.0.0.1.", "ambiguous"),
    ],
)
async def test_refused_hosts_are_never_contacted(make_agent, user_image, sessions, url, host, why):
    client, fake = await make_agent()
    resolver = _Resolver()
    client.app[AGENT_STATE_KEY].resolve = resolver
    r = await _submit(client, _body(_at(url), user_image))
    got = await r.json()
    assert r.status == 400 and got["code"] == "bad_job", got
    assert f"cloud_url host {host!r}" in got["error"] and why in got["error"], got
    if why != "ambiguous":
        assert "no setting allows it" in got["error"]
    assert sessions == [] and resolver.asked == [] and fake.requests == []  # no lookup, no connection


async def test_every_resolved_address_must_pass(make_agent, user_image, sessions):
    client, _ = await make_agent(allow_private_cloud=True)
    resolver = _Resolver(cloud_example=["192.0.2.10", "169.254.169.254"], meta_example=["fe80::1%2"])
    client.app[AGENT_STATE_KEY].resolve = resolver
    for url, bad in (("http://cloud.example:8080", "169.254.169.254"), ("http://meta.example", "fe80::1%2")):
        r = await _submit(client, _body(_at(url), user_image))
        got = await r.json()
        assert r.status == 400 and got["code"] == "bad_job", got
        assert f"resolves to {bad}, which is a link-local address" in got["error"]
    assert resolver.asked == ["cloud.example", "meta.example"] and sessions == []


async def test_private_clouds_need_the_setting(make_agent, user_image, counting_cloud, sessions):
    client, _ = await make_agent(allow_private_cloud=False)
    client.app[AGENT_STATE_KEY].resolve = _Resolver(lan_example=["10.1.2.3"], localhost=["127.0.0.1", "::1"])
    for url, what in (
        (counting_cloud.url, "'127.0.0.1' is a loopback"),
        ("http://lan.example", "'lan.example' resolves to 10.1.2.3, which is a private"),
        ("http://localhost:9", "'localhost' resolves to 127.0.0.1, which is a loopback"),
    ):
        r = await _submit(client, _body(_at(url), user_image))
        got = await r.json()
        assert r.status == 400 and got["code"] == "bad_job" and what in got["error"] and SETTING in got["error"], got
    assert counting_cloud.hits == [] and sessions == []


def test_private_clouds_are_allowed_by_default_only_on_a_loopback_agent():
    assert AgentConfig(token=PHONE_TOKEN).private_cloud_allowed is True
    lan = {"token": PHONE_TOKEN * 2, "host": "0.0.0.0", "allow_lan": True}
    assert AgentConfig(**lan).private_cloud_allowed is False
    assert AgentConfig(**lan, allow_private_cloud=True).private_cloud_allowed is True
    assert AgentConfig(token=PHONE_TOKEN, allow_private_cloud=False).private_cloud_allowed is False
    with pytest.raises(ValueError, match="allow_private_cloud must be True, False or None"):
        AgentConfig(token=PHONE_TOKEN, allow_private_cloud="yes")


async def test_the_agent_connects_only_to_the_checked_addresses(make_agent, user_image, counting_cloud):
    """A name resolved once, checked, then pinned: the manifest request goes to the checked address (here the
    counting cloud on 127.0.0.1; ``cloud.example`` has no DNS entry) and the edit gets the same addresses."""
    client, fake = await make_agent()
    client.app[AGENT_STATE_KEY].resolve = _Resolver(cloud_example=["127.0.0.1"])
    r = await _submit(client, _body(_at(f"http://cloud.example:{counting_cloud.port}"), user_image))
    assert r.status == 202, await r.text()
    assert counting_cloud.hits == [f"cloud.example:{counting_cloud.port}"]
    await asyncio.wait_for(_until(lambda: fake.requests), 30)
    assert fake.requests[0][0].source.addresses == ("127.0.0.1",)


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


# ---- redirects ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [302, 307])
async def test_a_redirecting_cloud_is_refused_and_its_target_never_asked(
    make_agent, aiohttp_server, user_image, status
):
    pair = await redirect_pair(aiohttp_server, status)
    client, fake = await make_agent()
    r = await _submit(client, _body(_at(pair.url), user_image))
    got = await r.json()
    assert r.status == 502 and got["code"] == "cloud_redirect", got
    assert pair.url in got["error"] and repr(pair.location) in got["error"] and got["location"] == pair.location
    assert pair.hits == [] and fake.requests == []


# ---- admission ------------------------------------------------------------------------------------------------
async def test_jobs_beyond_the_queue_never_reach_the_cloud(make_agent, user_image, counting_cloud, demo_model):
    """12 simultaneous jobs, 3 places (1 running + 2 queued): at most 3 manifest requests; 9 get 429 queue_full."""
    fake = FakeEdit(demo_model.adapter.num_layers)
    fake.gate.clear()  # the running job holds its place
    client, _ = await make_agent(fake, queue_size=2)
    counting_cloud.delay_s = 0.3  # every job is in flight before the first manifest arrives
    try:
        responses = await asyncio.gather(*(_submit(client, _body(counting_cloud, user_image)) for _ in range(12)))
        codes = sorted([r.status for r in responses])
        refused = [await r.json() for r in responses if r.status == 429]
    finally:
        fake.gate.set()
    assert codes == [202] * 3 + [429] * 9, codes
    assert all(x["code"] == "queue_full" for x in refused)
    assert len(counting_cloud.hits) <= 3, counting_cloud.hits


def test_the_cli_flag_sets_the_config_field():
    import argparse

    from android_bridge.cli_phone_agent import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    got = [
        parser.parse_args(argv).allow_private_cloud
        for argv in ([], ["--allow-private-cloud"], ["--no-allow-private-cloud"])
    ]
    assert got == [None, True, False]

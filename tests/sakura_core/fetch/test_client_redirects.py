"""The shard client never follows a redirect (catalog, manifest, shard): a 3xx is a ``RedirectRefusedError`` naming
the URL asked and the Location answered, and the redirect's target receives no request. Both servers on 127.0.0.1."""

import pytest
from redirecting import redirect_pair

from sakura_core.fetch.client import ClientConfig, FetchError, RedirectRefusedError, ShardClient

FAST = ClientConfig(
    backoff_initial_s=0.001, backoff_max_s=0.01, read_timeout_s=5, connect_timeout_s=2, retry_window_s=0, max_retries=0
)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("what", ["catalog", "manifest", "shard"])
async def test_a_redirect_is_an_error_and_never_followed(aiohttp_server, status, what):
    pair = await redirect_pair(aiohttp_server, status)
    async with ShardClient(pair.url, "read-token", config=FAST) as client:
        call = {
            "catalog": client.get_catalog,
            "manifest": lambda: client.get_manifest("tpl-a"),
            "shard": lambda: client.fetch_shard("ab" * 32),
        }[what]
        with pytest.raises(RedirectRefusedError) as info:
            await call()
    err = info.value
    assert isinstance(err, FetchError) and err.status == status and err.location == pair.location
    assert pair.url in str(err) and repr(pair.location) in str(err) and "do not follow redirects" in str(err)
    assert pair.hits == []  # the target received nothing: no request, no token

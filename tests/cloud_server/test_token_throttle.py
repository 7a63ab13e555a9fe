"""Wrong bearer tokens are rate limited per client address (issue 28): past ``max_token_failures`` in a window the
server answers 429 with ``Retry-After`` instead of 401, logs one line per interval, tracks a bounded number of
addresses; a right token is never limited, not even from the address that sent the wrong ones."""

import logging

import pytest

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from sakura_core.http_serving import TokenThrottle

from ..synthetic_templates import SyntheticModel, make_synthetic_template
from .conftest import MODEL_ID, READ_TOKEN, WRITE_TOKEN

WRONG = {"Authorization": "Bearer wrong-token-000"}
RIGHT = {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    from cloud_server.store import LocalStore

    store = LocalStore(tmp_path / "store")
    make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    cfg = ServerConfig(
        store_dir=store.root,
        model=None,
        write_token=WRITE_TOKEN,
        read_token=READ_TOKEN,
        max_token_failures=3,
        token_failure_window_s=60,
    )
    return await aiohttp_client(create_app(cfg, store=store, model=SyntheticModel(MODEL_ID)))


async def test_wrong_tokens_past_the_limit_get_429_and_right_ones_pass(client, caplog):
    caplog.set_level(logging.WARNING, logger="sakura_core.http_serving")
    for _ in range(3):
        assert (await client.get("/v1/templates", headers=WRONG)).status == 401
    for path in ("/v1/templates", "/v1/templates/tpl-a/manifest", "/v1/jobs/" + "0" * 32):
        r = await client.get(path, headers=WRONG)
        assert r.status == 429, (path, r.status)  # main: 401 for ever, at any rate
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert "too many wrong bearer tokens" in (await r.json())["error"]
    for _ in range(5):  # the same address with the right token: never limited
        assert (await client.get("/v1/templates", headers=RIGHT)).status == 200
    assert (await client.get("/v1/templates")).status == 429  # no token at all counts as a wrong one
    from sakura_core.fetch.client import ClientConfig, FetchError, ShardClient

    url = str(client.make_url("")).rstrip("/")
    async with ShardClient(url, "wrong-token-000", config=ClientConfig(backoff_initial_s=0.2)) as shards:
        with pytest.raises(FetchError, match="HTTP 429 .*too many wrong bearer tokens"):
            await shards.get_catalog()
        assert shards.stats.errors == {}  # Sakura-Retry: no: the client does not retry (no _Retry counted)
    lines = [r for r in caplog.records if "wrong bearer token" in r.getMessage()]
    assert len(lines) == 1 and lines[0].getMessage().startswith("refused 1 wrong bearer token(s)")


def test_the_window_ends_and_the_table_stays_bounded():
    now = [0.0]
    throttle = TokenThrottle(max_failures=2, window_s=10, max_addresses=8, log_interval_s=5, clock=lambda: now[0])
    assert [throttle.failed("10.0.0.1") for _ in range(3)] == [None, None, 10.0]
    now[0] = 7.5
    assert throttle.failed("10.0.0.1") == pytest.approx(2.5)  # Retry-After: the rest of the window
    now[0] = 10.0
    assert throttle.failed("10.0.0.1") is None  # a new window
    for i in range(1000):
        throttle.failed(f"10.1.{i // 256}.{i % 256}")
    assert len(throttle) == 8  # a flood of addresses keeps the table at its bound


def test_log_lines_are_one_per_interval(caplog):
    caplog.set_level(logging.WARNING, logger="sakura_core.http_serving")
    now = [0.0]
    throttle = TokenThrottle(max_failures=1, window_s=100, log_interval_s=10, clock=lambda: now[0])
    for t in range(30):
        now[0] = float(t)
        throttle.failed("10.0.0.2")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # t = 0, 10, 20
    assert lines[1].startswith("refused 10 wrong bearer token(s) in the last 10 s (10 rate limited")


@pytest.mark.parametrize("bad", [{"max_failures": 0}, {"window_s": 0}, {"max_addresses": 0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="TokenThrottle needs"):
        TokenThrottle(**bad)
    with pytest.raises(ValueError, match="token_failure_window_s"):
        ServerConfig(store_dir="/tmp/x", model=None, token_failure_window_s=0)

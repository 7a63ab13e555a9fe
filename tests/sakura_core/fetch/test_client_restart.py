"""Issue 15 point 9: a server restart (seconds of refused connections) is waited out and the fetch resumes,
instead of giving up after ~0.6 s and computing on the device."""

from aiohttp import web

from cloud_server.app import create_app
from cloud_server.config import ServerConfig
from cloud_server.store import LocalStore
from sakura_core.fetch.client import ClientConfig, ShardClient

from ...synthetic_templates import make_synthetic_template

MODEL_ID = "ab" * 32
RESTART_S = 4.0  # a `sakura serve` restart takes 3-4 s


class _RestartingServer:
    """A fake clock for the client's backoff that brings the server (back) up once RESTART_S seconds have passed."""

    def __init__(self, store: LocalStore, port: int):
        self.store, self.port = store, port
        self.waited_s = 0.0
        self.runner: web.AppRunner | None = None

    async def sleep(self, seconds: float) -> None:
        self.waited_s += seconds
        if self.runner is None and self.waited_s >= RESTART_S:
            app = create_app(ServerConfig(store_dir=self.store.root, model=None), store=self.store)
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_default_client_waits_out_a_restart_and_resumes(tmp_path, unused_tcp_port):
    store = LocalStore(tmp_path / "store")
    manifest = make_synthetic_template(store, "tpl-a", model_id=MODEL_ID)
    rep = manifest["shards"][0]["representations"][0]
    server = _RestartingServer(store, unused_tcp_port)
    try:
        async with ShardClient(f"http://127.0.0.1:{unused_tcp_port}", sleep=server.sleep) as client:
            assert (await client.get_manifest("tpl-a")).template_id == "tpl-a"
            await server.close()  # it goes down again (no partial body: the shard fetch starts while it is down)
            server.runner, server.waited_s = None, 0.0
            blob = await client.fetch_shard(rep["digest"], expected_bytes=rep["bytes"])
        assert blob == store.shard_path(rep["digest"]).read_bytes()
        assert RESTART_S <= server.waited_s <= RESTART_S + ClientConfig().backoff_max_s
    finally:
        await server.close()


def test_retry_window_is_validated():
    import pytest

    with pytest.raises(ValueError, match="retry_window_s"):
        ClientConfig(retry_window_s=-1)

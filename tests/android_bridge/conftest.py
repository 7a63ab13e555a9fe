"""Fixtures of the Android-bridge tests: the demo model, a store with one published template, a recording cloud
server (in a thread, on 127.0.0.1), and the emulated phone as a separate ``sakura phone-agent`` process."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ci_deps import QNN_WHEELS, require_or_skip

REPO = Path(__file__).resolve().parents[2]
PHONE_TOKEN = "pairing-token-0123"
WRITE_TOKEN = "cloud-write-token-0123"
TEMPLATE_ID = "tpl-astro"
PROMPT = "paint the cat as a watercolor portrait"


@pytest.fixture(scope="session")
def demo_model():
    from sakura_core.models.edit_model import load_demo_model

    return load_demo_model()


@pytest.fixture(scope="session")
def user_image(demo_model):
    from sakura_core.models.edit_model import load_image

    return load_image("chelsea", demo_model.spec.image_size)


@pytest.fixture(scope="session")
def store(tmp_path_factory, demo_model):
    """A local store holding ``TEMPLATE_ID`` published with the real codec for the demo model."""
    import torch

    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_image

    store = LocalStore(tmp_path_factory.mktemp("cloud-store"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 cores shared with other jobs: more threads only contend
    try:
        image = load_image("astronaut", demo_model.spec.image_size)
        publish_template(store, demo_model, image, TEMPLATE_ID, store_profile="full")  # fetch-fp16 exactness tests
    finally:
        torch.set_num_threads(threads)
    return store


class RecordingCloud:
    """``cloud_server.create_app`` with an outermost middleware recording every request's method, path, headers
    and body; served from a thread with its own event loop on 127.0.0.1, so sync and async tests can use it."""

    def __init__(self, store, *, write_token: str | None = WRITE_TOKEN):
        from cloud_server.app import create_app
        from cloud_server.config import ServerConfig

        self.records: list[dict] = []
        self.app = create_app(ServerConfig(store_dir=store.root, model=None, write_token=write_token), store=store)
        self.app.middlewares.insert(0, self._make_record())
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="recording-cloud", daemon=True)
        self.url = ""
        self.error: BaseException | None = None

    def _make_record(self):
        from aiohttp import web

        @web.middleware
        async def record(request, handler):
            body = await request.read() if request.can_read_body else b""
            self.records.append(
                {
                    "method": request.method,
                    "path": request.path_qs,
                    "headers": list(request.headers.items()),
                    "body": body,
                }
            )
            return await handler(request)

        return record

    def _serve(self) -> None:
        from aiohttp import web

        from sakura_core.http_serving import bound_port

        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            runner = web.AppRunner(self.app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{bound_port(runner)}"
            self._stop = asyncio.Event()
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

        try:
            self._loop.run_until_complete(main())
        except BaseException as e:  # noqa: BLE001 - surfaced by __enter__
            self.error = e
            self._started.set()

    def __enter__(self) -> RecordingCloud:
        self._thread.start()
        if not self._started.wait(60) or self.error is not None:
            raise RuntimeError(f"recording cloud server did not start: {self.error!r}")
        return self

    def __exit__(self, *exc) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def cloud(store):
    with RecordingCloud(store) as server:
        yield server


class AgentProcess:
    """``sakura phone-agent`` on a free 127.0.0.1 port, started at construction; ``url()`` waits until it listens."""

    def __init__(self, *extra: str):
        argv = [
            sys.executable,
            "-m",
            "sakura_core.cli",
            "phone-agent",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--token",
            PHONE_TOKEN,
            "--threads",
            "1",
            *extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        self.lines: list[str] = []
        self._found: dict[str, str] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m and not self._ready.is_set():
                self._found["url"] = m.group(1)
                self._ready.set()
        self._ready.set()

    def url(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1) and time.monotonic() < deadline:
            pass
        if "url" not in self._found:
            self.stop()
            raise RuntimeError("sakura phone-agent did not start:\n" + "".join(self.lines[-30:]))
        return self._found["url"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def agents():
    """Both emulated phones, launched together (their start-up overlaps the template's precompute): the default
    NPU profile, and one whose memory budget (0.25 MiB) no job fits."""
    procs = {"default": AgentProcess(), "tiny-budget": AgentProcess("--memory-budget-mib", "0.25")}
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


@pytest.fixture(scope="module")
def agent(agents, store):
    return agents["default"].url()


# ---- the QNN backend (npu tests): built once per test session into a temporary cache ----------------------------
@pytest.fixture(scope="session")
def qnn_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("qnn-cache")


@pytest.fixture(scope="session")
def qnn_backend(demo_model, qnn_cache):
    from android_bridge.qnn import qnn_available

    require_or_skip(*qnn_available(), ci_installs=QNN_WHEELS)
    import torch

    from android_bridge.npu_build import QnnBuildConfig, open_qnn_backend

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return open_qnn_backend(demo_model, QnnBuildConfig(cache_root=qnn_cache))  # builds once (~2 min here)
    finally:
        torch.set_num_threads(threads)

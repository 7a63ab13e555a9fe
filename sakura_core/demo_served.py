"""The served part of ``sakura demo``: a real server on loopback, a precomputed template, edits over a shaped link.

Starts the cloud server in-process on 127.0.0.1 (a temporary store), publishes the demo template with the SAKURA
and the CacheGen ladders, then edits the user image with each policy through the in-process shaper following a
shipped trace, on this CPU. Returns one row per policy; the caller prints and saves them.
"""

from __future__ import annotations

import asyncio
import tempfile
from importlib import resources

import numpy as np

from .models.demo import DemoModel
from .runtime.pipeline import LiveProfile
from .runtime.session import EditRequest, edit_from_server

__all__ = ["DEMO_POLICIES", "run_served_demo"]

DEMO_POLICIES = ("on-device", "on-device-cached", "fetch-fp16", "cachegen", "throughput", "sakura")


async def _serve_and_edit(model, template, user, prompt, steps, seed, trace_path, profile, policies, progress):
    from aiohttp import web

    from cloud_server.app import bound_port, create_app
    from cloud_server.config import ServerConfig
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore

    rows = []
    with tempfile.TemporaryDirectory(prefix="sakura-demo-store-") as tmp:
        store = LocalStore(tmp)
        for codec, tid in (("sakura", "demo-template"), ("cachegen", "demo-template-cachegen")):
            await asyncio.to_thread(publish_template, store, model, template, tid, codec=codec)
            progress(f"server: published {tid} ({codec} ladder)")
        app = create_app(ServerConfig(store_dir=tmp, host="127.0.0.1", port=0, model=None))
        runner = web.AppRunner(app, access_log=None)  # no aiohttp access line per shard request on the console
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{bound_port(runner)}"
        progress(f"server: listening on {url}")
        try:
            for name in policies:
                tid = "demo-template-cachegen" if name == "cachegen" else "demo-template"
                req = EditRequest(
                    url, tid, prompt, steps=steps, seed=seed, policy=name, bandwidth=f"trace:{trace_path}"
                )
                out = await edit_from_server(model, req, user, profile=profile)
                r = out.report
                rows.append({"policy": name, "latency_s": r["latency_s"], "bytes_fetched": r["bytes_fetched"],
                             "split_layer": r["split_layer"], "fallbacks": r["fallbacks"], "image": out.image,
                             "timeline": r["timeline"], "decisions": r["decisions"]})  # fmt: skip
                progress(f"phone: {name:<17} {r['latency_s']:6.2f} s  {r['bytes_fetched'] / 1024:8.1f} KiB  "
                         f"split {r['split_layer']}")  # fmt: skip
        finally:
            await runner.cleanup()
    return rows


def run_served_demo(
    model: DemoModel,
    template: np.ndarray,
    user: np.ndarray,
    prompt: str,
    *,
    steps: int,
    seed: int,
    profile: LiveProfile,
    trace_name: str = "norway_bus_1",
    policies=DEMO_POLICIES,
    progress=lambda msg: None,
) -> list[dict]:
    trace_path = str(resources.files("sakura_core.fetch").joinpath("traces", trace_name))
    return asyncio.run(
        _serve_and_edit(model, template, user, prompt, steps, seed, trace_path, profile, policies, progress)
    )

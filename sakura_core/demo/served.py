"""The served part of ``sakura demo``: a real server on loopback, a precomputed template, edits over a shaped link.

Starts the cloud server in-process on 127.0.0.1 (a temporary store), publishes the demo template with the SAKURA
and the CacheGen ladders, then edits the user image with each policy through the in-process shaper following a
shipped trace, on this CPU. With ``per_step_policies``, it also publishes the template in ``per-step`` KV mode
(one KV per (step, layer) for the edit's step count) and edits with those policies against it. Returns one row per
(KV mode, policy), with what the run did (``ran``: the split, or what a fallback computed here instead); the caller
prints and saves them.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from importlib import resources

import numpy as np

from ..edit import EditRequest, EditSettings, FetchSettings, ServerSource, edit_from_server
from ..edit_report import KVUse
from ..fetch.link import LinkSpec
from ..models.edit_model import EditModel
from ..precompute import precompute_template
from ..runtime.live_profile import LiveProfile

__all__ = ["DEMO_POLICIES", "PER_STEP_POLICIES", "run_served_demo"]

DEMO_POLICIES = ("on-device", "on-device-cached", "fetch-fp16", "cachegen", "throughput", "sakura")
PER_STEP_POLICIES = ("on-device", "fetch-fp16", "sakura")  # per-step mode: the template at every step on the device


async def _serve_and_edit(
    model, template, user, prompt, steps, seed, trace_path, profile, policies, progress, per_step_policies=()
):
    from aiohttp import web

    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore

    from ..http_serving import bound_port

    rows = []
    link = LinkSpec.trace_file(trace_path)  # read once, for every policy
    with tempfile.TemporaryDirectory(prefix="sakura-demo-store-") as tmp:
        store = LocalStore(tmp)
        for codec, tid in (("sakura", "demo-template"), ("cachegen", "demo-template-cachegen")):
            # full: the demo runs the fetch-fp16 baseline, which fetches the exact fp16 a serving store does not hold
            await asyncio.to_thread(publish_template, store, model, template, tid, codec=codec, store_profile="full")
            progress(f"server: published {tid} ({codec} ladder)")
        if per_step_policies:
            quick = functools.partial(precompute_template, held_out_probes=1)  # one held-out probe: a quick demo
            await asyncio.to_thread(
                publish_template,
                store,
                model,
                template,
                "demo-template-per-step",
                kv_mode="per-step",
                steps=steps,
                precompute_fn=quick,
                store_profile="full",
            )
            progress(f"server: published demo-template-per-step (sakura ladder, per-step KV for {steps} steps)")
        runner = web.AppRunner(
            create_app(ServerConfig(store_dir=tmp, host="127.0.0.1", port=0, model=None)), access_log=None
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{bound_port(runner)}"
        progress(f"server: listening on {url}")
        try:
            runs = [("single", name) for name in policies] + [("per-step", name) for name in per_step_policies]
            for kv_mode, name in runs:
                tid = "demo-template-cachegen" if name == "cachegen" else "demo-template"
                tid = "demo-template-per-step" if kv_mode == "per-step" else tid
                settings = EditSettings(prompt, steps, seed, FetchSettings(name, link))
                req = EditRequest(ServerSource(url), tid, settings)
                out = await edit_from_server(model, req, user, profile=profile)
                r = out.report
                # what the compute lane did: the split, or what a fallback computed here instead
                ran = KVUse.of_run(out.run, model.adapter.num_layers).compute_clause()
                rows.append(
                    {
                        "policy": name,
                        "kv_mode": kv_mode,
                        "latency_s": r["latency_s"],
                        "bytes_fetched": r["bytes_fetched"],
                        "bytes_used": r["bytes_used"],
                        "split_layer": r["split_layer"],
                        "ran": ran,
                        "fallbacks": r["fallbacks"],
                        "image": out.image,
                        "timeline": r["timeline"],
                        "decisions": r["decisions"],
                        "report": r,
                    }
                )
                progress(
                    f"phone: {kv_mode:<8} {name:<17} {r['latency_s']:6.2f} s  "
                    f"{r['bytes_fetched'] / 1024:8.1f} KiB fetched  {r['bytes_used'] / 1024:8.1f} KiB used  "
                    f"{ran}"
                )
        finally:
            await runner.cleanup()
    return rows


def run_served_demo(
    model: EditModel,
    template: np.ndarray,
    user: np.ndarray,
    prompt: str,
    *,
    steps: int,
    seed: int,
    profile: LiveProfile,
    trace_name: str = "norway_bus_1",
    policies=DEMO_POLICIES,
    per_step_policies=(),
    progress=lambda msg: None,
) -> list[dict]:
    trace_path = str(resources.files("sakura_core.fetch").joinpath("traces").joinpath(trace_name))
    return asyncio.run(
        _serve_and_edit(
            model, template, user, prompt, steps, seed, trace_path, profile, policies, progress, per_step_policies
        )
    )

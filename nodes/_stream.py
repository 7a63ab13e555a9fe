"""What flows between the Sakura nodes: the template handle, the KV stream and the per-run state of one edit.

``KVStream`` is the ``SAKURA_KV_STREAM`` value. The fetch node creates it and calls :meth:`KVStream.start`, which
fetches, in a background thread, what every run of this template needs before its first layer: the template image
named by the manifest (the device computes template layers from it, and it is the fallback when a shard fails),
over a connection opened to the server (or to a loopback server over a local store). The rest of the graph runs
meanwhile; the sampler then joins that prefetch and runs the pipelined edit, whose fetch lane streams the shards
the policy picks while the device computes (``sakura_core.runtime.pipeline``).

The edit itself is the second half of ``sakura_core.runtime.session.edit_from_server`` (policy, ladders from the
manifest, quality floor, ``run_pipelined_edit``): the first half — manifest and template image — is what the
stream already holds, checked against the model when the template was loaded.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np

from sakura_core.policy.plan import runnable_policies

from ._common import start_async

__all__ = [
    "EditRun",
    "FetchSettings",
    "KVStream",
    "Prefetched",
    "TemplateHandle",
    "open_base_url",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateHandle:
    """``SAKURA_TEMPLATE``: a published template, where it is served, and its manifest (checked against a model).

    Attributes:
        template_id: the template's id.
        model_id: content id of the model the manifest was checked against.
        server_url: SAKURA server (or CDN) base URL; ``None`` for a local store.
        store_dir: local store folder (served on a loopback port for each run); ``None`` for a server.
        token: bearer token of the server's read path (never shown in reprs or reports).
        manifest_json: the manifest as fetched.
    """

    template_id: str
    model_id: str
    server_url: str | None
    store_dir: str | None
    token: str | None = field(default=None, repr=False)
    manifest_json: str = field(default="{}", repr=False)

    def __post_init__(self) -> None:
        if (self.server_url is None) == (self.store_dir is None):
            raise ValueError("a template comes from exactly one of server_url and store_dir")

    @property
    def source(self) -> str:
        return self.server_url if self.server_url is not None else f"store:{self.store_dir}"

    def manifest(self) -> dict:
        return json.loads(self.manifest_json)

    def summary(self) -> dict:
        """What a report shows about the template: ids, geometry and bytes per representation level."""
        m = self.manifest()
        levels: dict[str, int] = {}
        for shard in m["shards"]:
            for rep in shard["representations"]:
                name = rep.get("name", str(rep["level"]))
                levels[name] = levels.get(name, 0) + rep["bytes"]
        return {
            "template_id": self.template_id,
            "model_id": self.model_id,
            "source": self.source,
            "token_grid": m["token_grid"],
            "num_layers": len(m["shards"]),
            "bytes_per_level": levels,
        }


@asynccontextmanager
async def open_base_url(template: TemplateHandle) -> AsyncIterator[str]:
    """The base URL to fetch ``template`` from: its server, or a read-only loopback server over its local store."""
    if template.server_url is not None:
        yield template.server_url
        return
    from aiohttp import web

    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from sakura_core.io_utils import bound_port

    config = ServerConfig(store_dir=template.store_dir, host="127.0.0.1", port=0, model=None)
    runner = web.AppRunner(create_app(config), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, 0)
        await site.start()
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class FetchSettings:
    """How a run fetches its KV.

    Attributes:
        policy: fetch policy name (one of :func:`runnable_policies`).
        bandwidth: "live" (the real link), "fixed:<Mbit/s>" or "trace:<path>" (emulated link, paced in the client).
        latency_target_s: the edit's latency target in seconds, or None.
    """

    policy: str = "sakura"
    bandwidth: str = "live"
    latency_target_s: float | None = None

    def __post_init__(self) -> None:
        from sakura_core.runtime.session import parse_bandwidth

        if self.policy not in runnable_policies():
            raise ValueError(
                f"policy {self.policy!r} cannot run an edit; choose one of {', '.join(runnable_policies())}"
            )
        parse_bandwidth(self.bandwidth)  # raises with the bad value named (and loads a trace file once)


@dataclass(frozen=True)
class Prefetched:
    """What the background prefetch brought: the template image file and when it was fetched (monotonic s)."""

    template_image: bytes
    started_s: float
    finished_s: float


class KVStream:
    """``SAKURA_KV_STREAM``: a template, fetch settings, and the background prefetch of the template image.

    The prefetch result is immutable and shared by every sampler run that gets this stream (ComfyUI reuses a
    cached output); a prefetch that failed is started again by the next :meth:`join`.
    """

    def __init__(self, template: TemplateHandle, settings: FetchSettings):
        self.template = template
        self.settings = settings
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None
        self.attempts = 0  # prefetches started

    def __repr__(self) -> str:
        return f"KVStream({self.template.template_id!r}, {self.settings})"

    def start(self) -> concurrent.futures.Future:
        """Start the prefetch unless it is running or done; returns its future."""
        with self._lock:
            failed = self._future is not None and self._future.done() and self._future.exception() is not None
            if self._future is None or failed:
                if failed:
                    logger.info("template %s: the last prefetch failed; fetching again", self.template.template_id)
                self._future = start_async(self._prefetch, name=f"sakura-prefetch-{self.template.template_id}")
                self.attempts += 1
            return self._future

    def join(self) -> concurrent.futures.Future:
        """The prefetch future to wait on (started again if the last attempt failed)."""
        return self.start()

    async def _prefetch(self) -> Prefetched:
        from sakura_core.fetch.client import ShardClient

        t0 = time.monotonic()
        manifest = self.template.manifest()
        image = manifest.get("template_image")
        if not image:
            raise ValueError(
                f"template {self.template.template_id!r}: its manifest names no template_image; republish it"
            )
        async with open_base_url(self.template) as url, ShardClient(url, self.template.token) as client:
            blob = await client.fetch_shard(image["digest"], expected_bytes=image["bytes"])
        return Prefetched(blob, t0, time.monotonic())


class EditRun:
    """Per-run state of one sampler execution: the cancel event and the progress counter.

    ``on_layer`` is called by the compute thread before each layer; the node's waiting loop reads
    ``layers_started`` for the progress bar and sets ``cancel`` on an interrupt. Call :meth:`reset` before reuse.
    """

    def __init__(self, steps: int, layers: int):
        self.steps = steps
        self.layers = layers
        self.reset()

    @property
    def total(self) -> int:
        return self.steps * self.layers

    def reset(self) -> None:
        self.cancel = threading.Event()
        self.layers_started = 0

    def on_layer(self, step: int, layer: int) -> None:
        self.layers_started = step * self.layers + layer + 1


async def run_edit(
    stream: KVStream,
    prefetched: Prefetched,
    model,
    user_image: np.ndarray,
    prompt: str,
    *,
    steps: int,
    seed: int,
    run: EditRun,
) -> tuple[np.ndarray, dict]:
    """One pipelined edit of ``user_image`` against the stream's template; returns (image, report)."""
    from sakura_core.fetch.client import ShardClient
    from sakura_core.runtime.live_profile import measure_profile
    from sakura_core.runtime.pipeline import RuntimeConfig, run_pipelined_edit
    from sakura_core.runtime.session import parse_bandwidth, plan_fetch, shaped_fetcher, template_image_from_manifest

    template = stream.template
    if template.model_id != model.model_id:
        raise ValueError(
            f"template {template.template_id!r} was loaded for model {template.model_id[:16]}, but the sampler got "
            f"model {model.model_id[:16]}; connect the same Sakura Model Loader to both nodes"
        )
    manifest = template.manifest()
    template_image = template_image_from_manifest(prefetched.template_image, model.spec.image_size)
    profile = measure_profile(model, steps)
    trace = parse_bandwidth(stream.settings.bandwidth)
    plan = plan_fetch(manifest, stream.settings.policy)

    async with open_base_url(template) as url, ShardClient(url, template.token) as client:
        t0 = time.monotonic()
        report = await run_pipelined_edit(
            model, manifest, shaped_fetcher(client, trace), user_image, prompt, policy=plan.policy,
            ladders=plan.ladders, reps=plan.reps, floor=plan.floor, profile=profile, template_image=template_image,
            trace=trace,
            config=RuntimeConfig(steps=steps, seed=seed, latency_target_s=stream.settings.latency_target_s),
            cancel=run.cancel, on_layer=run.on_layer,
        )  # fmt: skip
    prefetch_event = {
        "lane": "fetch",
        "start": prefetched.started_s - t0,
        "end": prefetched.finished_s - t0,
        "layer": -1,
        "level": "template image (prefetched)",
    }
    out = {
        "policy": report.policy,
        "template": template.summary(),
        "bandwidth": stream.settings.bandwidth,
        "latency_target_s": stream.settings.latency_target_s,
        "steps": steps,
        "seed": seed,
        "latency_s": report.latency_s,
        "bytes_fetched": report.bytes_fetched,
        "split_layer": report.split_layer,
        "levels_used": report.levels_used,
        "floor_level": plan.floor_name,
        "decisions": report.decisions,
        "fallbacks": report.fallbacks,
        "profile": {"layer_full_s": profile.layer_full_s, "layer_cached_s": profile.layer_cached_s},
        "prefetch": {
            "what": "template image",
            "bytes": len(prefetched.template_image),
            "seconds": prefetched.finished_s - prefetched.started_s,
            "done_before_edit_s": t0 - prefetched.finished_s,
        },
        "timeline": [prefetch_event, *report.events],
        "timeline_origin": "seconds since the pipelined edit started; negative = before it (prefetch)",
    }
    return report.image, out

"""The pipelined phone runtime: fetch (aiohttp, streaming), decode (thread pool) and compute (a backend: torch, or the
QNN HTP graphs of ``android_bridge.qnn_backend``) concurrently.

Step 0 is a hybrid forward whose split is decided while it runs: before each layer the policy says whether the
device keeps running the template tokens (compute) or drops them and uses the fetched shard. The fetch lane asks
the same policy, whenever the link is free, which shard to fetch at which level (or to skip it because the device
will compute it), and, once every needed shard is fetched, which shard to upgrade with a progressive enhancement
while later steps run. Policies see the same :class:`~sakura_core.policy.context.Context` as in the simulation.

Failures never produce a silently wrong result: a shard that cannot be fetched or decoded is retried at the floor
level; if that fails too, the device computes the template KV itself (the template-only pass, resumed where the step
dropped the template tokens: their hidden state is kept there) and the report says so.
A shard that is late is waited for while the policy (asked every cached-layer time, ``recompute_late``) finds a
template pass on the device no sooner, at most ``shard_wait_s``. Every event lands in the timeline.

Per-step KV mode (the per-step shard protocol of :mod:`sakura_core.policy.context`): the template pass restarts at
every step and shard ``g = step * L + layer`` holds the KV of one (step, layer). The fetch lane walks ``g`` in order,
so step s+1's shards stream and decode while step s computes; on entering a step the compute lane sets
``template_alive`` again and asks ``keep_template(ctx, g)`` per layer until it drops (one split ``k_s`` per step).
A failed shard falls back to a template-only pass at that step's own time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..fetch.traces import Trace
from ..kv.chain import ChainDecoder
from ..kv.manifest import check_schedule, manifest_kv_mode
from ..models.edit_model import EditModel
from ..policy.context import Context
from ..policy.estimator import ThroughputEstimator
from ..policy.ladder import Level
from ..policy.policies import Policy
from .backend import ComputeBackend, backend_of
from .decode_lane import DecodeLane
from .denoise import run_edit
from .fetch_lane import FetchLane, takes_on_chunk
from .late_shards import LateShards
from .live_profile import LiveProfile
from .live_state import LiveState
from .pipeline_config import Cancelled, RunReport, RuntimeConfig
from .schedule import flow_timesteps

__all__ = ["Cancelled", "PipelinedEdit", "RunReport", "RuntimeConfig", "run_pipelined_edit"]

logger = logging.getLogger(__name__)


class PipelinedEdit(FetchLane, DecodeLane, LateShards):
    """One pipelined edit: a fetch lane (base shards, then upgrades while the link is idle), a decode lane (thread
    pool), a compute lane (the edit in a worker thread) and the stall accounting between them.

    The inputs are fixed at construction; everything a run changes lives in attributes that :meth:`reset` makes
    afresh (:meth:`run` calls it first), so one instance can run the same edit again and each run's report owns its
    own lists (one run at a time per instance). Mirrors :class:`~sakura_core.runtime.simulate._Sim`, which plays
    the same lanes against a trace.

    Args:
        fetch_blob: ``async (digest, nbytes[, on_chunk]) -> bytes`` (a ShardClient's fetch, shaped by the caller:
            ``fetch.link.shaped_fetcher``); with ``on_chunk``, called with each chunk's size, the policy sees a
            transfer while it lasts (a stalled one too), as in the simulator.
        ladders/reps: from :func:`ladders_from_manifest`.
        floor: index of the cheapest level the policy may pick (quality floor).
        profile: measured per-layer compute times.
        template_image: the public template image (for layers the device computes).
        trace: the link's trace, for the policies that read it (cachegen's rule, the oracle).
        cancel: set it to stop between layers (raises :class:`Cancelled`).
        on_layer: ``(step, layer)`` before each layer (progress reporting).
        backend: what runs the model's blocks (:mod:`sakura_core.runtime.backend`); None = the torch adapter.
    """

    def __init__(
        self,
        model: EditModel,
        manifest: dict,
        fetch_blob,
        user_image: np.ndarray,
        prompt: str,
        *,
        policy: Policy,
        ladders: list[list[Level]],
        reps: list[list[dict]],
        floor: int,
        profile: LiveProfile,
        template_image: np.ndarray,
        trace: Trace | None = None,
        config: RuntimeConfig | None = None,
        cancel: threading.Event | None = None,
        on_layer: Callable[[int, int], None] | None = None,
        backend: ComputeBackend | None = None,
    ) -> None:
        self.model, self.adapter = model, model.adapter
        self.backend = backend_of(model, backend)
        self.L = self.adapter.num_layers
        self.cfg = config or RuntimeConfig()
        self.kv_mode = manifest_kv_mode(manifest)
        self.per_step = self.kv_mode == "per-step"
        self.times = flow_timesteps(self.cfg.steps)  # the edit's schedule (shift 1)
        if self.per_step:  # the KV of step s is only valid at the schedule it was computed for
            check_schedule(manifest, self.cfg.steps, 1.0, timesteps=[float(t) for t in self.times[:-1]])
        self.N = self.L * (self.cfg.steps if self.per_step else 1)  # shards: g = step * L + layer
        if len(ladders) != self.N:
            what = f"{self.cfg.steps} steps x {self.L} layers" if self.per_step else f"{self.L} layers"
            raise ValueError(f"{len(ladders)} shard ladders for a {self.kv_mode} template, the edit needs {what}")
        self.manifest, self.fetch_blob = manifest, fetch_blob
        self.reports_chunks = takes_on_chunk(fetch_blob)
        self.user_image, self.prompt, self.template_image = user_image, prompt, template_image
        self.policy, self.ladders, self.reps, self.floor = policy, ladders, reps, floor
        self.profile, self.trace = profile, trace
        self.cancel = cancel or threading.Event()
        self.user_hook = on_layer
        self.reset()

    def reset(self) -> None:
        """Fresh per-run state: clock, estimator, policy, timeline, shards, decoders, stall and split bookkeeping."""
        cfg = self.cfg
        self.estimator = ThroughputEstimator()
        trace = self.trace or Trace.constant(1e4)
        self.st = LiveState(self.profile, trace, self.ladders, self.floor, self.estimator, cfg.rtt_s,
                            cfg.latency_target_s, layers_per_step=self.L)  # fmt: skip
        self.ctx = Context(self.st)
        self.policy.reset()
        self.events: list[dict] = []
        self.decisions: list[dict] = []
        self.fallbacks: list[str] = []
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # shard g -> (k, v, level)
        self.ready = {g: threading.Event() for g in range(self.N)}
        self.failed: set[int] = set()
        self.deferred: list[int] = []  # shards the policy said "not now" to: asked again while the link would idle
        self._deferred_sig: tuple | None = None  # the state of the last "not now" to all of them (fetch_lane)
        self.levels_used: dict[int, list[str]] = {}
        self.kv_bytes = self.peak_kv_bytes = 0  # template KV held now (fetched + the device's), and its peak
        self.released_below = 0  # per-step: shards g below this served their (step, layer): their KV is freed
        self.kept_refs: set[int] = set()  # cross-step: shards kept as the reference of a shard in flight
        self.shard_kv_nbytes = 0  # one decoded shard's K and V (0 until one is decoded)
        self.bytes_fetched = 0
        self.split_layer = self.L
        self.split_layers = [self.L] * (self.cfg.steps if self.per_step else 1)  # k_s per step (per-step mode)
        self.step = -1  # the step the compute lane is in
        self.decoders: dict[int, tuple[list[str], ChainDecoder]] = {}  # layer -> (digests pushed, its decoder)
        self.decoder_lock = threading.Lock()
        self.fallback_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shard g -> the device's KV
        self.dropped: dict[int, tuple[int, torch.Tensor]] = {}  # step -> (drop layer, template hidden state there)
        self.span_t, self.span_key = 0.0, None  # the compute span open since the last layer hook
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._done: asyncio.Event | None = None

    # ---- timeline

    def event(self, lane: str, start: float, end: float, layer: int, level) -> None:
        self.events.append({"lane": lane, "start": start, "end": end, "layer": layer, "level": level})

    # ---- compute lane (waiting for shards, giving up on them: late_shards.LateShards)

    def kv_source(self, layer: int, step: int):
        """The KV the compute lane uses for ``layer`` at ``step``: the fetched shard (of that step, in per-step
        mode), or the device's."""
        g = step * self.L + layer if self.per_step else layer
        if g not in self.failed and not self.ready[g].is_set():
            self.wait_for_shard(g, step)
        if g in self.failed:
            k, v = self.device_kv(g)
            self.levels_used.setdefault(g, []).append("device")
            return k, v
        with self.st.lock:
            k, v, level = self.kv[g]
        self.levels_used.setdefault(g, []).append(self.ladders[g][level].name)
        return k.unsqueeze(0), v.unsqueeze(0)

    def on_layer(self, step: int, layer: int) -> None:
        """Before each layer: cancellation, the caller's hook, and the compute span of the previous layer."""
        if self.cancel.is_set():
            raise Cancelled(f"edit cancelled at step {step}, layer {layer}")
        if self.user_hook is not None:
            self.user_hook(step, layer)
        now = self.st.now
        self.close_compute_span(now)
        with self.st.lock:
            if self.per_step and step != self.step:  # the template pass restarts at every step
                self.st.template_alive, self.st.dropped_at = True, self.L
            self.step = step
            self.st.compute_layer, self.st.compute_t = self._g(layer), now
            if self.per_step:
                self.release_before(self._g(layer))
        self.span_t = now
        live = self.st.template_alive and (step == 0 or self.per_step or self.policy.template_every_step)
        self.span_key = (step, layer, "template" if live else "cached")

    def _g(self, layer: int) -> int:
        """The shard index of ``layer`` at the step the compute lane is in."""
        return max(self.step, 0) * self.L + layer if self.per_step else layer

    def close_compute_span(self, end: float) -> None:
        """Record the compute span open since the last layer hook (if any) as ending at ``end``."""
        if self.span_key is not None:
            _, layer, level = self.span_key
            self.event("compute", self.span_t, end, layer, level)

    def keep_template(self, layer: int) -> bool:
        """The split (step 0's; every step's in per-step mode): ask the policy whether the device keeps computing
        the template tokens at ``layer``."""
        st, g = self.st, self._g(layer)
        with st.lock:
            st.compute_layer, st.compute_t = g, st.now
            keep = self.policy.keep_template(self.ctx, g)
            if not keep:
                st.template_alive = False
                st.dropped_at = layer
                self.split_layers[max(self.step, 0) if self.per_step else 0] = layer
                if self.step <= 0:
                    self.split_layer = layer
        if keep and self.per_step:
            self.levels_used[g] = ["template"]
        if not keep:
            if self.span_key is not None and self.span_key[1] == layer:  # the span opened for this layer: no template
                self.span_key = (*self.span_key[:2], "cached")
            where = f"step {self.step} layer {layer}" if self.per_step else f"layer {layer}"
            self.decisions.append({"t": st.now, "layer": g, "level": "drop", "reason": f"template dropped at {where}"})
        return keep

    def compute_lane(self):
        """The edit itself (runs in a worker thread)."""
        cfg = self.cfg
        if self.policy.kv_preloaded:
            raise ValueError("free-kv is a simulation-only bound")
        if self.policy.template_every_step:
            self.st.template_alive = True
            return run_edit(self.model, self.user_image, self.prompt, steps=cfg.steps, seed=cfg.seed,
                            split_layer=self.L, template_image=self.template_image, template_every_step=True,
                            on_layer=self.on_layer, kv_mode=self.kv_mode, backend=self.backend)  # fmt: skip
        return run_edit(self.model, self.user_image, self.prompt, steps=cfg.steps, seed=cfg.seed,
                        split_layer=self.keep_template, kv_source=self.kv_source, template_image=self.template_image,
                        on_layer=self.on_layer, kv_mode=self.kv_mode, backend=self.backend,
                        on_drop=self._on_drop, on_extracted=self.keep_device_kv)  # fmt: skip

    # ---- the run

    async def run(self) -> RunReport:
        """Run the edit with the lanes overlapped (after :meth:`reset`)."""
        self.reset()
        self._loop = asyncio.get_running_loop()
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.decode_threads, thread_name_prefix="sakura-decode")
        self._done = asyncio.Event()
        fetch_task = asyncio.create_task(self.fetch_lane())
        try:
            result = await asyncio.to_thread(self.compute_lane)
            self.close_compute_span(self.st.now)
        finally:
            self._done.set()
            if not fetch_task.done():
                fetch_task.cancel()
            try:
                await fetch_task
            except asyncio.CancelledError:
                pass
            self._pool.shutdown(wait=True)
        return RunReport(
            policy=self.policy.name,
            latency_s=self.st.now,
            bytes_fetched=self.bytes_fetched,
            split_layer=self.split_layer if not self.policy.template_every_step else self.L,
            image=result.image,
            tokens=result.tokens,
            events=self.events,
            decisions=self.decisions,
            fallbacks=self.fallbacks,
            levels_used=self.levels_used,
            kv_mode=self.kv_mode,
            layers_per_step=self.L,
            peak_kv_bytes=self.peak_kv_bytes,
            split_layers=list(self.split_layers) if not self.policy.template_every_step else [],
        )


async def run_pipelined_edit(*args, **kwargs) -> RunReport:
    """Run one edit with the three lanes overlapped: a :class:`PipelinedEdit` (same arguments) run once."""
    return await PipelinedEdit(*args, **kwargs).run()

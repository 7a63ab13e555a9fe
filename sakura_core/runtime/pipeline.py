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

The lanes are objects that own their state (:mod:`~sakura_core.runtime.fetch_lane`,
:mod:`~sakura_core.runtime.decode_lane`, :mod:`~sakura_core.runtime.compute_lane` with
:mod:`~sakura_core.runtime.late_shards` and :mod:`~sakura_core.runtime.device_kv`); they meet in
:class:`~sakura_core.runtime.held_kv.HeldKV` (the shards and their KV) and share only the live state the policy
reads (:class:`~sakura_core.runtime.live_state.LiveState`, with the clock) and the run's log
(:class:`~sakura_core.runtime.run_log.RunLog`). Shards are :class:`~sakura_core.runtime.shard_index.ShardId`
(step, layer, and the flat ``g`` the policy protocol uses).

Threads: a run uses the caller's event loop (the fetch lane and the transfers), one worker thread of its own for the
compute lane, and the decode pool (``LiveSettings.decode_threads``); it starts no event loop. The policy is asked
from the loop (the fetch lane) and from the compute thread (the forward's hooks: ``keep_template``, and
``recompute_late`` while a shard is late), always under ``LiveState.lock`` and at one frozen moment per batch of
link decisions; HeldKV and the decode lane each guard their own state with their own lock, taken after
``LiveState.lock`` where both are held. Anything the run starts (the compute thread, fetches the compute lane asked
for) ends with it; a run cancelled as a task stops its compute thread at the next layer or shard wait.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ..fetch.traces import Trace
from ..kv.manifest import Manifest, as_manifest, check_schedule
from ..policy.context import Context
from ..policy.plan import FetchPlan
from .backend import backend_of
from .compute_lane import ComputeLane
from .decode_lane import DecodeLane
from .device_kv import DeviceKV
from .fetch_lane import FetchLane
from .held_kv import HeldKV
from .lane_parts import EditInputs, LaneParts, RunControls
from .lane_types import LaneResult
from .late_shards import LateShards
from .live_profile import LiveProfile
from .live_state import LiveState
from .pipeline_config import Cancelled, LiveSettings, RunReport, RuntimeConfig
from .run_log import RunLog
from .schedule import edit_times
from .shard_index import ShardGrid

__all__ = ["Cancelled", "LiveSettings", "PipelinedEdit", "RunReport", "RuntimeConfig", "run_pipelined_edit"]

logger = logging.getLogger(__name__)


class _EitherSet:
    """``is_set()`` of either event: the caller's cancel flag or the run's own stop (the run was cancelled)."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.a.is_set() or self.b.is_set()


class PipelinedEdit:
    """One pipelined edit: a fetch lane (base shards, then upgrades while the link is idle), a decode lane (thread
    pool), a compute lane (the edit in a worker thread) and the stall accounting between them.

    The inputs are fixed at construction; each lane keeps what a run changes and :meth:`reset` (which :meth:`run`
    calls first) resets them all, so one instance can run the same edit again and each run's report owns its own
    lists (one run at a time per instance). Mirrors :class:`~sakura_core.runtime.simulate._Sim`, which plays the
    same lanes against a trace.

    Args:
        edit: the model, the private user image and prompt, the public template image (for layers the device
            computes) and what runs the model's blocks (:mod:`sakura_core.runtime.backend`; None = the torch adapter).
        manifest: the template's manifest.
        fetch_blob: ``async (digest, nbytes[, on_chunk]) -> bytes`` (a ShardClient's fetch, shaped by the caller:
            ``fetch.link.shaped_fetcher``); with ``on_chunk``, called with each chunk's size, the policy sees a
            transfer while it lasts (a stalled one too), as in the simulator; a fetcher awaits what ``on_chunk``
            returns when it is awaitable (the wire turn of ``RuntimeConfig.request_ahead``, as ShardClient does).
        plan: the policy, its rungs (levels and their manifest entries: :func:`~sakura_core.policy.plan.plan_fetch`,
            or built from :func:`~sakura_core.policy.ladder.rungs_from_manifest`) and the floor: the cheapest level
            the policy may pick.
        profile: measured per-layer compute times.
        trace: the link's trace, for the policies that read it (cachegen's rule, the oracle); None on a live
            link: those rules then use the estimator's rate (``Context.has_trace``).
        config: the run's settings (None = the defaults).
        controls: the caller's cancel flag (set it to stop between layers: raises :class:`Cancelled`), progress
            hook (``(step, layer)`` before each layer) and clock (:mod:`sakura_core.runtime.clock`; None = the wall
            clock).
    """

    def __init__(
        self,
        edit: EditInputs,
        manifest: Manifest | dict,
        fetch_blob,
        plan: FetchPlan,
        profile: LiveProfile,
        *,
        trace: Trace | None = None,
        config: RuntimeConfig | None = None,
        controls: RunControls | None = None,
    ) -> None:
        model, ladders, policy = edit.model, plan.ladders, plan.policy
        controls = controls or RunControls()
        self.model = model
        self.backend = backend_of(model, edit.backend)
        L = model.adapter.num_layers
        self.cfg = cfg = config or RuntimeConfig()
        manifest = as_manifest(manifest)  # typed once (a caller holding the JSON: a benchmark, a test)
        self.kv_mode = manifest.kv_mode
        self.per_step = self.kv_mode == "per-step"
        self.times = edit_times(model, self.cfg.live.steps)  # the edit's schedule: the model's own (shift 1)
        if self.per_step:  # the KV of step s is only valid at the schedule it was computed for (the run's one check)
            check_schedule(manifest, self.cfg.live.steps, 1.0, timesteps=[float(t) for t in self.times[:-1]])
        self.grid = grid = ShardGrid.for_edit(L, cfg.live.steps, self.per_step)  # shards: g = step * L + layer
        if len(ladders) != len(grid):
            what = f"{cfg.live.steps} steps x {L} layers" if self.per_step else f"{L} layers"
            raise ValueError(f"{len(ladders)} shard ladders for a {self.kv_mode} template, the edit needs {what}")
        self.policy = policy
        self.cancel = controls.cancel or threading.Event()
        self._stop = threading.Event()  # set when the run itself is cancelled: the compute thread stops too
        stop = _EitherSet(self.cancel, self._stop)
        # shared by every lane: the live state (the clock, and what the policy sees) and the run's log
        self.st = LiveState(profile, trace, ladders, plan.floor, cfg, layers_per_step=L, clock=controls.clock)
        self.ctx = Context(self.st)
        self.log = RunLog()
        self.held = HeldKV(grid, ladders)
        parts = LaneParts(grid, plan, self.st, self.ctx, self.held, self.log, cfg, stop)
        self.decoder = DecodeLane(manifest, plan.rungs, self.st, self.log, cfg.live.decode_threads)
        self.fetch = FetchLane(fetch_blob, parts, self.decoder)
        self.st.request_ahead = self.fetch.ahead  # Context.queued_rtt_s: the policy's view of the lane's requests
        self.device = DeviceKV(
            model, self.backend, edit.template_image, self.times, grid, self.held, self.st, self.log
        )
        late = LateShards(parts, self.fetch, profile.layer_cached_s)
        self.compute = ComputeLane(
            replace(edit, backend=self.backend),
            self.kv_mode,
            parts,
            decoder=self.decoder,
            device=self.device,
            late=late,
            user_hook=controls.on_layer,
        )
        self.reset()

    def reset(self) -> None:
        """A fresh run: the clock at 0, the policy reset, every lane and the log emptied."""
        self._stop.clear()
        self.st.reset()
        self.policy.reset()
        self.log.reset()
        for lane in (self.held, self.decoder, self.fetch, self.device, self.compute):
            lane.reset()

    async def run(self) -> RunReport:
        """Run the edit with the lanes overlapped (after :meth:`reset`)."""
        self.reset()
        loop = asyncio.get_running_loop()
        compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sakura-compute")
        try:
            with self.decoder.pool_open():
                fetch_task = asyncio.create_task(self.fetch.run())
                try:
                    result = await loop.run_in_executor(compute, self.compute.run)
                    self.compute.close_span(self.st.now)
                except asyncio.CancelledError:
                    self._stop.set()  # the compute thread stops at its next layer (or shard wait)
                    raise
                finally:
                    await self.fetch.stop(fetch_task)
        finally:
            compute.shutdown(wait=False)
        return self._report(result)

    def _report(self, out) -> RunReport:
        compute, every_step = self.compute, self.policy.template_every_step
        result = LaneResult(
            policy=self.policy.name,
            latency_s=self.st.now,
            bytes_fetched=self.fetch.bytes_fetched,
            split_layer=compute.split_layer if not every_step else self.grid.layers,
            split_layers=list(compute.split_layers) if not every_step else [],
            events=self.log.events,
            decisions=self.log.decisions,
            peak_kv_bytes=self.held.peak_kv_bytes,
        )
        return RunReport(
            result,
            image=out.image,
            tokens=out.tokens,
            fallbacks=self.log.fallbacks,
            levels_used=compute.levels_used,
            kv_mode=self.kv_mode,
            layers_per_step=self.grid.layers,
            bytes_used=sum(compute.used_blobs.values()),
        )


async def run_pipelined_edit(*args, **kwargs) -> RunReport:
    """Run one edit with the three lanes overlapped: a :class:`PipelinedEdit` (same arguments) run once."""
    return await PipelinedEdit(*args, **kwargs).run()

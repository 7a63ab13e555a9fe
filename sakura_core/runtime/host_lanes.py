"""The pipelined runtime's fetch and decode lanes serving a host's own forward (ComfyUI's native klein, through its
patch points) in place of the runtime's compute lane: :class:`HostLanes`.

The fetch lane (:class:`~sakura_core.runtime.fetch_lane.FetchLane`), the decode lane, :class:`HeldKV` and the live
state are the runtime's own, so the fetch policy (``sakura`` or a baseline, ``sakura_core.policy``) chooses each
shard's level from the measured link (or an emulated one: ``LinkSpec``) exactly as in a pipelined edit. The host
plays the compute lane: before each layer it calls :meth:`HostLanes.at_layer`; while the reference tokens are in its
sequence (step 0 of a single-mode template, when the host has them) it asks :meth:`HostLanes.keep_template` — the
policy's hybrid split — and hands what it computed to :meth:`HostLanes.hold_computed`; after the split it takes each
layer's K/V from :meth:`HostLanes.kv`, which waits while a shard is on its way (a late shard the host can no longer
compute is asked for at once: ``FetchLane.fetch_skipped``). Once every shard is there, the idle link fetches the
policy's upgrades (progressive levels): a later step's :meth:`HostLanes.kv` gets the finer KV. The policy predicts
with the host's per-layer times (:meth:`HostLanes.layer_time`; before the first one, ``prior_layer_s``).

Threads: the lanes run on an event loop in a worker thread of their own (:meth:`start` .. :meth:`reset`); the host
calls from its sampling thread. Everything is per run: :meth:`reset` stops the loop and drops the KV.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import torch

from ..fetch.link import LinkSpec, shaped_fetcher
from ..kv.manifest import Manifest
from ..policy.context import Context
from ..policy.plan import plan_fetch
from .fetch_lane import FetchLane, takes_on_chunk
from .held_kv import HeldKV
from .lane_parts import LaneParts
from .lane_rules import ask_keep_template
from .live_profile import LiveProfile
from .live_state import LiveState
from .pipeline_config import RuntimeConfig
from .run_log import RunLog
from .shard_index import ShardGrid

__all__ = ["PRIOR_LAYER_S", "HostLanes"]

logger = logging.getLogger(__name__)

PRIOR_LAYER_S = 0.02  # the policy's per-layer time until the host has timed one (seconds)


class HostLanes:
    """One run's fetch + decode lanes for a host forward (see the module docstring).

    Args:
        source: where the template is served (``sakura_core.fetch.sources``).
        manifest: its manifest, checked against the host's model.
        policy: the fetch policy's name (``sakura_core.policy.plan.runnable_policies``).
        link: the link (``LinkSpec``: live, or emulated at a fixed rate / by a trace).
        layers: the host model's layers.
        config: the run's settings: its ``latency_target_s`` (seconds or None), its denoising ``live.steps`` and
            ``live.shard_wait_s`` (the longest wait for one shard before the run stops naming it, seconds).
        prior_layer_s: the per-layer time the policy predicts with until :meth:`layer_time` measured one (seconds).
    """

    def __init__(
        self,
        source,
        manifest: Manifest,
        policy: str,
        link: LinkSpec,
        layers: int,
        config: RuntimeConfig,
        *,
        prior_layer_s: float = PRIOR_LAYER_S,
    ) -> None:
        steps = config.live.steps
        self.source, self.manifest, self.link = source, manifest, LinkSpec.parse(link)
        self.per_step = manifest.kv_mode == "per-step"
        self.grid = ShardGrid.for_edit(layers, steps, self.per_step)
        plan = plan_fetch(manifest, policy)
        if len(plan.ladders) != len(self.grid):
            raise ValueError(
                f"template {manifest.template_id} has {len(plan.ladders)} shards, a {steps}-step run of "
                f"a {layers}-layer model needs {len(self.grid)}"
            )
        self.plan, self.policy = plan, plan.policy
        self.cfg = config
        profile = LiveProfile(2 * prior_layer_s, prior_layer_s, layers, steps)
        self.st = LiveState(profile, self.link.trace(), plan.ladders, plan.floor, config, layers_per_step=layers)
        self.ctx = Context(self.st)
        self.log = RunLog()
        self.held = HeldKV(self.grid, plan.ladders)
        from .decode_lane import DecodeLane

        self.decoder = DecodeLane(manifest, plan.rungs, self.st, self.log, self.cfg.live.decode_threads)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None  # the lanes' failure, raised in the host's forward
        self.reset()

    # ---- lifetime ---------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Stop the lanes (if running) and drop every shard; the next :meth:`start` is a fresh run."""
        self._cancel.set()
        loop, thread = self._loop, self._thread
        if loop is not None and self._stop is not None and thread is not None and thread.is_alive():
            try:
                loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop closed meanwhile (its lanes ended on an error): nothing left to stop
                logger.debug("template %s: the lanes had ended already", self.manifest.template_id)
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        self._thread, self._loop, self._stop, self._error = None, None, None, None
        self._cancel.clear()
        self.st.reset()
        self.policy.reset()
        self.log.reset()
        self.held.reset()
        self.decoder.reset()
        parts = LaneParts(self.grid, self.plan, self.st, self.ctx, self.held, self.log, self.cfg, self._cancel)
        self.fetch = FetchLane(None, parts, self.decoder)
        self.split_layer = self.grid.layers
        self.levels_used: dict[int, list[str]] = {}
        self.used_blobs: dict[str, int] = {}
        self.wait_s, self.waits = 0.0, 0

    def start(self, template_in_sequence: bool) -> None:
        """Begin the run: the lanes fetch as the policy decides. ``template_in_sequence``: the host has the
        reference tokens in its step-0 sequence (it can compute their layers: the hybrid split), else every shard is
        needed from the start."""
        with self.st.lock:
            self.st.template_alive = template_in_sequence and not self.per_step
            self.st.dropped_at = self.grid.layers if self.st.template_alive else 0
        self.split_layer = self.st.dropped_at  # no reference tokens in the host's sequence: every layer fetched
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), daemon=True, name=f"sakura-lanes-{self.manifest.template_id}"
        )
        self._thread.start()
        ready.wait(timeout=30.0)

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._lanes(ready))
        except BaseException as e:  # handed to the host's forward, which raises it in the sampler's thread
            logger.warning("template %s: the fetch lanes failed: %s", self.manifest.template_id, e)
            self._error = e
            for event in self.held.ready.values():
                event.set()
        finally:
            ready.set()

    async def _lanes(self, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.source.open() as shards:
            self.fetch.fetch_blob = fetch_blob = shaped_fetcher(shards, self.link)
            self.fetch.reports_chunks = takes_on_chunk(fetch_blob)
            with self.decoder.pool_open():
                task = asyncio.create_task(self.fetch.run())
                await asyncio.sleep(0)  # the lane has its loop (FetchLane.fetch_skipped calls into it)
                ready.set()
                await self._stop.wait()
                await self.fetch.stop(task)

    # ---- the host's side (its sampling thread) --------------------------------------------------------------------
    def at_layer(self, step: int, layer: int) -> None:
        """The host is about to run ``layer`` of ``step``."""
        shard = self.grid.at(step, layer)
        with self.st.lock:
            self.st.compute_layer, self.st.compute_t = shard.g, self.st.now

    def keep_template(self, layer: int) -> bool:
        """Step 0 with the reference tokens in the host's sequence: the policy's split — True = the host computes
        this layer's reference tokens, False = they are dropped here and every later layer uses fetched K/V."""
        st, shard = self.st, self.grid.at(0, layer)
        with st.lock:
            if not st.template_alive:
                return False
            st.compute_layer, st.compute_t = shard.g, st.now
            keep = ask_keep_template(self.policy, self.ctx, shard.g, st.computed)
            if not keep:
                st.template_alive, st.dropped_at, self.split_layer = False, layer, layer
        if not keep:
            self.log.decision(st.now, shard.g, "drop", f"template dropped at layer {layer}")
        return keep

    def hold_computed(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The host computed ``layer``'s reference K/V (tokens, heads, head_dim) at step 0: later steps use them
        and the link does not fetch that shard."""
        shard = self.grid.at(0, layer)
        self.held.hold_device({shard: (k, v)})
        self.levels_used.setdefault(shard.g, []).append("computed here")

    def kv(
        self, step: int, layer: int, *, check: Callable[[], None] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s K/V at ``step`` (tokens, heads, head_dim): computed here at step 0, or fetched — waiting while
        it is on its way (``check()``, the host's interrupt test, every 0.1 s)."""
        shard = self.grid.at(step, layer)
        made = self.held.device(shard)
        if made is not None:
            return made
        if not self.held.is_ready(shard) and not self.held.is_failed(shard) and self._error is None:
            self._wait(shard, check)
        if self._error is not None:
            raise RuntimeError(f"template {self.manifest.template_id}: fetch failed: {self._error}") from self._error
        if not self.held.is_held(shard):
            raise RuntimeError(
                f"template {self.manifest.template_id}: {shard} could not be fetched ("
                f"{'; '.join(self.log.fallbacks) or 'the link gave up'})"
            )
        k, v, level, blobs = self.held.fetched_blobs(shard)
        self.levels_used.setdefault(shard.g, []).append(
            self.held.source_name(shard) or self.plan.ladders[shard.g][level].name
        )
        self.used_blobs.update(blobs)
        return k, v

    def _wait(self, shard, check) -> None:
        self.fetch.fetch_skipped(shard)  # a shard the policy left to the host's compute: fetched at once
        st, t0, ready = self.st, time.perf_counter(), self.held.ready[shard]
        with st.lock:
            st.waiting_since = st.now
        try:
            while not ready.wait(0.1) and self._error is None:
                if check is not None:
                    check()
                if time.perf_counter() - t0 > (wait_s := self.cfg.live.shard_wait_s):
                    raise RuntimeError(f"template {self.manifest.template_id}: {shard} not fetched after {wait_s:g} s")
        finally:
            with st.lock:
                st.stalls_done_s += st.now - st.waiting_since
                st.waiting_since = None
            self.wait_s += time.perf_counter() - t0
            self.waits += 1

    def layer_time(self, seconds: float, with_template: bool) -> None:
        """The host ran a layer in ``seconds`` (with the reference tokens, or with their K/V injected): the policy
        predicts with it from now on."""
        with self.st.lock:
            p = self.st.profile
            assert isinstance(p, LiveProfile)  # the one this object made (above) or replaced here
            if with_template:
                self.st.profile = dataclasses.replace(p, layer_full_s=max(seconds, p.layer_cached_s))
            else:
                self.st.profile = dataclasses.replace(
                    p, layer_cached_s=seconds, layer_full_s=max(p.layer_full_s, seconds)
                )

    # ---- what the run did ---------------------------------------------------------------------------------------------
    def shards_done(self) -> int:
        """Shards decoded or computed here so far (the host's progress bar)."""
        return sum(1 for s in self.grid if self.held.is_ready(s) or self.held.device(s) is not None)

    def report(self) -> dict:
        """The run in ``sakura_core.edit_report``'s terms: policy, bytes fetched / used, split, levels per shard,
        waits, the policy's decisions and fallbacks, the link."""
        computed = sorted(g for g, used in self.levels_used.items() if "computed here" in used)
        return {
            "policy": self.policy.name,
            "template_id": self.manifest.template_id,
            "latency_s": round(self.st.now, 4),
            "bytes_fetched": self.fetch.bytes_fetched,
            "bytes_used": sum(self.used_blobs.values()),
            "split_layer": self.split_layer,
            "levels_used": {str(g): used for g, used in sorted(self.levels_used.items())},
            "kv_mode": self.manifest.kv_mode,
            "floor_level": self.plan.floor_name,
            "computed_here": computed,
            "wait_s": round(self.wait_s, 4),
            "waits": self.waits,
            "decisions": [dict(d, t=round(d["t"], 4)) for d in self.log.decisions],
            "fallbacks": list(self.log.fallbacks),
            "link": self.link.to_wire(),
            "steps": self.cfg.live.steps,
            "latency_target_s": self.cfg.latency_target_s,
        }

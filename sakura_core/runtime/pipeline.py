"""The pipelined phone runtime: fetch (aiohttp, streaming), decode (thread pool) and compute (torch) concurrently.

Step 0 is a hybrid forward whose split is decided while it runs: before each layer the policy says whether the
device keeps running the template tokens (compute) or drops them and uses the fetched shard. The fetch lane asks
the same policy, whenever the link is free, which shard to fetch at which level (or to skip it because the device
will compute it), and, once every needed shard is fetched, which shard to upgrade with a progressive enhancement
while later steps run. Policies see the same :class:`~sakura_core.runtime.context.Context` as in the simulation.

Failures never produce a silently wrong result: a shard that cannot be fetched or decoded is retried at the floor
level; if that fails too, the device computes the template KV itself (a template-only pass) and the report says so.
Every event lands in the timeline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from ..fetch.estimator import ThroughputEstimator
from ..fetch.policies import LEVEL_COMPUTE, Policy
from ..fetch.traces import Trace
from ..models.demo import DemoModel
from .context import Context, LiveState
from .edit import run_edit
from .ladder import Level

__all__ = ["Cancelled", "LiveProfile", "RunReport", "RuntimeConfig", "run_pipelined_edit"]

logger = logging.getLogger(__name__)


class Cancelled(RuntimeError):
    """The edit was cancelled (between layers or steps)."""


@dataclass(frozen=True)
class RuntimeConfig:
    """Attributes:
    steps: denoising steps.
    seed: noise seed.
    decode_threads: decoder pool size.
    upgrades: fetch progressive enhancements during later steps (policies that ask for them).
    shard_wait_s: longest wait for one shard before the device computes the template KV itself.
    rtt_s: round trip charged per request in the policies' predictions.
    latency_target_s: the user's latency target for the edit (seconds) or None; policies trade the slack under it
        for quality (sakura) or use it as their SLO (cachegen).
    """

    steps: int = 8
    seed: int = 0
    decode_threads: int = 1
    upgrades: bool = True
    shard_wait_s: float = 120.0
    rtt_s: float = 0.04
    latency_target_s: float | None = None

    def __post_init__(self) -> None:
        if self.latency_target_s is not None and not self.latency_target_s > 0:
            raise ValueError(f"latency_target_s must be > 0 seconds or None, got {self.latency_target_s}")
        if self.steps < 1 or self.decode_threads < 1 or self.shard_wait_s <= 0:
            raise ValueError(
                f"steps and decode_threads must be >= 1 and shard_wait_s > 0, got {self.steps}, "
                f"{self.decode_threads}, {self.shard_wait_s}"
            )


@dataclass(frozen=True)
class LiveProfile:
    """Measured compute costs of the model on this device, which the policies predict with.

    Attributes:
        layer_full_s: one layer that also runs the template tokens, seconds.
        layer_cached_s: one layer with the template KV injected, seconds.
        layers: transformer layers.
        steps: denoising steps.
        fixed_s: per-edit work outside the transformer, seconds.
    """

    layer_full_s: float
    layer_cached_s: float
    layers: int
    steps: int
    fixed_s: float = 0.0

    @property
    def template_pass_s(self) -> float:
        """Extra cost of running the template tokens through every layer."""
        return (self.layer_full_s - self.layer_cached_s) * self.layers

    @property
    def model(self) -> LiveProfile:  # the simulation's profiles expose model.steps / model.layers
        return self


@dataclass
class RunReport:
    policy: str
    latency_s: float
    bytes_fetched: int
    split_layer: int
    image: np.ndarray
    tokens: torch.Tensor
    events: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    levels_used: dict[int, list[str]] = field(default_factory=dict)

    def busy_s(self, lane: str) -> float:
        """Total time the lane was busy (overlaps merged)."""
        spans = sorted((e["start"], e["end"]) for e in self.events if e["lane"] == lane)
        total, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    total += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _wait_or_cancel(ready: threading.Event, cancel: threading.Event, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait up to ``timeout_s`` for ``ready``, returning early (False) once ``cancel`` is set."""
    waited = 0.0
    while not cancel.is_set() and waited < timeout_s:
        step = min(poll_s, timeout_s - waited)
        if ready.wait(step):
            return True
        waited += step
    return ready.is_set()


async def run_pipelined_edit(
    model: DemoModel,
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
) -> RunReport:
    """Run one edit with the three lanes overlapped.

    Args:
        fetch_blob: ``async (digest, nbytes) -> bytes`` (a ShardClient's fetch, shaped by the caller).
        ladders/reps: from :func:`ladders_from_manifest`.
        floor: index of the cheapest level the policy may pick (quality floor).
        profile: measured per-layer compute times.
        template_image: the public template image (for layers the device computes).
        trace: the link's trace, for the policies that read it (cachegen's rule, the oracle).
        cancel: set it to stop between layers (raises :class:`Cancelled`).
        on_layer: ``(step, layer)`` before each layer (progress reporting).
    """
    cfg = config or RuntimeConfig()
    cancel = cancel or threading.Event()
    adapter = model.adapter
    L = adapter.num_layers
    if len(ladders) != L:
        raise ValueError(f"manifest has {len(ladders)} shards, the model {L} layers")
    estimator = ThroughputEstimator()
    st = LiveState(profile, trace or Trace.constant(1e4), ladders, floor, estimator, cfg.rtt_s, cfg.latency_target_s)
    ctx = Context(st)
    policy.reset()
    events: list[dict] = []
    decisions: list[dict] = []
    fallbacks: list[str] = []
    kv: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # layer -> (k, v, level)
    ready = {layer: threading.Event() for layer in range(L)}
    failed: set[int] = set()
    levels_used: dict[int, list[str]] = {}
    blobs: dict[str, bytes] = {}
    nbytes = [0]
    split = [L]
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=cfg.decode_threads, thread_name_prefix="sakura-decode")
    from ..kv.binding import check_shard_binding, slot_from_manifest
    from ..kv.chain import ChainDecoder

    def event(lane, start, end, layer, level):
        events.append({"lane": lane, "start": start, "end": end, "layer": layer, "level": level})

    async def get(digest: str, size: int, layer: int, level_name: str) -> bytes:
        if digest in blobs:
            return blobs[digest]
        t0 = st.now
        data = await fetch_blob(digest, size)
        t1 = st.now
        estimator.observe(len(data), max(t1 - t0, 1e-6))
        nbytes[0] += len(data)
        event("fetch", t0, t1, layer, level_name)
        blobs[digest] = data
        return data

    decoders: dict[int, tuple[list[str], ChainDecoder]] = {}  # layer -> (digests pushed, its incremental decoder)
    decoder_lock = threading.Lock()

    def decode(layer: int, level: int, digests: list[str], chain: list[bytes]):
        """Decode a chain; an upgrade that extends the chain already decoded applies only its new blobs."""
        t0 = st.now
        with decoder_lock:
            done, dec = decoders.pop(layer, ([], None))
        if dec is None or digests[: len(done)] != done or len(digests) <= len(done):
            done, dec = [], ChainDecoder()
        for blob in chain[len(done) :]:  # on an error the half-advanced decoder stays dropped (popped above)
            dec.push(blob)
        # the blob must be the one this slot needs, not just the one the manifest names (a corrupt shard if not)
        check_shard_binding(dec.header, slot_from_manifest(manifest, layer, reps[layer][level]))
        k, v = dec.tensors()
        with decoder_lock:
            decoders[layer] = (list(digests), dec)
        t1 = st.now
        event("decode", t0, t1, layer, ladders[layer][level].name)
        return k, v

    async def fetch_level(layer: int, level: int) -> None:
        rep = reps[layer][level]
        by_digest = {r["digest"]: r for r in reps[layer]}
        digests = [*rep.get("requires", []), rep["digest"]]
        chain = [await get(d, by_digest[d]["bytes"], layer, ladders[layer][level].name) for d in digests]
        k, v = await loop.run_in_executor(pool, decode, layer, level, digests, chain)
        with st.lock:
            cur = kv.get(layer)
            if cur is None or cur[2] < level:
                kv[layer] = (k[0], v[0], level)
            st.got.setdefault(layer, []).append((level, st.now))
            st.in_flight.pop(layer, None)
            st.decoder_free = st.now
        ready[layer].set()

    async def fetch_with_fallback(layer: int, level: int) -> None:
        try:
            await fetch_level(layer, level)
        except Exception as e:  # noqa: BLE001 - every failure has the same fallback, and it is reported
            if level != floor:
                fallbacks.append(f"shard {layer} level {ladders[layer][level].name}: {e}; retrying at the floor level")
                try:
                    await fetch_level(layer, floor)
                    return
                except Exception as e2:  # noqa: BLE001
                    e = e2
            fallbacks.append(f"shard {layer}: {e}; the device computes this layer's template KV")
            failed.add(layer)
            ready[layer].set()

    async def fetch_lane() -> None:
        while st.next_layer < L and not cancel.is_set():
            layer = st.next_layer
            with st.lock:
                st.link_free = st.now
                d = policy.choose(ctx, layer)
            decisions.append({"t": st.now, "layer": layer, "level": d.level, "reason": d.reason})
            if d.level is None:
                break
            st.next_layer += 1
            if d.level == LEVEL_COMPUTE:
                continue
            with st.lock:
                st.in_flight[layer] = ctx.predict_ready(layer, ladders[layer][d.level], estimator.robust())
            await fetch_with_fallback(layer, d.level)
        st.base_done = True
        while cfg.upgrades and not cancel.is_set() and not done.is_set():
            with st.lock:
                st.link_free = st.now
                up = policy.upgrade(ctx)
            if up is None:
                break
            layer, level = up
            decisions.append({"t": st.now, "layer": layer, "level": level, "reason": "upgrade"})
            try:
                await fetch_level(layer, level)
            except Exception as e:  # noqa: BLE001 - an upgrade is optional: report and stop upgrading
                fallbacks.append(f"upgrade of shard {layer} to {ladders[layer][level].name} failed: {e}")
                break

    fallback_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def device_kv(layer: int):
        if not fallback_kv:
            t0 = st.now
            tkv = adapter.extract_template_kv(model.template_tokens(template_image), model.spec.grid)
            event("compute", t0, st.now, -1, "fallback template pass")
            for i in range(L):
                fallback_kv[i] = tkv.layer(i)
        return fallback_kv[layer]

    def kv_source(layer: int, step: int):
        if not ready[layer].is_set():
            if layer not in st.in_flight and not st.got.get(layer) and (st.base_done or st.next_layer > layer):
                # the fetch lane skipped it (a policy may not foresee a drop) — fetch it now at the floor
                asyncio.run_coroutine_threadsafe(fetch_with_fallback(layer, floor), loop)
            t0 = st.now
            if not _wait_or_cancel(ready[layer], cancel, cfg.shard_wait_s):
                if cancel.is_set():
                    raise Cancelled(f"edit cancelled at step {step}, layer {layer} while waiting for its shard")
                fallbacks.append(f"shard {layer} not ready after {cfg.shard_wait_s}s; computing it on the device")
                failed.add(layer)
            event("stall", t0, st.now, layer, f"step {step}")
        if layer in failed:
            k, v = device_kv(layer)
            levels_used.setdefault(layer, []).append("device")
            return k, v
        with st.lock:
            k, v, level = kv[layer]
        levels_used.setdefault(layer, []).append(ladders[layer][level].name)
        return k.unsqueeze(0), v.unsqueeze(0)

    last = {"t": 0.0, "key": None}

    user_hook = on_layer

    def on_layer(step: int, layer: int) -> None:  # noqa: F811 - wraps the caller's hook
        if cancel.is_set():
            raise Cancelled(f"edit cancelled at step {step}, layer {layer}")
        if user_hook is not None:
            user_hook(step, layer)
        now = st.now
        if last["key"] is not None:
            s, lay, lvl = last["key"]
            event("compute", last["t"], now, lay, lvl)
        with st.lock:
            st.compute_layer, st.compute_t = layer, now
        last["t"] = now
        last["key"] = (step, layer, "template" if (step == 0 and st.template_alive) else "cached")

    def keep_template(layer: int) -> bool:
        with st.lock:
            st.compute_layer, st.compute_t = layer, st.now
            keep = policy.keep_template(ctx, layer)
            if not keep:
                st.template_alive = False
                split[0] = layer
        if not keep:
            decisions.append({"t": st.now, "layer": layer, "level": "drop", "reason": "template dropped"})
        return keep

    def compute():
        if policy.kv_preloaded:
            raise ValueError("free-kv is a simulation-only bound")
        if policy.template_every_step:
            st.template_alive = True
            return run_edit(model, user_image, prompt, steps=cfg.steps, seed=cfg.seed, split_layer=L,
                            template_image=template_image, template_every_step=True, on_layer=on_layer)  # fmt: skip
        return run_edit(model, user_image, prompt, steps=cfg.steps, seed=cfg.seed, split_layer=keep_template,
                        kv_source=kv_source, template_image=template_image, on_layer=on_layer)  # fmt: skip

    done = asyncio.Event()
    fetch_task = asyncio.create_task(fetch_lane())
    try:
        result = await asyncio.to_thread(compute)
        if last["key"] is not None:
            event("compute", last["t"], st.now, last["key"][1], last["key"][2])
    finally:
        done.set()
        cancel_fetch = not fetch_task.done()
        if cancel_fetch:
            fetch_task.cancel()
        try:
            await fetch_task
        except asyncio.CancelledError:
            pass
        pool.shutdown(wait=True)
    latency = st.now
    return RunReport(
        policy=policy.name,
        latency_s=latency,
        bytes_fetched=nbytes[0],
        split_layer=split[0] if not policy.template_every_step else L,
        image=result.image,
        tokens=result.tokens,
        events=events,
        decisions=decisions,
        fallbacks=fallbacks,
        levels_used=levels_used,
    )
